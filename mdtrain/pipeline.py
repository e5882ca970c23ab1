"""tf.data input pipelines: decode, cache, shuffle, batch, augment, prefetch.

Images stay uint8 after decoding (a quarter of float32's memory and
host-to-device traffic) and are batched by the GLOBAL batch size, the last
partial batch kept: the strategy splits each batch across replicas. Notebook 02
builds the same pipeline stage by stage in plain tf.data.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import tensorflow as tf

from mdtrain.augment import AugmentPolicy, apply_packed, augment_batch, draw_packed
from mdtrain.choices import CACHE_MODES  # the values of `cache=` and of `mdtrain train --cache`
from mdtrain.data import ImageList, Splits, cache_folder, tf_paths
from mdtrain.distribute import BatchGeometry, shard_by_batch
from mdtrain.errors import UsageError
from mdtrain.images import load_image

try:
    import fcntl
except ImportError:  # Windows: no flock; a killed run's lockfile must be removed by hand
    fcntl = None

AUTOTUNE = tf.data.AUTOTUNE


def _set_options(ds: tf.data.Dataset, deterministic: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = deterministic
    return shard_by_batch(ds.with_options(options))


def _file_names(images: ImageList) -> tf.data.Dataset:
    """`(path, label)` of each file, in file order: what the shuffles reorder."""
    return tf.data.Dataset.from_tensor_slices(
        (tf_paths(images.files), np.asarray(images.labels, np.int32))
    )


def _decode(names: tf.data.Dataset, image_size: int, deterministic: bool) -> tf.data.Dataset:
    """`(path, label)` to `(uint8 image, label)`, decoded in parallel (`load_image`)."""
    return names.map(
        lambda path, label: (load_image(path, image_size), label),
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )


def decoded_images(images: ImageList, image_size: int) -> tf.data.Dataset:
    """Unbatched `(uint8 image, int32 label)` in file order, decoded in parallel."""
    return _decode(_file_names(images), image_size, deterministic=True)


def _epoch_seed(seed: int | tf.Tensor, epoch: int | tf.Tensor) -> int | tf.Tensor:
    """A seed of (seed, epoch) only (or of a step): an int, or a tensor if either is one."""
    if isinstance(seed, int):
        return (seed * 1_000_003 + epoch) % (2**63)
    return tf.cast(seed, tf.int64) * 1_000_003 + epoch


def resolve_cache(
    cache: bool | str, num_images: int, image_size: int, cache_dir=None, available=None
) -> str:
    """The cache mode `InputData` uses, `"memory"`, `"disk"` or `"none"`; `available` in bytes."""
    if cache is True or cache is False:
        return "memory" if cache else "none"
    if cache not in CACHE_MODES:
        raise UsageError(f"--cache {cache!r}: expected one of {', '.join(CACHE_MODES)}")
    if cache != "auto":
        return cache
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    decoded_bytes = num_images * image_size * image_size * 3  # uint8 RGB
    # A quarter of the memory available now at most: the model, the optimizer and
    # the batches need the rest.
    if decoded_bytes <= 0.25 * available:
        return "memory"
    return "disk" if cache_dir is not None else "none"


@dataclass
class InputData:
    """Everything training needs to know about its input.

    `train_epochs` gives the training batches; `val_ds` is the validation batches, or None.

    Args:
        splits: training and validation images (`mdtrain.load_splits`).
        image_size: side of the square images the model sees.
        global_batch_size: images per step over all replicas.
        seed: seed of the shuffle and the augmentation: an int, or a scalar
            int64 tensor computed where the dataset is built (each
            parameter-server worker draws its own; not with a disk cache,
            whose files are named by the seed). Defaults to 0.
        shuffle: shuffle the training images every epoch. Defaults to True.
        augment: the `AugmentPolicy`, or None for none. Defaults to `AugmentPolicy()`.
        augment_in: `"pipeline"`: the batches come augmented, for any Keras model;
            `"model"`: as `(images, labels, transforms)`, each image's transform
            for the training step to apply on its replica's device, to the same
            pixels (`ExactTrainer(augment=policy)`; `mdtrain train`'s default).
            Defaults to `"pipeline"`.
        cache: where the decoded images are kept: `"memory"`, `"disk"`,
            `"none"` or `"auto"` (data/README.md, "Caching"). Defaults to `"auto"`.
        deterministic: keep the exact order even when parallel decoding
            finishes out of order. Defaults to False.
        cache_dir: folder of a disk cache; None: mdtrain's cache folder. Defaults to None.
        cache_task: this process's task in a multi-worker cluster
            (`"worker-1"`), so that each fills a disk cache of its own; None
            outside one. Defaults to None.

    Example:

    >>> data = InputData(load_splits("data/demo"), 64, 32, cache="none")  # doctest: +SKIP
    >>> data.cache_mode, data.steps_per_epoch  # doctest: +SKIP
    """

    splits: Splits
    image_size: int
    global_batch_size: int
    seed: int | tf.Tensor = 0
    shuffle: bool = True
    augment: AugmentPolicy | None = field(default_factory=AugmentPolicy)
    augment_in: str = "pipeline"
    cache: bool | str = "auto"
    deterministic: bool = False
    cache_dir: str | os.PathLike | None = None
    cache_task: str | None = None

    def __post_init__(self) -> None:
        if self.augment_in not in ("pipeline", "model"):
            raise ValueError(
                f"augment_in {self.augment_in!r}: expected one of ('pipeline', 'model')"
            )
        self.cache_mode = resolve_cache(
            self.cache, self.num_train + self.num_val, self.image_size, self.cache_dir
        )
        # Epoch 0's order: a shuffle of the names, never of decoded images, so the first
        # batch waits for its own decodes only.
        self._first_order = self._shuffled(_file_names(self.splits.train), 0, self.num_train)
        self._train_cached = None
        if self.cache_mode != "none":
            # Decoded in epoch 0's order, deterministically, so epochs depend on (seed, epoch) only.
            ds = _decode(self._first_order, self.image_size, deterministic=True)
            self._train_cached = ds.cache(self._cache_file(self.splits.train, "train"))
        self.val_ds, self._val_source = None, None
        if self.num_val:
            self._val_source = _file_names(self.splits.val)  # decoded and cached with a cache
            if self.cache_mode != "none":
                val = _decode(self._val_source, self.image_size, self.deterministic)
                self._val_source = val.cache(self._cache_file(self.splits.val, "val"))
            self.val_ds = self._val_batches()

    def _cache_file(self, images: ImageList, split: str) -> str:
        """The argument of `Dataset.cache`: "" (memory), or a disk prefix this process fills."""
        if self.cache_mode == "memory":
            return ""
        # Named by what it holds: a changed file is never served stale (data/README.md, "Caching").
        order = [self.seed, self.shuffle] if split == "train" else None
        h = hashlib.sha256(json.dumps([self.image_size, order]).encode())
        for f in images.files:
            st = os.stat(f)
            h.update(os.fsencode(f) + f"\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        folder = self.cache_dir if self.cache_dir is not None else cache_folder() / "decoded"
        where = Path(folder) / f"mdtrain-{h.hexdigest()[:16]}"
        where.mkdir(parents=True, exist_ok=True)
        task = self.cache_task
        prefix = str(where / (split if task is None else f"{split}-{task}"))
        _claim(prefix)
        return prefix

    def _shuffled(self, ds: tf.data.Dataset, epoch: int, buffer: int) -> tf.data.Dataset:
        if not self.shuffle:
            return ds
        return ds.shuffle(
            buffer, seed=_epoch_seed(self.seed, epoch), reshuffle_each_iteration=False
        )

    @property
    def class_names(self) -> list[str]:
        return self.splits.class_names

    @property
    def num_train(self) -> int:
        return len(self.splits.train)

    @property
    def num_val(self) -> int:
        return len(self.splits.val) if self.splits.val is not None else 0

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_train / self.global_batch_size)

    def epoch_batches(self, epoch: int, context=None) -> tf.data.Dataset:
        """The training batches of one epoch; their order depends only on (seed, epoch).

        How each epoch is ordered: data/README.md, "Caching".

        Args:
            epoch: the epoch's number, from 0.
            context: a `tf.distribute.InputContext`, for the per-replica
                batches of its worker's replicas. Defaults to None.

        Returns:
            A dataset of `(images, labels)` batches, or of `(images, labels,
            transforms)` with `augment_in="model"`.
        """
        cached = self._train_cached is not None
        ds = self._train_cached if cached else self._first_order
        if epoch > 0:  # epoch 0's order shuffled again, by a seed of this epoch's
            buffer = 1024 if self.cache_mode == "disk" else self.num_train
            ds = self._shuffled(ds, epoch, buffer)
        return self._batches(ds, self.num_train, cached, epoch, context)

    def _augmented(self, batches: tf.data.Dataset, epoch: int) -> tf.data.Dataset:
        """Each batch augmented, or its transforms drawn for the model, from (seed, epoch, step)."""
        policy, seed, in_model = self.augment, self.seed, self.augment_in == "model"

        def augment(step, batch):
            images, labels = batch
            step_seed = tf.stack([tf.cast(seed, tf.int64), _epoch_seed(step, epoch)])
            if not in_model:
                return augment_batch(images, policy, step_seed), labels
            # Drawn and composed here, applied by each replica to its slice.
            return images, labels, draw_packed(images, policy, step_seed)

        return batches.enumerate().map(augment, num_parallel_calls=AUTOTUNE)

    def _batches(self, records, count: int, decoded: bool, epoch: int | None, context):
        """An epoch's global batches, or with `context` its worker's per-replica batches."""
        batch, augment = self.global_batch_size, (self.augment if epoch is not None else None)
        if context is None:
            ds = records if decoded else _decode(records, self.image_size, self.deterministic)
            ds = ds.batch(batch)
            return ds if augment is None else self._augmented(ds, epoch)
        total, side = context.num_replicas_in_sync, self.image_size
        local = _local(context)
        first = context.input_pipeline_id * local

        def part(step, records):  # the worker's part of a batch; each record's step and place
            size = tf.shape(records[-1], out_type=tf.int64)[0]
            per = (size + total - 1) // total
            lo, hi = tf.minimum(first * per, size), tf.minimum((first + local) * per, size)
            tags = (tf.fill([hi - lo], step), tf.range(lo, hi), tf.fill([hi - lo], size))
            return (*tags, *(x[lo:hi] for x in records))

        def decode(step, at, size, path, label):
            return step, at, size, load_image(path, self.image_size), label

        ours = records.batch(batch).enumerate().map(part)
        if not decoded:  # image by image, in parallel, in order: the slices are cut by count
            ours = ours.unbatch().map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
            ours = ours.batch(1)
        geometry = BatchGeometry(count, batch, total)
        slices = geometry.split(batch)[first : first + local] * (geometry.steps - 1)
        slices += geometry.split(geometry.last_batch_size)[first : first + local]

        def finish(steps, places, sizes, images, labels):
            if augment is None:
                return images, labels
            # The step's transforms (draw_packed reads the shape only), each image its row.
            step, size = (tf.concat([v, [0]], 0)[0] for v in (steps, sizes))  # empty: 0, 0
            seed = tf.stack([tf.cast(self.seed, tf.int64), _epoch_seed(step, epoch)])
            drawn = draw_packed(tf.zeros([size, side, side, 0], tf.uint8), augment, seed)
            packed = tf.gather(drawn, places)
            if self.augment_in == "model":
                return images, labels, packed
            return apply_packed(images, augment, packed), labels

        return ours.rebatch(slices).map(finish, num_parallel_calls=AUTOTUNE)

    def train_epochs(
        self, first_epoch: int = 0, last_epoch: int = 1, skip_steps: int = 0, context=None
    ) -> tf.data.Dataset:
        """Training batches of epochs `first_epoch`…`last_epoch - 1` back to back, prefetched.

        Args:
            first_epoch: the first epoch's number. Defaults to 0.
            last_epoch: one past the last epoch's number. Defaults to 1.
            skip_steps: steps of the first epoch to leave out (a run resumed
                part-way); the later steps keep their augmentation. Defaults to 0.
            context: a `tf.distribute.InputContext`, for the per-replica batches
                of its worker's replicas (`for_strategy`). Defaults to None.

        Returns:
            The batches (see `epoch_batches`), prefetched.
        """
        ds = self.epoch_batches(first_epoch, context)
        for epoch in range(first_epoch + 1, last_epoch):
            ds = ds.concatenate(self.epoch_batches(epoch, context))
        if skip_steps:  # each step is one element per local replica
            ds = ds.skip(skip_steps * (1 if context is None else _local(context)))
        return _set_options(ds.prefetch(AUTOTUNE), self.deterministic)

    def _val_batches(self, context=None) -> tf.data.Dataset | None:
        """The validation batches (`val_ds`), or with `context` its worker's per-replica ones."""
        if self._val_source is None:
            return None
        decoded = self.cache_mode != "none"
        ds = self._batches(self._val_source, self.num_val, decoded, None, context)
        return _set_options(ds.prefetch(AUTOTUNE), self.deterministic)

    def for_strategy(
        self, strategy, first_epoch: int, last_epoch: int, skip_steps: int = 0, watch=None
    ):
        """`(train, val)` as `custom_fit` takes them under `strategy`; see `train_epochs`.

        Under `MultiWorkerMirroredStrategy` each worker decodes and augments only its
        replicas' slices of each global batch, as one process would (docs/multi-worker.md).

        Args:
            strategy: the run's `tf.distribute.Strategy`.
            first_epoch, last_epoch, skip_steps: as in `train_epochs`.
            watch: `MonitorCallback.watch`, to stamp the training batches (each
                worker's, under several workers). Defaults to None: not stamped.

        Returns:
            `(train, val)`: distributed datasets under several workers, else the
            global batches; `val` None without validation images.
        """
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            train = self.train_epochs(first_epoch, last_epoch, skip_steps)
            return (watch(train) if watch else train), self.val_ds

        def worker_batches(context):  # one element per local replica and step
            batches = self.train_epochs(first_epoch, last_epoch, skip_steps, context)
            return watch(batches, _local(context)) if watch else batches

        train = strategy.distribute_datasets_from_function(worker_batches)
        if self.val_ds is None:
            return train, None
        return train, strategy.distribute_datasets_from_function(self._val_batches)


def _local(context) -> int:
    """The replicas of the worker of `context` (a `tf.distribute.InputContext`)."""
    return context.num_replicas_in_sync // context.num_input_pipelines


#: The disk caches this process fills, each with its lock, held until the process exits.
_CLAIMED: dict[str, TextIO] = {}


def _claim(prefix: str) -> None:
    """Makes this process the one that fills the disk cache `prefix`, unless it is complete."""
    # TensorFlow refuses to fill a cache while a killed filler's `_0.lockfile` exists; an OS
    # lock (`flock`), dropped when its holder dies, tells a live filler from a dead one.
    if fcntl is None or prefix in _CLAIMED or os.path.exists(prefix + ".index"):
        return
    lock = open(prefix + ".mdtrain-lock", "a")  # noqa: SIM115  (held until the process exits)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise UsageError(
            f"--cache disk: another process is filling the cache {Path(prefix).parent} now; "
            "wait until its first epoch ends, or use --cache memory or none"
        ) from None
    _CLAIMED[prefix] = lock
    for leftover in glob.glob(glob.escape(prefix) + "_*"):  # a killed filler's
        os.remove(leftover)
