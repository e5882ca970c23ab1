"""Shared fixtures: small real image datasets on disk, made once per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mdtrain.sources import make_synthetic_dataset

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """3 classes × 8 training images (+1 validation each), JPEGs of varied sizes ~48 px."""
    root = tmp_path_factory.mktemp("tiny") / "shapes"
    return make_synthetic_dataset(root, classes=3, per_class=8, image_size=48, seed=1)


@pytest.fixture(scope="session")
def messy_dataset(tmp_path_factory, tiny_dataset) -> Path:
    """The tiny dataset plus what real folders contain: broken, empty, misnamed, non-image files."""
    root = tmp_path_factory.mktemp("messy") / "shapes"
    shutil.copytree(tiny_dataset / "train", root)
    cls = root / "circle"
    some_jpeg = sorted(cls.glob("*.jpg"))[0]
    (cls / "truncated.jpg").write_bytes(some_jpeg.read_bytes()[:200])
    (cls / "empty.png").write_bytes(b"")
    (cls / "notes.jpg").write_text("this is not an image")
    shutil.copy(some_jpeg, cls / "really_a_jpeg.png")  # content decides, not the name
    (cls / "README.txt").write_text("ignored: not an image extension")
    hidden = root / ".thumbnails"
    hidden.mkdir()
    shutil.copy(some_jpeg, hidden / "x.jpg")
    return root


def pytest_configure(config):
    """Four virtual CPU devices for every in-process TensorFlow test, made before TensorFlow starts.

    Virtual devices can only be configured once per process, before any
    TensorFlow work; doing it here lets any test build a `cpu:2` or `cpu:4`
    MirroredStrategy in this process, whatever ran before it.
    """
    from mdtrain.distribute import configure_devices

    configure_devices("cpu:4")


def pytest_collection_modifyitems(config, items):
    for item in items:  # nbval's items: `-m "not notebooks"` leaves them out
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebooks)


def run_mdtrain(*args: str, timeout: float = 600, env: dict | None = None, cwd=None):
    """Runs `python -m mdtrain ARGS` in a fresh process; returns the CompletedProcess."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mdtrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )
