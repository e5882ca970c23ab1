"""A `model.keras` from `mdtrain train` loads with plain Keras, without mdtrain, and
predicts what `mdtrain predict` says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

CASES = [
    ("small-cnn", "exact"),
    ("efficientnet-lite0", "exact"),
    ("small-cnn", "synchronized"),
    ("small-cnn", "local"),
]

# One process trains every case with `mdtrain train` and asks `mdtrain predict` about the
# validation images, through the command line's own entry point (a TensorFlow start-up each
# would cost more than the small runs): each case's last JSON line of `predict`.
MDTRAIN = """
import contextlib, io, json, sys
from mdtrain.cli import main
data, work, cases, images = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
said = {}
for model, batch_norm in cases:
    out = f"{work}/{model}-{batch_norm}"
    assert main(["train", "--data", data, "--model", model, "--weights", "none",
                 "--image-size", "32", "--epochs", "1", "--strategy", "cpu:2",
                 "--global-batch-size", "8", "--output", out, "--monitor", "none",
                 "--batch-norm", batch_norm]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["predict", *images, "--model-file", f"{out}/model.keras", "--top", "3",
                     "--json"]) == 0
    said[f"{model}-{batch_norm}"] = json.loads(printed.getvalue().strip().splitlines()[-1])
print(json.dumps(said))
"""

# A fresh interpreter that never imports mdtrain (and checks that it did not) loads each model.
PLAIN_KERAS = """
import json, sys
import keras, tensorflow as tf
folders, images = sys.argv[1].split(","), sys.argv[2:]
def load(path, size):  # what mdtrain's pipeline does to these small JPEGs: decode, resize, round
    image = tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(path), channels=3), [size, size])
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
loaded = {}
for folder in folders:
    model = keras.models.load_model(f"{folder}/model.keras")
    batch = tf.stack([load(path, model.input_shape[1]) for path in images])
    layers = {type(layer).__name__ for layer in model._flatten_layers()}
    loaded[folder] = {"probabilities": model.predict(batch, verbose=0).tolist(),
                      "layers": sorted(layers)}
assert not [m for m in sys.modules if m.split(".")[0] == "mdtrain"], "mdtrain was imported"
print(json.dumps(loaded))
"""


def _last_json(script: str, *args: str, cwd) -> dict:
    """Runs `script` in a fresh interpreter in `cwd`; the JSON of its last line."""
    process = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=cwd,  # not the checkout: mdtrain as installed
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout.strip().splitlines()[-1])


def load_without_mdtrain(folders: list, images: list[str], cwd) -> dict:
    """`{folder: {"probabilities", "layers"}}`: each `folder/model.keras` loaded by plain Keras."""
    return _last_json(PLAIN_KERAS, ",".join(map(str, folders)), *images, cwd=cwd)


@pytest.fixture(scope="module")
def both_sides(tmp_path_factory, tiny_dataset) -> dict:
    """`{case: (what mdtrain predict said, what plain Keras loaded)}` for every case."""
    work = tmp_path_factory.mktemp("portable")
    images = sorted(str(p) for p in (tiny_dataset / "val").rglob("*.jpg"))
    said = _last_json(MDTRAIN, str(tiny_dataset), str(work), json.dumps(CASES), *images, cwd=work)
    folders = [work / f"{model}-{batch_norm}" for model, batch_norm in CASES]
    loaded = load_without_mdtrain(folders, images, cwd=work)
    return {case: (said[case], loaded[str(work / case)]) for case in said}


@pytest.mark.slow
@pytest.mark.parametrize(("model", "batch_norm"), CASES)
def test_saved_model_loads_and_predicts_without_mdtrain(both_sides, model, batch_norm):
    said, loaded = both_sides[f"{model}-{batch_norm}"]
    assert "BatchNormalization" in loaded["layers"]
    assert not [name for name in loaded["layers"] if name.startswith("Exact")]
    predictions = said["predictions"]
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
