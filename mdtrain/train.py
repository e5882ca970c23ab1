"""`train(config)`: the whole training run that `mdtrain train` and the notebooks use.

Devices → data → strategy → model → (fine-tuning) → outputs, with every
choice in one `TrainConfig`. The logic of each step lives in its own module;
this one only wires them together and writes the results.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mdtrain.errors import UsageError

OUTPUT_FILES = ("model.keras", "history.json", "report.json")


def _folder_problem(folder: Path) -> str | None:
    """Why mdtrain could not create or write `folder`, or None: checked before training."""
    if folder.exists():
        return None if folder.is_dir() else "is a file; pass a folder"
    parent = next(p for p in folder.absolute().parents if p.exists())
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable"
    return None


@dataclass
class TrainConfig:
    """Every choice of a training run; field names match `mdtrain train` options.

    `data=None` trains on the demo dataset (created on first use). Either
    `batch_size_per_replica` or `global_batch_size` may be set (neither: 32 per
    replica). `image_size=None` picks 32 for `small-cnn` and 224 for
    EfficientNetV2.
    """

    data: str | None = None
    val_data: str | None = None
    validation_split: float = 0.0
    model: str = "small-cnn"
    weights: str = "none"
    image_size: int | None = None
    batch_size_per_replica: int | None = None
    global_batch_size: int | None = None
    epochs: int = 15
    fine_tune_epochs: int = 0
    learning_rate: float = 2e-3
    strategy: str = "auto"
    loop: str = "fit"
    mixed_precision: bool = False
    augment: bool = True
    augment_in: str = "auto"
    dropout: float = 0.2
    class_weight: str = "none"
    seed: int = 0
    deterministic: bool = False
    backup_dir: str | None = None
    backup_every_steps: int | None = None
    output: str | None = None
    cache: str = "auto"
    cache_dir: str | None = None
    monitor: str = "auto"
    verbose: int = 2

    def validate(self) -> None:
        """Raises `UsageError` for any value that cannot work, before TensorFlow starts."""
        from mdtrain import choices as c

        c.check_strategy_name(self.strategy)
        c.check_model_name(self.model)
        c.check_dropout(self.dropout)
        c.check_batch_sizes(self.batch_size_per_replica, self.global_batch_size)
        if self.image_size is not None:
            c.check_image_size(self.model, self.image_size)
        for argument, options in (
            ("loop", c.LOOPS),
            ("augment_in", c.AUGMENT_IN),
            ("class_weight", c.CLASS_WEIGHTS),
            ("cache", c.CACHE_MODES),
            ("monitor", c.MONITOR_DISPLAYS),
        ):
            value = getattr(self, argument)
            c.check(value in options, argument, value, f"choose one of {', '.join(options)}")
        c.check(self.epochs >= 1, "epochs", self.epochs, "must be at least 1")
        c.check(self.fine_tune_epochs >= 0, "fine_tune_epochs", self.fine_tune_epochs,
                "must be at least 0")  # fmt: skip
        c.check(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be positive")
        c.check(
            0 <= self.validation_split < 1,
            "validation_split",
            self.validation_split,
            "must be in [0, 1) (0 means no validation)",
        )
        c.check(
            self.backup_every_steps is None or self.backup_every_steps >= 1,
            "backup_every_steps",
            self.backup_every_steps,
            "must be at least 1",
        )
        c.check(
            self.backup_every_steps is None or bool(self.backup_dir),
            "backup_every_steps",
            self.backup_every_steps,
            "needs a backup folder (--backup-dir)",
        )
        c.check(
            self.augment or self.augment_in == "auto",
            "augment_in",
            self.augment_in,
            "has nothing to place: --no-augment turns augmentation off",
        )
        c.check_seed(self.seed)
        self._validate_weights()
        self._validate_folders()

    def _validate_weights(self) -> None:
        from mdtrain import choices as c

        c.check(
            self.fine_tune_epochs == 0 or self.model != "small-cnn",
            "fine_tune_epochs",
            self.fine_tune_epochs,
            "needs a pretrained base: use an EfficientNet model",
        )
        c.check(
            self.fine_tune_epochs == 0 or self.weights != "none",
            "fine_tune_epochs",
            self.fine_tune_epochs,
            "needs a pretrained base: pass --weights imagenet or a weights file",
        )
        c.check(
            self.weights in ("imagenet", "none") or os.path.isfile(self.weights),
            "weights",
            self.weights,
            "no such file; pass imagenet, none, or a weights file",
        )
        # EfficientNetV2 trains its head on a frozen base: a random base cannot learn.
        c.check(
            self.weights != "none" or self.model not in c.EFFICIENTNETS,
            "model",
            self.model,
            "trains only its head on a frozen base, so it needs --weights imagenet or a "
            "…_notop.h5 file; to train an EfficientNet from scratch use efficientnet-lite0",
        )

    def _validate_folders(self) -> None:
        from mdtrain import choices as c

        for argument in ("output", "backup_dir", "cache_dir"):
            folder = getattr(self, argument)
            problem = _folder_problem(Path(folder)) if folder else None
            c.check(problem is None, argument, folder, problem)
        taken = [n for n in OUTPUT_FILES if self.output and (Path(self.output) / n).exists()]
        c.check(not taken, "output", self.output, f"already holds {', '.join(taken)}; "
                "choose a new folder (nothing was overwritten)")  # fmt: skip

    @property
    def resolved_image_size(self) -> int:
        return self.image_size or (32 if self.model == "small-cnn" else 224)


@dataclass
class TrainResult:
    """What a run produced; `summary()` is the `--json` object."""

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

    def summary(self) -> dict:
        return {
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
            "config": dataclasses.asdict(self.config),
        }


def train(config: TrainConfig, callbacks: list | None = None) -> TrainResult:
    """Runs one training job as described by `config`.

    Prints the batch geometry first, a line (or a live dashboard) per epoch,
    and writes `model.keras`, `history.json` and `report.json` to
    `config.output` when set (only the chief does, under multi-worker).

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
    run = _Run(config)
    result = run.execute(callbacks or [])
    if config.output:
        _write_outputs(result, run.chief)
    if config.backup_dir and run.chief:  # finished: the outputs now hold the result
        from mdtrain.backup import remove_backups

        remove_backups(config.backup_dir)
    return result


def augment_place(config: TrainConfig) -> str | None:
    """Where the run augments: `"pipeline"`, `"model"`, or None when it does not.

    `auto` is the model, on every kind of replica: the input pipeline draws
    and composes each image's transform, and each replica's training step
    applies its slice of them (the same pixels either way). On GPUs the warp
    is then a small kernel beside the model's, and the CPU threads, which
    often cannot decode and warp as fast as the GPUs train, are left to
    decode; on CPU replicas, where step and pipeline share the cores, it
    trained at least as fast as the pipeline (`benchmarks/augment_in.json`).

    Args:
        config: the run's `TrainConfig` (`augment`, `augment_in`).
    """
    if not config.augment:
        return None
    return "model" if config.augment_in == "auto" else config.augment_in


class _Run:
    """The runner: sets a run up, then carries out its plan (`mdtrain.plan`) segment by segment."""

    def __init__(self, config: TrainConfig):
        from mdtrain.distribute import configure_devices

        configure_devices(config.strategy)
        import keras
        import tensorflow as tf

        from mdtrain.distribute import BatchGeometry, is_chief, strategy_for_run, task_id

        self.strategy = strategy_for_run(config.strategy)  # first: multi-worker setup
        keras.utils.set_random_seed(config.seed)
        if config.deterministic:
            tf.config.experimental.enable_op_determinism()
        self.chief = is_chief(self.strategy)
        self.config = config if self.chief else dataclasses.replace(config, verbose=0)
        self.augment_in = augment_place(config)
        self.inputs = self._input_data()
        self.geometry = BatchGeometry(
            self.inputs.num_train, self.inputs.global_batch_size, self.replicas
        )
        if not self.chief:  # every worker prints its geometry; only the chief reports progress
            print(f"worker {task_id(self.strategy)}: {self.geometry.describe()}", flush=True)
        self.loop = self._choose_loop()
        self._describe()
        self.trainer = self._build_trainer()

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def _input_data(self):
        from mdtrain.augment import AugmentPolicy
        from mdtrain.data import load_splits
        from mdtrain.distribute import resolve_global_batch_size, task_name
        from mdtrain.pipeline import InputData
        from mdtrain.sources import ensure_demo_dataset

        config = self.config
        self.data_dir = config.data if config.data is not None else str(ensure_demo_dataset())
        self.splits = load_splits(
            self.data_dir, config.val_data, config.validation_split, config.seed
        )
        global_batch = resolve_global_batch_size(
            self.replicas, config.batch_size_per_replica, config.global_batch_size
        )
        return InputData(
            self.splits,
            config.resolved_image_size,
            global_batch,
            seed=config.seed,
            augment=AugmentPolicy() if config.augment else None,
            augment_in=self.augment_in or "pipeline",
            cache=config.cache,
            cache_dir=config.cache_dir,
            deterministic=config.deterministic,
            cache_task=task_name(self.strategy),
        )

    def _choose_loop(self) -> str:
        import tensorflow as tf

        if self.config.loop == "fit" and isinstance(
            self.strategy, tf.distribute.MultiWorkerMirroredStrategy
        ):
            # Keras 3's fit reduces a sample batch across workers before training and fails
            # under this strategy (keras-team/keras#20585); the custom loop has the same numerics.
            self._say("multi-worker: using the custom training loop (Keras 3's fit fails here)")
            return "custom"
        return self.config.loop

    def _describe(self) -> None:
        splits = self.splits
        self._say(f"strategy {type(self.strategy).__name__} with {self.replicas} replica(s): "
                  f"{self.geometry.describe()}")  # fmt: skip
        self._say(
            f"data {self.data_dir}: {len(splits.class_names)} classes, {self.inputs.num_train} "
            f"train, {self.inputs.num_val} validation, {len(splits.skipped)} unreadable file(s) "
            "skipped"
        )
        for s in splits.skipped[:10]:
            self._say(f"  skipped {s.path}: {s.reason}")
        if self.augment_in == "model":
            self._say("augmentation: drawn by the input pipeline, applied in the training step "
                      "on each replica's device")  # fmt: skip

    def _build_trainer(self):
        import keras

        from mdtrain.imbalance import class_weights_for
        from mdtrain.loop import ExactTrainer
        from mdtrain.models import build_model
        from mdtrain.precision import choose_policy, local_device_kinds

        config, size = self.config, self.config.resolved_image_size
        class_weights = class_weights_for(
            config.class_weight, self.splits.train.counts(len(self.splits.class_names))
        )
        previous = keras.mixed_precision.dtype_policy()
        mode = "auto" if config.mixed_precision else "float32"  # auto: float16 on GPUs only
        keras.mixed_precision.set_dtype_policy(choose_policy(mode, local_device_kinds()))
        try:
            with self.strategy.scope():
                net = build_model(config.model, len(self.splits.class_names), size,
                                  config.weights, config.dropout)  # fmt: skip
                augment = self.inputs.augment if self.augment_in == "model" else None
                trainer = ExactTrainer(net, class_weights, augment=augment)
                trainer.build((None, size, size, 3))
        finally:
            keras.mixed_precision.set_dtype_policy(previous)
        return trainer

    def fingerprint(self) -> dict:
        """What gives a saved position its meaning; a backup made under other values is refused."""
        return dict(
            model=self.config.model,
            image_size=self.config.resolved_image_size,
            class_names=self.splits.class_names,
            num_train=self.inputs.num_train,
            global_batch_size=self.inputs.global_batch_size,
            seed=self.config.seed,
            # a disk cache orders later epochs differently from memory or streaming
            disk_cache=self.inputs.cache_mode == "disk",
        )

    def execute(self, callbacks: list) -> TrainResult:
        from mdtrain.backup import resume_point
        from mdtrain.heartbeat import heartbeat_from_env
        from mdtrain.monitor import make_monitor
        from mdtrain.plan import plan_run

        config = self.config
        monitor = make_monitor(
            self.inputs.global_batch_size,
            epochs=config.epochs + config.fine_tune_epochs,
            steps_per_epoch=self.inputs.steps_per_epoch,
            display=config.monitor if self.chief else "none",
            augments_on_device=self.augment_in == "model",
        )
        point = resume_point(config.backup_dir, self.fingerprint(), self.chief, say=self._say)
        total = config.epochs + config.fine_tune_epochs
        if point.epoch > total:
            raise UsageError(
                f"--backup-dir {config.backup_dir}: its backup is at epoch {point.epoch}, past "
                f"this run's {total}; use the same --epochs, or another --backup-dir"
            )
        segments = plan_run(config.epochs, config.fine_tune_epochs, config.learning_rate,
                            self.inputs.steps_per_epoch, point.position)  # fmt: skip
        if not segments and point.path is not None:
            self._restore_finished(point)
        history = list(point.history)  # the epochs before the backup, as that run saw them
        if self.chief and config.verbose:  # under `mdtrain launch`: slow is not stuck
            callbacks = [*callbacks, *heartbeat_from_env()]
        with monitor.run():  # one run's figures across phases and resume segments
            for segment in segments:
                history += self._run_segment(segment, point, [*callbacks, monitor], history)
        summary = monitor.summary()
        return TrainResult(
            config=config,
            replicas=self.replicas,
            global_batch_size=self.inputs.global_batch_size,
            num_train=self.inputs.num_train,
            num_val=self.inputs.num_val,
            class_names=self.splits.class_names,
            history=history,
            images_per_sec=float(summary.images_per_sec or 0.0),
            skipped_files=[vars(s) for s in self.splits.skipped],
            output=config.output,
            model=self.trainer.net,
            monitor_summary=summary.to_dict(),
            is_chief=self.chief,
            augment_in=self.augment_in,
        )

    def _say(self, text: str) -> None:
        if self.config.verbose:  # 0 on every worker but the chief
            print(text, flush=True)

    def _start_phase(self, segment) -> None:
        import keras

        from mdtrain.models import unfreeze_top

        with self.strategy.scope():
            if segment.fine_tune:
                n = unfreeze_top(self.trainer.net)
                self._say(f"fine-tuning: {n} top layers of the base unfrozen, "
                          f"learning rate {segment.learning_rate:g}")  # fmt: skip
            # Cosine decay to a tenth over the phase: large steps early, and a
            # settled model (and BatchNorm statistics) by the last epoch.
            schedule = keras.optimizers.schedules.CosineDecay(
                segment.learning_rate, decay_steps=segment.decay_steps, alpha=0.1
            )
            self.trainer.compile(optimizer=keras.optimizers.Adam(schedule))

    def _restore_finished(self, point) -> None:
        """Loads a backup taken at the very end of the run: its weights are the result."""
        from mdtrain.backup import restore
        from mdtrain.models import unfreeze_top

        self._say("the backup is at the end of the run: its weights are the result")
        if point.phase == 1:  # the layers fine-tuning unfroze, as the run left them
            with self.strategy.scope():
                unfreeze_top(self.trainer.net)
        restore(self.trainer, point, with_optimizer=False)

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
        train_ds = inputs.train_epochs(segment.first_epoch, segment.last_epoch)
        if segment.skip_steps:  # their original step numbers keep their augmentation seeds
            train_ds = train_ds.skip(segment.skip_steps)
        if config.backup_dir:
            callbacks = [*callbacks, Backup(
                config.backup_dir, self.fingerprint(), segment.phase, inputs.steps_per_epoch,
                config.backup_every_steps, step_offset=segment.skip_steps, write=self.chief,
                history=history,
            )]  # fmt: skip
        run = dict(
            epochs=segment.last_epoch,
            initial_epoch=segment.first_epoch,
            steps_per_epoch=segment.steps(inputs.steps_per_epoch),
            callbacks=callbacks,
            verbose=config.verbose,
        )
        if self.loop == "fit":  # shuffle=False: the dataset is shuffled already, per epoch
            hist = self.trainer.fit(train_ds, validation_data=inputs.val_ds, shuffle=False, **run)
        else:
            hist = custom_fit(self.trainer, self.strategy, train_ds, val_ds=inputs.val_ds, **run)
        return history_rows(hist)


def _write_outputs(result: TrainResult, chief: bool) -> None:
    """Writes model.keras, history.json, report.json; non-chief workers write to a temp dir.

    Every worker must take part in saving (it can involve collectives), but
    only the chief's files are kept.
    """
    if not chief:
        out = Path(tempfile.mkdtemp(prefix="mdtrain-worker-"))
        try:
            _save(result, out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return
    try:
        _save(result, Path(result.output))
    except OSError as e:  # the disk filled up, the folder went away, ...: keep the model
        rescue = Path(tempfile.mkdtemp(prefix="mdtrain-run-"))
        _save(result, rescue)
        raise UsageError(f"--output {result.output}: cannot write ({e.strerror or e}); "
                         f"the run's outputs were saved to {rescue} instead") from None  # fmt: skip


def _save(result: TrainResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result.model.save(out / "model.keras")
    (out / "history.json").write_text(json.dumps(result.history, indent=1))
    (out / "report.json").write_text(json.dumps(result.summary(), indent=1))
