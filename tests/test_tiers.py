"""The fast tier is collected without TensorFlow; TensorFlow, once imported, has 4 CPU devices.

`pytest -m fast` is the fast tier (see tests/conftest.py). Importing TensorFlow
costs seconds and its devices can be set only once per process, so the fast
tier must not import it to collect, and the process must get its virtual CPU
devices whenever the first test that needs TensorFlow imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import CPU_DEVICES, REPO, selects_only_fast

# Collects the fast tier in a fresh process, then lists what it holds of TensorFlow and Keras.
_COLLECT = """
import json, sys, pytest
code = pytest.main(["-m", "fast", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"])
loaded = sorted(m for m in sys.modules if m in ("tensorflow", "keras"))
print(json.dumps({"exit": int(code), "loaded": loaded}))
"""


def test_the_fast_tier_is_collected_without_tensorflow():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", _COLLECT], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    *collected, last = done.stdout.splitlines()
    assert json.loads(last) == {"exit": 0, "loaded": []}, done.stderr[-3000:]
    this_test = "tests/test_tiers.py::test_the_fast_tier_is_collected_without_tensorflow"
    assert this_test in collected  # the fast tier was collected
    # Modules that need TensorFlow are left to the full suite, counted, never "skipped".
    assert not any("skipped" in line for line in collected), collected[-5:]
    assert any(line.startswith("fast tier: ") and "full suite only" in line for line in collected)


def test_tensorflow_starts_with_the_virtual_cpus_of_conftest():
    import tensorflow as tf

    assert len(tf.config.list_logical_devices("CPU")) == CPU_DEVICES


@pytest.mark.parametrize(
    ("markexpr", "fast_tier"),
    [
        ("fast", True),
        ("fast and not gpu", True),
        ("", False),  # the README's command: everything
        ("not slow", False),  # selects tests that are not fast too
        ("fast or notebooks", False),
        ("not fast", False),
    ],
)
def test_which_mark_expressions_collect_only_the_fast_tier(markexpr, fast_tier):
    assert selects_only_fast(markexpr) is fast_tier
