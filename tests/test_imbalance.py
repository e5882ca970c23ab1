"""Imbalanced subsets, per-replica class counts, class weights and balanced resampling."""

from __future__ import annotations

import numpy as np
import pytest

from mdtrain.data import load_splits
from mdtrain.errors import UsageError
from mdtrain.sources import make_synthetic_dataset

COUNTS = [10, 5, 3, 2, 1]
IMAGE_SIZE = 16


@pytest.fixture(scope="module")
def strategy():
    """A 2-replica MirroredStrategy on the virtual CPUs conftest configures."""
    from mdtrain.compat import fresh_collective_keys
    from mdtrain.distribute import make_strategy

    fresh_collective_keys()
    return make_strategy("cpu:2")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = make_synthetic_dataset(
        tmp_path_factory.mktemp("imb") / "shapes", classes=5, per_class=10, image_size=48
    )
    return load_splits(root, check_decoding=False)


@pytest.fixture(scope="module")
def subset(splits):
    from mdtrain.imbalance import make_imbalanced_subset

    return make_imbalanced_subset(splits, COUNTS, seed=0)


def test_subset_counts_and_choice(splits, subset):
    from mdtrain.imbalance import make_imbalanced_subset

    assert subset.train.counts(5) == COUNTS
    assert set(subset.train.files) <= set(splits.train.files)
    for f, y in zip(subset.train.files, subset.train.labels, strict=True):
        assert splits.train.labels[splits.train.files.index(f)] == y
    assert subset.val is splits.val and subset.class_names == splits.class_names
    again = make_imbalanced_subset(splits.train, COUNTS, seed=0)
    assert again.files == subset.train.files  # same seed, same choice
    other = make_imbalanced_subset(splits.train, COUNTS, seed=1)
    assert other.files != subset.train.files and other.counts(5) == COUNTS


def test_subset_rejects_impossible_counts(splits):
    from mdtrain.imbalance import make_imbalanced_subset

    with pytest.raises(UsageError, match="has 10 images"):
        make_imbalanced_subset(splits.train, [11, 1, 1, 1, 1])
    with pytest.raises(UsageError, match="one count per class"):
        make_imbalanced_subset(splits, [1, 1])


def test_balanced_class_weights():
    from mdtrain.imbalance import balanced_class_weights

    weights = balanced_class_weights(COUNTS)
    np.testing.assert_allclose(weights, [21 / (5 * c) for c in COUNTS])
    # every class then carries the same total weight: n / k
    np.testing.assert_allclose(np.multiply(weights, COUNTS), [21 / 5] * 5)
    assert balanced_class_weights([4, 0]) == [0.5, 0.0]


def test_replica_slices_match_batch_geometry():
    from mdtrain.distribute import BatchGeometry
    from mdtrain.imbalance import replica_slices

    for batch, replicas in [(16, 2), (15, 4), (5, 4), (1, 2)]:
        sizes = [len(s) for s in replica_slices(np.arange(batch), replicas)]
        assert sizes == BatchGeometry(batch, 16, replicas).split(batch)


def test_shuffled_pipeline_counts_every_example_once(strategy, subset):
    from mdtrain.imbalance import replica_class_counts
    from mdtrain.pipeline import InputData

    inputs = InputData(subset, IMAGE_SIZE, global_batch_size=8, augment=None)
    counts = replica_class_counts(inputs.epoch_batches(0), strategy, 5)
    assert counts.shape == (inputs.steps_per_epoch, 2, 5)
    assert counts.sum(axis=(0, 1)).tolist() == COUNTS
    # 21 examples in batches of 8: slices 4+4, 4+4, 3+2
    assert counts.sum(axis=2).tolist() == [[4, 4], [4, 4], [3, 2]]


@pytest.mark.parametrize("global_batch, low, high", [(20, 2, 2), (16, 1, 2)])
def test_round_robin_balances_every_replica_slice(strategy, subset, global_batch, low, high):
    from mdtrain.augment import AugmentPolicy
    from mdtrain.imbalance import balanced_dataset, replica_class_counts

    ds = balanced_dataset(subset.train, 5, IMAGE_SIZE, global_batch, seed=3,
                          augment=AugmentPolicy())  # fmt: skip
    counts = replica_class_counts(ds, strategy, 5, steps=12)
    assert counts.shape == (12, 2, 5)
    assert counts.min() >= low and counts.max() <= high  # every class, every slice, every step
    totals = counts.sum(axis=(0, 1))
    assert totals.max() - totals.min() <= 1


def test_random_sampling_is_uniform_on_average_only(strategy, subset):
    from mdtrain.imbalance import balanced_dataset, replica_class_counts

    ds = balanced_dataset(subset.train, 5, IMAGE_SIZE, 20, seed=0, mode="random")
    counts = replica_class_counts(ds, strategy, 5, steps=150)
    per_replica = counts.sum(axis=0)  # (replicas, classes): 1500 examples per replica
    expected = 150 * 10 / 5
    # binomial sd = sqrt(1500 * 0.2 * 0.8) ≈ 15.5; allow 4 sd
    assert np.abs(per_replica - expected).max() < 4 * np.sqrt(1500 * 0.2 * 0.8)
    assert (counts == 0).any()  # ...but single slices do miss classes


def test_balanced_dataset_errors(subset):
    from mdtrain.data import ImageList
    from mdtrain.imbalance import balanced_dataset

    with pytest.raises(UsageError, match="round-robin"):
        balanced_dataset(subset.train, 5, IMAGE_SIZE, 8, mode="stratify")
    with pytest.raises(UsageError, match="at least one image"):
        balanced_dataset(ImageList(subset.train.files[:2], [0, 0]), 2, IMAGE_SIZE, 8)


def test_per_class_recall():
    import tensorflow as tf

    from mdtrain.imbalance import per_class_recall

    labels = np.array([0, 0, 1, 1, 1, 2], np.int32)
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((6, 2, 2, 3), np.uint8), labels)).batch(4)

    def always_one(x, training=False):  # predicts class 1 for everything
        return tf.one_hot(tf.ones(tf.shape(x)[0], tf.int32), 4)

    recall = per_class_recall(always_one, ds, 4)
    np.testing.assert_array_equal(recall[:3], [0.0, 1.0, 0.0])
    assert np.isnan(recall[3])


@pytest.mark.slow
def test_fit_and_score_runs_weighted(strategy, subset):
    from mdtrain.imbalance import balanced_class_weights, balanced_dataset, fit_and_score
    from mdtrain.pipeline import InputData

    val_ds = InputData(subset, IMAGE_SIZE, 8, augment=None).val_ds
    recall, history = fit_and_score(
        strategy, balanced_dataset(subset.train, 5, IMAGE_SIZE, 8), val_ds,
        num_classes=5, image_size=IMAGE_SIZE, epochs=1, steps_per_epoch=2,
        class_weights=balanced_class_weights(COUNTS),
    )  # fmt: skip
    assert recall.shape == (5,) and np.all((recall >= 0) & (recall <= 1))
    assert len(history["loss"]) == 1 and np.isfinite(history["loss"][0])
