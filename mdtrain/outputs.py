"""A finished run's output folder: written whole, or written elsewhere, never lost.

`TrainConfig.validate` checks the folder before training; it is written after.
If writing fails then (the disk filled up, the folder went away), the files go
to a new temporary folder and the one-line error names it: a full disk does
not cost the hours of training before it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mdtrain.errors import UsageError


def save_or_rescue(output: str | os.PathLike, save: Callable[[Path], None]) -> None:
    """Calls `save(folder)` on `output`, created if missing; on failure, on a new temporary folder.

    Args:
        output: the run's `--output` folder.
        save: writes the run's files into the folder it is given.

    Raises:
        UsageError: when `output` could not be written; names the folder
            that holds the files instead.
    """
    try:
        Path(output).mkdir(parents=True, exist_ok=True)
        save(Path(output))
    except OSError as e:
        rescue = Path(tempfile.mkdtemp(prefix="mdtrain-run-"))
        save(rescue)
        raise UsageError(f"--output {output}: cannot write ({e.strerror or e}); "
                         f"the run's outputs were saved to {rescue} instead") from None  # fmt: skip


def save_and_discard(save: Callable[[Path], None]) -> None:
    """Calls `save(folder)` on a temporary folder, then deletes it.

    What the workers of a multi-worker run other than the chief do: every
    worker must take part in saving (it can involve collectives), but only
    the chief's files are kept.
    """
    out = Path(tempfile.mkdtemp(prefix="mdtrain-worker-"))
    try:
        save(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
