"""Fault drills for the lessons and tests: kill a worker at a known step, then watch it resume.

A drill has two halves. `MarkAfter`, given to the chief's run through
`mdtrain.train(config, callbacks=[...])`, writes a mark file after N training
steps; `kill_worker_when`, called just before `mdtrain.launch`, kills a worker
with SIGKILL once that file (or a backup's) appears. They are course material,
not the library: `mdtrain train --help` has no drill options (issue 35).

`MarkAfter` loads on first use, so that importing `kill_worker_when` loads no
TensorFlow: notebook 07 starts its workers before it chooses its own devices.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import threading
import time

import psutil

from mdtrain.launcher.processes import POLL_S


def kill_worker_when(
    pattern: str | os.PathLike, index: int, timeout_s: float = 600.0
) -> threading.Thread:
    """Kills worker `index` with SIGKILL once a file matching `pattern` exists (a fault drill).

    For demonstrating and testing `--restarts` with `--backup-dir`: call it just
    before `launch` or `run_workers` in the same process, with e.g.
    `"backup/mdtrain-backup.json"` (the manifest written after each backup), so
    a worker dies right after the first backup.

    Args:
        pattern: a glob pattern, absolute or relative to the current folder.
        index: the worker to kill (its `MDTRAIN_WORKER_INDEX`).
        timeout_s: give up after this many seconds. Defaults to `600.0`.

    Returns:
        The watching daemon thread.
    """

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not glob.glob(str(pattern)):
            if time.monotonic() > deadline:
                return  # the drill never came: a later job's worker must not pay for it
            time.sleep(POLL_S)
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):  # a child that is gone, or not ours to read
                if child.environ().get("MDTRAIN_WORKER_INDEX") == str(index):
                    child.send_signal(signal.SIGKILL)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def __getattr__(name: str):
    if name == "MarkAfter":  # a Keras callback: Keras, and so TensorFlow, only now
        from mdtrain_course.mark_after import MarkAfter

        return MarkAfter
    raise AttributeError(f"module 'mdtrain_course.drills' has no attribute {name!r}")
