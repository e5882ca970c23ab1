"""The fast tier is collected without TensorFlow; TensorFlow, once imported, has 4 CPU devices.

`pytest -m fast` is the fast tier (see tests/conftest.py). Importing TensorFlow
costs seconds and its devices can be set only once per process, so the fast
tier must not import it to collect, and the process must get its virtual CPU
devices whenever the first test that needs TensorFlow imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import CPU_DEVICES, REPO


def _imported(importtime_stderr: str) -> set[str]:
    """Module names from `python -X importtime`'s lines ('import time: self | total | name')."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in importtime_stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_the_fast_tier_is_collected_without_tensorflow():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pytest", "-m", "fast", "--collect-only",
         "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    this_test = "tests/test_tiers.py::test_the_fast_tier_is_collected_without_tensorflow"
    assert this_test in done.stdout.splitlines()  # the fast tier was collected
    imported = _imported(done.stderr)
    assert "mdtrain" in imported  # the parse works: conftest imports mdtrain
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "keras")}


def test_tensorflow_starts_with_the_virtual_cpus_of_conftest():
    import tensorflow as tf

    assert len(tf.config.list_logical_devices("CPU")) == CPU_DEVICES
