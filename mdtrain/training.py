"""`train(config)`: the whole training run that `mdtrain train` and the notebooks use.

The controller: setup → restore → segments → outputs, each step timed
(docs/development.md, "How a training run is built"). Light at import:
TensorFlow loads in `train`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mdtrain.config import TrainConfig
from mdtrain.errors import UsageError
from mdtrain.phases import PhaseClock
from mdtrain.plan import ResumePoint, Segment, plan_run

if TYPE_CHECKING:  # modules that load TensorFlow: imported in `train`, timed
    from mdtrain.monitor import MonitorCallback
    from mdtrain.parts import RunParts

__all__ = ["TrainConfig", "TrainResult", "train"]


@dataclass
class TrainResult:
    """What a run produced; `summary()` is the `--json` object.

    `history` has one row per epoch, under every strategy; `ps_log` is
    parameter-server training's finer loss curve (docs/multi-worker.md,
    "Parameter servers"); `phases` the seconds of each phase (docs/figures.md).
    """

    config: TrainConfig
    replicas: int
    global_batch_size: int
    num_train: int
    num_val: int
    class_names: list[str]
    history: list[dict[str, float]]
    images_per_sec: float
    skipped_files: list[dict[str, str]]
    output: str | None
    model: object = field(repr=False, default=None)
    monitor_summary: dict | None = None
    is_chief: bool = True  # False on the other workers of a multi-worker run
    augment_in: str | None = None  # where augmentation ran: "pipeline", "model", None (none)
    ps_log: dict | None = None  # parameter-server training's loss curve (see above)
    precision: str = "float32"  # the Keras dtype policy the model computed in
    monitor_chart: bytes | None = field(repr=False, default=None)  # the chief's, as a PNG
    phases: dict[str, float] = field(default_factory=dict)  # seconds by phase (`mdtrain.phases`)

    def summary(self) -> dict:
        summary = {
            "replicas": self.replicas,
            "global_batch_size": self.global_batch_size,
            "num_train": self.num_train,
            "num_val": self.num_val,
            "class_names": self.class_names,
            "epochs": len(self.history),
            "history": self.history,
            "images_per_sec": round(self.images_per_sec, 1),
            "skipped_files": self.skipped_files,
            "output": self.output,
            "monitor": self.monitor_summary,
            "augment_in": self.augment_in,
            "precision": self.precision,
            "config": dataclasses.asdict(self.config),
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
        }
        if self.ps_log is not None:
            summary["ps_log"] = self.ps_log
        return summary


def train(config: TrainConfig, callbacks: list | None = None) -> TrainResult:
    """Runs one training job as described by `config`.

    Prints the batch geometry first, a line (or a live dashboard) per epoch,
    and writes the outputs to `config.output` when set (the chief only; README,
    "The command"). Under `strategy="ps"` the run is a parameter-server chief's.

    What the run changes in TensorFlow is undone when it returns (`compat.run_settings`),
    but for what TensorFlow cannot undo: the devices `configure_devices` set up, the seeds.

    Args:
        config: the run's `TrainConfig`.
        callbacks: extra Keras callbacks. Defaults to None.

    Returns:
        A `TrainResult`.

    Raises:
        UsageError: for bad input (see `TrainConfig.validate`, missing data,
            weights that cannot be loaded, ...).

    Example:

    >>> result = train(TrainConfig(epochs=2, strategy="cpu:2"))  # doctest: +SKIP
    >>> result.history[-1]["val_accuracy"]
    """
    config.validate()
    clock = PhaseClock()
    with clock.phase("import"):  # TensorFlow (unless imported before), Keras, the run's modules
        from mdtrain.tf_import import import_tensorflow

        import_tensorflow()
        from mdtrain.compat import run_settings
        from mdtrain.heartbeat import heartbeat_from_env
        from mdtrain.parts import set_up

    with run_settings(config.deterministic):
        parts = set_up(config, clock)
        with clock.phase("restore"):
            point, segments = _resume(config, parts)
        monitor = parts.monitor
        # A progress line when an epoch runs long, if a launcher asked: the chief's (verbose).
        heartbeat = heartbeat_from_env() if parts.verbose else []
        callbacks = [*(callbacks or []), *heartbeat, monitor]
        with monitor.run():  # one run's figures across phases and resume segments
            history, ps_log = _run_segments(config, parts, point, segments, callbacks, clock)
        result = _result(config, parts, history, ps_log, monitor, clock)
    if config.output:
        result = _write_outputs(config, parts, result, clock)
    if config.backup_dir and parts.chief:  # finished: the outputs now hold the result
        from mdtrain.backup import remove_backups

        remove_backups(config.backup_dir)
    return result


def _resume(config: TrainConfig, parts: RunParts) -> tuple[ResumePoint, list[Segment]]:
    """`(point, segments)`: where the run stands (the start, without a backup), what is left."""
    from mdtrain.backup import restore, resume_point
    from mdtrain.models import unfreeze_top

    total = config.epochs + config.fine_tune_epochs
    point = resume_point(config.backup_dir, parts.fingerprint, parts.chief, say=parts.say)
    if point.epoch > total:
        raise UsageError(
            f"--backup-dir {config.backup_dir}: its backup is at epoch {point.epoch}, past "
            f"this run's {total}; use the same --epochs, or another --backup-dir"
        )
    segments = plan_run(
        config.epochs,
        config.fine_tune_epochs,
        config.learning_rate,
        parts.inputs.steps_per_epoch,
        point,
        config.warmup_epochs,
    )
    if not segments and point.path is not None:  # a backup at the very end of the run
        parts.say("the backup is at the end of the run: its weights are the result")
        if point.phase == 1:  # the layers fine-tuning unfroze, as the run left them
            with parts.strategy.scope():
                unfreeze_top(parts.trainer.net)
        restore(parts.trainer, point, with_optimizer=False)
    return point, segments


def _run_segments(
    config: TrainConfig,
    parts: RunParts,
    point: ResumePoint,
    segments: list[Segment],
    callbacks: list,
    clock: PhaseClock,
) -> tuple[list[dict[str, float]], dict | None]:
    """Carries out the plan's segments; `(history, ps_log)`: the run's rows, the loop's log."""
    from mdtrain.backup import restore

    history = list(point.history)  # the epochs before the backup, as that run saw them
    ps_log = None
    for segment in segments:
        if segment.starts_phase:
            _start_phase(parts, segment, config.resolved_steps_per_execution)
        if segment.restore:
            with clock.phase("restore"):
                restore(parts.trainer, point, with_optimizer=segment.restore_optimizer)
        backups = _backups(config, parts, segment, point, history)
        run = parts.loop(segment, [clock.segment_timer(), *callbacks, *backups])
        history += run.history
        ps_log = run.log if run.log is not None else ps_log
    return history, ps_log


def _start_phase(parts: RunParts, segment: Segment, steps_per_execution: int) -> None:
    """A fresh optimizer for the segment's phase; fine-tuning first unfreezes the base's top."""
    import keras

    from mdtrain.models import unfreeze_top

    with parts.strategy.scope():
        if segment.phase == 1:  # fine-tuning
            unfrozen = unfreeze_top(parts.trainer.net)
            parts.say(
                f"fine-tuning: {unfrozen} top layers of the base unfrozen, "
                f"learning rate {segment.learning_rate:g}"
            )
        parts.trainer.compile(
            optimizer=keras.optimizers.Adam(parts.loop.learning_rate(segment)),
            steps_per_execution=steps_per_execution,
        )


def _backups(
    config: TrainConfig, parts: RunParts, segment: Segment, point: ResumePoint, history: list
) -> list:
    """The segment's `Backup` callback, with `--backup-dir`; else none."""
    from mdtrain.backup import Backup

    if not config.backup_dir:
        return []
    backup = Backup(
        config.backup_dir,
        parts.fingerprint,
        segment.phase,
        parts.inputs.steps_per_epoch,
        config.backup_every_steps,
        step_offset=segment.skip_steps,
        write=parts.chief,
        history=history,
        resumed_from=point.path,
    )
    return [backup]


def _result(
    config: TrainConfig,
    parts: RunParts,
    history: list[dict[str, float]],
    ps_log: dict | None,
    monitor: MonitorCallback,
    clock: PhaseClock,
) -> TrainResult:
    """What the run produced, its phases so far."""
    summary = monitor.summary()
    # Drawn only for --output: what a notebook shows of a run in other processes.
    keep_chart = parts.chief and config.monitor != "none" and bool(config.output)
    return TrainResult(
        config=config,
        replicas=parts.replicas,
        global_batch_size=parts.inputs.global_batch_size,
        num_train=parts.inputs.num_train,
        num_val=parts.inputs.num_val,
        class_names=parts.splits.class_names,
        history=history,
        images_per_sec=float(summary.images_per_sec or 0.0),
        skipped_files=[vars(skipped) for skipped in parts.splits.skipped],
        output=config.output,
        model=parts.trainer.net,
        monitor_summary=summary.to_dict(),
        is_chief=parts.chief,
        augment_in=config.augment_place,
        ps_log=ps_log,
        precision=parts.precision,
        monitor_chart=monitor.chart_png(dpi=100) if keep_chart else None,
        phases=clock.seconds(),
    )


def _write_outputs(
    config: TrainConfig, parts: RunParts, result: TrainResult, clock: PhaseClock
) -> TrainResult:
    """Writes the outputs; the result, its phases now with `outputs`, as report.json has them."""
    from mdtrain.outputs import write_outputs

    started = clock.now()
    finished = result

    def report() -> dict:  # written last: its phases hold the writing of the other files
        nonlocal finished
        writing = {"outputs": clock.now() - started}
        finished = dataclasses.replace(result, phases=clock.seconds() | writing)
        return finished.summary()

    write_outputs(
        config.output,
        result.model,
        result.history,
        report,
        parts.chief,
        result.monitor_chart,
    )
    return finished
