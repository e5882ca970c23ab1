"""Notebook 01's exercise checks: a right answer passes, each wrong one is named in words."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mdtrain.exercises import ExerciseError, nb01


def _augmentation(rotation=20 / 360, layers=nb01.LAYERS):
    made = {
        "RandomFlip": keras.layers.RandomFlip("horizontal", seed=0),
        "RandomRotation": keras.layers.RandomRotation(rotation, fill_mode="nearest", seed=0),
        "RandomZoom": keras.layers.RandomZoom(0.15, fill_mode="nearest", seed=0),
        "RandomBrightness": keras.layers.RandomBrightness(0.4, value_range=(0, 255), seed=0),
        "RandomContrast": keras.layers.RandomContrast(0.4, value_range=(0, 255), seed=0),
    }
    return keras.Sequential([made[name] for name in layers])


@pytest.fixture(scope="module")
def source():
    images = nb01._test_batch(32).astype(np.uint8)
    return tf.data.Dataset.from_tensor_slices((images, np.arange(4))).batch(2)


def test_the_worked_augmentation_model_passes(capsys):
    assert nb01.check_augmentation_model(_augmentation(), strict=True)
    assert "it works" in capsys.readouterr().out


def test_the_placeholder_is_named_and_does_not_raise(capsys):
    assert nb01.check_augmentation_model(None) is False
    assert "still the placeholder" in capsys.readouterr().out


def test_missing_layers_and_a_rotation_in_the_wrong_unit_are_named(capsys):
    model = _augmentation(rotation=0.2, layers=("RandomFlip", "RandomRotation"))
    assert nb01.check_augmentation_model(model) is False
    out = capsys.readouterr().out
    for name in ("RandomZoom", "RandomBrightness", "RandomContrast"):
        assert f"no `keras.layers.{name}`" in out
    assert "up to 72°, not 20°" in out
    with pytest.raises(ExerciseError):
        nb01.check_augmentation_model(model, strict=True)


def test_colour_layers_without_the_pixel_range_are_named(capsys):
    model = keras.Sequential(
        [
            *_augmentation(layers=nb01.LAYERS[:3]).layers,
            keras.layers.RandomBrightness(0.4, value_range=(0, 1)),
        ]
    )
    assert nb01.check_augmentation_model(model) is False
    assert "value_range=(0, 255)" in capsys.readouterr().out


def test_a_layer_that_changes_images_at_inference_is_named(capsys):
    model = keras.Sequential([*_augmentation().layers, keras.layers.Rescaling(0.5)])
    assert nb01.check_augmentation_model(model) is False
    assert "at inference" in capsys.readouterr().out


def test_the_worked_augmented_dataset_passes(source):
    augmentation = _augmentation()
    augmented = source.map(lambda x, y: (augmentation(tf.cast(x, tf.float32), training=True), y))
    assert nb01.check_augmented_dataset(augmented, source, strict=True)


def test_a_dataset_that_does_not_augment_or_drops_labels_is_named(source, capsys):
    assert nb01.check_augmented_dataset(source, source) is False
    assert "images are the source's" in capsys.readouterr().out
    augmentation = _augmentation()
    no_labels = source.map(lambda x, y: (augmentation(tf.cast(x, tf.float32)), y * 0))
    assert nb01.check_augmented_dataset(no_labels, source) is False
    assert "labels are not the source's" in capsys.readouterr().out
    assert nb01.check_augmented_dataset(source.map(lambda x, y: x), source) is False
    assert "not `(images, labels)` pairs" in capsys.readouterr().out
