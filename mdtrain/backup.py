"""Backups a killed run resumes from exactly: weights, optimizer, dropout RNG, position.

Why not `keras.callbacks.BackupAndRestore` (Keras 3)? It saves the weights and
optimizer but not the dropout layers' `SeedGenerator` state, so a resumed run
draws different dropout masks; it resumes only at epoch starts even when it
saved mid-epoch (the epoch is then run again on already-updated weights); with
`double_checkpoint=True` it silently falls back to the previous checkpoint when
the newest cannot be read; and it deletes its backup after every `fit`, which
loses the state between a training and a fine-tuning phase.

Layout of `backup_dir` (one folder per save, the newest two kept):

    ckpt-00003-000000/   epoch 3 (0-based, next to run), step 0 of it
        net.weights.h5   the network's weights (with BatchNorm statistics)
        state.npz        optimizer variables, dropout seed-generator states and,
                         within an epoch, the training metrics' sums and counts
        MANIFEST.json    position, run fingerprint, SHA-256 of the files above

A save is written to a `mdtrain-tmp-*` folder, the manifest last, then
renamed into place, so a process killed mid-save leaves a `mdtrain-tmp-*`
folder that is never loaded. On resume the newest `ckpt-*` folder is verified
file by file; a mismatch is an error (`UsageError`), never a silent fall-back.
The manifest also keeps the per-epoch history so far, so a resumed run
reports every epoch; with the metric state of a save within an epoch, the
resumed epoch reports what the uninterrupted run would (a backup made
before mdtrain kept that state still resumes, its epoch's training figures
counting only the steps after the resume). mdtrain removes only folders it
could have written (named as above, holding nothing but its three files):
other files in `backup_dir` are the user's.

Under multi-worker training only the chief writes; every worker restores from
the same folder, which must therefore be on a filesystem all workers share.
"""

from __future__ import annotations

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
from mdtrain.plan import ResumePoint

NET_FILE, STATE_FILE, MANIFEST_FILE = "net.weights.h5", "state.npz", "MANIFEST.json"
_CKPT = re.compile(r"^ckpt-(\d{5})-(\d{6})$")
_TMP_PREFIX = "mdtrain-tmp-"
_TMP = re.compile(f"^{_TMP_PREFIX}")
_KEEP = 2


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _corrupt(backup_dir, ckpt: Path, why: str) -> UsageError:
    return UsageError(
        f"--backup-dir {backup_dir}: backup {ckpt.name} is corrupt or partial ({why}); "
        "nothing was loaded: move the folder away to start afresh"
    )


def find_resume_point(
    backup_dir: str | os.PathLike, fingerprint: dict | None = None
) -> ResumePoint:
    """Finds and verifies the newest backup in `backup_dir`.

    Args:
        backup_dir: the run's `--backup-dir`.
        fingerprint: what must match between the saving and the resuming run
            (model, image size, batch, seed, ...). Defaults to None (not checked).

    Returns:
        The `ResumePoint`; epoch 0, step 0 and no path when there is no backup.

    Raises:
        UsageError: if the newest backup is missing a file, fails its checksum,
            or was made by a run with another fingerprint.

    Example:
        >>> find_resume_point("/nonexistent").epoch
        0
    """
    ckpts = _backups(backup_dir)
    if not ckpts:
        return ResumePoint()
    ckpt = ckpts[-1]
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
    return point


def resume_point(
    backup_dir: str | os.PathLike | None, fingerprint: dict, chief: bool = True, say=print
) -> ResumePoint:
    """The verified backup a run resumes from (the start when none); says one line about it.

    The chief first removes saves that a killed process left unfinished.

    Args:
        backup_dir: the run's `--backup-dir`, or None (no backups: the start).
        fingerprint: the run's settings a backup must match.
        chief: whether this process may remove unfinished saves. Defaults to True.
        say: prints a line of progress. Defaults to `print`.

    Returns:
        The `ResumePoint`.

    Raises:
        UsageError: see `find_resume_point`.
    """
    if not backup_dir:
        return ResumePoint()
    if chief:
        for name in remove_unfinished(backup_dir):
            say(f"backup: removed {name}, a save that a killed process left unfinished")
    point = find_resume_point(backup_dir, fingerprint)
    if point.path is not None:
        where = f"epoch {point.epoch + 1}" + (f", step {point.step + 1}" if point.step else "")
        print(f"resuming from {point.path} at {where}", flush=True)
    return point


def _rng_state(net: keras.Model) -> list:
    """The random-number state of `net` (its dropout seed generators).

    Keras documents `Layer.variables` as `weights` plus all other state,
    random seeds included; the difference is the RNG state. A network with
    dropout must have some: finding none means Keras moved it, and a resumed
    run would silently stop being exact.
    """
    weights = {id(w) for w in net.weights}
    state = [v for v in net.variables if id(v) not in weights]
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


def restore(trainer, point: ResumePoint, with_optimizer: bool = True) -> None:
    """Loads a verified backup into a built, compiled `ExactTrainer`.

    Args:
        trainer: the trainer, compiled for the phase being resumed.
        point: from `find_resume_point`.
        with_optimizer: also load the optimizer variables (False when the
            backup ended a phase and the next phase starts a fresh optimizer).
            Defaults to True.

    Raises:
        UsageError: if the backup does not fit the model.
    """
    net = trainer.net
    try:
        net.load_weights(point.path / NET_FILE)
        with np.load(point.path / STATE_FILE) as state:
            seeds = [state[f"seed_{i}"] for i in range(int(state["num_seeds"]))]
            optimizer = [state[f"opt_{i}"] for i in range(int(state["num_opt"]))]
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(
            f"backup {point.path}: does not fit this model ({type(e).__name__}: {e}); "
            "use another --backup-dir"
        ) from None
    state = _rng_state(net)
    if len(seeds) != len(state):
        raise UsageError(f"backup {point.path}: {len(seeds)} random states for {len(state)}")
    for variable, value in zip(state, seeds, strict=True):
        variable.assign(value)
    if with_optimizer:
        from mdtrain.loop import build_optimizer

        build_optimizer(trainer)
        variables = trainer.optimizer.variables
        if len(variables) != len(optimizer):
            raise UsageError(
                f"backup {point.path}: {len(optimizer)} optimizer variables for {len(variables)}"
            )
        for v, value in zip(variables, optimizer, strict=True):
            v.assign(value)


def metric_state(trainer) -> list[np.ndarray]:
    """The values of `trainer`'s metric variables (Keras' `Metric.variables`: sums, counts).

    Under a strategy each variable is read summed over the replicas; under
    multi-worker training that read is a collective, so every worker must call this.

    Args:
        trainer: the `ExactTrainer` being trained.

    Returns:
        One array per variable, in `trainer.metrics` order.
    """
    return [np.asarray(v.numpy()) for m in trainer.metrics for v in m.variables]


def restore_metrics(trainer, path: Path) -> bool:
    """Puts the metric state saved in the backup at `path` back into `trainer`'s metrics.

    Assigned outside a replica context, a summed variable gets an equal share
    on every replica, so its value read back is the saved one.

    Args:
        trainer: the `ExactTrainer`, its metrics just reset for the resumed epoch.
        path: a verified backup folder (`ResumePoint.path`).

    Returns:
        False, changing nothing, when the backup holds no metric state (an
        epoch-end backup, or one made before mdtrain saved it).

    Raises:
        UsageError: if the backup's metrics do not fit `trainer`'s.
    """
    with np.load(path / STATE_FILE) as state:
        if "num_metrics" not in state:
            return False
        values = [state[f"metric_{i}"] for i in range(int(state["num_metrics"]))]
    variables = [v for m in trainer.metrics for v in m.variables]
    if len(values) != len(variables):
        raise UsageError(f"backup {path}: {len(values)} metric variables for {len(variables)}")
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
    return True


def save(
    backup_dir: str | os.PathLike, trainer, point: ResumePoint, metrics: list | None = None
) -> Path:
    """Writes one complete backup of `trainer` at `point` and drops the older ones.

    Args:
        backup_dir: the folder.
        trainer: the `ExactTrainer` being trained.
        point: the position the backup resumes at (`path` is ignored).
        metrics: `metric_state(trainer)` of a save within an epoch, read on
            every worker. Defaults to None (an epoch end: none needed).

    Returns:
        The new `ckpt-*` folder.
    """
    root = Path(backup_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=root))
    trainer.net.save_weights(tmp / NET_FILE)
    seeds = [np.asarray(v.numpy()) for v in _rng_state(trainer.net)]
    optimizer = [np.asarray(v.numpy()) for v in trainer.optimizer.variables]
    arrays = {f"seed_{i}": s for i, s in enumerate(seeds)}
    arrays.update({f"opt_{i}": v for i, v in enumerate(optimizer)})
    if metrics is not None:
        arrays.update({f"metric_{i}": v for i, v in enumerate(metrics)}, num_metrics=len(metrics))
    np.savez(tmp / STATE_FILE, num_seeds=len(seeds), num_opt=len(optimizer), **arrays)
    files = {name: _sha256(tmp / name) for name in (NET_FILE, STATE_FILE)}
    manifest = {
        "epoch": point.epoch,
        "step": point.step,
        "phase": point.phase,
        "fingerprint": point.fingerprint,
        "history": point.history,
        "files": files,
    }
    with open(tmp / MANIFEST_FILE, "w") as f:  # written last: its presence means complete
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    for name in (NET_FILE, STATE_FILE):
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    final = root / f"ckpt-{point.epoch:05d}-{point.step:06d}"
    if final.exists() and not _ours(final):
        shutil.rmtree(tmp)
        raise UsageError(
            f"--backup-dir {backup_dir}: {final.name} holds files that are not "
            "an mdtrain backup; nothing was overwritten: use another --backup-dir"
        )
    if final.exists():  # the same position saved again (a resumed run): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in _backups(root)[:-_KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _ours(folder: Path) -> bool:
    """Whether mdtrain could have written `folder`: it holds nothing but a backup's files."""
    return folder.is_dir() and {p.name for p in folder.iterdir()} <= {
        NET_FILE, STATE_FILE, MANIFEST_FILE
    }  # fmt: skip


def _own_folders(backup_dir: str | os.PathLike, name: re.Pattern) -> list[Path]:
    """mdtrain's folders in `backup_dir` whose names match `name`, oldest first."""
    root = Path(backup_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if name.match(p.name) and _ours(p))


def _backups(backup_dir: str | os.PathLike) -> list[Path]:
    """mdtrain's complete or partial backups (`ckpt-*`), oldest first."""
    return _own_folders(backup_dir, _CKPT)


def _unfinished(backup_dir: str | os.PathLike) -> list[Path]:
    """Saves a killed process left half-written (`mdtrain-tmp-*`)."""
    return _own_folders(backup_dir, _TMP)


def remove_unfinished(backup_dir: str | os.PathLike) -> list[str]:
    """Deletes the saves a killed process left unfinished; returns their names."""
    gone = _unfinished(backup_dir)
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return [path.name for path in gone]


def remove_backups(backup_dir: str | os.PathLike) -> None:
    """Deletes mdtrain's backups (and the folder if then empty) after a finished run."""
    root = Path(backup_dir)
    if not root.is_dir():
        return
    for p in [*_backups(root), *_unfinished(root)]:
        shutil.rmtree(p, ignore_errors=True)
    try:
        root.rmdir()
    except OSError:
        pass  # other files are the user's


class Backup(keras.callbacks.Callback):
    """Saves a backup at each epoch end and, optionally, every `every_steps` steps.

    Args:
        backup_dir: the folder.
        fingerprint: stored with each backup, checked on resume.
        phase: 0 for training, 1 for fine-tuning.
        steps_per_epoch: steps in one epoch.
        every_steps: also save after every this many steps within an epoch.
            Defaults to None (epoch ends only).
        step_offset: steps of the first epoch done before this `fit` (a
            mid-epoch resume). Defaults to 0.
        write: False on non-chief workers, which only restore. Defaults to True.
        history: the rows of the epochs finished before this `fit` (earlier
            phases, and a resumed run's earlier epochs); each epoch this `fit`
            ends adds its row, and every backup stores them. Defaults to None.
        resumed_from: the backup a mid-epoch resume loaded: the first epoch's
            metrics continue from its metric state, put back after `fit` (or
            `custom_fit`) reset them as the epoch began. Defaults to None.
    """

    def __init__(
        self,
        backup_dir,
        fingerprint: dict,
        phase: int,
        steps_per_epoch: int,
        every_steps=None,
        step_offset: int = 0,
        write: bool = True,
        history: list[dict[str, float]] | None = None,
        resumed_from: Path | None = None,
    ):
        super().__init__()
        self.backup_dir, self.fingerprint, self.phase = backup_dir, fingerprint, phase
        self.steps_per_epoch = steps_per_epoch
        self.every_steps, self.step_offset, self.write = every_steps, step_offset, write
        self.history, self.resumed_from = list(history or []), resumed_from
        self._epoch = 0

    def _save(self, epoch: int, step: int) -> None:
        metrics = metric_state(self.model) if step else None  # on every worker: a collective
        if self.write:
            point = ResumePoint(epoch, step, self.phase, None, self.fingerprint, self.history)
            save(self.backup_dir, self.model, point, metrics)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.step_offset and self.resumed_from is not None:
            if not restore_metrics(self.model, self.resumed_from) and self.write:
                print(f"backup: {self.resumed_from.name} holds no training metrics (an older "
                      "mdtrain made it): this epoch's figures count the steps after the resume",
                      flush=True)  # fmt: skip

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_offset + batch + 1
        # The epoch's last step is saved by on_epoch_end, after validation.
        if self.every_steps and step % self.every_steps == 0 and step < self.steps_per_epoch:
            self._save(self._epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        self.step_offset = 0  # only the first epoch of a resumed fit starts part-way
        self.history.append({name: float(value) for name, value in (logs or {}).items()})
        self._save(epoch + 1, 0)
