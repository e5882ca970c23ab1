"""Augmenting in the model (`auto`): the pipeline draws the transforms, the replica applies them.

The model path must make the very pixels the pipeline path makes, so a run
that augments on its replicas trains to the weights, bit for bit, of one that
augments in its input pipeline (whose batches are split across replicas after
augmenting, as `tests/test_numerics.py` checks against one device).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from mdtrain.augment import (
    AugmentPolicy,
    apply_packed,
    augment_batch,
    pack_transforms,
    sample_transforms,
)
from mdtrain.data import load_splits
from mdtrain.loop import ExactTrainer
from mdtrain.pipeline import InputData

POLICY = AugmentPolicy(brightness=(0.8, 1.2), contrast=0.2)


def _inputs(tiny_dataset, augment_in: str) -> InputData:
    splits = load_splits(str(tiny_dataset / "train"), None, 0.0, 0)
    return InputData(splits, 32, 10, augment=POLICY, augment_in=augment_in, cache="memory")


def test_the_model_path_makes_the_pixels_the_pipeline_makes(tiny_dataset):
    augmented = list(_inputs(tiny_dataset, "pipeline").epoch_batches(1))
    drawn = list(_inputs(tiny_dataset, "model").epoch_batches(1))
    assert [len(batch) for batch in drawn] == [3] * len(augmented)
    for (want, labels), (images, got_labels, transforms) in zip(augmented, drawn, strict=True):
        assert transforms.shape == (images.shape[0], 8)
        got = apply_packed(images, POLICY, transforms)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        np.testing.assert_array_equal(got_labels.numpy(), labels.numpy())
        assert not np.array_equal(images.numpy(), want.numpy())  # it was augmented


@pytest.mark.parametrize("cuts", [(5,), (7,), (0, 3, 10), (1, 2, 3, 4)])
def test_any_slice_of_a_batch_gets_the_pixels_the_whole_batch_gets(cuts):
    # What a replica does with its slice of a global batch of 10. Noise at 224 px makes
    # every rounding visible: the rotation's sine and cosine, computed per slice, come
    # out differently for 5 values than for 10 (vectorised vs scalar code on the CPU),
    # and changed 27 pixels here before they were computed once, for the whole batch.
    images = tf.constant(np.random.default_rng(0).integers(0, 256, (10, 224, 224, 3)), tf.uint8)
    seed = tf.constant([3, 4], tf.int64)
    whole = augment_batch(images, POLICY, seed)
    packed = pack_transforms(sample_transforms(10, POLICY, seed), 224.0, 224.0)
    edges = [0, *cuts, 10]
    pairs = zip(edges[:-1], edges[1:], strict=True)
    slices = [apply_packed(images[a:b], POLICY, packed[a:b]) for a, b in pairs]
    assert int(tf.reduce_sum(tf.cast(tf.concat(slices, 0) != whole, tf.int32))) == 0


# Three runs of `train` in a fresh process (a strategy's collectives outlive it in the
# process that ran it): on two replicas, augmenting in the pipeline with `fit`, where
# `auto` puts it (the model) with the custom loop, and not at all. 24 images in batches
# of 10: the last batch splits 2 + 2 over the replicas.
_RUNS = """
import json, sys
from mdtrain.distribute import configure_devices
configure_devices("cpu:2")
import numpy as np
from mdtrain.training import TrainConfig, train

def max_relative_difference(a, b):  # largest |a - b| relative to each tensor's scale
    return max(float(np.max(np.abs(x - y), initial=0.0)) / max(float(np.max(np.abs(y))), 1e-12)
               for x, y in zip(a, b, strict=True))

def run(**options):
    result = train(TrainConfig(data=sys.argv[1], image_size=32, epochs=2, global_batch_size=10,
                               dropout=0.0, cache="memory", monitor="none", deterministic=True,
                               verbose=0, strategy="cpu:2", **options))
    return result.summary()["augment_in"], result.model.get_weights()

pipeline = run(augment_in="pipeline")
model = run(loop="custom")  # augment_in="auto"
unaugmented = run(augment=False)
print(json.dumps({
    "places": [pipeline[0], model[0], unaugmented[0]],
    "model_vs_pipeline": max_relative_difference(model[1], pipeline[1]),
    "model_vs_unaugmented": max_relative_difference(model[1], unaugmented[1]),
}))
"""


@pytest.mark.slow
def test_augmenting_on_the_replicas_trains_like_augmenting_in_the_pipeline(tiny_dataset):
    done = subprocess.run([sys.executable, "-c", _RUNS, str(tiny_dataset / "train")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["places"] == ["pipeline", "model", None]
    assert result["model_vs_pipeline"] == 0.0  # bit for bit
    # ... and the augmentation did change what the model learnt from.
    assert result["model_vs_unaugmented"] > 1e-3


def test_transforms_without_a_policy_are_refused_not_ignored():
    trainer = ExactTrainer(tf.keras.Sequential([tf.keras.layers.Flatten()]))
    batch = (tf.zeros([2, 8, 8, 3], tf.uint8), tf.zeros([2], tf.int32), tf.zeros([2, 6]))
    with pytest.raises(ValueError, match="pass augment=the policy"):
        trainer._padded(batch)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--augment-in", "gpu"], "auto, pipeline, model"),
        (["--no-augment", "--augment-in", "model"], "--no-augment turns augmentation off"),
    ],
)
def test_a_bad_place_is_one_line(capsys, args, words):
    from mdtrain.cli import main

    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "--augment-in" in err and words in err and "\n" not in err


def test_evaluation_leaves_training_transforms_unused():
    net = tf.keras.Sequential([tf.keras.Input((8, 8, 3)), tf.keras.layers.Flatten(),
                               tf.keras.layers.Dense(2, activation="softmax")])  # fmt: skip
    trainer = ExactTrainer(net, augment=POLICY)
    trainer.compile(optimizer="sgd")
    images = tf.random.uniform([4, 8, 8, 3])
    labels = tf.constant([0, 1, 0, 1])
    plain = trainer.evaluate(images, labels, verbose=0, return_dict=True)
    with_transforms = trainer.test_step((images, labels, tf.zeros([4, 8])))
    assert float(with_transforms["loss"]) == pytest.approx(plain["loss"])
