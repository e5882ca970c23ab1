"""Does N-replica training give the same weights as 1 replica? A small, exact experiment.

The same fixed, globally batched data (uint8 images, int labels, no shuffle,
no augmentation) trains the same small model from the same initial weights
under different strategies and loss-scaling rules; the final weights are then
compared. Three rules:

- `"exact"`: `mdtrain.loop.ExactTrainer` (each replica divides its summed
  loss by the all-reduced global example count), with `fit` or `custom_fit`;
- `"keras_fit"`: plain `model.compile(loss=...)` + `model.fit`; Keras 3
  scales each replica's *mean* loss by 1/num_replicas_in_sync, wrong when a
  partial batch splits unevenly (and Keras may fail outright on it);
- `"naive_global_batch"`: a custom loop using
  `tf.nn.compute_average_loss(..., global_batch_size=GLOBAL)`, which divides
  a partial batch by the full global batch size.

Used by notebook 03 and `tests/test_numerics.py`. Virtual CPU replicas must
be configured (`configure_devices("cpu:4")`) before TensorFlow starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from mdtrain.compat import fresh_collective_keys
from mdtrain.distribute import shard_by_batch
from mdtrain.errors import UsageError
from mdtrain.loop import ExactTrainer, custom_fit
from mdtrain.models import build_model, unfreeze_top
from mdtrain.norm import swap_batch_norm

LOSSES = ("exact", "keras_fit", "naive_global_batch")
LOOPS = ("fit", "custom")


def fixed_dataset(
    num_examples: int,
    global_batch_size: int,
    image_size: int = 16,
    num_classes: int = 3,
    seed: int = 0,
) -> tf.data.Dataset:
    """Random uint8 images with labels, batched by the global batch, in a fixed order.

    Args:
        num_examples: examples in the epoch (the last batch may be partial).
        global_batch_size: examples per step over all replicas.
        image_size: side of the square images. Defaults to 16.
        num_classes: number of classes. Defaults to 3.
        seed: numpy seed of images and labels. Defaults to 0.

    Returns:
        A dataset of `(uint8 [B, S, S, 3], int32 [B])` batches; one epoch.
    """
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (num_examples, image_size, image_size, 3), dtype=np.uint8)
    labels = rng.integers(0, num_classes, num_examples).astype(np.int32)
    return shard_by_batch(
        tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch_size)
    )


def _dataset_shape(dataset: tf.data.Dataset) -> tuple[int, int, int]:
    """(image size, batches, examples) of a finite batched dataset."""
    sizes = [int(labels.shape[0]) for _, labels in dataset]
    return int(dataset.element_spec[0].shape[1]), len(sizes), sum(sizes)


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
) -> list[np.ndarray]:
    """Trains a fresh small model on `dataset` and returns its final weights.

    Plain SGD, no shuffling, no augmentation: the only difference between two
    runs is the strategy and the loss-scaling rule.

    Args:
        strategy: where to train, e.g. `OneDeviceStrategy("/cpu:0")` or
            `MirroredStrategy(["/cpu:0", "/cpu:1"])`.
        dataset: one epoch of global batches (`fixed_dataset`).
        epochs: passes over `dataset`. Defaults to 2.
        loss: `"exact"`, `"keras_fit"` or `"naive_global_batch"` (module doc).
            Defaults to `"exact"`.
        loop: for `"exact"`, `"fit"` (Keras `fit`) or `"custom"`
            (`mdtrain.loop.custom_fit`). Defaults to `"fit"`.
        class_weights: optional loss weight per class. Defaults to None.
        global_batch_size: the configured global batch, which
            `"naive_global_batch"` divides by. Defaults to the first batch's size.
        model: `"tiny"` (two convolutions, no normalisation: fast to trace) or
            an `mdtrain.models` name such as `"small-cnn"` (built with dropout
            0). Defaults to `"tiny"`.
        num_classes: classes of the model's output. Defaults to 3.
        learning_rate: SGD step size. Defaults to 0.1.
        seed: initial weights. Defaults to 0.
        weights: initial weights of a pretrained model (`"imagenet"`), or
            `"none"`. Defaults to `"none"`.
        fine_tune: unfreeze the top of a pretrained base (`unfreeze_top`)
            before training. Defaults to False.
        per_replica_batch_norm: use Keras' `BatchNormalization` (statistics
            of each replica's slice) instead of mdtrain's exact layer, to see
            what it changes. Defaults to False.
        dtype: `"float32"` or `"float64"`, the Keras dtype policy the model is
            built and trained under. In float32 a deep network trained from
            scratch amplifies rounding: a ReLU6 input of 1e-8 lands on either
            side of the kink depending on summation order, even on one device
            with a batch's examples reordered; float64 shows the rule itself.
            Defaults to `"float32"`.

    Returns:
        All the model's weights (trainable, and batch-norm statistics if any), as numpy.

    Raises:
        ValueError: unknown `loss` or `loop`.
        Exception: whatever Keras raises (e.g. `keras_fit` on an uneven first batch).
    """
    if loss not in LOSSES or loop not in LOOPS:
        raise ValueError(f"loss must be one of {LOSSES} and loop one of {LOOPS}")
    image_size, steps, _ = _dataset_shape(dataset)
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
            _exact_fit(net, strategy, dataset, epochs, learning_rate, class_weights, loop, steps)
    finally:
        keras.config.set_floatx(previous[0])
        keras.config.set_dtype_policy(previous[1])
    return net.get_weights()


def _keras_fit(net, strategy, dataset, epochs, learning_rate, class_weights) -> None:
    """Keras' own rule: `compile(loss=...)` and `fit`."""
    with strategy.scope():
        net.compile(
            optimizer=keras.optimizers.SGD(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(),
        )
    weights = None if class_weights is None else dict(enumerate(class_weights))
    net.fit(dataset, epochs=epochs, shuffle=False, verbose=0, class_weight=weights)


def _exact_fit(net, strategy, dataset, epochs, learning_rate, class_weights, loop, steps) -> None:
    """`ExactTrainer`, through Keras `fit` or mdtrain's `custom_fit`."""
    with strategy.scope():
        trainer = ExactTrainer(net, class_weights=class_weights)
        trainer.compile(optimizer=keras.optimizers.SGD(learning_rate))
    if loop == "fit":
        trainer.fit(dataset, epochs=epochs, shuffle=False, verbose=0)
    else:
        custom_fit(
            trainer,
            strategy,
            dataset.repeat(epochs),
            epochs=epochs,
            steps_per_epoch=steps,
            verbose=0,
        )


def max_relative_difference(
    weights_a: Sequence, weights_b: Sequence, floor: float = 1e-12
) -> float:
    """Largest difference between two sets of weights, relative to each tensor's scale.

    For each tensor: max |a - b| / max(max |b|, floor); the result is the
    largest over all tensors. Float32 rounding gives ~1e-6; a different loss
    scale gives far more.

    Args:
        weights_a: list of arrays (`model.get_weights()`).
        weights_b: the reference, same shapes.
        floor: the smallest scale a tensor is measured against. A tensor that
            is zero in exact arithmetic (a BatchNorm shift that the next
            BatchNorm cancels) holds only rounding noise, which differs
            between any two runs by about its own size. Defaults to 1e-12.

    Returns:
        The largest relative difference (0.0 for identical weights).
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
    """`max_relative_difference` between two saved models' weights (0.0: identical).

    Args:
        model_a: a `.keras` file, e.g. `runs/a/model.keras`.
        model_b: the reference `.keras` file, with the same architecture.

    Returns:
        The largest relative difference over all weight tensors.

    Raises:
        UsageError: if the files hold different models.

    Example:
        >>> max_weight_difference("runs/a/model.keras", "runs/b/model.keras")  # doctest: +SKIP
        0.0
    """
    a, b = (keras.saving.load_model(f, compile=False) for f in (model_a, model_b))
    shapes = [[w.shape for w in m.get_weights()] for m in (a, b)]
    if shapes[0] != shapes[1] or not shapes[0]:
        raise UsageError(f"{model_a} and {model_b} hold different models")
    return max_relative_difference(a.get_weights(), b.get_weights())


@dataclass
class Comparison:
    """One run compared with the 1-replica reference."""

    replicas: int
    loss: str
    loop: str
    difference: float | None  # None when training failed
    error: str | None = None

    def __str__(self) -> str:
        what = f"{self.replicas} replica(s), loss={self.loss:<18} loop={self.loop:<6}"
        if self.error is not None:
            return f"{what} FAILED: {self.error}"
        return f"{what} max relative weight difference {self.difference:.1e}"


def compare_with_reference(
    strategies: Mapping[str, tf.distribute.Strategy] | Sequence[tf.distribute.Strategy],
    dataset: tf.data.Dataset,
    runs: Sequence[tuple[str, str]] = (("exact", "fit"), ("exact", "custom")),
    reference: tf.distribute.Strategy | None = None,
    **train_kwargs,
) -> list[Comparison]:
    """Trains with every strategy and (loss, loop) pair; compares with 1-replica exact `fit`.

    Failures (e.g. Keras' own `fit` on an uneven first batch) are caught and
    reported in the result, not raised.

    Args:
        strategies: the strategies to try (a dict's keys are ignored).
        dataset: one epoch of global batches (`fixed_dataset`).
        runs: (loss, loop) pairs. Defaults to exact with `fit` and `custom`.
        reference: the 1-replica strategy. Defaults to `OneDeviceStrategy("/cpu:0")`.
        **train_kwargs: passed to `train_weights` (epochs, class_weights, ...).

    Returns:
        One `Comparison` per (strategy, run).
    """
    if isinstance(strategies, Mapping):
        strategies = list(strategies.values())
    reference = reference or tf.distribute.OneDeviceStrategy("/cpu:0")
    expected = train_weights(reference, dataset, **train_kwargs)
    results = []
    for strategy in strategies:
        for loss, loop in runs:
            n = strategy.num_replicas_in_sync
            try:
                got = train_weights(strategy, dataset, loss=loss, loop=loop, **train_kwargs)
            except Exception as error:  # noqa: BLE001  (a failing baseline is a result)
                message = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
                results.append(Comparison(n, loss, loop, None, message))
                continue
            results.append(Comparison(n, loss, loop, max_relative_difference(got, expected)))
    return results


def per_replica_batch_sizes(
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset
) -> list[list[int]]:
    """How many examples each replica really receives at each step.

    Iterates `strategy.experimental_distribute_dataset(dataset)` and reads the
    shape of each replica's slice of the labels.

    Args:
        strategy: the strategy.
        dataset: a dataset of globally batched `(images, labels)`.

    Returns:
        One list per step, one size per replica.
    """
    sizes = []
    for _, labels in strategy.experimental_distribute_dataset(dataset):
        local = strategy.experimental_local_results(labels)
        sizes.append([int(t.shape[0]) for t in local])
    return sizes


def side_by_side_strategies(
    replica_counts: Sequence[int] = (1, 2, 4),
) -> dict[int, tf.distribute.Strategy]:
    """Strategies over the first N CPU devices, usable together in one process.

    `1` gives `OneDeviceStrategy("/cpu:0")`; N > 1 a `MirroredStrategy` over
    `/cpu:0` ... `/cpu:N-1` (call `configure_devices("cpu:4")` first). Two
    MirroredStrategies that share a device would reuse the same collective
    group keys and fail ("joining a group with size 4, but that group has
    size 2"); each one here gets its own key range, as TensorFlow's own tests
    do.

    Args:
        replica_counts: replicas of each strategy. Defaults to (1, 2, 4).

    Returns:
        `{num_replicas: strategy}`.
    """
    strategies: dict[int, tf.distribute.Strategy] = {}
    for n in replica_counts:
        if n == 1:
            strategies[n] = tf.distribute.OneDeviceStrategy("/cpu:0")
            continue
        fresh_collective_keys()
        strategies[n] = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    fresh_collective_keys()  # strategies made later (make_strategy, train) get their own too
    return strategies
