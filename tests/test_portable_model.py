"""A `model.keras` from `mdtrain train` loads with plain Keras, without mdtrain, and
predicts what `mdtrain predict` says."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import run_mdtrain

# Runs in a fresh interpreter that never imports mdtrain (and checks that it did not).
PLAIN_KERAS = """
import json, sys
import keras, tensorflow as tf
model = keras.models.load_model(sys.argv[1])
assert not [m for m in sys.modules if m.split(".")[0] == "mdtrain"], "mdtrain was imported"
size = model.input_shape[1]
def load(path):  # what mdtrain's pipeline does to these small JPEGs: decode, resize, round
    image = tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(path), channels=3), [size, size])
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
images = tf.stack([load(path) for path in sys.argv[2:]])
layers = {type(layer).__name__ for layer in model._flatten_layers()}
print(json.dumps({"probabilities": model.predict(images, verbose=0).tolist(),
                  "layers": sorted(layers)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "batch_norm"),
    [("small-cnn", "exact"), ("efficientnet-lite0", "exact"), ("small-cnn", "synchronized"),
     ("small-cnn", "local")],
)  # fmt: skip
def test_saved_model_loads_and_predicts_without_mdtrain(tmp_path, tiny_dataset, model,
                                                        batch_norm):  # fmt: skip
    out = tmp_path / "run"
    trained = run_mdtrain(
        "train", "--data", str(tiny_dataset), "--model", model, "--weights", "none",
        "--image-size", "32", "--epochs", "1", "--strategy", "cpu:2",
        "--global-batch-size", "8", "--output", str(out), "--monitor", "none",
        "--batch-norm", batch_norm,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    images = sorted(str(p) for p in (tiny_dataset / "val").rglob("*.jpg"))
    said = run_mdtrain("predict", *images, "--model-file", str(out / "model.keras"),
                       "--top", "3", "--json")  # fmt: skip
    assert said.returncode == 0, said.stderr
    predictions = json.loads(said.stdout.strip().splitlines()[-1])["predictions"]

    plain = subprocess.run(
        [sys.executable, "-c", PLAIN_KERAS, str(out / "model.keras"), *images],
        capture_output=True, text=True, cwd=tmp_path,  # not the checkout: no mdtrain on the path
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    loaded = json.loads(plain.stdout.strip().splitlines()[-1])
    assert "BatchNormalization" in loaded["layers"]
    assert not [name for name in loaded["layers"] if name.startswith("Exact")]
    for prediction, probabilities in zip(predictions, loaded["probabilities"], strict=True):
        for top in prediction["top"]:
            assert top["probability"] == pytest.approx(probabilities[top["index"]], abs=1e-5)


def test_saved_weights_keep_the_nets_order(tmp_path):
    """The `model.keras` mdtrain writes (Keras' BatchNormalization in place of the exact layer)
    loads with plain Keras holding the trained net's weights in the net's order: notebook 07
    compares it, tensor by tensor, with a plain script's model saved as it was built."""
    import keras

    from mdtrain.models import build_model
    from mdtrain.norm import swap_batch_norm

    net = build_model("small-cnn", 3, 16)
    rng = np.random.default_rng(0)
    net.set_weights([rng.normal(size=w.shape).astype(w.dtype) for w in net.get_weights()])
    swap_batch_norm(net, keras.layers.BatchNormalization).save(tmp_path / "model.keras")
    net.save(tmp_path / "plain.keras")  # mdtrain's layer, as a plain script saves it
    for name in ("model.keras", "plain.keras"):
        loaded = keras.models.load_model(tmp_path / name).get_weights()
        assert len(loaded) == len(net.get_weights())
        for got, want in zip(loaded, net.get_weights(), strict=True):
            np.testing.assert_array_equal(got, want)
