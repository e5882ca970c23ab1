"""One interface for the run's three loops: each carries out one segment of the plan.

Keras' `fit`, `custom_fit` (which multi-worker runs need) and a parameter-server
chief's `coordinator_fit`, each a `SegmentLoop` subclass (docs/development.md, "How a
training run is built", says where a new one goes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import keras
import tensorflow as tf

from mdtrain.history import history_rows
from mdtrain.loop import ExactTrainer, custom_fit
from mdtrain.pipeline import InputData
from mdtrain.plan import Segment
from mdtrain.ps.loop import coordinator_fit, worker_dataset_fn

LearningRate = float | keras.optimizers.schedules.LearningRateSchedule
# `MonitorCallback.watch`: the training batches stamped for the monitor (`mdtrain.monitor.watch`).
Watch = Callable[..., tf.data.Dataset]


@dataclass(frozen=True)
class SegmentRun:
    """What a loop returns for one segment: a history row per epoch, and its own record."""

    history: list[dict[str, float]]
    # Parameter-server training's loss curve (`TrainResult.ps_log`); None from the other loops.
    log: dict | None = None


class SegmentLoop(Protocol):
    """A loop that carries out segments of the plan with the trainer it was built with."""

    def learning_rate(self, segment: Segment) -> LearningRate:
        """The rate to compile the optimizer with at the start of the segment's phase."""
        return segment.schedule()  # by step, as Keras' optimizer counts them

    def __call__(self, segment: Segment, callbacks: list) -> SegmentRun:
        """Trains epochs `first_epoch`…`last_epoch - 1` of `segment`, less its `skip_steps`."""
        ...


def _loop_arguments(segment: Segment, steps_per_epoch: int, callbacks: list, verbose: int):
    """The keyword arguments `fit`, `custom_fit` and `coordinator_fit` share, for `segment`."""
    return dict(
        epochs=segment.last_epoch,
        initial_epoch=segment.first_epoch,
        steps_per_epoch=steps_per_epoch - segment.skip_steps,
        callbacks=callbacks,
        verbose=verbose,
    )


@dataclass(frozen=True)
class FitLoop(SegmentLoop):
    """Keras' `fit`, which `ExactFitHooks` makes run the trainer's exact steps."""

    trainer: ExactTrainer
    inputs: InputData
    verbose: int = 2
    watch: Watch | None = None  # stamps the training batches, where the trainer keeps no clock

    def __call__(self, segment: Segment, callbacks: list) -> SegmentRun:
        inputs = self.inputs
        train_ds = inputs.train_epochs(segment.first_epoch, segment.last_epoch, segment.skip_steps)
        if self.watch is not None:
            train_ds = self.watch(train_ds)
        history = self.trainer.fit(
            train_ds,
            validation_data=inputs.val_ds,
            shuffle=False,  # shuffled already, each epoch by its own seed
            **_loop_arguments(segment, inputs.steps_per_epoch, callbacks, self.verbose),
        )
        return SegmentRun(history_rows(history))


@dataclass(frozen=True)
class CustomLoop(SegmentLoop):
    """`custom_fit`: under several workers each decodes only its replicas' slices."""

    trainer: ExactTrainer
    strategy: tf.distribute.Strategy
    inputs: InputData
    verbose: int = 2
    watch: Watch | None = None  # stamps the training batches, where the trainer keeps no clock

    def __call__(self, segment: Segment, callbacks: list) -> SegmentRun:
        epochs = (segment.first_epoch, segment.last_epoch, segment.skip_steps)
        train_ds, val_ds = self.inputs.for_strategy(self.strategy, *epochs, watch=self.watch)
        history = custom_fit(
            self.trainer,
            self.strategy,
            train_ds,
            val_ds=val_ds,
            **_loop_arguments(segment, self.inputs.steps_per_epoch, callbacks, self.verbose),
        )
        return SegmentRun(history_rows(history))


@dataclass(frozen=True)
class ParameterServerLoop(SegmentLoop):
    """`coordinator_fit`, in a parameter-server chief: each worker builds its own batches.

    Its `SegmentRun.log` is the segment's loss curve with the cluster's size
    (`num_workers`, `num_ps`), which `TrainResult.ps_log` reports.
    """

    trainer: ExactTrainer
    strategy: tf.distribute.Strategy
    inputs: InputData
    epochs: int  # the run's training epochs: each worker's dataset holds them all
    log_every: int  # steps per point of the loss curve
    cluster: dict[str, int] = field(default_factory=dict)  # `num_workers` and `num_ps`
    verbose: int = 2

    def learning_rate(self, segment: Segment) -> LearningRate:
        return segment.learning_rate  # a float, which the coordinator sets step by step

    def __call__(self, segment: Segment, callbacks: list) -> SegmentRun:
        history, log = coordinator_fit(
            self.trainer,
            self.strategy,
            worker_dataset_fn(self.inputs, self.epochs),
            val_ds=self.inputs.val_ds,
            learning_rate=segment.schedule(),
            log_every=self.log_every,
            **_loop_arguments(segment, self.inputs.steps_per_epoch, callbacks, self.verbose),
        )
        return SegmentRun(history_rows(history), log | self.cluster)

    def describe(self) -> str:
        """One line for the start of a run."""
        steps = self.epochs * self.inputs.steps_per_epoch
        return (
            f"parameter-server training: {self.cluster['num_workers']} worker(s), "
            f"{self.cluster['num_ps']} ps; {steps} steps of {self.inputs.global_batch_size} "
            "examples, asynchronous"
        )
