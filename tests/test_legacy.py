"""The ImageDataGenerator baseline and both ways to hand it to a strategy."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from mdtrain.augment import AugmentPolicy
from mdtrain.legacy import as_tf_dataset, flow_from_directory, preprocess_up_front
from mdtrain.sources import make_synthetic_dataset

SIZE, BATCH = 32, 16


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory):
    root = make_synthetic_dataset(tmp_path_factory.mktemp("idg") / "d", per_class=10, image_size=64)
    return root / "train"  # 5 classes × 10 images


def test_flow_from_directory_gives_float_batches_and_sparse_labels(train_dir):
    it = flow_from_directory(train_dir, SIZE, BATCH, AugmentPolicy(), seed=1)
    assert len(it) == 4 and it.num_classes == 5
    images, labels = next(it)
    assert images.dtype == np.float32 and images.shape == (BATCH, SIZE, SIZE, 3)
    assert 0 <= images.min() and images.max() <= 255
    assert set(labels.astype(int)) <= set(range(5))


def test_augmentation_changes_images_and_none_keeps_them(train_dir):
    plain = next(flow_from_directory(train_dir, SIZE, BATCH, None, shuffle=False))[0]
    again = next(flow_from_directory(train_dir, SIZE, BATCH, None, shuffle=False))[0]
    augmented = next(flow_from_directory(train_dir, SIZE, BATCH, AugmentPolicy(), shuffle=False))[0]
    np.testing.assert_array_equal(plain, again)
    assert not np.allclose(plain, augmented)


def test_from_generator_dataset_is_data_sharded_with_a_signature(train_dir):
    ds = as_tf_dataset(flow_from_directory(train_dir, SIZE, BATCH, AugmentPolicy()))
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.DATA
    sizes = [int(y.shape[0]) for _, y in ds.take(5)]  # endless: wraps into the next epoch
    assert sizes == [16, 16, 16, 2, 16]
    images, labels = next(iter(ds))
    assert images.dtype == tf.float32 and labels.dtype == tf.int32


def test_preprocess_up_front_freezes_one_epoch_in_memory(train_dir):
    it = flow_from_directory(train_dir, SIZE, BATCH, AugmentPolicy())
    next(it)  # a half-used iterator still gives exactly one whole epoch
    frozen = preprocess_up_front(it)
    assert frozen.images.shape == (50, SIZE, SIZE, 3) and frozen.labels.shape == (50,)
    assert frozen.nbytes == 50 * SIZE * SIZE * 3 * 4 + 50 * 4
    assert sorted(np.bincount(frozen.labels)) == [10] * 5
    ds = frozen.dataset(global_batch_size=32)
    assert [int(y.shape[0]) for _, y in ds] == [32, 18]
    epoch1 = np.concatenate([x for x, _ in ds])
    epoch2 = np.concatenate([x for x, _ in ds])
    np.testing.assert_array_equal(epoch1, epoch2)  # the same augmented copy every epoch


def test_the_benchmark_policy_runs_in_the_generator_with_brightness(train_dir):
    darker = AugmentPolicy(horizontal_flip=False, rotation_degrees=0, zoom=0, brightness=(0.5, 0.5))
    plain = next(flow_from_directory(train_dir, SIZE, BATCH, None, shuffle=False))[0]
    dark = next(flow_from_directory(train_dir, SIZE, BATCH, darker, shuffle=False))[0]
    # brightness_range multiplies (PIL's ImageEnhance.Brightness), as AugmentPolicy.brightness does
    np.testing.assert_allclose(dark.mean(), plain.mean() * 0.5, rtol=0.02)
