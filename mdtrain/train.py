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
import time
from dataclasses import dataclass, field
from pathlib import Path

from mdtrain.errors import UsageError

OUTPUT_FILES = ("model.keras", "history.json", "report.json")


@dataclass
class TrainConfig:
    """Every choice of a training run; field names match `mdtrain train` options.

    `data=None` trains on the demo dataset (created on first use). Either
    `batch_size_per_replica` or `global_batch_size` may be set (neither: 32 per
    replica). `image_size=None` picks 64 for `small-cnn` and 224 for
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
    epochs: int = 20
    fine_tune_epochs: int = 0
    learning_rate: float = 2e-3
    strategy: str = "auto"
    loop: str = "fit"
    mixed_precision: bool = False
    augment: bool = True
    dropout: float = 0.2
    class_weight: str = "none"
    seed: int = 0
    deterministic: bool = False
    backup_dir: str | None = None
    backup_every_steps: int | None = None
    output: str | None = None
    cache: bool = True
    monitor: str = "auto"
    verbose: int = 2

    def validate(self) -> None:
        """Raises `UsageError` for any value that cannot work, before TensorFlow starts."""
        from mdtrain.choices import check_model_name, check_strategy_name

        check_strategy_name(self.strategy)
        check_model_name(self.model)
        checks = [
            (self.epochs >= 1, f"--epochs {self.epochs}: must be at least 1"),
            (
                self.fine_tune_epochs >= 0,
                f"--fine-tune-epochs {self.fine_tune_epochs}: must be >= 0",
            ),
            (
                self.image_size is None or self.image_size >= 8,
                f"--image-size {self.image_size}: must be at least 8 pixels",
            ),
            (self.learning_rate > 0, f"--learning-rate {self.learning_rate}: must be positive"),
            (self.loop in ("fit", "custom"), f"--loop {self.loop}: choose fit or custom"),
            (
                self.class_weight in ("auto", "none"),
                f"--class-weight {self.class_weight}: choose auto or none",
            ),
            (
                0 <= self.validation_split < 1,
                f"--validation-split {self.validation_split}: must be in [0, 1) "
                "(0 means no validation)",
            ),
            (
                self.batch_size_per_replica is None or self.batch_size_per_replica >= 1,
                f"--batch-size-per-replica {self.batch_size_per_replica}: must be at least 1",
            ),
            (
                self.global_batch_size is None or self.global_batch_size >= 1,
                f"--global-batch-size {self.global_batch_size}: must be at least 1",
            ),
            (0 <= self.dropout < 1, f"--dropout {self.dropout}: must be in [0, 1)"),
            (
                self.backup_every_steps is None or self.backup_every_steps >= 1,
                f"--backup-every-steps {self.backup_every_steps}: must be at least 1",
            ),
            (
                self.backup_every_steps is None or self.backup_dir,
                "--backup-every-steps needs --backup-dir",
            ),
            (
                self.fine_tune_epochs == 0 or self.model != "small-cnn",
                "--fine-tune-epochs needs a pretrained base: use an EfficientNetV2 model",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        if self.weights not in ("imagenet", "none") and not os.path.isfile(self.weights):
            raise UsageError(
                f"--weights {self.weights}: no such file; pass imagenet, none, or a weights file"
            )
        if self.output:
            taken = [n for n in OUTPUT_FILES if (Path(self.output) / n).exists()]
            if taken:
                raise UsageError(
                    f"--output {self.output}: already holds {', '.join(taken)}; choose a new "
                    "folder (nothing was overwritten)"
                )

    @property
    def resolved_image_size(self) -> int:
        return self.image_size or (64 if self.model == "small-cnn" else 224)


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
            "config": dataclasses.asdict(self.config),
        }


def balanced_class_weights(counts: list[int]) -> list[float]:
    """`n / (k × n_c)` per class: every class contributes equally to the loss."""
    total, k = sum(counts), len(counts)
    return [total / (k * c) if c else 0.0 for c in counts]


def _say(config: TrainConfig, text: str) -> None:
    if config.verbose:
        print(text, flush=True)


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
    from mdtrain.distribute import configure_devices

    configure_devices(config.strategy)
    import keras
    import tensorflow as tf

    from mdtrain.augment import AugmentPolicy
    from mdtrain.backup import Backup, remove_backups, restore
    from mdtrain.data import load_splits
    from mdtrain.distribute import (
        BatchGeometry,
        make_strategy,
        multiworker_strategy,
        resolve_global_batch_size,
    )
    from mdtrain.loop import ExactTrainer, custom_fit
    from mdtrain.models import build_model, unfreeze_top
    from mdtrain.pipeline import InputData
    from mdtrain.sources import ensure_demo_dataset

    # First: MultiWorkerMirroredStrategy must configure collectives before TensorFlow
    # initialises its runtime (make_strategy lists logical devices, which does).
    if config.strategy == "multiworker":
        strategy = multiworker_strategy()
    else:
        strategy = make_strategy(config.strategy)
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    data_dir = config.data if config.data is not None else str(ensure_demo_dataset())
    splits = load_splits(data_dir, config.val_data, config.validation_split, config.seed)
    replicas = strategy.num_replicas_in_sync
    global_batch = resolve_global_batch_size(
        replicas, config.batch_size_per_replica, config.global_batch_size
    )
    image_size = config.resolved_image_size
    inputs = InputData(
        splits,
        image_size,
        global_batch,
        seed=config.seed,
        augment=AugmentPolicy() if config.augment else None,
        cache=config.cache,
        deterministic=config.deterministic,
    )
    geometry = BatchGeometry(inputs.num_train, global_batch, replicas)
    chief = _is_chief(strategy)
    loop = config.loop
    if loop == "fit" and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Keras 3's fit reduces a sample batch across workers before training and fails
        # under this strategy (keras-team/keras#20585); the custom loop has the same numerics.
        loop = "custom"
        _say(config, "multi-worker: using the custom training loop (Keras 3's fit cannot run here)")
    if not chief:  # every worker prints its geometry; only the chief reports progress
        config = dataclasses.replace(config, verbose=0)
        print(f"worker {_task_id(strategy)}: {geometry.describe()}", flush=True)
    _say(
        config,
        f"strategy {type(strategy).__name__} with {replicas} replica(s): {geometry.describe()}",
    )
    _say(
        config,
        f"data {data_dir}: {len(splits.class_names)} classes, {inputs.num_train} train, "
        f"{inputs.num_val} validation, {len(splits.skipped)} unreadable file(s) skipped",
    )
    for s in splits.skipped[:10]:
        _say(config, f"  skipped {s.path}: {s.reason}")

    policy = keras.mixed_precision.dtype_policy()
    if config.mixed_precision:
        # float16 needs loss scaling and pays off on GPUs; bfloat16 on CPU/TPU needs none.
        on_gpu = bool(tf.config.list_logical_devices("GPU"))
        keras.mixed_precision.set_dtype_policy("mixed_float16" if on_gpu else "mixed_bfloat16")
    class_weights = None
    if config.class_weight == "auto":
        class_weights = balanced_class_weights(splits.train.counts(len(splits.class_names)))
    try:
        with strategy.scope():
            net = build_model(
                config.model, len(splits.class_names), image_size, config.weights, config.dropout
            )
            trainer = ExactTrainer(net, class_weights)
            trainer.build((None, image_size, image_size, 3))
    finally:
        keras.mixed_precision.set_dtype_policy(policy)

    extra = list(callbacks or [])
    from mdtrain.monitor import make_monitor

    monitor = make_monitor(
        global_batch,
        epochs=config.epochs + config.fine_tune_epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        display=config.monitor if chief else "none",
    )
    extra.append(monitor)
    # What gives a saved position its meaning; a backup made under other values is refused.
    fingerprint = dict(
        model=config.model,
        image_size=image_size,
        class_names=splits.class_names,
        num_train=inputs.num_train,
        global_batch_size=global_batch,
        seed=config.seed,
    )
    point = _resume_point(config, fingerprint, chief, replicas)
    phases = [(0, config.epochs, config.learning_rate, False)]
    if config.fine_tune_epochs:
        total = config.epochs + config.fine_tune_epochs
        phases.append((config.epochs, total, config.learning_rate / 10, True))
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    start_epoch = point.epoch
    for phase, (first, last, lr, fine_tune) in enumerate(phases):
        if last <= start_epoch:
            continue
        with strategy.scope():
            if fine_tune:
                n = unfreeze_top(net)
                _say(
                    config,
                    f"fine-tuning: {n} top layers of the base unfrozen, learning rate {lr:g}",
                )
            # Cosine decay to a tenth over the phase: large steps early, and a
            # settled model (and BatchNorm statistics) by the last epoch.
            schedule = keras.optimizers.schedules.CosineDecay(
                lr, decay_steps=(last - first) * inputs.steps_per_epoch, alpha=0.1
            )
            trainer.compile(optimizer=keras.optimizers.Adam(schedule))
            if point.path is not None and first <= start_epoch:  # the phase the backup is in
                restore(trainer, point, with_optimizer=point.phase == phase)
        first = max(first, start_epoch)
        segments = []  # (first epoch, train_ds, steps per epoch, steps already done)
        if first == point.epoch and point.step:
            # Mid-epoch resume: the rest of that epoch's batches, with their original
            # step numbers (augmentation seeds), then the remaining whole epochs.
            rest = inputs.train_epochs(first, first + 1).skip(point.step)
            segments.append((first, rest, inputs.steps_per_epoch - point.step, point.step))
            first += 1
        if first < last:
            segments.append((first, inputs.train_epochs(first, last), inputs.steps_per_epoch, 0))
        for seg_first, train_ds, steps, done in segments:
            seg_last = seg_first + 1 if done else last
            run_callbacks = list(extra)
            if config.backup_dir:
                run_callbacks.append(
                    Backup(
                        config.backup_dir,
                        fingerprint,
                        phase,
                        inputs.steps_per_epoch,
                        config.backup_every_steps,
                        step_offset=done,
                        write=chief,
                    )
                )
            run_kwargs = dict(
                epochs=seg_last,
                steps_per_epoch=steps,
                callbacks=run_callbacks,
                initial_epoch=seg_first,
                verbose=config.verbose,
            )
            if loop == "fit":
                # shuffle=False: the dataset is shuffled already, per epoch, by seed
                hist = trainer.fit(
                    train_ds, validation_data=inputs.val_ds, shuffle=False, **run_kwargs
                )
            else:
                hist = custom_fit(
                    trainer,
                    strategy,
                    train_ds,
                    val_ds=inputs.val_ds,
                    num_examples=inputs.num_train,
                    **run_kwargs,
                )
            keys = list(hist.history)
            history += (
                [
                    {k: float(hist.history[k][i]) for k in keys}
                    for i in range(len(hist.history[keys[0]]))
                ]
                if keys
                else []
            )
    elapsed = time.perf_counter() - started

    summary = monitor.summary()
    images_per_sec = summary.images_per_sec or inputs.num_train * max(len(history), 1) / elapsed
    result = TrainResult(
        config=config,
        replicas=replicas,
        global_batch_size=global_batch,
        num_train=inputs.num_train,
        num_val=inputs.num_val,
        class_names=splits.class_names,
        history=history,
        images_per_sec=float(images_per_sec),
        skipped_files=[vars(s) for s in splits.skipped],
        output=config.output,
        model=net,
        monitor_summary=summary.to_dict(),
        is_chief=chief,
    )
    if config.output:
        _write_outputs(result, chief)
    if config.backup_dir and chief:  # finished: the outputs now hold the result
        remove_backups(config.backup_dir)
    return result


def _resume_point(config: TrainConfig, fingerprint: dict, chief: bool, replicas: int):
    """The verified backup to resume from (epoch 0 when none); prints one line about it."""
    from mdtrain.backup import ResumePoint, find_resume_point, remove_unfinished

    if not config.backup_dir:
        return ResumePoint()
    if chief:
        for name in remove_unfinished(config.backup_dir):
            _say(config, f"backup: removed {name}, a save that a killed process left unfinished")
    point = find_resume_point(config.backup_dir, fingerprint)
    if point.path is not None:
        where = f"epoch {point.epoch + 1}" + (f", step {point.step + 1}" if point.step else "")
        print(f"resuming from {point.path} at {where}", flush=True)
    return point


def saved_weights(model_file: str | os.PathLike) -> dict:
    """Every weight array stored in a `.keras` file, by its path inside the file."""
    import io
    import zipfile

    import h5py

    with zipfile.ZipFile(model_file) as z:
        h5 = h5py.File(io.BytesIO(z.read("model.weights.h5")))
        out = {}

        def keep(name, item) -> None:  # visititems stops at the first non-None return
            if isinstance(item, h5py.Dataset):
                out[name] = item[()]

        h5.visititems(keep)
        return out


def max_weight_difference(model_a: str | os.PathLike, model_b: str | os.PathLike) -> float:
    """Largest relative difference between two saved models' weights (0.0: identical).

    Per array: max |a - b| / max |a|; the maximum over all arrays.

    Example:
        >>> max_weight_difference("runs/a/model.keras", "runs/b/model.keras")  # doctest: +SKIP
        0.0
    """
    import numpy as np

    a, b = saved_weights(model_a), saved_weights(model_b)
    if a.keys() != b.keys() or not a:
        raise UsageError(f"{model_a} and {model_b} hold different models")
    return max(
        float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(a[k]))), 1e-12)) for k in a
    )


def _task_id(strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(getattr(resolver, "task_id", 0) or 0)


def _is_chief(strategy) -> bool:
    """True unless this is a non-chief worker of a multi-worker cluster (TF_CONFIG or Slurm)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )


def _write_outputs(result: TrainResult, chief: bool) -> None:
    """Writes model.keras, history.json, report.json; non-chief workers write to a temp dir.

    Every worker must take part in saving (it can involve collectives), but
    only the chief's files are kept.
    """
    out = Path(result.output) if chief else Path(tempfile.mkdtemp(prefix="mdtrain-worker-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        result.model.save(out / "model.keras")
        (out / "history.json").write_text(json.dumps(result.history, indent=1))
        (out / "report.json").write_text(json.dumps(result.summary(), indent=1))
    finally:
        if not chief:
            shutil.rmtree(out, ignore_errors=True)
