"""Importing mdtrain changes nothing in TensorFlow or Keras; `train` undoes what it changes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = """
import importlib, json, pkgutil, sys
import keras, tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops as mdi
from tensorflow.python.framework import config

def state():
    return {"create_device_dataset": mdi._create_device_dataset.__module__,
            "determinism": config.is_op_determinism_enabled(),
            "dtype_policy": keras.config.dtype_policy().name,
            "fit": keras.Model.fit.__module__}

before = state()
import mdtrain
for name in mdtrain.__all__:
    getattr(mdtrain, name)
for module in pkgutil.walk_packages(mdtrain.__path__, "mdtrain."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
imported = state()
mdtrain.configure_devices("cpu:2")
result = mdtrain.train(mdtrain.TrainConfig(
    data=sys.argv[1], strategy="cpu:2", image_size=32, epochs=1, global_batch_size=8,
    deterministic=True, mixed_precision=True, monitor="none", verbose=0))
print(json.dumps({"before": before, "imported": imported, "after": state(),
                  "trained": len(result.history)}))
"""


@pytest.mark.slow
def test_import_patches_nothing_and_train_restores_what_it_changed(tiny_dataset, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_dataset)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    states = json.loads(done.stdout.strip().splitlines()[-1])
    assert states["trained"] == 1
    assert states["imported"] == states["before"]  # every module imported: nothing changed
    assert states["after"] == states["before"]  # determinism off again, TF's function back
    assert states["before"]["determinism"] is False
