"""Where a disk cache of decoded images lives, and who may fill it.

`tf.data.Dataset.cache(prefix)` fills `prefix` during the first pass and
reads it on every later one, in this run and in the next. Two things make a
shared file prefix fragile, and this module handles both:

- what is cached must decide the prefix: the prefix hashes the image side,
  the order, and every file's name, size and modification time, so a changed
  file is never served from an old cache;
- only one process may fill a prefix: TensorFlow marks a cache being filled
  with `<prefix>_0.lockfile` and refuses to fill it while that file exists.
  A process killed mid-fill (preempted, out of memory) leaves the file
  behind, and every later run would stop on it. This process takes an OS
  lock (`fcntl.flock`) beside the cache, which the OS drops when its holder
  dies: a live filler is reported in one line, a dead one's leftovers are
  removed. Workers of one multi-worker job each fill their own prefix.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import TextIO

from mdtrain.errors import UsageError

try:
    import fcntl
except ImportError:  # Windows: no flock; a killed run's lockfile must be removed by hand
    fcntl = None

#: The prefixes this process fills, each with its lock, held until the process exits.
_CLAIMED: dict[str, TextIO] = {}


def cache_prefix(
    folder: str | os.PathLike,
    files: list[str],
    image_size: int,
    order_key,
    split: str,
    task: str | None = None,
) -> str:
    """The file prefix of a disk cache, which changes whenever what it would hold changes.

    Args:
        folder: the cache folder (`--cache-dir`, or mdtrain's own).
        files: the image files, in the order they are cached.
        image_size: the side they are resized to.
        order_key: anything else that changes the cached order (JSON-able).
        split: `"train"` or `"val"`.
        task: this process's task in a multi-worker cluster (`"worker-1"`),
            or None outside one: each task fills its own cache (a shared
            folder would have them all write the same files).

    Returns:
        The prefix to pass to `tf.data.Dataset.cache`; its folder exists.
    """
    h = hashlib.sha256()
    h.update(json.dumps([image_size, order_key]).encode())
    for f in files:  # a changed file must not be served from an old cache
        st = os.stat(f)
        h.update(os.fsencode(f) + f"\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    where = Path(folder) / f"mdtrain-{h.hexdigest()[:16]}"
    where.mkdir(parents=True, exist_ok=True)
    return str(where / (split if task is None else f"{split}-{task}"))


def claim(prefix: str) -> None:
    """Makes this process the one that fills the cache `prefix`, unless it is complete.

    Removes what a killed filler left (its lockfile and temporary data);
    does nothing when the cache is complete (it is only read) or already
    this process's.

    Raises:
        UsageError: when a live process is filling the same cache now.
    """
    if fcntl is None or prefix in _CLAIMED or os.path.exists(prefix + ".index"):
        return
    lock = open(prefix + ".mdtrain-lock", "a")  # noqa: SIM115  (held until the process exits)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise UsageError(
            f"--cache disk: another process is filling the cache {Path(prefix).parent} now; "
            "wait until its first epoch ends, or use --cache memory or none"
        ) from None
    _CLAIMED[prefix] = lock
    for leftover in glob.glob(glob.escape(prefix) + "_*"):  # a killed filler's
        os.remove(leftover)
