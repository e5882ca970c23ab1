"""Parameter-server training's loop on the chief: the coordinator's asynchronous steps.

`mdtrain.training.train` runs it instead of `fit` or `custom_fit`
(`mdtrain.segment_loops.ParameterServerLoop`): Keras 3's
`fit` does not support parameter servers (keras-team/keras#18624) and fails
asking for `create_per_worker_dataset`.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import keras
import numpy as np
import tensorflow as tf

from mdtrain.compat import one_result_copy_at_a_time
from mdtrain.loop import StepStats, build_optimizer, callback_list, evaluate
from mdtrain.pipeline import InputData


@one_result_copy_at_a_time()
def coordinator_fit(
    trainer,
    strategy,
    dataset_fn,
    *,
    epochs: int,
    steps_per_epoch: int,
    val_ds=None,
    initial_epoch: int = 0,
    callbacks: list | None = None,
    verbose: int = 2,
    log_every: int = 10,
    learning_rate=None,
) -> tuple[keras.callbacks.History, dict]:
    """Trains with a `ClusterCoordinator`'s asynchronous steps: `custom_fit`'s counterpart.

    Each step returns its own metric sums, which the chief adds up in blocks of `log_every` steps,
    each a point of the loss curve and a batch for the callbacks (docs/multi-worker.md).
    """
    if log_every < 1:
        raise ValueError(f"log_every must be at least 1, not {log_every}")
    blocks = _Blocks(trainer, strategy, dataset_fn, learning_rate)
    cbs, history = callback_list(trainer, callbacks, verbose, epochs, steps_per_epoch)
    cbs.on_train_begin()
    logs: dict[str, float] = {}
    for epoch in range(initial_epoch, epochs):
        cbs.on_epoch_begin(epoch)
        logs = blocks.epoch(cbs, steps_per_epoch, log_every)
        if val_ds is not None:
            # On the chief alone: Keras' `evaluate` cannot run under parameter servers.
            logs.update(evaluate(trainer, val_ds, cbs, trainer.test_step))
        cbs.on_epoch_end(epoch, logs)
        if trainer.stop_training:
            break
    cbs.on_train_end(logs)
    return history, blocks.log


class _Blocks:
    """Schedules blocks of steps on the workers, waits for them, and keeps the curve (`log`)."""

    def __init__(self, trainer, strategy, dataset_fn, learning_rate):
        self.trainer, self.learning_rate = trainer, learning_rate
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        build_optimizer(trainer)  # on the ps, before any step
        self.iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))
        self.step = tf.function(partial(_timed_step, strategy, trainer))
        self.workers = _worker_count(strategy)
        self.log = {k: [] for k in ("steps", "loss", "accuracy", "seconds", "learning_rate")}
        self.log |= dict(scheduled=0, completed=0, examples=0)
        self.start = time.perf_counter()

    def epoch(self, cbs, steps: int, log_every: int) -> dict[str, float]:
        """Runs one epoch of `steps` steps in blocks; its mean loss and accuracy."""
        done, totals = 0, np.zeros(3)
        while done < steps:
            block = min(log_every - self.log["completed"] % log_every, steps - done)
            cbs.on_train_batch_begin(done)
            sums, waited = self.run(block)
            totals, done = totals + sums, done + block
            # The block's examples, and the workers' mean wait: they fetch side by side.
            self.trainer.last_step = StepStats(int(sums[2]), waited / self.workers)
            cbs.on_train_batch_end(done - 1, _means(sums))
        return _means(totals)

    def run(self, steps: int) -> tuple[np.ndarray, float]:
        """Schedules `steps` steps, waits for them; their summed loss, correct, examples, and
        the seconds their workers waited for input, summed."""
        log, optimizer = self.log, self.trainer.optimizer
        if self.learning_rate is not None:
            # Set from the coordinator's count of steps, not the optimizer's: under parameter
            # servers `iterations` undercounts, because Keras 3's `assign_add` reads and then
            # writes, and two workers' increments can interleave and one be lost (the
            # optimizer races under parameter servers: keras-team/keras#18668).
            optimizer.learning_rate = self.learning_rate(log["completed"])
            log["learning_rate"].append(float(optimizer.learning_rate))
        remote = [self.coordinator.schedule(self.step, args=(self.iterator,)) for _ in range(steps)]
        log["scheduled"] += steps
        self.coordinator.join()  # raises if a step failed for a reason other than a lost worker
        # fetch() raises if this step failed; a lost worker's steps were rerun elsewhere.
        results = [r.fetch() for r in remote]
        sums = np.sum([step_sums for step_sums, _ in results], axis=0)
        waited = float(sum(wait for _, wait in results))
        log["completed"] += steps
        log["examples"] += int(sums[2])  # (their class weights' sum, with --class-weight)
        log["steps"].append(log["completed"])
        for name, value in _means(sums).items():
            log[name].append(value)
        log["seconds"].append(time.perf_counter() - self.start)
        return sums, waited


def _worker_count(strategy) -> int:
    """The cluster's workers: from the strategy's resolver, else `TF_CONFIG`, else 1."""
    resolver = strategy.cluster_resolver
    if resolver is not None:
        return max(1, resolver.cluster_spec().num_tasks("worker"))
    return max(1, cluster_size()["num_workers"])


def _timed_step(strategy, trainer, iterator):
    """One worker's step on its next batch: the step's sums, and how long it waited for it."""
    start = tf.timestamp()  # a parameter-server run never sets op determinism
    batch = next(iterator)
    with tf.control_dependencies(tf.nest.flatten(batch)):
        waited = tf.timestamp() - start
    return strategy.run(trainer.train_step_sums, args=(batch,)), waited


def _means(sums) -> dict[str, float]:
    loss_sum, correct, examples = sums
    return {"loss": float(loss_sum / examples), "accuracy": float(correct / examples)}


def cluster_size() -> dict[str, int]:
    """`num_workers` and `num_ps` of the cluster in `TF_CONFIG` (`make_strategy("ps")`'s)."""
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec().as_dict()
    return {"num_workers": len(cluster.get("worker", [])), "num_ps": len(cluster.get("ps", []))}


def worker_dataset_fn(inputs: InputData, epochs: int):
    """The function every worker builds its batches with: the run's `inputs`, its own seed.

    Args:
        inputs: the run's `InputData` on the chief; each worker builds its
            like, from its own random stream, cached in its own memory.
        epochs: the training epochs the workers' datasets hold, back to back.

    Returns:
        A function of no arguments returning a dataset, for
        `ClusterCoordinator.create_per_worker_dataset`.
    """

    def dataset_fn():
        # Traced once on the chief, for every worker: its own stream is seeded from the clock
        # where its dataset is built (docs/multi-worker.md, "Parameter servers").
        stream = tf.cast(tf.timestamp() * 1e6, tf.int64) % 2**31  # microseconds
        # tf.data compares a tensor seed with 0 in Python when the graph's seed is 0 (the
        # default --seed) and fails (tensorflow/tensorflow#17284): this graph gets its own.
        tf.random.set_seed(inputs.seed + 1)
        # In each worker's memory: a disk cache would be one set of files for all.
        cache = "none" if inputs.cache == "none" else "memory"
        worker_inputs = dataclasses.replace(inputs, seed=stream, cache=cache)
        # The run's epochs, each its own shuffle and transforms; repeated in case a worker
        # takes over the steps of one that was lost.
        return worker_inputs.train_epochs(0, epochs).repeat()

    return dataset_fn
