"""tf.data input pipelines: decode, cache, shuffle, batch, augment, prefetch.

The training pipeline, stage by stage and why:

1. file names and labels, shuffled by a seed that depends on the *epoch
   number* (so a resumed run sees the same order as an uninterrupted one);
2. read, decode (by content; large JPEGs at reduced scale) and resize, in
   parallel, kept as uint8 (a quarter of float32's memory and host-to-device
   traffic);
3. optionally cached in memory after decoding, so later epochs skip the disk
   and the decoder (then the shuffle happens after the cache);
4. batched by the GLOBAL batch size: the strategy splits each batch across
   replicas, and the last, partial batch is kept, not dropped;
5. augmented a whole batch at a time by one fused, XLA-compiled affine
   resampling (`mdtrain.augment`), batches in parallel;
6. prefetched, so the next batch is ready while the devices compute.

The auto-shard policy is set explicitly to DATA: a dataset built from a list
of files in memory cannot be sharded by file (TensorFlow would fall back with
a warning), and DATA sharding gives each worker its slice of every global
batch, which keeps multi-worker numerics equal to single-machine ones.

The legacy `ImageDataGenerator` baseline lives in `mdtrain.legacy`; the
measured comparison in `mdtrain.bench.pipelines`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from mdtrain.augment import AugmentPolicy, augment_batch
from mdtrain.data import ImageList, SkippedFile, Splits
from mdtrain.images import decode_image

AUTOTUNE = tf.data.AUTOTUNE


def _is_jpeg(contents: tf.Tensor) -> tf.Tensor:
    return tf.equal(tf.strings.substr(contents, 0, 3), b"\xff\xd8\xff")


def _decode_reduced(contents: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decodes a JPEG at 1/2, 1/4 or 1/8 scale when it stays at least `image_size`.

    libjpeg scales in the inverse DCT, so a 4x-too-large photo decodes about
    as fast as a small one; the bilinear resize that follows sees fewer pixels.
    """
    shape = tf.image.extract_jpeg_shape(contents)
    smallest = tf.minimum(shape[0], shape[1])
    # Index of the largest ratio in (1, 2, 4, 8) that keeps the short side >= image_size.
    index = tf.reduce_sum(tf.cast(smallest >= image_size * tf.constant([2, 4, 8]), tf.int32))
    branches = [lambda r=r: tf.io.decode_jpeg(contents, channels=3, ratio=r) for r in (1, 2, 4, 8)]
    return tf.switch_case(index, branches)


def load_image(path: tf.Tensor, image_size: int) -> tf.Tensor:
    """Reads, decodes and resizes one image file to a (size, size, 3) uint8 tensor.

    The aspect ratio is not kept (as in `image_dataset_from_directory` and
    `flow_from_directory`); bilinear resizing. JPEGs at least twice the target
    size are decoded at reduced scale first (`decode_jpeg(ratio=...)`).
    """
    contents = tf.io.read_file(path)
    image = tf.cond(
        _is_jpeg(contents),
        lambda: _decode_reduced(contents, image_size),
        lambda: decode_image(contents),
    )
    image.set_shape([None, None, 3])
    image = tf.image.resize(image, [image_size, image_size])
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def _set_options(ds: tf.data.Dataset, deterministic: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def decoded_images(
    images: ImageList, image_size: int, cache: bool | str = False, deterministic: bool = True
) -> tf.data.Dataset:
    """Dataset of `(uint8 image, int32 label)` in file order, decoded in parallel.

    Args:
        images: files and labels.
        image_size: side of the square output.
        cache: True caches in memory, a string caches to that file prefix.
            Defaults to False.
        deterministic: keep file order even when parallel decoding finishes
            out of order. Defaults to True.

    Returns:
        An unbatched dataset.
    """
    ds = tf.data.Dataset.from_tensor_slices((images.files, np.asarray(images.labels, np.int32)))
    ds = ds.map(
        lambda path, label: (load_image(path, image_size), label),
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )
    if cache:
        ds = ds.cache("" if cache is True else cache)
    return ds


def epoch_seed(seed, epoch: int):
    """A seed that depends on (seed, epoch) only: an int, or a tensor if `seed` is one."""
    if isinstance(seed, int):
        return (seed * 1_000_003 + epoch) % (2**63)
    return tf.cast(seed, tf.int64) * 1_000_003 + epoch


@dataclass
class InputData:
    """Everything training needs to know about its input.

    `train_epochs(first, last)` gives the batches of epochs `first`…`last - 1`
    back to back (each epoch's order fixed by its number); `val_ds` is the
    validation batches, or None.
    """

    splits: Splits
    image_size: int
    global_batch_size: int
    seed: int = 0
    shuffle: bool = True
    augment: AugmentPolicy | None = field(default_factory=AugmentPolicy)
    cache: bool | str = True
    deterministic: bool = False

    def __post_init__(self) -> None:
        self._train_decoded = None
        if self.cache:
            # Cached in file order (a deterministic decode), so that every epoch's
            # shuffle, applied after the cache, depends on (seed, epoch) only.
            self._train_decoded = decoded_images(
                self.splits.train, self.image_size, self.cache, deterministic=True
            )
        self.val_ds = None
        if self.splits.val is not None and len(self.splits.val):
            val = decoded_images(self.splits.val, self.image_size, self.cache, self.deterministic)
            self.val_ds = _set_options(
                val.batch(self.global_batch_size).prefetch(AUTOTUNE), self.deterministic
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
    def skipped(self) -> list[SkippedFile]:
        return self.splits.skipped

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_train / self.global_batch_size)

    @property
    def validation_steps(self) -> int:
        return math.ceil(self.num_val / self.global_batch_size)

    def epoch_batches(self, epoch: int) -> tf.data.Dataset:
        """The training batches of one epoch; their order depends only on (seed, epoch).

        Uncached, the file names are shuffled and then decoded in parallel;
        cached, the decoded images are shuffled. With `deterministic=False`
        parallel decoding may hand images over slightly out of order (never
        across epochs), which keeps both cores busy when file costs vary.
        """
        shuffle_seed = epoch_seed(self.seed, epoch)
        if self._train_decoded is not None:
            ds = self._train_decoded
            if self.shuffle:
                ds = ds.shuffle(self.num_train, seed=shuffle_seed, reshuffle_each_iteration=False)
        else:
            train = self.splits.train
            ds = tf.data.Dataset.from_tensor_slices(
                (train.files, np.asarray(train.labels, np.int32))
            )
            if self.shuffle:
                ds = ds.shuffle(self.num_train, seed=shuffle_seed, reshuffle_each_iteration=False)
            size = self.image_size
            ds = ds.map(
                lambda path, label: (load_image(path, size), label),
                num_parallel_calls=AUTOTUNE,
                deterministic=self.deterministic,
            )
        ds = ds.batch(self.global_batch_size)
        if self.augment is not None:
            policy, seed = self.augment, self.seed

            def augment(step, batch):
                images, labels = batch
                step_seed = tf.stack([tf.constant(seed, tf.int64), epoch_seed(step, epoch)])
                return augment_batch(images, policy, step_seed), labels

            ds = ds.enumerate().map(augment, num_parallel_calls=AUTOTUNE)
        return ds

    def train_epochs(self, first_epoch: int = 0, last_epoch: int = 1) -> tf.data.Dataset:
        """Training batches of epochs `first_epoch`…`last_epoch - 1` back to back, prefetched.

        Each epoch is its own shuffled pass over the (cached) images, chained
        with `concatenate`; a resumed run starting at epoch k gets exactly the
        batches an uninterrupted run saw from epoch k on.
        """
        ds = self.epoch_batches(first_epoch)
        for epoch in range(first_epoch + 1, last_epoch):
            ds = ds.concatenate(self.epoch_batches(epoch))
        return _set_options(ds.prefetch(AUTOTUNE), self.deterministic)
