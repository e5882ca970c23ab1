"""Multi-worker training on loopback: `mdtrain launch`, numerics, a worker crash and restart.

Two workers × 1 replica must end with exactly the weights of one process × 2
replicas (`--strategy cpu:2`, Keras `fit`) for the same global batches. All runs are
subprocesses on tiny data, bounded by timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.test_resume import (
    TIMEOUT_S,
    TRAIN_ARGS,
    assert_same_history,
    backed_up_at,
    dataset,
    env,
    max_relative_difference,
    mdtrain_cmd,
    reference_run,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """A clean 2-worker run; TMPDIR is private so leftover worker folders would show.

    Its decoded images are cached on disk, in one folder for both workers (as on a
    shared home folder); on 33 images the disk cache's shuffle buffer holds them all,
    so the batches are those of the memory cache the reference run used.
    """
    work = tmp_path_factory.mktemp("two-workers")
    (work / "tmp").mkdir()
    cmd = mdtrain_cmd(
        "launch",
        "--workers",
        2,
        "--log-dir",
        work / "logs",
        "--",
        "--data",
        dataset(tmp_path_factory),
        *TRAIN_ARGS,
        "--cache",
        "disk",
        "--cache-dir",
        work / "cache",
        "--output",
        work / "out",
    )
    started = time.monotonic()
    proc = subprocess.run(
        cmd,
        env={**env(), "TMPDIR": str(work / "tmp")},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return proc, work, time.monotonic() - started


def test_two_workers_on_loopback_only_the_chief_writes(two_workers):
    proc, work, _ = two_workers
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "[launch] 2 workers on 127.0.0.1" in proc.stdout
    assert sorted(p.name for p in (work / "out").iterdir()) == [
        "history.json",
        "model.keras",
        "report.json",
    ]
    assert list((work / "tmp").glob("mdtrain-worker-*")) == []  # worker 1's outputs removed
    chief, other = ((work / "logs" / f"worker-{i}.log").read_text() for i in (0, 1))
    assert "with 2 replica(s): global batch 10 = 5 per replica x 2 replica(s)" in chief
    assert "worker 1: global batch 10 = 5 per replica x 2 replica(s)" in other
    assert "Epoch 2/2" in chief and "Epoch" not in other  # only the chief reports progress
    filled = sorted(p.name for p in (work / "cache").glob("mdtrain-*/*.index"))
    assert filled == ["train-worker-0.index", "train-worker-1.index", "val-worker-0.index",
                      "val-worker-1.index"]  # fmt: skip


def test_two_workers_match_one_process_with_two_replicas(two_workers, tmp_path_factory):
    proc, work, _ = two_workers
    assert proc.returncode == 0, proc.stdout[-3000:]
    difference = max_relative_difference(
        reference_run(tmp_path_factory), work / "out" / "model.keras"
    )
    assert difference == 0.0  # bit for bit, per-replica BatchNormalization included


def test_deterministic_runs_measure_their_input_wait(two_workers, tmp_path_factory):
    """Op determinism refuses tf.timestamp, so ExactTrainer's graph keeps no clock: the run's
    monitor stamps the training batches instead (`mdtrain.parts.segment_loop`), under
    several workers (each its own pipeline) and in one process with 2 replicas."""
    proc, work, _ = two_workers
    assert proc.returncode == 0, proc.stdout[-3000:]
    reference = reference_run(tmp_path_factory).parent
    for report in (work / "out" / "report.json", reference / "report.json"):
        monitor = json.loads(report.read_text())["monitor"]
        assert monitor["input_wait_share"] is not None, (report, monitor)
        assert not monitor["verdict"].startswith("unknown"), (report, monitor["verdict"])


def _worker_pid(launcher: subprocess.Popen, index: int) -> int | None:
    for child in psutil.Process(launcher.pid).children():
        try:
            if child.environ().get("MDTRAIN_WORKER_INDEX") == str(index):
                return child.pid
        except psutil.Error:
            pass
    return None


def test_killed_worker_is_restarted_and_resumes(two_workers, tmp_path_factory, tmp_path):
    backup, out = tmp_path / "backup", tmp_path / "out"
    cmd = mdtrain_cmd(
        "launch",
        "--workers",
        2,
        "--restarts",
        1,
        "--log-dir",
        tmp_path / "logs",
        "--",
        "--data",
        dataset(tmp_path_factory),
        *TRAIN_ARGS,
        "--backup-dir",
        backup,
        "--backup-every-steps",
        2,
        "--output",
        out,
    )
    launcher = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: backed_up_at(backup) is not None, launcher)
        os.kill(_worker_pid(launcher, 1), signal.SIGKILL)
        output, _ = launcher.communicate(timeout=TIMEOUT_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output[-3000:]
    assert "worker 1 exited with code -9; stopping the others; restart 1 of 1" in output
    assert "resuming from" in (tmp_path / "logs" / "worker-1.log").read_text()
    # Resumed after the crash == the same 2 workers uninterrupted.
    _, work, _ = two_workers
    assert max_relative_difference(work / "out" / "model.keras", out / "model.keras") < 1e-4
    # ... and logs the same figures, the resumed epoch's training metrics included.
    assert_same_history(work / "out" / "history.json", out / "history.json", rel=1e-4)
