"""Backups a killed run resumes from exactly: weights, optimizer, dropout RNG, metrics, position.

A backup is a `tf.train.Checkpoint` written by a `tf.train.CheckpointManager`
and mdtrain's manifest beside it, written after its checkpoint. Why not Keras'
`BackupAndRestore`, the folder's layout, what is deleted and the multi-worker
rules: docs/multi-worker.md, "Fault tolerance"; exact resume: docs/numerics.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import keras

from mdtrain.errors import UsageError
from mdtrain.loop import build_optimizer
from mdtrain.plan import ResumePoint

MANIFEST_FILE = "mdtrain-backup.json"
CHECKPOINT_NAME = "mdtrain-ckpt"
STATE_FILE = "checkpoint"  # `CheckpointManager`'s own list of its checkpoints
FORMAT = 2  # the manifest's "format"; 1 was the hand-written one-folder-per-save layout
_KEEP = 2
# A checkpoint's files, and what a save under way writes first (TensorFlow's temporary
# folder `_temp`, `.index.tempstate<n>`; `checkpoint.tmp<hex>`; the manifest's `.tmp`).
_CHECKPOINT_FILE = re.compile(
    rf"({CHECKPOINT_NAME}-(\d+))((\.index|\.data-\d+-of-\d+)(\.tempstate\d+)?|_temp)$"
)
_TEMPORARY = re.compile(rf"({re.escape(MANIFEST_FILE)}\..+\.tmp|{STATE_FILE}\.tmp[0-9a-f]+)$")
# Format 1: `ckpt-EEEEE-SSSSSS/` (and `mdtrain-tmp-*/` mid-save) holding these files.
_FORMAT_1 = re.compile(r"(ckpt-\d{5}-\d{6}|mdtrain-tmp-.+)$")
_FORMAT_1_FILES = {"net.weights.h5", "state.npz", "MANIFEST.json"}


def resume_point(
    backup_dir: str | os.PathLike | None,
    fingerprint: dict | None = None,
    chief: bool = True,
    say=print,
) -> ResumePoint:
    """Where a run resumes: the checkpoint the manifest in `backup_dir` names, verified.

    Every tensor of the checkpoint is read back and the fingerprint compared
    before anything is loaded; then the chief removes what a killed run left
    (docs/multi-worker.md, "Fault tolerance").

    Args:
        backup_dir: the `--backup-dir`; None or "" for a run without backups.
        fingerprint: the run's settings; a backup made under others is
            refused. Defaults to None (not compared).
        chief: whether this process may remove leftovers (other workers
            only read). Defaults to True.
        say: prints one line about each leftover removed. Defaults to `print`.

    Returns:
        The `ResumePoint` of the backup, `path` its checkpoint's prefix; the
        start (`ResumePoint()`) without one.

    Raises:
        UsageError: a backup in an older mdtrain's format, another TensorFlow
            checkpoint's list in the folder, a corrupt or partial backup, or
            one made under other settings; nothing is touched then.

    Example:

    >>> point = resume_point("runs/backup", run_fingerprint)  # doctest: +SKIP
    >>> point.epoch, point.step
    (3, 120)
    """
    if not backup_dir:
        return ResumePoint()
    root = Path(backup_dir)
    _check_folder(root, backup_dir, chief)
    point = _read_manifest(root, backup_dir)
    if point is not None:
        _verify(point.path, backup_dir)
        _check_fingerprint(point, fingerprint, backup_dir)
    if chief:
        _remove_leftovers(root, point.path.name if point else None, say)
    if point is None:
        return ResumePoint()
    where = f"epoch {point.epoch + 1}" + (f", step {point.step + 1}" if point.step else "")
    print(f"resuming from {point.path} at {where}", flush=True)
    return point


def _check_folder(root: Path, backup_dir, chief: bool = True) -> None:
    """Refuses a folder holding a format-1 backup, or a list of checkpoints not mdtrain's.

    Only the chief, whose manager would delete what the list names, checks the list: it
    removes the list when it resumes, and another worker could find it gone mid-read.
    """
    format_1 = [path.name for path in _entries(root) if _is_format_1(path)]
    if format_1:
        raise UsageError(
            f"--backup-dir {backup_dir}: holds a backup in an older mdtrain's format "
            f"({min(format_1)}/), which this version cannot resume; delete {backup_dir} "
            "(or move it away) to start afresh, or pass another --backup-dir"
        )
    if chief and (root / STATE_FILE).exists() and not _state_is_ours(root):
        raise UsageError(
            f"--backup-dir {backup_dir}: its file '{STATE_FILE}' lists TensorFlow checkpoints "
            "that mdtrain did not write; nothing was touched: use another --backup-dir"
        )


def _is_format_1(path: Path) -> bool:
    """A folder an earlier mdtrain wrote: the name, and nothing but its backup files."""
    return (
        bool(_FORMAT_1.match(path.name))
        and path.is_dir()
        and {p.name for p in path.iterdir()} <= _FORMAT_1_FILES
    )


def _state_is_ours(root: Path) -> bool:
    """Whether the manager's list in `root` names only mdtrain's checkpoints."""
    import tensorflow as tf

    try:
        state = tf.train.get_checkpoint_state(str(root))
    except Exception:  # noqa: BLE001 - TensorFlow raises its own errors for a foreign file
        return False
    names = (
        [] if state is None else [state.model_checkpoint_path, *state.all_model_checkpoint_paths]
    )
    return state is not None and all(_numbered(Path(name).name) is not None for name in names)


def _numbered(name: str) -> int | None:
    """The number of checkpoint prefix `name` (`mdtrain-ckpt-37`), or None if not one."""
    match = re.fullmatch(rf"{CHECKPOINT_NAME}-(\d+)", name)
    return int(match[1]) if match else None


def _corrupt(backup_dir, name: str, why: str) -> UsageError:
    return UsageError(
        f"--backup-dir {backup_dir}: backup {name} is corrupt or partial ({why}); "
        "nothing was loaded: move the folder away to start afresh"
    )


def _read_manifest(root: Path, backup_dir) -> ResumePoint | None:
    """The manifest's `ResumePoint` (`path`: the checkpoint it names); None if there is none."""
    path = root / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        version = manifest.get("format")
        if version == FORMAT:
            point = ResumePoint(
                int(manifest["epoch"]),
                int(manifest["step"]),
                int(manifest["phase"]),
                root / _checkpoint_name(manifest["checkpoint"]),
                dict(manifest["fingerprint"]),
                list(manifest["history"]),
            )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        why = f"{MANIFEST_FILE} unreadable: {type(error).__name__}"
        raise _corrupt(backup_dir, MANIFEST_FILE, why) from None
    if version != FORMAT:
        raise UsageError(
            f"--backup-dir {backup_dir}: its backup is in format {version!r}, not this "
            f"mdtrain's {FORMAT}; resume it with the mdtrain that wrote it, or pass another "
            "--backup-dir"
        )
    return point


def _checkpoint_name(name: str) -> str:
    if _numbered(name) is None:
        raise ValueError(f"{name!r} names no checkpoint")
    return name


def _verify(prefix: Path, backup_dir) -> None:
    """Reads every tensor of checkpoint `prefix` back: TensorFlow checks each one's CRC32C."""
    import tensorflow as tf

    if not prefix.with_name(prefix.name + ".index").is_file():
        raise _corrupt(backup_dir, prefix.name, f"{prefix.name}.index missing")
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # noqa: BLE001 - truncation surfaces as IndexError, too
        raise _corrupt(backup_dir, prefix.name, _first_line(error)) from None


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160]}" if text else type(error).__name__


def _check_fingerprint(point: ResumePoint, fingerprint: dict | None, backup_dir) -> None:
    """Refuses a backup made under settings other than `fingerprint`."""
    if fingerprint is None or point.fingerprint == fingerprint:
        return
    changed = sorted(k for k in fingerprint if point.fingerprint.get(k) != fingerprint[k])
    hint = ""
    if "disk_cache" in changed:  # `--cache auto` chooses by free memory, which varies
        cache = "disk" if point.fingerprint.get("disk_cache") else "memory"
        hint = f" with --cache {cache} (auto goes by free memory)"
    raise UsageError(
        f"--backup-dir {backup_dir}: the backup was made by a run with other settings "
        f"({', '.join(changed) or 'fingerprint'} differ); use the same command{hint}, or "
        "another --backup-dir"
    )


def _remove_leftovers(root: Path, keep: str | None, say) -> None:
    """Removes mdtrain's files in `root` but the manifest and the checkpoint `keep` names,
    saying which saves (newer than `keep`, or any without a manifest) a killed run left."""
    kept = _numbered(keep) if keep else -1
    said = set()
    for path in sorted(_entries(root)):
        match = _CHECKPOINT_FILE.match(path.name)
        unfinished = bool(match) and (match[3] == "_temp" or match[5] is not None)
        if match and (match[1] != keep or unfinished):
            if match[1] not in said and (unfinished or int(match[2]) > kept):
                say(f"backup: removed {match[1]}, a save that a killed process left unfinished")
                said.add(match[1])
            _remove(path)
        elif _TEMPORARY.match(path.name):
            _remove(path)
    with contextlib.suppress(FileNotFoundError):  # the next save starts a list of its own
        (root / STATE_FILE).unlink()


def _entries(root: Path) -> list[Path]:
    return list(root.iterdir()) if root.is_dir() else []


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_backups(backup_dir: str | os.PathLike) -> None:
    """Deletes mdtrain's backup files (and the folder if then empty) after a finished run.

    Args:
        backup_dir: the run's `--backup-dir`.
    """
    root = Path(backup_dir)
    for path in _entries(root):
        if _CHECKPOINT_FILE.match(path.name) or _TEMPORARY.match(path.name):
            _remove(path)
    if (root / STATE_FILE).exists() and _state_is_ours(root):
        (root / STATE_FILE).unlink()
    with contextlib.suppress(FileNotFoundError):
        (root / MANIFEST_FILE).unlink()
    with contextlib.suppress(OSError):  # other files are the user's
        root.rmdir()


# --- what a checkpoint holds ---------------------------------------------------------------


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


def _rng_by_name(net: keras.Model) -> dict:
    """`_rng_state(net)` keyed by owning layer (`small_cnn/head_dropout/0`).

    A Keras 3 `SeedGenerator` is not tracked by `tf.train.Checkpoint`, and its
    variable's own name is numbered per process (`seed_generator_3`), so the
    names are the layers'. mdtrain's models name every layer.
    """
    named = {}

    def add(model: keras.Model, prefix: str) -> None:
        for layer in model.layers:
            path = f"{prefix}/{layer.name}"
            if isinstance(layer, keras.Model):
                add(layer, path)
                continue
            weights = {id(w) for w in layer.weights}
            state = [v for v in layer.variables if id(v) not in weights]
            named.update({f"{path}/{i}": variable for i, variable in enumerate(state)})

    add(net, net.name)
    if {id(v) for v in named.values()} != {id(v) for v in _rng_state(net)}:
        raise RuntimeError(
            "mdtrain.backup: some of the model's random state belongs to no layer; "
            "backups would not resume exactly (report it to mdtrain)"
        )
    return named


def _metrics_by_name(trainer) -> dict:
    """The training metrics' variables (`loss/total`, ...): Keras 3 metrics are not trackable."""
    return {f"{metric.name}/{v.name}": v for metric in trainer.metrics for v in metric.variables}


def _checkpoint(trainer, optimizer: bool = True, metrics: bool = True):
    """A `tf.train.Checkpoint` of `trainer`'s state: what `save` writes, or a part to restore."""
    import tensorflow as tf

    objects = {"net": trainer.net, "rng": _rng_by_name(trainer.net)}
    if optimizer:
        objects["optimizer"] = trainer.optimizer
    if metrics:
        objects["metrics"] = _metrics_by_name(trainer)
    return tf.train.Checkpoint(**objects)


def _check_reaches_all(checkpoint, trainer) -> None:
    """Fails loudly if `checkpoint` misses a variable a resume needs (Keras moved something)."""
    import tensorflow as tf

    reached = {id(item) for item in tf.train.TrackableView(checkpoint).descendants()}
    needed = [*trainer.net.variables, *trainer.optimizer.variables]
    needed += [v for metric in trainer.metrics for v in metric.variables]
    missed = [v.path for v in needed if id(v) not in reached]
    if missed:
        raise RuntimeError(
            f"mdtrain.backup: tf.train.Checkpoint does not reach {', '.join(missed[:3])} in "
            "this Keras version; backups would not resume exactly (report it to mdtrain)"
        )


def restore(trainer, point: ResumePoint, with_optimizer: bool = True) -> None:
    """Loads a verified backup into a built `ExactTrainer` compiled for the phase being resumed.

    Args:
        trainer: the run's `ExactTrainer`, built and compiled.
        point: the `resume_point`, whose `path` is the checkpoint.
        with_optimizer: also the optimizer's variables (a backup of the same
            phase). Defaults to True.

    Raises:
        UsageError: the checkpoint does not fit this model (a variable
            missing, another shape).
    """
    if with_optimizer:
        build_optimizer(trainer)  # restored into at once, not when first created
    _load(_checkpoint(trainer, optimizer=with_optimizer, metrics=False), point.path)


def _restore_metrics(trainer, prefix: Path) -> None:
    """Puts a mid-epoch backup's metric sums back, after `fit` reset the metrics (an equal
    share on every replica of the sum saved: docs/numerics.md)."""
    import tensorflow as tf

    _load(tf.train.Checkpoint(metrics=_metrics_by_name(trainer)), prefix)


def _load(checkpoint, prefix: Path) -> None:
    """Restores `checkpoint`'s objects from `prefix`; each must be found, in its shape."""
    import tensorflow as tf

    try:
        status = checkpoint.restore(str(prefix))
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, IndexError, tf.errors.OpError) as error:
        raise UsageError(
            f"backup {prefix}: does not fit this model ({_first_line(error)}); "
            "use another --backup-dir"
        ) from None
    status.expect_partial()  # the parts of the backup not asked for


# --- writing -------------------------------------------------------------------------------


class BackupWriter:
    """Saves a trainer's state with `tf.train.CheckpointManager`, then the manifest beside it.

    Every worker saves; only the chief keeps its saves (docs/multi-worker.md).

    Args:
        backup_dir: the `--backup-dir`.
        trainer: the run's `ExactTrainer`, compiled for the phase being run.
        chief: whether this process keeps the backups. Defaults to True.

    Raises:
        UsageError: `backup_dir` holds a backup in an older mdtrain's format,
            or another TensorFlow checkpoint list (nothing is touched).
        RuntimeError: `tf.train.Checkpoint` does not reach all of the
            trainer's variables in this Keras version.

    Example:

    >>> writer = BackupWriter("runs/backup", trainer)  # doctest: +SKIP
    >>> writer.save(ResumePoint(1, 0, fingerprint=fingerprint), number=40)
    PosixPath('runs/backup/mdtrain-ckpt-40')
    """

    def __init__(self, backup_dir: str | os.PathLike, trainer, chief: bool = True):
        import tensorflow as tf

        self.root, self.chief = Path(backup_dir), chief
        build_optimizer(trainer)  # its variables in the checkpoint from the first save
        self.checkpoint = _checkpoint(trainer)
        _check_reaches_all(self.checkpoint, trainer)
        self.manager = None
        if chief:
            _check_folder(self.root, backup_dir)
            self.root.mkdir(parents=True, exist_ok=True)
            self.manager = tf.train.CheckpointManager(
                self.checkpoint, str(self.root), max_to_keep=_KEEP, checkpoint_name=CHECKPOINT_NAME
            )

    def save(self, point: ResumePoint, number: int) -> Path:
        """Saves checkpoint `number` (the run's global step), then the manifest naming it.

        Args:
            point: the position and the history and fingerprint to record.
            number: the checkpoint's number; a save of the same number replaces it.

        Returns:
            The checkpoint's prefix (`backup_dir/mdtrain-ckpt-<number>`); on a
            worker other than the chief, where it was (now deleted).
        """
        import tensorflow as tf

        if not self.chief:
            with tempfile.TemporaryDirectory(prefix="mdtrain-worker-backup-") as scratch:
                manager = tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1)
                return Path(manager.save(checkpoint_number=number))
        prefix = Path(self.manager.save(checkpoint_number=number))
        for path in prefix.parent.glob(f"{prefix.name}.*"):  # on disk before the manifest
            with open(path, "rb") as file:
                os.fsync(file.fileno())
        _write_manifest(self.root, prefix.name, point)
        return prefix


def _write_manifest(root: Path, checkpoint: str, point: ResumePoint) -> None:
    """Writes the manifest naming `checkpoint` atomically: a temporary file, then `os.replace`."""
    manifest = {"format": FORMAT, "checkpoint": checkpoint} | dataclasses.asdict(point)
    del manifest["path"]  # "checkpoint" says it
    handle, temporary = tempfile.mkstemp(prefix=f"{MANIFEST_FILE}.", suffix=".tmp", dir=root)
    with os.fdopen(handle, "w") as file:
        json.dump(manifest, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, root / MANIFEST_FILE)


@dataclasses.dataclass(eq=False)
class Backup(keras.callbacks.Callback):
    """Saves a backup at each epoch end and, optionally, every `every_steps` steps."""

    backup_dir: str
    fingerprint: dict
    phase: int
    steps_per_epoch: int
    every_steps: int | None
    step_offset: int  # steps of the first epoch done before this `fit` (a mid-epoch resume)
    write: bool  # False on non-chief workers, which save only to temporary folders
    history: list[dict[str, float]]  # the epochs before this `fit`; each epoch adds its row
    # A mid-epoch resume's backup: its metric state is put back after `fit` resets the metrics.
    resumed_from: Path | None

    def __post_init__(self):
        super().__init__()
        self.history = list(self.history)
        self._epoch = 0
        self._writer = None  # made at the first save, for the optimizer `fit` runs with

    def _save(self, epoch: int, step: int) -> None:
        # Every worker saves: reading the metrics summed over the replicas is a collective.
        if self._writer is None:
            self._writer = BackupWriter(self.backup_dir, self.model, chief=self.write)
        point = ResumePoint(epoch, step, self.phase, None, self.fingerprint, self.history)
        self._writer.save(point, number=epoch * self.steps_per_epoch + step)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._step = epoch, self.step_offset
        if self.step_offset and self.resumed_from is not None:
            _restore_metrics(self.model, self.resumed_from)

    def on_train_batch_end(self, batch, logs=None):
        # N steps per call: a backup at the first end at or past each multiple of `every_steps`.
        before, self._step = self._step, self.step_offset + batch + 1
        # The epoch's last step is saved by on_epoch_end, after validation.
        every = self.every_steps
        if every and self._step // every > before // every and self._step < self.steps_per_epoch:
            self._save(self._epoch, self._step)

    def on_epoch_end(self, epoch, logs=None):
        self.step_offset = 0  # only the first epoch of a resumed fit starts part-way
        self.history.append({name: float(value) for name, value in (logs or {}).items()})
        self._save(epoch + 1, 0)
