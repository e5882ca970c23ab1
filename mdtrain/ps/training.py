"""Parameter-server training on the chief: the coordinator's loop over asynchronous steps.

mdtrain runs the same exact step as every other strategy
(`mdtrain.loop.ExactTrainer.train_step`) and the same input pipeline
(`mdtrain.pipeline.InputData`, built on each worker through
`ClusterCoordinator.create_per_worker_dataset`). Keras' own `fit` cannot run
here: Keras 3 does not support parameter-server training
(keras-team/keras#18624), and `fit` fails asking for
`create_per_worker_dataset`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from mdtrain.errors import UsageError
from mdtrain.training import (
    AUGMENT_IN_STEP_NOTE,
    TrainConfig,
    cosine_schedule,
    input_data_for,
    new_trainer,
    run_splits,
    write_outputs,
)


def train_steps(
    strategy,
    coord,
    trainer,
    dataset_fn,
    num_steps: int,
    *,
    log_every: int = 10,
    on_block=None,
    learning_rate=None,
) -> dict:
    """Schedules `num_steps` asynchronous training steps and waits for them.

    Each step is `trainer.train_step_sums` on the next batch of the worker
    that runs it: the exact step, returning its own loss and accuracy sums.
    Every `log_every` steps the coordinator waits for all scheduled steps
    (`join`) and adds up their sums: one point of the loss curve, exact for
    the steps it covers. (Keras metrics would live on the parameter servers,
    where two workers' read-modify-write updates can interleave and one be
    lost.)

    Args:
        strategy: a `ParameterServerStrategy`.
        coord: its `ClusterCoordinator`.
        trainer: a compiled `mdtrain.loop.ExactTrainer`, created in `strategy.scope()`.
        dataset_fn: a function returning a repeated dataset of `(images,
            labels)`, or of `(images, labels, transforms)` for a trainer that
            augments in its step (`InputData(augment_in="model")`); every
            worker builds its own from it.
        num_steps: steps to run in all, over all workers.
        log_every: steps per point of the curve. Defaults to 10.
        on_block: called as `on_block(history)` after each point. Defaults to None.
        learning_rate: called as `learning_rate(completed_steps)` before each
            block, the rate the block runs at (the optimizer must have been
            built with a float rate); None leaves the optimizer's own.
            Defaults to None.

    Returns:
        The history: per point, `steps` (done by its end), `loss` and
        `accuracy` (the mean of its steps), `seconds` (since the first step
        was scheduled) and `learning_rate` (when set); in all, `scheduled`,
        `completed`, `examples` (trained on) and `events`.

    Raises:
        ValueError: if `log_every` is below 1.
    """
    from mdtrain.loop import build_optimizer

    if log_every < 1:
        raise ValueError(f"log_every must be at least 1, not {log_every}")
    build_optimizer(trainer)  # on the ps, before any step
    iterator = iter(coord.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        return strategy.run(trainer.train_step_sums, args=(next(it),))

    history = {k: [] for k in ("steps", "loss", "accuracy", "seconds", "learning_rate", "events")}
    history.update(scheduled=0, completed=0, examples=0)
    start = time.perf_counter()
    while history["scheduled"] < num_steps:
        block = min(log_every, num_steps - history["scheduled"])
        if learning_rate is not None:
            # Set from the coordinator's count of steps, not the optimizer's: under parameter
            # servers `iterations` undercounts, because Keras 3's `assign_add` reads and then
            # writes, and two workers' increments can interleave and one be lost (the optimizer
            # races under parameter servers: keras-team/keras#18668).
            trainer.optimizer.learning_rate = learning_rate(history["completed"])
            history["learning_rate"].append(float(trainer.optimizer.learning_rate))
        remote = [coord.schedule(step, args=(iterator,)) for _ in range(block)]
        history["scheduled"] += block
        coord.join()  # raises if a step failed for a reason other than a lost worker
        # fetch() raises if this step failed; a lost worker's steps were rerun elsewhere.
        loss_sum, correct, examples = np.sum([r.fetch() for r in remote], axis=0)
        history["completed"] += block
        history["examples"] += int(examples)  # (their class weights' sum, with --class-weight)
        history["steps"].append(history["completed"])
        history["loss"].append(float(loss_sum / examples))
        history["accuracy"].append(float(correct / examples))
        history["seconds"].append(time.perf_counter() - start)
        if on_block is not None:
            on_block(history)
    return history


_UNSUPPORTED = (
    ("backup_dir", None, "--backup-dir: not under parameter-server training"),
    ("fine_tune_epochs", 0, "--fine-tune-epochs: not under parameter-server training"),
    ("mixed_precision", False, "--mixed-precision: not under parameter-server training"),
    ("deterministic", False, "--deterministic: asynchronous updates cannot be reproduced"),
)
_NO_DISK_CACHE = "--cache disk: every worker would write the same cache files; use memory or none"


def check_config(config: TrainConfig) -> None:
    """Raises `UsageError` for a `TrainConfig` option parameter-server training lacks.

    Args:
        config: the run's `TrainConfig`.

    Raises:
        UsageError: one line naming the option, pointing to notebook 07.
    """
    for name, default, message in _UNSUPPORTED:
        if getattr(config, name) != default:
            raise UsageError(f"{message} (see notebooks/07_choosing_a_strategy.ipynb)")
    if config.cache == "disk":
        raise UsageError(f"{_NO_DISK_CACHE} (see notebooks/07_choosing_a_strategy.ipynb)")


def _dataset_fn(splits, batch_size: int, config: TrainConfig):
    def dataset_fn():
        # Built on each worker from ONE function traced on the chief: no worker number
        # reaches it, and an unseeded random op would draw what every other worker draws
        # (the chief set the global seed). The clock where the dataset is built gives
        # each worker a stream of its own: its own order and transforms, new every epoch.
        stream = tf.cast(tf.timestamp() * 1e6, tf.int64) % 2**31  # microseconds
        # tf.data compares a tensor seed with 0 in Python when the graph's seed is 0 (the
        # default --seed) and fails (tensorflow/tensorflow#17284): this graph gets its own.
        tf.random.set_seed(config.seed + 1)
        # In each worker's memory: a disk cache would be one set of files for all.
        cache = "none" if config.cache in ("none", False) else "memory"
        inputs = input_data_for(config, splits, batch_size, seed=stream, cache=cache)
        # The run's epochs, each its own shuffle and transforms; repeated in case a worker
        # takes over the steps of one that was lost.
        return inputs.train_epochs(0, config.epochs).repeat()

    return dataset_fn


def train(
    config: TrainConfig,
    resolver=None,
    *,
    log_every: int = 10,
    mark_after: int | None = None,
    mark_file: str | os.PathLike | None = None,
) -> dict:
    """Trains `config`'s model with parameter-server training; runs on the chief.

    What `mdtrain launch --workers N --ps M` runs in its chief: the run's data,
    input pipeline, model, trainer and learning-rate schedule are
    `mdtrain.training`'s, and only the loop is the coordinator's. The run is
    `epochs × steps_per_epoch` steps of `global_batch_size` examples, shared
    by the workers as they come free.

    Args:
        config: a `mdtrain.training.TrainConfig`; `strategy` is ignored.
        resolver: the cluster. Defaults to None: `TF_CONFIG`'s.
        log_every: steps per point of the loss curve. Defaults to 10.
        mark_after: for a fault drill: after this many steps, create
            `mark_file` (a launcher may kill a worker then). Defaults to None.
        mark_file: the file to create. Defaults to None.

    Returns:
        A JSON-able summary: `train_steps`' history plus `val_accuracy`,
        `num_workers`, `num_ps`, `global_batch_size`, `num_train`,
        `class_names` and `augment_in`.

    Raises:
        UsageError: for an option parameter-server training lacks, or bad data.

    Example:

    >>> summary = train(TrainConfig(epochs=2))  # doctest: +SKIP
    """
    from mdtrain.distribute import resolve_global_batch_size

    config.validate()
    check_config(config)
    resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coord = tf.distribute.coordinator.ClusterCoordinator(strategy)
    cluster = resolver.cluster_spec().as_dict()
    workers, servers = len(cluster.get("worker", [])), len(cluster.get("ps", []))
    splits = run_splits(config)[1]
    # One replica per worker, and a worker takes a whole step.
    batch = resolve_global_batch_size(1, config.batch_size_per_replica, config.global_batch_size)
    num_steps = config.epochs * -(-len(splits.train) // batch)
    trainer = _compiled_trainer(config, strategy, splits)
    print(
        f"parameter-server training: {workers} worker(s), {servers} ps; {num_steps} steps "
        f"of {batch} examples, asynchronous",
        flush=True,
    )
    if config.augment_place == "model":
        print(AUGMENT_IN_STEP_NOTE, flush=True)

    def on_block(history: dict) -> None:
        if config.verbose:
            _print_block(history, num_steps)
        if mark_after is not None and history["steps"][-1] >= mark_after and mark_file:
            _mark_once(history, mark_file)

    schedule = cosine_schedule(config.learning_rate, num_steps)
    history = train_steps(
        strategy, coord, trainer, _dataset_fn(splits, batch, config), num_steps,
        log_every=log_every, on_block=on_block,
        learning_rate=lambda completed: float(schedule(completed)),
    )  # fmt: skip
    val_ds = input_data_for(config, splits, batch, augment=None, augment_in="pipeline",
                            cache="none").val_ds  # fmt: skip
    summary = history | {
        "val_accuracy": _val_accuracy(trainer.net, val_ds),
        "num_workers": workers,
        "num_ps": servers,
        "global_batch_size": batch,
        "num_train": len(splits.train),
        "class_names": splits.class_names,
        "augment_in": config.augment_place,
    }
    if config.output:
        write_outputs(config.output, trainer.net, history, summary)
    return summary


def _val_accuracy(net, val_ds) -> float | None:
    """Accuracy on the validation batches, on the chief (Keras' `evaluate` cannot run here)."""
    if val_ds is None:
        return None
    right = total = 0
    for images, labels in val_ds:  # the weights are read from the ps
        predicted = tf.argmax(net(images, training=False), axis=-1, output_type=tf.int32)
        right += int(tf.reduce_sum(tf.cast(predicted == labels, tf.int32)))
        total += int(labels.shape[0])
    return right / max(total, 1)


def _compiled_trainer(config: TrainConfig, strategy, splits):
    """An `ExactTrainer` of `config`'s model; its variables live on the parameter servers."""
    from mdtrain.augment import AugmentPolicy

    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        augment = AugmentPolicy() if config.augment_place == "model" else None
        trainer = new_trainer(config, splits, augment)
        # A float rate, which the coordinator sets block by block (`train_steps`).
        trainer.compile(optimizer=keras.optimizers.Adam(config.learning_rate))
    return trainer


def _print_block(history: dict, num_steps: int) -> None:
    done, loss, accuracy = history["steps"][-1], history["loss"][-1], history["accuracy"][-1]
    print(
        f"step {done}/{num_steps}: loss {loss:.4f} accuracy {accuracy:.3f} "
        f"({history['seconds'][-1]:.1f} s)",
        flush=True,
    )


def _mark_once(history: dict, mark_file: str | os.PathLike) -> None:
    """Creates the fault drill's mark file, once; a launcher may kill a worker then."""
    if not Path(mark_file).exists():
        Path(mark_file).touch()
        history["events"].append(f"step {history['steps'][-1]}: drill mark written")
