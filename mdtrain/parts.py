"""The setup step of a run: its parts, built from its `TrainConfig`.

`set_up` is where a `TrainConfig` is read: each builder hands the layers below
the values they need by name (docs/development.md, "How a training run is built").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import tensorflow as tf

from mdtrain import distribute, precision
from mdtrain.augment import AugmentPolicy
from mdtrain.config import TrainConfig
from mdtrain.data import Splits, load_splits
from mdtrain.imbalance import class_weights_for
from mdtrain.loop import ExactTrainer
from mdtrain.models import build_model
from mdtrain.monitor import MonitorCallback, make_monitor
from mdtrain.phases import PhaseClock
from mdtrain.pipeline import InputData
from mdtrain.ps.loop import cluster_size
from mdtrain.segment_loops import CustomLoop, FitLoop, ParameterServerLoop, SegmentLoop
from mdtrain.sources import ensure_demo_dataset


@dataclass(frozen=True)
class RunParts:
    """What a run is made of, built once by `set_up`."""

    strategy: tf.distribute.Strategy
    chief: bool  # False on the other workers of a multi-worker run
    say: Callable[[str], None]  # prints the run's own lines: on the chief, when verbose
    verbose: int  # Keras' progress: the run's on the chief, 0 on the other workers
    inputs: InputData  # the splits, batched for the strategy's replicas
    trainer: ExactTrainer  # built in the strategy's scope, not compiled yet
    precision: str  # the Keras dtype policy the model computes in
    monitor: MonitorCallback  # one for all the run's segments; it shows on the chief only
    loop: SegmentLoop
    fingerprint: dict  # what gives a backup's position its meaning (`mdtrain.backup`)

    @property
    def splits(self) -> Splits:
        return self.inputs.splits

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def set_up(config: TrainConfig, clock: PhaseClock) -> RunParts:
    """Builds the parts of the run `config` describes, timing each on `clock`.

    Prints the batch geometry, the data and the run's choices first (every
    worker prints its geometry; only the chief the rest).

    Raises:
        UsageError: for data, batch sizes or weights that cannot be used.
    """
    with clock.phase("devices"):
        strategy = devices_and_strategy(config.strategy, config.seed)
    chief = distribute.is_chief(strategy)
    verbose = config.verbose if chief else 0
    say = printer(verbose)
    with clock.phase("data_scan"):
        data_dir, inputs = data_and_inputs(config, strategy)
    describe(say, strategy, chief, data_dir, inputs)
    with clock.phase("model"):
        augment = inputs.augment if inputs.augment_in == "model" else None
        trainer, policy = model_and_trainer(config, strategy, inputs.splits, augment, say)
    monitor = run_monitor(config, inputs, chief)
    return RunParts(
        strategy=strategy,
        chief=chief,
        say=say,
        verbose=verbose,
        inputs=inputs,
        trainer=trainer,
        precision=policy,
        monitor=monitor,
        loop=segment_loop(config, strategy, trainer, inputs, monitor, verbose, say),
        fingerprint=fingerprint(config.model, config.seed, inputs),
    )


def printer(verbose: int) -> Callable[[str], None]:
    """`print`, flushed, when `verbose`; else a function that prints nothing."""

    def say(text: str) -> None:
        if verbose:
            print(text, flush=True)

    return say


def devices_and_strategy(strategy: str, seed: int) -> tf.distribute.Strategy:
    """The devices configured, the strategy made (first: multi-worker setup), then the seed."""
    distribute.configure_devices(strategy)
    made = distribute.make_strategy(strategy)
    keras.utils.set_random_seed(seed)  # op determinism: `train`'s run_settings
    return made


def data_and_inputs(config: TrainConfig, strategy: tf.distribute.Strategy) -> tuple[str, InputData]:
    """The data's folder, and its input pipeline batched for `strategy`'s replicas.

    `config.data` None is the demo dataset, created on first use.
    """
    data_dir = config.data if config.data is not None else str(ensure_demo_dataset())
    splits = load_splits(data_dir, config.val_data, config.validation_split, config.seed)
    global_batch_size = distribute.resolve_global_batch_size(
        strategy.num_replicas_in_sync, config.batch_size_per_replica, config.global_batch_size
    )
    inputs = InputData(
        splits,
        config.resolved_image_size,
        global_batch_size,
        seed=config.seed,
        augment=AugmentPolicy() if config.augment else None,
        augment_in=config.augment_place or "pipeline",
        cache=config.cache,
        cache_dir=config.cache_dir,
        deterministic=config.deterministic,
        cache_task=distribute.task_name(strategy),  # each worker fills a disk cache of its own
    )
    return data_dir, inputs


def describe(
    say: Callable[[str], None],
    strategy: tf.distribute.Strategy,
    chief: bool,
    data_dir: str,
    inputs: InputData,
) -> None:
    """The run's first lines: the batch geometry, the data, where augmentation runs."""
    replicas = strategy.num_replicas_in_sync
    geometry = distribute.BatchGeometry(inputs.num_train, inputs.global_batch_size, replicas)
    if not chief:  # every worker prints its geometry; only the chief reports progress
        print(f"worker {distribute.task_id(strategy)}: {geometry.describe()}", flush=True)
    say(f"strategy {type(strategy).__name__} with {replicas} replica(s): {geometry.describe()}")
    splits = inputs.splits
    say(
        f"data {data_dir}: {len(splits.class_names)} classes, {inputs.num_train} "
        f"train, {inputs.num_val} validation, {len(splits.skipped)} unreadable "
        "file(s) skipped"
    )
    for skipped in splits.skipped[:10]:
        say(f"  skipped {skipped.path}: {skipped.reason}")
    if inputs.augment is not None and inputs.augment_in == "model":
        say(
            "augmentation: drawn by the input pipeline, applied in the training step "
            "on each replica's device"
        )


def model_and_trainer(
    config: TrainConfig,
    strategy: tf.distribute.Strategy,
    splits: Splits,
    augment: AugmentPolicy | None,
    say: Callable[[str], None] = print,
) -> tuple[ExactTrainer, str]:
    """`config`'s model in a built, uncompiled `ExactTrainer` under `strategy`; its dtype policy.

    Args:
        config: the run's `TrainConfig`.
        strategy: the strategy whose scope holds the variables.
        splits: the data: its classes, and the class weights' counts.
        augment: the `AugmentPolicy` the training step applies (batches of
            `InputData(augment_in="model")`), or None.
        say: prints the precision line. Defaults to `print`.

    Returns:
        `(trainer, policy)`.

    Raises:
        UsageError: for weights that cannot be loaded, or `deterministic`
            with an op TensorFlow cannot run deterministically.
    """
    size = config.resolved_image_size
    devices = precision.strategy_devices(strategy) if config.mixed_precision else []
    policy = precision.choose_policy(config.mixed_precision, devices)
    if devices:
        say(precision.describe_policy(policy, devices))
    classes = splits.class_names
    class_weights = class_weights_for(config.class_weight, splits.train.counts(len(classes)))
    with strategy.scope():
        net = build_model(
            config.model,
            len(classes),
            size,
            config.weights,
            config.dropout,
            config.batch_norm,
            policy,
        )
        # The trainer's policy too: under mixed_float16 its `compile` adds loss scaling.
        trainer = ExactTrainer(net, class_weights, augment=augment, dtype=policy)
        trainer.build((None, size, size, 3))
        if config.deterministic:  # refused before training, not at its first step
            trained = net.weights if config.fine_tune_epochs else net.trainable_weights
            precision.check_deterministic(strategy, net, size, trained)
    return trainer, policy


def run_monitor(config: TrainConfig, inputs: InputData, chief: bool) -> MonitorCallback:
    """The run's monitor: one for all its segments; it shows on the chief only."""
    return make_monitor(
        inputs.global_batch_size,
        epochs=config.epochs + config.fine_tune_epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        display=config.monitor if chief else "none",
        augments_on_device=config.augment_place == "model",
        cached=inputs.cache_mode != "none",
        prefetched=True,  # `InputData`'s batches always are
    )


def segment_loop(
    config: TrainConfig,
    strategy: tf.distribute.Strategy,
    trainer: ExactTrainer,
    inputs: InputData,
    monitor: MonitorCallback,
    verbose: int,
    say: Callable[[str], None],
) -> SegmentLoop:
    """The loop for `strategy`: `config.loop` where it can run, else the one that can."""
    # Where the trainer's steps keep no clock (op determinism), the monitor times the input
    # wait from stamps on the training batches instead.
    watch = None if trainer.times_input_wait else monitor.watch
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        # The coordinator's loop: Keras 3's fit cannot (keras-team/keras#18624).
        loop = ParameterServerLoop(
            trainer, strategy, inputs, config.epochs, config.log_every, cluster_size(), verbose
        )
        say(loop.describe())
        return loop
    if config.loop == "fit" and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Keras 3's fit reduces a sample batch across workers before training and fails
        # under this strategy (keras-team/keras#20585); the custom loop has the same numerics.
        say("multi-worker: using the custom training loop (Keras 3's fit fails here)")
        return CustomLoop(trainer, strategy, inputs, verbose, watch)
    if config.loop == "fit":
        return FitLoop(trainer, inputs, verbose, watch)
    return CustomLoop(trainer, strategy, inputs, verbose, watch)


def fingerprint(model: str, seed: int, inputs: InputData) -> dict:
    """What gives a saved position its meaning; a backup made under other values is refused."""
    return dict(
        model=model,
        image_size=inputs.image_size,
        class_names=inputs.class_names,
        seed=seed,
        num_train=inputs.num_train,
        global_batch_size=inputs.global_batch_size,
        # A disk cache orders later epochs differently from memory or streaming.
        disk_cache=inputs.cache_mode == "disk",
    )
