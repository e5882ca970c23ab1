"""Exact batch normalization: one all-reduce per layer and pass, and digits kept for large means.

The moments are checked on 1, 2 and 4 CPU replicas (uneven slices, one empty)
against float64 NumPy; the collectives are counted in the traced training step
of a model with 1 and with 3 batch-normalization layers, for each `batch_norm`
choice and for the former two-pass moments.
"""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import mdtrain.norm  # noqa: E402
from mdtrain.compat import fresh_collective_keys  # noqa: E402
from mdtrain.loop import pad_empty_slice  # noqa: E402
from mdtrain.norm import ExactBatchNormalization, all_reduce_sum, global_moments  # noqa: E402

COLLECTIVES = ("CollectiveReduce", "CollectiveReduceV2", "NcclAllReduce")


def _strategy(replicas: int) -> tf.distribute.Strategy:
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    fresh_collective_keys()  # strategies over the same CPUs: tensorflow/tensorflow#61314
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _large_mean_batch(examples: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """float32 activations 10,000 standard deviations from 0, and the channels' rough means."""
    rng = np.random.default_rng(0)
    means = np.array([1e4, -3e4, 5e3, 2e4], "float32")
    x = (means + rng.normal(0.0, 1.0, (examples, 3, 3, 4))).astype("float32")
    return x, means + 5.0  # a shift 5 standard deviations off, as a lagging moving mean is


def _distributed_moments(replicas: int, x: np.ndarray, shift) -> tuple[np.ndarray, np.ndarray]:
    """`global_moments` as the trainer runs it: a global batch split over the replicas."""
    strategy = _strategy(replicas)
    labels = np.zeros(len(x), "int32")
    batches = tf.data.Dataset.from_tensor_slices((x, labels)).batch(len(x))
    batch = next(iter(strategy.experimental_distribute_dataset(batches)))

    def replica(images, labels):
        images, _, weights, _ = pad_empty_slice(images, labels)  # 5 on 4 replicas: 2/2/1/0
        return global_moments(images, weights, shift)

    outputs = tf.function(lambda b: strategy.run(replica, args=b))(batch)
    return tuple(strategy.experimental_local_results(t)[-1].numpy() for t in outputs)


def test_moments_of_a_large_mean_match_float64_on_any_number_of_replicas():
    x, shift = _large_mean_batch()
    mean = x.astype("float64").mean(axis=(0, 1, 2))
    variance = x.astype("float64").var(axis=(0, 1, 2))
    got = {n: _distributed_moments(n, x, shift) for n in (1, 2, 4)}
    for n, (m, v) in got.items():
        np.testing.assert_allclose(m, mean, rtol=1e-7, err_msg=f"{n} replicas")
        np.testing.assert_allclose(v, variance, rtol=1e-5, err_msg=f"{n} replicas")
    for n in (2, 4):  # N replicas == 1, to float rounding
        np.testing.assert_allclose(got[n][1], got[1][1], rtol=1e-5)


def test_without_the_shift_a_large_mean_loses_the_variance():
    """Why the sums are of x - K: E[x²] - E[x]² in float32 is wrong here by orders of magnitude."""
    x, _ = _large_mean_batch()
    _, unshifted = _distributed_moments(2, x, None)
    variance = x.astype("float64").var(axis=(0, 1, 2))
    assert np.max(np.abs(unshifted - variance) / variance) > 0.1


def test_the_layer_shifts_by_its_moving_mean():
    x, shift = _large_mean_batch(8)
    layer = ExactBatchNormalization(momentum=0.0, center=False, scale=False)
    layer.build(x.shape)
    layer.moving_mean.assign(shift)
    out = np.asarray(layer(x, training=True), "float64")
    x64 = x.astype("float64")
    expected = (x64 - x64.mean((0, 1, 2))) / np.sqrt(x64.var((0, 1, 2)) + layer.epsilon)
    np.testing.assert_allclose(out, expected, atol=1e-2)  # x - mean: float32 at 3e4 is 0.004
    np.testing.assert_allclose(layer.moving_variance, x64.var((0, 1, 2)), rtol=1e-5)


def _two_pass_moments(x, weights=None, shift=None):
    """The former `global_moments`: the mean, then the squared deviations, two all-reduces."""
    axes = list(range(len(x.shape) - 1))
    weights = tf.ones(tf.shape(x)[:1], x.dtype) if weights is None else tf.cast(weights, x.dtype)
    per_example = tf.cast(tf.reduce_prod(tf.shape(x)[1:-1]), x.dtype)
    w = tf.reshape(weights, [-1] + [1] * (len(x.shape) - 1))
    count, total = all_reduce_sum(
        [tf.reduce_sum(weights) * per_example, tf.reduce_sum(x * w, axes)]
    )
    mean = total / tf.maximum(count, 1.0)
    squares = all_reduce_sum(tf.reduce_sum(tf.square(x - mean) * w, axes))
    return mean, squares / tf.maximum(count, 1.0)


def _net(layers: int, batch_norm: str) -> keras.Model:
    inputs = keras.Input((8, 8, 3))
    x = inputs
    for _ in range(layers):
        x = keras.layers.Conv2D(4, 3, padding="same")(x)
        exact = batch_norm in ("exact", "two-pass")
        synchronized = batch_norm == "synchronized"
        norm = ExactBatchNormalization() if exact else keras.layers.BatchNormalization(
            synchronized=synchronized)  # fmt: skip
        x = norm(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


def _collectives(batch_norm: str, layers: int, backward: bool) -> int:
    """All-reduces per replica in one traced step (forward, or forward, backward and update)."""
    strategy = _strategy(2)
    with strategy.scope():
        net = _net(layers, batch_norm)
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(net.trainable_variables)

    def replica(images):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(net(images, training=True))
        if backward:
            optimizer.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)

    step = tf.function(lambda images: strategy.run(replica, args=(images,)))
    # Batch size unknown, as in training: with a static one, Keras' count is a constant.
    graph = step.get_concrete_function(tf.TensorSpec((None, 8, 8, 3))).graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return sum(node.op in COLLECTIVES for node in nodes) // strategy.num_replicas_in_sync


@pytest.mark.parametrize(
    ("batch_norm", "forward", "per_step"),
    [("exact", 1, 2), ("two-pass", 2, 4), ("synchronized", 3, 6), ("local", 0, 0)],
)
def test_collectives_per_layer_and_step(monkeypatch, batch_norm, forward, per_step):
    """What each choice costs, as `mdtrain.norm`'s docstring and docs/numerics.md say."""
    if batch_norm == "two-pass":  # before: the mean, then the squared deviations
        monkeypatch.setattr(mdtrain.norm, "global_moments", _two_pass_moments)
    for backward, expected in ((False, forward), (True, per_step)):
        one, three = (_collectives(batch_norm, k, backward) for k in (1, 3))
        assert (three - one) / 2 == expected, (batch_norm, backward, one, three)
