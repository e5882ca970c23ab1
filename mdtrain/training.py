"""`train(config)`: the whole training run that `mdtrain train` and the notebooks use.

Devices → data → strategy → model → (fine-tuning) → outputs; this module
wires the other modules together and writes the results.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mdtrain.config import TrainConfig
from mdtrain.errors import UsageError

__all__ = ["TrainConfig", "TrainResult", "train"]


@dataclass
class TrainResult:
    """What a run produced; `summary()` is the `--json` object.

    `history` has one row per epoch, under every strategy. Under
    parameter-server training an epoch is `steps_per_epoch` steps of all the
    workers together, and `ps_log` holds the finer loss curve: a point every
    `TrainConfig.log_every` steps and at each epoch's end (`steps`, `loss`,
    `accuracy`, `seconds`, `learning_rate`), and the run's `scheduled`,
    `completed` and `examples` counts, `num_workers` and `num_ps`.
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
        }
        if self.ps_log is not None:
            summary["ps_log"] = self.ps_log
        return summary


def train(config: TrainConfig, callbacks: list | None = None) -> TrainResult:
    """Runs one training job as described by `config`.

    Prints the batch geometry first, a line (or a live dashboard) per epoch,
    and writes `model.keras`, `history.json` and `report.json` to
    `config.output` when set (only the chief does, under multi-worker).
    With `strategy="ps"`, in the chief of a parameter-server cluster
    (`mdtrain launch --workers N --ps M`), the same run goes through the
    coordinator's asynchronous loop (`mdtrain.ps.coordinator_fit`).
    `model.keras` holds Keras' own layers only: it loads with
    `keras.models.load_model`, without mdtrain.

    What the run changes in TensorFlow is undone when it returns
    (`mdtrain.compat.run_settings`), except what TensorFlow cannot undo in a
    running process: the devices `configure_devices` set up, and the random
    seeds.

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
    from mdtrain.compat import run_settings

    with run_settings(config.deterministic):
        run = _Run(config)
        result = run.execute(callbacks or [])
    if config.output:
        write_outputs(
            config.output,
            result.model,
            result.history,
            result.summary(),
            run.chief,
            result.monitor_chart,
        )
    if config.backup_dir and run.chief:  # finished: the outputs now hold the result
        from mdtrain.backup import remove_backups

        remove_backups(config.backup_dir)
    return result


def new_trainer(config: TrainConfig, splits, augment=None, dtype=None):
    """`config`'s model in an uncompiled `ExactTrainer`, dtype policy `dtype`; in the scope."""
    from mdtrain.imbalance import class_weights_for
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    classes = splits.class_names
    class_weights = class_weights_for(config.class_weight, splits.train.counts(len(classes)))
    net = build_model(
        config.model,
        len(classes),
        config.resolved_image_size,
        config.weights,
        config.dropout,
        config.batch_norm,
        dtype,
    )
    # The trainer's policy too: under mixed_float16 its `compile` adds loss scaling.
    return ExactTrainer(net, class_weights, augment=augment, dtype=dtype)


class _Run:
    """The runner: sets a run up, then carries out its plan (`mdtrain.plan`) segment by segment."""

    def __init__(self, config: TrainConfig):
        from mdtrain import distribute

        distribute.configure_devices(config.strategy)
        import keras

        from mdtrain.data import load_splits
        from mdtrain.pipeline import input_data_for
        from mdtrain.sources import ensure_demo_dataset

        self.strategy = distribute.make_strategy(config.strategy)  # first: multi-worker setup
        keras.utils.set_random_seed(config.seed)  # op determinism: `train`'s run_settings
        self.chief = distribute.is_chief(self.strategy)
        self.config = config if self.chief else dataclasses.replace(config, verbose=0)
        self.augment_in = config.augment_place
        self.replicas = self.strategy.num_replicas_in_sync
        # data=None: the demo dataset, created on first use
        self.data_dir = config.data if config.data is not None else str(ensure_demo_dataset())
        self.splits = load_splits(
            self.data_dir, config.val_data, config.validation_split, config.seed
        )
        global_batch = distribute.resolve_global_batch_size(
            self.replicas, config.batch_size_per_replica, config.global_batch_size
        )
        task = distribute.task_name(self.strategy)  # each worker's own disk cache
        self.inputs = input_data_for(config, self.splits, global_batch, cache_task=task)
        # What gives a saved position its meaning; a backup made under other values is refused.
        # (A disk cache orders later epochs differently from memory or streaming.)
        self.fingerprint = dict(
            model=config.model,
            image_size=config.resolved_image_size,
            class_names=self.splits.class_names,
            seed=config.seed,
            num_train=self.inputs.num_train,
            global_batch_size=global_batch,
            disk_cache=self.inputs.cache_mode == "disk",
        )
        self.geometry = distribute.BatchGeometry(self.inputs.num_train, global_batch, self.replicas)
        if not self.chief:  # every worker prints its geometry; only the chief reports progress
            worker = distribute.task_id(self.strategy)
            print(f"worker {worker}: {self.geometry.describe()}", flush=True)
        self.loop = self._choose_loop()
        self.ps_log = None  # filled by parameter-server training's loop
        self.ps_cluster = None  # `num_workers` and `num_ps` under parameter servers
        if self.loop == "ps":
            from mdtrain.ps.loop import cluster_size

            self.ps_cluster = cluster_size()
        self._describe()
        self.trainer = self._build_trainer()

    def _choose_loop(self) -> str:
        import tensorflow as tf

        if isinstance(self.strategy, tf.distribute.ParameterServerStrategy):
            return "ps"  # the coordinator's loop: Keras 3's fit cannot (keras-team/keras#18624)
        if self.config.loop == "fit" and isinstance(
            self.strategy, tf.distribute.MultiWorkerMirroredStrategy
        ):
            # Keras 3's fit reduces a sample batch across workers before training and fails
            # under this strategy (keras-team/keras#20585); the custom loop has the same numerics.
            self._say("multi-worker: using the custom training loop (Keras 3's fit fails here)")
            return "custom"
        return self.config.loop

    def _describe(self) -> None:
        splits, inputs = self.splits, self.inputs
        self._say(
            f"strategy {type(self.strategy).__name__} with {self.replicas} replica(s): "
            f"{self.geometry.describe()}"
        )
        if self.loop == "ps":
            size, steps = self.ps_cluster, self.config.epochs * inputs.steps_per_epoch
            self._say(
                f"parameter-server training: {size['num_workers']} worker(s), "
                f"{size['num_ps']} ps; {steps} steps of {inputs.global_batch_size} "
                "examples, asynchronous"
            )
        self._say(
            f"data {self.data_dir}: {len(splits.class_names)} classes, {inputs.num_train} "
            f"train, {inputs.num_val} validation, {len(splits.skipped)} unreadable "
            "file(s) skipped"
        )
        for s in splits.skipped[:10]:
            self._say(f"  skipped {s.path}: {s.reason}")
        if self.augment_in == "model":  # `TrainConfig.augment_place`
            self._say(
                "augmentation: drawn by the input pipeline, applied in the training step "
                "on each replica's device"
            )

    def _build_trainer(self):
        from mdtrain import precision

        config, size = self.config, self.config.resolved_image_size
        devices = precision.strategy_devices(self.strategy) if config.mixed_precision else []
        self.precision = precision.choose_policy(config.mixed_precision, devices)
        if devices:
            self._say(precision.describe_policy(self.precision, devices))
        with self.strategy.scope():
            augment = self.inputs.augment if self.augment_in == "model" else None
            trainer = new_trainer(config, self.splits, augment, self.precision)
            trainer.build((None, size, size, 3))
            if config.deterministic:  # refused before training, not at its first step
                net = trainer.net
                trained = net.weights if config.fine_tune_epochs else net.trainable_weights
                precision.check_deterministic(self.strategy, net, size, trained)
        return trainer

    def execute(self, callbacks: list) -> TrainResult:
        from mdtrain.backup import restore, resume_point
        from mdtrain.heartbeat import heartbeat_from_env
        from mdtrain.models import unfreeze_top
        from mdtrain.monitor import make_monitor
        from mdtrain.plan import plan_run

        config, inputs = self.config, self.inputs
        total = config.epochs + config.fine_tune_epochs
        monitor = make_monitor(
            inputs.global_batch_size,
            epochs=total,
            steps_per_epoch=inputs.steps_per_epoch,
            display=config.monitor if self.chief else "none",
            augments_on_device=self.augment_in == "model",
        )
        # Where the backup says the run stands (the start without one); refuses one too far.
        point = resume_point(config.backup_dir, self.fingerprint, self.chief, say=self._say)
        if point.epoch > total:
            raise UsageError(
                f"--backup-dir {config.backup_dir}: its backup is at epoch {point.epoch}, past "
                f"this run's {total}; use the same --epochs, or another --backup-dir"
            )
        segments = plan_run(
            config.epochs,
            config.fine_tune_epochs,
            config.learning_rate,
            inputs.steps_per_epoch,
            point,
            config.warmup_epochs,
        )
        if not segments and point.path is not None:  # a backup at the very end of the run
            self._say("the backup is at the end of the run: its weights are the result")
            if point.phase == 1:  # the layers fine-tuning unfroze, as the run left them
                with self.strategy.scope():
                    unfreeze_top(self.trainer.net)
            restore(self.trainer, point, with_optimizer=False)
        history = list(point.history)  # the epochs before the backup, as that run saw them
        if self.chief and config.verbose:  # under `mdtrain launch`: slow is not stuck
            callbacks = [*callbacks, *heartbeat_from_env()]
        with monitor.run():  # one run's figures across phases and resume segments
            for segment in segments:
                history += self._run_segment(segment, point, [*callbacks, monitor], history)
        summary = monitor.summary()
        # Drawn only for --output: what a notebook shows of a run in other processes.
        keep_chart = self.chief and config.monitor != "none" and bool(config.output)
        return TrainResult(
            config=config,
            replicas=self.replicas,
            global_batch_size=inputs.global_batch_size,
            num_train=inputs.num_train,
            num_val=inputs.num_val,
            class_names=self.splits.class_names,
            history=history,
            images_per_sec=float(summary.images_per_sec or 0.0),
            skipped_files=[vars(s) for s in self.splits.skipped],
            output=config.output,
            model=self.trainer.net,
            monitor_summary=summary.to_dict(),
            is_chief=self.chief,
            augment_in=self.augment_in,
            ps_log=self.ps_log,
            precision=self.precision,
            monitor_chart=monitor.chart_png(dpi=100) if keep_chart else None,
        )

    def _say(self, text: str) -> None:
        if self.config.verbose:  # 0 on every worker but the chief
            print(text, flush=True)

    def _start_phase(self, segment) -> None:
        import keras

        from mdtrain.models import unfreeze_top

        with self.strategy.scope():
            if segment.phase == 1:  # fine-tuning
                n = unfreeze_top(self.trainer.net)
                self._say(
                    f"fine-tuning: {n} top layers of the base unfrozen, "
                    f"learning rate {segment.learning_rate:g}"
                )
            self.schedule = segment.schedule()
            # Under parameter servers a float rate, which the coordinator sets (`mdtrain.ps`).
            rate = segment.learning_rate if self.loop == "ps" else self.schedule
            self.trainer.compile(
                optimizer=keras.optimizers.Adam(rate),
                steps_per_execution=self.config.resolved_steps_per_execution,
            )

    def _run_segment(self, segment, point, callbacks: list, history) -> list[dict[str, float]]:
        """Runs one segment of the plan after the epochs of `history`; returns its rows."""
        from mdtrain.backup import Backup, restore
        from mdtrain.history import history_rows
        from mdtrain.loop import custom_fit

        config, inputs = self.config, self.inputs
        if segment.starts_phase:
            self._start_phase(segment)
        if segment.restore:
            restore(self.trainer, point, with_optimizer=segment.restore_optimizer)
        if config.backup_dir:
            callbacks = [
                *callbacks,
                Backup(
                    config.backup_dir,
                    self.fingerprint,
                    segment.phase,
                    inputs.steps_per_epoch,
                    config.backup_every_steps,
                    step_offset=segment.skip_steps,
                    write=self.chief,
                    history=history,
                    resumed_from=point.path,
                ),
            ]
        run = dict(
            epochs=segment.last_epoch,
            initial_epoch=segment.first_epoch,
            steps_per_epoch=inputs.steps_per_epoch - segment.skip_steps,
            callbacks=callbacks,
            verbose=config.verbose,
        )
        if self.loop == "ps":  # each worker builds its own batches
            from mdtrain.ps.loop import coordinator_fit, worker_dataset_fn

            batches = worker_dataset_fn(config, self.splits, inputs.global_batch_size)
            hist, self.ps_log = coordinator_fit(
                self.trainer,
                self.strategy,
                batches,
                val_ds=inputs.val_ds,
                learning_rate=self.schedule,
                log_every=config.log_every,
                **run,
            )
            self.ps_log |= self.ps_cluster
            return history_rows(hist)
        epochs = (segment.first_epoch, segment.last_epoch, segment.skip_steps)
        if self.loop == "fit":  # shuffle=False: the dataset is shuffled already, per epoch
            train_ds = inputs.train_epochs(*epochs)
            hist = self.trainer.fit(train_ds, validation_data=inputs.val_ds, shuffle=False, **run)
        else:  # several workers: each decodes only its replicas' slices
            train_ds, val_ds = inputs.for_strategy(self.strategy, *epochs)
            hist = custom_fit(self.trainer, self.strategy, train_ds, val_ds=val_ds, **run)
        return history_rows(hist)


def write_outputs(output, net, history, report: dict, chief: bool = True, chart=None) -> None:
    """Writes `model.keras`, `history.json`, `report.json` and a `chart` (`monitor.png`)."""
    import keras

    from mdtrain.norm import swap_batch_norm

    def save(out: Path) -> None:
        # Keras' own BatchNormalization (the same at inference): loads without mdtrain.
        swap_batch_norm(net, keras.layers.BatchNormalization).save(out / "model.keras")
        (out / "history.json").write_text(json.dumps(history, indent=1))
        (out / "report.json").write_text(json.dumps(report, indent=1))
        if chart is not None:  # the monitor's chart, as PNG bytes
            (out / "monitor.png").write_bytes(chart)

    if not chief:  # saving can involve collectives: other workers save into a temporary folder
        scratch = tempfile.TemporaryDirectory(prefix="mdtrain-worker-", ignore_cleanup_errors=True)
        with scratch as out:
            return save(Path(out))
    try:
        Path(output).mkdir(parents=True, exist_ok=True)
        save(Path(output))
    except OSError as e:  # to a new temporary folder, named in the error
        rescue = Path(tempfile.mkdtemp(prefix="mdtrain-run-"))
        save(rescue)
        raise UsageError(
            f"--output {output}: cannot write ({e.strerror or e}); "
            f"the run's outputs were saved to {rescue} instead"
        ) from None
