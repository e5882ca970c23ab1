"""Class imbalance under a distribution strategy: subsets, per-replica counts, remedies.

Under `MirroredStrategy` (and `MultiWorkerMirroredStrategy`) every global
batch is cut into contiguous slices, one per replica. Nothing in that split
looks at labels: with a rare class, most replicas' slices hold none of it on
most steps. Two remedies keep the rare classes in the gradient:

- class weights: every example's loss is multiplied by `n / (k × n_c)`
  (`balanced_class_weights`); the data stay as they are;
- balanced resampling (`balanced_dataset`): each class gets its own endless,
  shuffled stream, and the streams are drawn round-robin, so every run of
  `k` consecutive examples holds one of each class. Since the strategy cuts
  each global batch into contiguous slices, every replica's slice is balanced
  too, on every step (to within one example per class when the slice is not
  a multiple of `k`).

Splitting the data per GPU yourself, as some recipes do with scikit-learn's
`train_test_split(x, y, test_size=0, stratify=y)`, does neither: a test size
of 0 either raises or returns the data unchanged (only shuffled), and the
strategy shards and splits batches on its own anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from mdtrain.augment import AugmentPolicy, augment_batch
from mdtrain.data import ImageList, Splits
from mdtrain.distribute import shard_by_batch, split_batch
from mdtrain.errors import UsageError
from mdtrain.pipeline import AUTOTUNE, InputData, decoded_images, epoch_seed

__all__ = [
    "balanced_class_weights",
    "balanced_dataset",
    "class_weights_for",
    "make_imbalanced_subset",
    "per_class_recall",
    "replica_class_counts",
    "replica_slices",
    "compare_remedies",
]

REMEDIES = ("no remedy", "class weights", "balanced resampling")


def balanced_class_weights(counts: Sequence[int]) -> list[float]:
    """`n / (k × n_c)` per class: every class contributes equally to the loss.

    Example:

    >>> balanced_class_weights([30, 10])
    [0.6666666666666666, 2.0]
    """
    total, k = sum(counts), len(counts)
    return [total / (k * c) if c else 0.0 for c in counts]


def class_weights_for(mode: str, counts: Sequence[int]) -> list[float] | None:
    """The class weights `--class-weight MODE` gives: balanced for `auto`, None for `none`."""
    return balanced_class_weights(counts) if mode == "auto" else None


def make_imbalanced_subset(
    data: ImageList | Splits, counts: Sequence[int], seed: int = 0
) -> ImageList | Splits:
    """Picks `counts[c]` images of class `c` at random: an imbalanced view of a dataset.

    Files are chosen, not copied. Given `Splits`, only the training images
    are subsampled; the validation images (and class names) stay as they are,
    so models are still judged on balanced data.

    Args:
        data: an `ImageList`, or `Splits` whose `train` is subsampled.
        counts: images to keep per class, indexed by label.
        seed: seed of the random choice. Defaults to 0.

    Returns:
        The same kind of object as `data`, with files in their original order.

    Raises:
        UsageError: if a class has fewer images than asked for, or `counts`
            has the wrong length.

    Example:

    >>> subset = make_imbalanced_subset(splits, [300, 150, 60, 30, 15])  # doctest: +SKIP
    >>> subset.train.counts(5)
    [300, 150, 60, 30, 15]
    """
    if isinstance(data, Splits):
        if len(counts) != len(data.class_names):
            raise UsageError(
                f"counts {list(counts)}: need one count per class ({len(data.class_names)})"
            )
        train = make_imbalanced_subset(data.train, counts, seed)
        return Splits(train, data.val, data.class_names, data.skipped)
    labels = np.asarray(data.labels)
    have = np.bincount(labels, minlength=len(counts)) if len(labels) else np.zeros(len(counts))
    if len(have) > len(counts):
        raise UsageError(f"counts {list(counts)}: the data have {len(have)} classes")
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for label, n in enumerate(counts):
        if not 0 <= n <= have[label]:
            raise UsageError(
                f"counts {list(counts)}: class {label} has {int(have[label])} images, "
                f"cannot take {n}"
            )
        keep += rng.choice(np.flatnonzero(labels == label), size=n, replace=False).tolist()
    keep.sort()
    return ImageList([data.files[i] for i in keep], [int(labels[i]) for i in keep])


def replica_slices(labels: np.ndarray, num_replicas: int) -> list[np.ndarray]:
    """Cuts one global batch of labels into the slices the replicas get.

    Same rule as `tf.distribute` (and `BatchGeometry.split`): contiguous
    slices of `ceil(batch / replicas)`, the last ones shorter or empty.
    """
    ends = np.cumsum([0, *split_batch(len(labels), num_replicas)])
    return [labels[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]


def replica_class_counts(
    dataset: tf.data.Dataset,
    strategy: tf.distribute.Strategy,
    num_classes: int,
    steps: int | None = None,
) -> np.ndarray:
    """Counts the examples of each class that land on each replica, step by step.

    Distributes `dataset` with the strategy exactly as training does and
    reads every replica's labels back.

    Args:
        dataset: globally batched `(images, labels)` dataset.
        strategy: the strategy that splits the batches.
        num_classes: number of classes.
        steps: steps to read; needed for an endless dataset. Defaults to
            None (the whole dataset).

    Returns:
        int array of shape `(steps, num_replicas, num_classes)`.

    Example:

    >>> counts = replica_class_counts(inputs.epoch_batches(0), strategy, 5)  # doctest: +SKIP
    >>> counts.sum(axis=(0, 1))  # images per class in one epoch
    """
    labels_only = dataset.map(lambda images, labels: labels)  # same batches, no pixels
    dist = strategy.experimental_distribute_dataset(labels_only)
    out = []
    for step, labels in enumerate(dist):
        if steps is not None and step >= steps:
            break
        per_replica = strategy.experimental_local_results(labels)
        out.append([np.bincount(np.asarray(x), minlength=num_classes) for x in per_replica])
    return np.asarray(out, dtype=np.int64).reshape(-1, strategy.num_replicas_in_sync, num_classes)


def balanced_dataset(
    images: ImageList,
    num_classes: int,
    image_size: int,
    global_batch_size: int,
    *,
    seed: int = 0,
    augment: AugmentPolicy | None = None,
    mode: str = "round-robin",
    cache: bool = True,
) -> tf.data.Dataset:
    """An endless, class-balanced training stream, batched by the GLOBAL batch size.

    Each class becomes its own dataset (decoded, cached, reshuffled every
    pass, repeated forever), so rare classes are seen again and again and
    common ones are subsampled. The class of each example is chosen:

    - `"round-robin"`: classes in turn, 0, 1, …, k-1, 0, 1, …: any `k`
      consecutive examples hold each class once, so every replica's
      contiguous slice of every global batch is balanced;
    - `"random"`: uniformly at random (`Dataset.sample_from_datasets`):
      balanced on average only; a slice can still miss a class.

    The dataset never ends: pass `steps_per_epoch` to `fit`.

    Args:
        images: training files and labels.
        num_classes: number of classes; each must have at least one image.
        image_size: side of the square images.
        global_batch_size: examples per step over all replicas.
        seed: seed of shuffling, sampling and augmentation. Defaults to 0.
        augment: augmentation applied per batch, or None. Defaults to None.
        mode: `"round-robin"` or `"random"`. Defaults to `"round-robin"`.
        cache: keep decoded images in memory. Defaults to True.

    Returns:
        A dataset of `(uint8 images, int32 labels)` batches.

    Raises:
        UsageError: for an empty class or an unknown mode.

    Example:

    >>> train_ds = balanced_dataset(subset, 5, 64, global_batch_size=64)  # doctest: +SKIP
    >>> trainer.fit(train_ds, steps_per_epoch=10, epochs=5)
    """
    if mode not in ("round-robin", "random"):
        raise UsageError(f"mode {mode!r}: choose 'round-robin' or 'random'")
    counts = images.counts(num_classes)
    if min(counts) == 0:
        raise UsageError(f"class counts {counts}: every class needs at least one image")
    streams = _class_streams(images, num_classes, image_size, seed, cache)
    if mode == "round-robin":
        ds = tf.data.Dataset.choose_from_datasets(
            streams, tf.data.Dataset.range(num_classes).repeat()
        )
    else:
        ds = tf.data.Dataset.sample_from_datasets(
            streams, weights=[1.0 / num_classes] * num_classes, seed=seed
        )
    ds = ds.batch(global_batch_size)
    if augment is not None:

        def _augment(step, batch):
            x, y = batch
            return augment_batch(x, augment, tf.stack([tf.constant(seed, tf.int64), step])), y

        ds = ds.enumerate().map(_augment, num_parallel_calls=AUTOTUNE)
    return shard_by_batch(ds).prefetch(AUTOTUNE)


def _class_streams(
    images: ImageList, num_classes: int, image_size: int, seed: int, cache: bool
) -> list[tf.data.Dataset]:
    """One endless stream of decoded images per class, reshuffled every pass."""
    labels = np.asarray(images.labels)
    streams = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        one_class = ImageList([images.files[i] for i in idx], [c] * len(idx))
        ds = decoded_images(one_class, image_size, cache=cache)
        ds = ds.shuffle(len(idx), seed=epoch_seed(seed, c), reshuffle_each_iteration=True)
        streams.append(ds.repeat())
    return streams


def per_class_recall(model, dataset: tf.data.Dataset, num_classes: int) -> np.ndarray:
    """Share of each class's examples that `model` classifies correctly.

    Args:
        model: images in, class probabilities out.
        dataset: finite `(images, labels)` dataset, batched.
        num_classes: number of classes.

    Returns:
        float array of shape `(num_classes,)`; NaN for a class absent from `dataset`.
    """
    true, pred = [], []
    for x, y in dataset:
        true.append(y.numpy())
        pred.append(np.argmax(model(x, training=False), axis=-1))
    true, pred = np.concatenate(true), np.concatenate(pred)
    hits = np.bincount(true[true == pred], minlength=num_classes)
    totals = np.bincount(true, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, hits / np.maximum(totals, 1), math.nan)


def fit_and_score(
    strategy: tf.distribute.Strategy,
    train_ds: tf.data.Dataset,
    val_ds: tf.data.Dataset,
    *,
    num_classes: int,
    image_size: int,
    epochs: int,
    steps_per_epoch: int,
    class_weights: Sequence[float] | None = None,
    model: str = "small-cnn",
    learning_rate: float = 1e-3,
    seed: int = 0,
    verbose: int = 0,
) -> tuple[np.ndarray, dict[str, list[float]]]:
    """Trains a fresh model with `ExactTrainer` and measures its per-class recall.

    The same seed gives every variant the same initial weights, so variants
    differ only by their data or loss.

    Args:
        strategy: the strategy to train under.
        train_ds: globally batched training data (may be endless).
        val_ds: finite, globally batched data to score on.
        num_classes: number of classes.
        image_size: side of the square images.
        epochs: epochs to train.
        steps_per_epoch: steps per epoch.
        class_weights: loss weight per class, or None. Defaults to None.
        model: model name for `build_model`. Defaults to `"small-cnn"`.
        learning_rate: Adam's learning rate. Defaults to 1e-3.
        seed: seed of the initial weights. Defaults to 0.
        verbose: Keras' verbosity. Defaults to 0.

    Returns:
        `(recall per class on val_ds, training history dict)`.
    """
    import keras

    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    keras.utils.set_random_seed(seed)
    with strategy.scope():
        net = build_model(model, num_classes, image_size)
        trainer = ExactTrainer(net, class_weights=class_weights)
        trainer.build((None, image_size, image_size, 3))
        trainer.compile(optimizer=keras.optimizers.Adam(learning_rate))
    # No validation inside fit: recall is measured once at the end, which saves
    # tracing a distributed test step for every variant.
    history = trainer.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch, shuffle=False,
                          verbose=verbose)  # fmt: skip
    return per_class_recall(net, val_ds, num_classes), history.history


def compare_remedies(
    strategy: tf.distribute.Strategy,
    splits: Splits,
    *,
    image_size: int,
    global_batch_size: int,
    epochs: int,
    seeds: Sequence[int] = (0, 1, 2),
    augment: AugmentPolicy | None = None,
    learning_rate: float = 1e-3,
) -> dict[str, np.ndarray]:
    """Per-class validation recall of each remedy (`REMEDIES`), trained once per seed.

    For each seed, the three variants start from the same initial weights
    and see the same shuffling and augmentation: the plain shuffled data,
    the same data with balanced class weights, and the round-robin balanced
    stream. Each trains `epochs` × (steps of one epoch of the plain data).

    Args:
        strategy: the strategy to train under.
        splits: imbalanced training images, balanced validation images.
        image_size: side of the square images.
        global_batch_size: examples per step over all replicas.
        epochs: epochs to train each variant.
        seeds: one run of every variant per seed. Defaults to (0, 1, 2).
        augment: augmentation of the training data. Defaults to None.
        learning_rate: Adam's learning rate. Defaults to 1e-3.

    Returns:
        `{remedy: recall}`, each an array of shape `(len(seeds), num_classes)`.
    """
    num_classes = len(splits.class_names)
    weights = balanced_class_weights(splits.train.counts(num_classes))
    recalls: dict[str, list] = {name: [] for name in REMEDIES}
    for seed in seeds:
        inputs = InputData(splits, image_size, global_batch_size, seed=seed, augment=augment)
        balanced = balanced_dataset(splits.train, num_classes, image_size, global_batch_size,
                                    seed=seed, augment=augment)  # fmt: skip
        variants = {
            "no remedy": (inputs.train_epochs(0, epochs), None),
            "class weights": (inputs.train_epochs(0, epochs), weights),
            "balanced resampling": (balanced, None),
        }
        for name, (train_ds, class_weights) in variants.items():
            recall, _ = fit_and_score(
                strategy, train_ds, inputs.val_ds, num_classes=num_classes,
                image_size=image_size, epochs=epochs, steps_per_epoch=inputs.steps_per_epoch,
                class_weights=class_weights, learning_rate=learning_rate, seed=seed,
            )  # fmt: skip
            recalls[name].append(recall)
    return {name: np.asarray(values) for name, values in recalls.items()}
