"""The N-replicas-vs-1 experiment behind `tests/test_numerics.py` (test helper, not a test).

The same fixed, globally batched data (uint8 images, int labels, no shuffle,
no augmentation) trains the same small model from the same initial weights
under different strategies and loss-scaling rules; the final weights are then
compared. Three rules:

- `"exact"`: `mdtrain.ExactTrainer` (each replica divides its summed loss by
  the all-reduced global example count), with `fit` or `custom_fit`;
- `"keras_fit"`: plain `model.compile(loss=...)` + `model.fit`; Keras 3
  scales each replica's *mean* loss by 1/num_replicas_in_sync, wrong when a
  partial batch splits unevenly (and Keras fails outright on an uneven first
  batch, keras-team/keras#19246);
- `"naive_global_batch"`: a custom loop using
  `tf.nn.compute_average_loss(..., global_batch_size=GLOBAL)`, which divides
  a partial batch by the full global batch size.

Plain Keras code must never see an empty replica slice here: TensorFlow's
oneDNN CPU kernels fail on one on AVX-512 machines
(tensorflow/tensorflow#112639), so the baselines use sizes where every
replica gets at least one example. Virtual CPU replicas must be configured
(`configure_devices("cpu:4")`) before TensorFlow starts. Moved here from the
package's former `mdtrain.numerics`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from mdtrain.compat import fresh_collective_keys
from mdtrain.distribute import shard_by_batch
from mdtrain.loop import ExactTrainer, custom_fit
from mdtrain.models import build_model, unfreeze_top
from mdtrain.norm import swap_batch_norm

# On GPUs of compute capability 8.0 and up TensorFlow computes float32 matmuls and
# convolutions in TF32 (10-bit mantissas) by default: N replicas ≡ 1 is a float32 claim.
if tf.config.list_physical_devices("GPU"):
    tf.config.experimental.enable_tensor_float_32_execution(False)

LOSSES = ("exact", "keras_fit", "naive_global_batch")
LOOPS = ("fit", "custom")


def fixed_dataset(
    num_examples: int, global_batch_size: int, image_size: int = 16, num_classes: int = 3,
    seed: int = 0,
) -> tf.data.Dataset:  # fmt: skip
    """Random `(uint8 [B, S, S, 3], int32 [B])` batches of the global batch, one epoch."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (num_examples, image_size, image_size, 3), dtype=np.uint8)
    labels = rng.integers(0, num_classes, num_examples).astype(np.int32)
    return shard_by_batch(
        tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch_size)
    )


def _tiny_cnn(image_size: int, num_classes: int) -> keras.Model:
    """Two convolutions and a dense layer: traces in seconds even on 4 replicas."""
    layers = keras.layers
    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Rescaling(1 / 255.0)(inputs)
    x = layers.Conv2D(8, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(16, 3, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="tiny_cnn")


def _build_net(model: str, image_size: int, num_classes: int, seed: int, **options) -> keras.Model:
    keras.utils.set_random_seed(seed)  # same initial weights under every strategy
    if model == "tiny":
        return _tiny_cnn(image_size, num_classes)
    net = build_model(model, num_classes, image_size, weights=options["weights"], dropout=0.0)
    if options["fine_tune"]:
        unfreeze_top(net)
    if options["per_replica_batch_norm"]:  # Keras' own layer: each replica's own statistics
        net = swap_batch_norm(net, keras.layers.BatchNormalization)
    return net


def _naive_fit(net, strategy, dataset, epochs, learning_rate, global_batch_size, class_weights):
    """A custom loop with the common but wrong rule: divide by the full global batch."""
    with strategy.scope():
        optimizer = keras.optimizers.SGD(learning_rate)
        optimizer.build(net.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    weights = None if class_weights is None else tf.constant(class_weights, tf.float32)

    def step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            losses = per_example(labels, net(images, training=True))
            if weights is not None:
                losses = losses * tf.gather(weights, labels)
            loss = tf.nn.compute_average_loss(losses, global_batch_size=global_batch_size)
        gradients = tape.gradient(loss, net.trainable_variables)
        optimizer.apply(gradients, net.trainable_variables)

    @tf.function
    def distributed_step(batch):
        strategy.run(step, args=(batch,))

    for _ in range(epochs):
        for batch in strategy.experimental_distribute_dataset(dataset):
            distributed_step(batch)


def _keras_fit(net, strategy, dataset, epochs, learning_rate, class_weights) -> None:
    """Keras' own rule: `compile(loss=...)` and `fit`."""
    with strategy.scope():
        net.compile(
            optimizer=keras.optimizers.SGD(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(),
        )
    weights = None if class_weights is None else dict(enumerate(class_weights))
    net.fit(dataset, epochs=epochs, shuffle=False, verbose=0, class_weight=weights)


def _exact_fit(net, strategy, dataset, epochs, learning_rate, class_weights, loop, spe) -> None:
    """`ExactTrainer`, through Keras `fit` or mdtrain's `custom_fit`, `spe` steps per call."""
    with strategy.scope():
        trainer = ExactTrainer(net, class_weights=class_weights)
        trainer.compile(optimizer=keras.optimizers.SGD(learning_rate), steps_per_execution=spe)
    if loop == "fit":
        trainer.fit(dataset, epochs=epochs, shuffle=False, verbose=0)
        return
    steps = sum(1 for _ in dataset)
    custom_fit(trainer, strategy, dataset.repeat(epochs), epochs=epochs, steps_per_epoch=steps,
               verbose=0)  # fmt: skip


def train_weights(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    *,
    epochs: int = 2,
    loss: str = "exact",
    loop: str = "fit",
    class_weights: Sequence[float] | None = None,
    global_batch_size: int | None = None,
    model: str = "tiny",
    num_classes: int = 3,
    learning_rate: float = 0.1,
    seed: int = 0,
    weights: str = "none",
    fine_tune: bool = False,
    per_replica_batch_norm: bool = False,
    dtype: str = "float32",
    steps_per_execution: int = 1,
) -> list[np.ndarray]:
    """Trains a fresh model on `dataset` with plain SGD; returns all its final weights.

    `loss` is one of `LOSSES` (module doc), `loop` one of `LOOPS` (for
    `"exact"`). `global_batch_size` is what `"naive_global_batch"` divides by
    (default: the first batch's size). `model` is `"tiny"` (no normalisation)
    or an `mdtrain.models` name built with dropout 0; `weights`, `fine_tune`
    and `per_replica_batch_norm` (Keras' own `BatchNormalization`) change it.
    `dtype` is the Keras dtype policy: float64 shows the rule itself where
    float32 rounding would be amplified (ReLU6 kinks, Adam). `steps_per_execution`
    is `ExactTrainer.compile`'s (for `"exact"`).
    """
    if loss not in LOSSES or loop not in LOOPS:
        raise ValueError(f"loss must be one of {LOSSES} and loop one of {LOOPS}")
    image_size = int(dataset.element_spec[0].shape[1])
    global_batch_size = global_batch_size or int(next(iter(dataset))[1].shape[0])
    previous = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(dtype)  # losses and metrics compute in floatx
    keras.config.set_dtype_policy(dtype)
    try:
        with strategy.scope():
            net = _build_net(
                model, image_size, num_classes, seed, weights=weights, fine_tune=fine_tune,
                per_replica_batch_norm=per_replica_batch_norm,
            )  # fmt: skip
        if loss == "naive_global_batch":
            _naive_fit(
                net, strategy, dataset, epochs, learning_rate, global_batch_size, class_weights
            )
        elif loss == "keras_fit":
            _keras_fit(net, strategy, dataset, epochs, learning_rate, class_weights)
        else:
            _exact_fit(net, strategy, dataset, epochs, learning_rate, class_weights, loop,
                       steps_per_execution)  # fmt: skip
    finally:
        keras.config.set_floatx(previous[0])
        keras.config.set_dtype_policy(previous[1])
    return net.get_weights()


def max_relative_difference(
    weights_a: Sequence, weights_b: Sequence, floor: float = 1e-12
) -> float:
    """Largest max |a - b| / max(max |b|, floor) over all tensors (0.0: identical).

    Float32 rounding gives ~1e-6, a different loss scale far more. `floor` is
    the smallest scale a tensor is measured against: a tensor that is zero in
    exact arithmetic holds only rounding noise.
    """
    if len(weights_a) != len(weights_b):
        raise ValueError(f"{len(weights_a)} tensors vs {len(weights_b)}")
    worst = 0.0
    for a, b in zip(weights_a, weights_b, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(float(np.max(np.abs(b))), floor) if b.size else 1.0
        worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)) / scale)
    return worst


def max_weight_difference(model_a: str | os.PathLike, model_b: str | os.PathLike) -> float:
    """`max_relative_difference` between two saved `.keras` models' weights."""
    a, b = (keras.saving.load_model(f, compile=False) for f in (model_a, model_b))
    return max_relative_difference(a.get_weights(), b.get_weights())


def per_replica_batch_sizes(
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset
) -> list[list[int]]:
    """How many examples each replica really receives at each step."""
    sizes = []
    for _, labels in strategy.experimental_distribute_dataset(dataset):
        local = strategy.experimental_local_results(labels)
        sizes.append([int(t.shape[0]) for t in local])
    return sizes


def side_by_side_strategies(
    replica_counts: Sequence[int] = (1, 2, 4),
) -> dict[int, tf.distribute.Strategy]:
    """`{n: strategy}` over the first n CPU devices, usable together in one process.

    1 gives `OneDeviceStrategy("/cpu:0")`. Two MirroredStrategies that share a
    device would reuse the same collective group keys and fail ("joining a
    group with size 4, but that group has size 2"); each one here gets its own
    key range, as TensorFlow's own tests do.
    """
    strategies: dict[int, tf.distribute.Strategy] = {}
    for n in replica_counts:
        if n == 1:
            strategies[n] = tf.distribute.OneDeviceStrategy("/cpu:0")
            continue
        fresh_collective_keys()
        strategies[n] = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    fresh_collective_keys()
    return strategies
