"""Shared fixtures (small real image datasets on disk), the fast tier, and TensorFlow's devices.

Two tiers, one suite:

- `MDTRAIN_SMOKE=1 pytest -n 2 --dist loadfile` (the README's command) runs
  everything: unit and integration tests, the wheel, the browser test and every
  notebook, in two pytest-xdist workers. `--dist loadfile` keeps a module, and
  so its module-scoped fixtures, in one worker, and a notebook's cells with
  their kernel; workers that split them are refused in one line.
- `pytest -m fast` runs the fast tier in a few minutes: every test not marked
  `slow`, `browser`, `gpu` or `notebooks`, from the test modules that import
  without TensorFlow. While the fast tier is collected, `import tensorflow`
  is refused, so a module that needs it at import is left out (one summary
  line counts them; nothing is reported as skipped) instead of costing
  TensorFlow's start-up; its tests run in the full suite. No list to keep: a
  new module joins the tier it imports for. Tests of the fast tier may still
  use TensorFlow inside the test. `tests/test_tiers.py` checks both.

Each test process (each xdist worker) gets 4 virtual CPU devices the moment
anything imports TensorFlow (a test, a fixture, a test module, mdtrain
itself), before any TensorFlow work, so any test can build a `cpu:2` or `cpu:4` MirroredStrategy
in this process, whatever ran before it. A session that never imports
TensorFlow never pays for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from mdtrain.sources import make_synthetic_dataset

REPO = Path(__file__).resolve().parents[1]

#: The virtual CPU devices of the test process.
CPU_DEVICES = 4

#: Marks that keep a test out of the fast tier.
NOT_FAST = ("slow", "browser", "gpu", "notebooks")

#: Whether this session runs the fast tier (`-m fast`).
FAST_TIER = pytest.StashKey[bool]()
_FINDER = pytest.StashKey["_TensorFlowImport"]()
_LEFT_OUT = pytest.StashKey[list]()
_LEFT_TO_FULL_SUITE = "imports TensorFlow at collection: runs in the full suite only"


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


# --- TensorFlow: devices on first import, none while the fast tier is collected ------------


def _configure_devices(tf) -> None:
    """What `mdtrain.configure_devices("cpu:4")` sets, then the devices are started.

    Runs inside the first `import tensorflow`, which may come from mdtrain's own
    modules half-way through their import, so it uses TensorFlow's calls only.
    Starting the devices here fixes them: a later `configure_devices("cpu:2")`
    finds 4 CPUs and keeps them.
    """
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    (cpu, *_) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(CPU_DEVICES)]
    )
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (cores or 1) // CPU_DEVICES))
    tf.config.list_logical_devices("CPU")  # starts the devices


class _TensorFlowImport(importlib.abc.MetaPathFinder):
    """Sees the process's first `import tensorflow`: refuses it, or configures devices after it."""

    def __init__(self) -> None:
        self.refuse = False  # True while the fast tier is collected

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self.refuse:  # the module is left out: `pytest_make_collect_report` below
            raise pytest.skip.Exception(_LEFT_TO_FULL_SUITE, allow_module_level=True)
        sys.meta_path.remove(self)  # the first import only
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_configure(module) -> None:
                exec_module(module)
                _configure_devices(module)

            spec.loader.exec_module = exec_then_configure
        return spec


def selects_only_fast(markexpr: str) -> bool:
    """Whether `-m markexpr` selects only tests marked `fast` (`fast`, `fast and not gpu`)."""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pytest moved it: the plain form still works
        return markexpr.strip() == "fast"
    expression = Expression.compile(markexpr)

    def without_fast(others_present: bool):
        return lambda name, /, **_: name != "fast" and others_present

    # Nothing is selected without `fast`, whether every other mark is present or none is.
    return not any(expression.evaluate(without_fast(present)) for present in (True, False))


def pytest_configure(config):
    distribution = config.getoption("dist", "no")  # pytest-xdist's --dist, once -n set it
    if distribution not in ("no", "loadfile"):
        raise pytest.UsageError(
            f"--dist {distribution} splits a notebook's cells between workers: "
            "run the workers with --dist loadfile"
        )
    config.stash[FAST_TIER] = selects_only_fast(config.option.markexpr)
    finder = _TensorFlowImport()
    if "tensorflow" not in sys.modules:  # imported by a plugin: too late to watch it
        finder.refuse = config.stash[FAST_TIER]
        sys.meta_path.insert(0, finder)
    config.stash[_FINDER] = finder


def pytest_report_header(config):
    import mdtrain

    versions = []
    for label, names in (("TensorFlow", ("tensorflow", "tensorflow-cpu")), ("Keras", ("keras",))):
        found = [v for v in map(_version, names) if v]
        versions.append(f"{label} {found[0] if found else 'not installed'}")
    tier = "the fast tier (-m fast)" if config.stash[FAST_TIER] else "all tiers"
    return [
        f"mdtrain {mdtrain.__version__} from {Path(mdtrain.__file__).parent}",
        f"{', '.join(versions)}, Python {sys.version.split()[0]}; {tier}",
    ]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def pytest_collection_modifyitems(config, items):
    for item in items:  # nbval's items: `-m "not notebooks"` leaves them out
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebooks)
    if config.stash[FAST_TIER]:  # every module collected here imported without TensorFlow
        for item in items:
            if not any(item.get_closest_marker(name) for name in NOT_FAST):
                item.add_marker(pytest.mark.fast)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """In the fast tier, a module that imports TensorFlow is left out, not reported as skipped."""
    report = yield
    if report.skipped and _LEFT_TO_FULL_SUITE in str(report.longrepr):
        report.outcome, report.longrepr, report.result = "passed", None, []
        collector.config.stash.setdefault(_LEFT_OUT, []).append(str(report.nodeid))
    return report


def pytest_sessionfinish(session):
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # a pytest-xdist worker: the controller writes the summary
        worker_output["left_out"] = session.config.stash.get(_LEFT_OUT, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Under pytest-xdist each worker collects; the controller gathers what they left out."""
    left_out = node.config.stash.setdefault(_LEFT_OUT, [])
    for nodeid in getattr(node, "workeroutput", {}).get("left_out", []):
        if nodeid not in left_out:
            left_out.append(nodeid)


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(_LEFT_OUT, [])
    if left_out:
        terminalreporter.write_line(
            f"fast tier: {len(left_out)} test modules import TensorFlow at collection and run "
            "in the full suite only"
        )


def pytest_collection_finish(session):
    session.config.stash[_FINDER].refuse = False  # tests of the fast tier may use TensorFlow


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


@pytest.fixture(autouse=True)
def _collective_keys_of_its_own():
    """Each test's new `MirroredStrategy` gets collective keys no earlier strategy holds.

    Strategies over the same devices in one process reuse collective keys, and a step of one
    then aborts on another's shapes ("Shape mismatch in the collective instance 100"), which
    poisons every later collective in the process (tensorflow/tensorflow#61314). Which modules
    share a process depends on how the suite is split between workers, so every test starts
    from a fresh range, as TensorFlow's own tests do. Nothing is imported without TensorFlow.
    """
    if "tensorflow" in sys.modules:
        from mdtrain.compat import fresh_collective_keys

        fresh_collective_keys()
    yield
