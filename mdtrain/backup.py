"""Backups a killed run resumes from exactly: weights, optimizer, dropout RNG, position.

Why not `keras.callbacks.BackupAndRestore` (Keras 3)? It does not save the
dropout layers' `SeedGenerator` state (other masks after a resume); it resumes
only at epoch starts, running a mid-epoch save's epoch again on updated weights;
with `double_checkpoint=True` it silently falls back to an older checkpoint; and
by default it deletes its backup after every `fit`, losing it between phases.

Layout of `backup_dir` (one folder per save, the newest two kept):

    ckpt-00003-000000/   epoch 3 (0-based, next to run), step 0 of it
        net.weights.h5   the network's weights (with BatchNorm statistics)
        state.npz        optimizer variables, dropout seed-generator states and,
                         within an epoch, the training metrics' sums and counts
        MANIFEST.json    position, run fingerprint, history, SHA-256 of the files above

Atomic saves, verified resumes, what is deleted and the multi-worker rules:
see docs/multi-worker.md (backups) and docs/numerics.md (exact resume).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import keras
import numpy as np

from mdtrain.errors import UsageError
from mdtrain.loop import build_optimizer
from mdtrain.plan import ResumePoint

NET_FILE, STATE_FILE, MANIFEST_FILE = "net.weights.h5", "state.npz", "MANIFEST.json"
_CKPT, _TMP = r"ckpt-\d{5}-\d{6}$", "mdtrain-tmp-"  # the names of saves and unfinished saves
_FILES, _KEEP = {NET_FILE, STATE_FILE, MANIFEST_FILE}, 2


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()  # block by block: the optimizer state can be a gigabyte
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _corrupt(backup_dir, ckpt: Path, why: str) -> UsageError:
    return UsageError(
        f"--backup-dir {backup_dir}: backup {ckpt.name} is corrupt or partial ({why}); "
        "nothing was loaded: move the folder away to start afresh"
    )


def resume_point(
    backup_dir: str | os.PathLike | None,
    fingerprint: dict | None = None,
    chief: bool = True,
    say=print,
) -> ResumePoint:
    """Where a run resumes: the newest backup, verified (the chief drops unfinished saves first)."""
    if not backup_dir:
        return ResumePoint()
    if chief:
        for path in _folders(backup_dir, _TMP):
            shutil.rmtree(path, ignore_errors=True)
            say(f"backup: removed {path.name}, a save that a killed process left unfinished")
    ckpt = max(_folders(backup_dir, _CKPT), default=None)  # the newest
    if ckpt is None:
        return ResumePoint()
    try:
        manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
        files = manifest["files"]
        point = ResumePoint(
            int(manifest["epoch"]),
            int(manifest["step"]),
            int(manifest.get("phase", 0)),
            ckpt,
            manifest.get("fingerprint", {}),
            list(manifest.get("history", [])),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _corrupt(
            backup_dir, ckpt, f"{MANIFEST_FILE} unreadable: {type(e).__name__}"
        ) from None
    for name in (NET_FILE, STATE_FILE):
        path = ckpt / name
        if name not in files or not path.is_file():
            raise _corrupt(backup_dir, ckpt, f"{name} missing")
        if _sha256(path) != files[name]:
            raise _corrupt(backup_dir, ckpt, f"{name} fails its SHA-256 checksum")
    if fingerprint is not None and point.fingerprint != fingerprint:
        changed = sorted(k for k in fingerprint if point.fingerprint.get(k) != fingerprint[k])
        cache = "disk" if point.fingerprint.get("disk_cache") else "memory"
        hint = f" with --cache {cache} (auto goes by free memory)" * ("disk_cache" in changed)
        raise UsageError(
            f"--backup-dir {backup_dir}: the backup was made by a run with other settings "
            f"({', '.join(changed) or 'fingerprint'} differ); use the same command{hint}, or "
            "another --backup-dir"
        )
    where = f"epoch {point.epoch + 1}" + (f", step {point.step + 1}" if point.step else "")
    print(f"resuming from {point.path} at {where}", flush=True)
    return point


def _rng_state(net: keras.Model) -> list:
    """The dropout seed generators' state: `Layer.variables` minus `weights`, as Keras documents."""
    weights = {id(w) for w in net.weights}
    state = [v for v in net.variables if id(v) not in weights]
    # Dropout without any: Keras moved it, and a resumed run would silently stop being exact.
    if not state and any(isinstance(layer, keras.layers.Dropout) for layer in _all_layers(net)):
        raise RuntimeError(
            "mdtrain.backup: this Keras version keeps the dropout seed state outside "
            "Layer.variables; backups would not resume exactly (report it to mdtrain)"
        )
    return state


def _all_layers(model: keras.Model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)


def _assign(variables: list, values: list, what: str, path: Path) -> None:
    """Puts a backup's `values` into `variables`; refuses a backup holding another number."""
    if len(values) != len(variables):
        raise UsageError(f"backup {path}: {len(values)} {what} for {len(variables)}")
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def restore(trainer, point: ResumePoint, with_optimizer: bool = True) -> None:
    """Loads a verified backup into a built `ExactTrainer` compiled for the phase being resumed."""
    try:
        trainer.net.load_weights(point.path / NET_FILE)
        with np.load(point.path / STATE_FILE) as state:
            seeds = [state[f"seed_{i}"] for i in range(int(state["num_seeds"]))]
            optimizer = [state[f"opt_{i}"] for i in range(int(state["num_opt"]))]
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(
            f"backup {point.path}: does not fit this model ({type(e).__name__}: {e}); "
            "use another --backup-dir"
        ) from None
    _assign(_rng_state(trainer.net), seeds, "random states", point.path)
    if with_optimizer:
        build_optimizer(trainer)
        _assign(trainer.optimizer.variables, optimizer, "optimizer variables", point.path)


def _restore_metrics(trainer, path: Path) -> bool:
    """Puts a mid-epoch backup's metric sums back; False, changing nothing, if it has none."""
    with np.load(path / STATE_FILE) as state:
        if "num_metrics" not in state:  # an epoch-end backup, or an older mdtrain's
            return False
        values = [state[f"metric_{i}"] for i in range(int(state["num_metrics"]))]
    # Assigned outside a replica context, a summed variable gets an equal share
    # on every replica, so its value read back is the saved one.
    _assign([v for m in trainer.metrics for v in m.variables], values, "metric variables", path)
    return True


def save(
    backup_dir: str | os.PathLike, trainer, point: ResumePoint, metrics: list | None = None
) -> Path:
    """Writes a complete backup at `point` (within an epoch with `metrics`); drops older ones."""
    root = Path(backup_dir)
    final = root / f"ckpt-{point.epoch:05d}-{point.step:06d}"
    if final.exists() and not _ours(final):
        raise UsageError(
            f"--backup-dir {backup_dir}: {final.name} holds files that are not "
            "an mdtrain backup; nothing was overwritten: use another --backup-dir"
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP, dir=root))
    trainer.net.save_weights(tmp / NET_FILE)
    seeds, optimizer = _rng_state(trainer.net), trainer.optimizer.variables
    arrays = {f"seed_{i}": v.numpy() for i, v in enumerate(seeds)}
    arrays |= {f"opt_{i}": v.numpy() for i, v in enumerate(optimizer)}
    if metrics is not None:
        arrays |= {f"metric_{i}": v for i, v in enumerate(metrics)} | {"num_metrics": len(metrics)}
    np.savez(tmp / STATE_FILE, num_seeds=len(seeds), num_opt=len(optimizer), **arrays)
    files = {name: _sha256(tmp / name) for name in (NET_FILE, STATE_FILE)}
    manifest = dataclasses.asdict(point) | {"files": files}
    del manifest["path"]  # the folder's name
    # Written last: its presence means complete. All on disk before the rename.
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    for name in (NET_FILE, STATE_FILE, MANIFEST_FILE):
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    if final.exists():  # the same position saved again (a resumed run): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in _folders(root, _CKPT)[:-_KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _ours(folder: Path) -> bool:
    """Whether mdtrain could have written `folder`: it holds nothing but a backup's files."""
    return folder.is_dir() and {p.name for p in folder.iterdir()} <= _FILES


def _folders(backup_dir: str | os.PathLike, name: str) -> list[Path]:
    """mdtrain's folders in `backup_dir` whose names match the pattern `name`, oldest first."""
    root = Path(backup_dir)
    folders = root.iterdir() if root.is_dir() else ()
    return sorted(p for p in folders if re.match(name, p.name) and _ours(p))


def remove_backups(backup_dir: str | os.PathLike) -> None:
    """Deletes mdtrain's backups (and the folder if then empty) after a finished run."""
    for path in [*_folders(backup_dir, _CKPT), *_folders(backup_dir, _TMP)]:
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # other files are the user's
        Path(backup_dir).rmdir()


@dataclasses.dataclass(eq=False)
class Backup(keras.callbacks.Callback):
    """Saves a backup at each epoch end and, optionally, every `every_steps` steps."""

    backup_dir: str
    fingerprint: dict
    phase: int
    steps_per_epoch: int
    every_steps: int | None
    step_offset: int  # steps of the first epoch done before this `fit` (a mid-epoch resume)
    write: bool  # False on non-chief workers, which only restore
    history: list[dict[str, float]]  # the epochs before this `fit`; each epoch adds its row
    # A mid-epoch resume's backup: its metric state is put back after `fit` resets the metrics.
    resumed_from: Path | None

    def __post_init__(self):
        super().__init__()
        self.history = list(self.history)
        self._epoch = 0

    def _save(self, epoch: int, step: int) -> None:
        # Within an epoch, the metrics' sums and counts too. Under a strategy each is read
        # summed over the replicas; under multi-worker training that read is a collective,
        # so every worker reads them.
        metrics = [v.numpy() for m in self.model.metrics for v in m.variables] if step else None
        if self.write:
            point = ResumePoint(epoch, step, self.phase, None, self.fingerprint, self.history)
            save(self.backup_dir, self.model, point, metrics)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._step = epoch, self.step_offset
        if self.step_offset and self.resumed_from is not None:
            if not _restore_metrics(self.model, self.resumed_from) and self.write:
                print(
                    f"backup: {self.resumed_from.name} holds no training metrics (an older "
                    "mdtrain made it): this epoch's figures count the steps after the resume",
                    flush=True,
                )

    def on_train_batch_end(self, batch, logs=None):
        # With N steps per call (`steps_per_execution`) a batch ends every N steps: the backup
        # comes at the first end at or past each multiple of `every_steps`, where it stands.
        before, self._step = self._step, self.step_offset + batch + 1
        # The epoch's last step is saved by on_epoch_end, after validation.
        every = self.every_steps
        if every and self._step // every > before // every and self._step < self.steps_per_epoch:
            self._save(self._epoch, self._step)

    def on_epoch_end(self, epoch, logs=None):
        self.step_offset = 0  # only the first epoch of a resumed fit starts part-way
        self.history.append({name: float(value) for name, value in (logs or {}).items()})
        self._save(epoch + 1, 0)
