"""Exact resume: a run killed with SIGKILL and started again ends with the same weights,
and reports the same per-epoch figures.

Every test runs `mdtrain train` in subprocesses on tiny data (16-pixel images),
bounded by timeouts. `reference_run` (an uninterrupted run) is shared with
tests/test_multiworker.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdtrain.sources import make_synthetic_dataset

pytestmark = pytest.mark.slow
TIMEOUT_S = 240
# 33 training images, global batch 10: 4 steps per epoch, the last batch of 3 split [2, 1].
TRAIN_ARGS = [
    "--image-size",
    "16",
    "--epochs",
    "2",
    "--global-batch-size",
    "10",
    "--deterministic",
    "--warmup-epochs",  # killed within the warm-up: resumed on the same schedule
    "1",
    "--monitor",
    "none",
]


def env() -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def mdtrain_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "mdtrain", *map(str, args)]


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder shared by the whole pytest session (both test files)."""
    return tmp_path_factory.getbasetemp() / name


def dataset(tmp_path_factory) -> Path:
    root = shared_dir(tmp_path_factory, "mw-data")
    if not (root / "train").is_dir():
        make_synthetic_dataset(root, classes=3, per_class=11, image_size=32, seed=3)
    return root


def reference_run(tmp_path_factory) -> Path:
    """model.keras of one uninterrupted single-process run on 2 replicas (cpu:2)."""
    out = shared_dir(tmp_path_factory, "mw-reference")
    if not (out / "model.keras").exists():
        data = dataset(tmp_path_factory)
        proc = subprocess.run(
            mdtrain_cmd(
                "train", "--data", data, *TRAIN_ARGS, "--strategy", "cpu:2", "--output", out
            ),
            env=env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "model.keras"


def max_relative_difference(a_file: Path, b_file: Path) -> float:
    from tests.numerics_harness import max_weight_difference

    return max_weight_difference(a_file, b_file)


def assert_same_history(a_file: Path, b_file: Path, rel: float = 1e-5) -> None:
    """Two `history.json` files hold the same figures, epoch by epoch, to float rounding."""
    a, b = (json.loads(Path(f).read_text()) for f in (a_file, b_file))
    assert len(a) == len(b) and a, (a, b)
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a == pytest.approx(row_b, rel=rel, abs=0.0)


def wait_for(
    predicate, proc: subprocess.Popen, timeout_s: float = TIMEOUT_S, poll_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"exited early with code {proc.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll_s)


def backed_up_at(backup: Path) -> str | None:
    """The checkpoint that the manifest in `backup` names (it is replaced whole), or None."""
    try:
        return json.loads((backup / "mdtrain-backup.json").read_text())["checkpoint"]
    except FileNotFoundError:
        return None


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """Kills a run with SIGKILL once its first backup exists, keeps a copy, runs it again."""
    data, work = dataset(tmp_path_factory), tmp_path_factory.mktemp("resume")
    backup, out = work / "backup", work / "out"
    cmd = mdtrain_cmd(
        "train",
        "--data",
        data,
        *TRAIN_ARGS,
        "--strategy",
        "cpu:2",
        "--backup-dir",
        backup,
        "--backup-every-steps",
        3,
        "--output",
        out,
    )
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # a mid-epoch backup: epoch 1 (0-based 0), after 3 of its 4 steps (global step 3);
        # polled often: the next, after the epoch's last step and validation, replaces it
        wait_for(lambda: backed_up_at(backup) == "mdtrain-ckpt-3", proc, poll_s=0.02)
    finally:
        proc.kill()
        proc.wait()
    assert not (out / "model.keras").exists()
    shutil.copytree(backup, work / "backup-copy")
    resumed = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    return {"resumed": resumed, "out": out, "backup": work / "backup-copy", "data": data}


def test_killed_run_resumes_with_the_same_weights_and_figures(killed_and_resumed, tmp_path_factory):
    resumed, out = killed_and_resumed["resumed"], killed_and_resumed["out"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "at epoch 1, step 4" in resumed.stdout
    reference = reference_run(tmp_path_factory)
    assert max_relative_difference(reference, out / "model.keras") == 0.0
    # The epoch resumed after its step 3 counts steps 1-3 too (its metric state was backed up).
    assert_same_history(reference.parent / "history.json", out / "history.json")
    assert not (out.parent / "backup").exists()  # a finished run removes its backups


def _train_one_device(data, args, backup) -> subprocess.CompletedProcess:
    """`mdtrain train` on one device, resuming from (or refusing) `backup`."""
    cmd = mdtrain_cmd("train", "--data", data, *args, "--strategy", "one", "--backup-dir", backup)
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def test_corrupt_backup_is_reported_not_loaded(killed_and_resumed, tmp_path):
    backup = shutil.copytree(killed_and_resumed["backup"], tmp_path / "backup")
    data = backup / f"{backed_up_at(backup)}.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:1000])  # truncated, as by a full disk
    proc = _train_one_device(killed_and_resumed["data"], TRAIN_ARGS, backup)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mdtrain: error: --backup-dir") and "Traceback" not in proc.stderr
    assert "backup mdtrain-ckpt-3 is corrupt or partial" in last


def test_backup_from_other_settings_is_refused(killed_and_resumed, tmp_path):
    backup = shutil.copytree(killed_and_resumed["backup"], tmp_path / "backup")
    args = [a if a != "10" else "12" for a in TRAIN_ARGS]  # another global batch size
    proc = _train_one_device(killed_and_resumed["data"], args, backup)
    assert proc.returncode == 2
    assert "global_batch_size differ" in proc.stderr.strip().splitlines()[-1]
