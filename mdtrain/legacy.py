"""The legacy `ImageDataGenerator` baseline, and the two ways to feed it to a strategy.

`ImageDataGenerator.flow_from_directory` is what most older Keras tutorials
use: PIL decodes and resizes, scipy applies the random affine transform, one
image at a time, in float32, in one Python thread. It is the baseline the
tf.data pipeline (`mdtrain.pipeline`) is measured against, with the same
augmentations (`AugmentPolicy.image_data_generator_kwargs`).

A `tf.distribute` strategy needs a `tf.data.Dataset`, and there are two ways
to turn the generator into one:

- `as_tf_dataset`: wrap it with `Dataset.from_generator`. Every batch is still
  made by the Python generator, under the GIL, one batch at a time; tf.data
  cannot parallelise it, and the dataset cannot be sharded by file, so its
  auto-shard policy is set to DATA (else TensorFlow warns and falls back).
- `preprocess_up_front`: run the generator once and keep every batch in memory
  as numpy arrays. Training is then fast, but the images are one frozen
  augmented copy (no fresh augmentation per epoch) and hold float32 memory:
  1500 images of 224 px take 900 MB.

Keras 3 removed `keras.preprocessing.image.ImageDataGenerator`; TensorFlow
2.21 still ships it as `tf.keras.preprocessing.image.ImageDataGenerator`
(it needs scipy).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from mdtrain.augment import AugmentPolicy
from mdtrain.distribute import shard_by_batch


def flow_from_directory(
    directory: str | os.PathLike,
    image_size: int,
    batch_size: int,
    augment: AugmentPolicy | None = None,
    shuffle: bool = True,
    seed: int = 0,
    interpolation: str = "bilinear",
    class_mode: str = "sparse",
):
    """The legacy generator over a class-folder directory, with mdtrain's augmentations.

    Args:
        directory: a folder with one sub-folder per class.
        image_size: side of the square output images.
        batch_size: images per batch.
        augment: the `AugmentPolicy` to apply, or None for none. Defaults to None.
        shuffle: shuffle the files every epoch. Defaults to True.
        seed: seed of the shuffle and of the transforms. Defaults to 0.
        interpolation: PIL resize filter. Defaults to "bilinear".
        class_mode: label format; "sparse" gives class indices. Defaults to "sparse".

    Returns:
        A Keras `DirectoryIterator`: `next(it)` gives `(float32 images in
        0-255, float32 labels)`; `len(it)` is the number of batches per epoch.

    Example:

    >>> it = flow_from_directory("data/demo/train", 64, 32, AugmentPolicy())  # doctest: +SKIP
    >>> images, labels = next(it)  # doctest: +SKIP
    """
    kwargs = augment.image_data_generator_kwargs() if augment is not None else {}
    generator = tf.keras.preprocessing.image.ImageDataGenerator(**kwargs)
    return generator.flow_from_directory(
        str(directory),
        target_size=(image_size, image_size),
        batch_size=batch_size,
        class_mode=class_mode,
        shuffle=shuffle,
        seed=seed,
        interpolation=interpolation,
    )


def as_tf_dataset(iterator) -> tf.data.Dataset:
    """Wraps a generator iterator as an endless `tf.data.Dataset` for a strategy.

    The dataset calls `next(iterator)` in one Python thread: no parallel
    decoding, every batch holds the GIL. Its auto-shard policy is DATA (a
    generator has no files to shard by). It repeats forever, like the
    iterator, so pass `steps_per_epoch=len(iterator)` to `fit`.

    Args:
        iterator: a `flow_from_directory` iterator (anything with
            `image_shape` and `batch_size`, yielding (images, labels)).

    Returns:
        A dataset of `(float32 images, int32 labels)`, batch dimension unknown
        (the last batch of an epoch is smaller).
    """
    height, width, channels = iterator.image_shape

    def batches():
        while True:
            images, labels = next(iterator)
            yield images, labels.astype(np.int32)

    ds = tf.data.Dataset.from_generator(
        batches,
        output_signature=(
            tf.TensorSpec([None, height, width, channels], tf.float32),
            tf.TensorSpec([None], tf.int32),
        ),
    )
    return shard_by_batch(ds)


@dataclass
class Preprocessed:
    """One epoch of a generator, frozen in memory: what `preprocess_up_front` returns."""

    images: np.ndarray
    labels: np.ndarray

    @property
    def nbytes(self) -> int:
        """Memory the arrays hold, in bytes."""
        return int(self.images.nbytes + self.labels.nbytes)

    def dataset(self, global_batch_size: int) -> tf.data.Dataset:
        """The arrays as batches by the global batch size, auto-shard policy DATA."""
        ds = tf.data.Dataset.from_tensor_slices((self.images, self.labels))
        return shard_by_batch(ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE))


def preprocess_up_front(iterator) -> Preprocessed:
    """Runs a generator for one epoch and keeps every (augmented) image in memory.

    What older multi-GPU tutorials do to get a strategy-friendly dataset.
    The cost: float32 memory for the whole dataset, one pass of the slow
    generator before training starts, and the same augmented copy every
    epoch.

    Args:
        iterator: a `flow_from_directory` iterator.

    Returns:
        A `Preprocessed` with float32 `images` (N, H, W, C) and int32 `labels`.
    """
    iterator.reset()  # start at an epoch boundary, wherever the iterator stood
    images, labels = [], []
    for _ in range(len(iterator)):
        x, y = next(iterator)
        images.append(x)
        labels.append(y.astype(np.int32))
    return Preprocessed(np.concatenate(images), np.concatenate(labels))
