"""FusedAugmentation: the fused pass as a Keras layer in tf.data, in a model, per replica."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from mdtrain.augment import AugmentPolicy
from mdtrain.augment_layer import FusedAugmentation
from tests.conftest import run_mdtrain

skimage_data = Path(pytest.importorskip("skimage").__file__).parent / "data"
POLICY = AugmentPolicy(brightness=(0.8, 1.2), contrast=0.2)


def _photos(size: int = 64) -> np.ndarray:
    """Two real photographs (scikit-image's cat and coffee cup), each twice."""
    photos = [
        np.asarray(Image.open(skimage_data / name).convert("RGB").resize((size, size)))
        for name in ("chelsea.png", "coffee.png")
    ]
    return np.stack(photos * 2)


def test_augments_in_training_and_passes_through_at_inference():
    photos = tf.constant(_photos())
    layer = FusedAugmentation(POLICY, seed=0)
    out = layer(photos)
    assert out.dtype == tf.uint8 and out.shape == photos.shape
    # Each copy of a photo gets its own transform, and every image changes.
    assert not np.array_equal(out[0], out[2]) and not np.array_equal(out[1], out[3])
    assert all(not np.array_equal(out[i], photos[i]) for i in range(4))
    assert layer(photos, training=False) is photos


def test_same_seed_same_transforms_and_every_call_draws_new_ones():
    photos = tf.constant(_photos())
    a, b = FusedAugmentation(POLICY, seed=5), FusedAugmentation(POLICY, seed=5)
    first, second = a(photos), a(photos)
    np.testing.assert_array_equal(first, b(photos))
    np.testing.assert_array_equal(second, b(photos))
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, FusedAugmentation(POLICY, seed=6)(photos))


def test_maps_over_batches_in_tf_data():
    photos = _photos()
    layer = FusedAugmentation(POLICY, seed=1)
    ds = tf.data.Dataset.from_tensors(photos).repeat(3).map(lambda x: layer(x))
    batches = [b.numpy() for b in ds]
    assert len(batches) == 3 and batches[0].dtype == np.uint8
    assert not np.array_equal(batches[0], batches[1])
    assert not np.array_equal(batches[1], batches[2])


def test_each_replica_draws_its_own_transforms():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        layer = FusedAugmentation(POLICY, seed=2)
    photos = tf.constant(_photos())  # every replica gets the same batch

    @tf.function
    def augment(images):
        return strategy.run(lambda x: layer(x), args=(images,))

    first, second = strategy.experimental_local_results(augment(photos))
    assert first.shape == photos.shape
    assert not np.array_equal(first.numpy(), second.numpy())


def _model(size: int) -> keras.Model:
    return keras.Sequential([
        keras.Input((size, size, 3)),
        FusedAugmentation(POLICY, seed=3),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2, activation="softmax"),
    ])  # fmt: skip


def test_first_layer_of_a_model_trains_under_a_strategy_and_saves(tmp_path):
    photos = _photos(32).astype(np.float32)
    labels = np.array([0, 1, 0, 1])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _model(32)
        model.compile("sgd", "sparse_categorical_crossentropy")
    history = model.fit(photos, labels, batch_size=4, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    layer = loaded.layers[0]
    assert isinstance(layer, FusedAugmentation)
    assert layer.policy == POLICY and layer.seed == 3
    # At inference the layer passes images through: the loaded model predicts the same.
    np.testing.assert_allclose(loaded.predict(photos, verbose=0),
                               model.predict(photos, verbose=0), atol=1e-6)  # fmt: skip


def test_a_uint8_model_input_stays_uint8():
    inputs = keras.Input((64, 64, 3), dtype="uint8")
    model = keras.Model(inputs, FusedAugmentation(POLICY, seed=4)(inputs))
    assert model.output.dtype == "uint8"
    out = model(tf.constant(_photos()), training=True)
    assert out.dtype == tf.uint8 and out.shape == (4, 64, 64, 3)


def test_config_round_trip_leaves_the_config_as_it_was():
    # Through JSON, as a .keras file holds it: the brightness range comes back a list.
    config = json.loads(json.dumps(FusedAugmentation(POLICY, seed=7, name="augment").get_config()))
    kept = dict(config)
    layer = FusedAugmentation.from_config(config)
    assert config == kept
    assert (layer.policy, layer.seed, layer.name) == (POLICY, 7, "augment")


@pytest.mark.slow
def test_mdtrain_predict_loads_a_model_that_holds_the_layer(tmp_path, tiny_dataset):
    model = _model(32)
    model.save(tmp_path / "model.keras")
    proc = run_mdtrain("predict", str(tiny_dataset / "train" / "circle"),
                       "--model-file", str(tmp_path / "model.keras"), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    predictions = json.loads(proc.stdout.strip().splitlines()[-1])["predictions"]
    assert len(predictions) == 8 and all(p["top"] for p in predictions)


def test_under_mixed_float16_on_replicas_it_augments_in_float16_and_trains():
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_float16")  # what mdtrain picks on a GPU
    try:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = _model(32)
            model.compile("sgd", "sparse_categorical_crossentropy")
        history = model.fit(_photos(32).astype(np.float32), np.array([0, 1, 0, 1]),
                            batch_size=4, epochs=1, verbose=0)  # fmt: skip
        layer = model.layers[0]
        out = layer(tf.constant(_photos(32), tf.float16))
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    assert layer.compute_dtype == "float16" and out.dtype == tf.float16
    assert np.isfinite(history.history["loss"]).all()
    assert np.isfinite(out.numpy()).all() and not np.array_equal(out.numpy(), _photos(32))
