"""Runs a learner's per-replica training step on 2 replicas and on one device.

Shared by the checks of notebooks 03 and 04, whose exercises ask for the
function that `strategy.run` calls on each replica. The step trains a tiny
model with plain SGD, so that a wrong loss rule shows as a wrong update (Adam
would normalise a gradient twice too large away), and the reference is the
same update computed on one device, without a strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from mdtrain.compat import fresh_collective_keys

NUM_CLASSES = 3
LEARNING_RATE = 0.5


@dataclass
class StepRun:
    """What a training step did: the loss it returned (summed over replicas) and the update."""

    loss: float
    updates: list[np.ndarray]


def step_devices(count: int = 2) -> list[str]:
    """The first `count` devices a notebook's strategy would use: its GPUs, else its CPUs."""
    gpus = tf.config.list_logical_devices("GPU")
    return [device.name for device in gpus or tf.config.list_logical_devices("CPU")][:count]


def tiny_model(seed: int = 0, l2: float = 0.0) -> keras.Model:
    """A linear classifier of 4×4×3 images, with an L2 penalty on its kernel when `l2` > 0."""
    keras.utils.set_random_seed(seed)
    regularizer = keras.regularizers.L2(l2) if l2 else None
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.Flatten()(inputs)
    outputs = keras.layers.Dense(NUM_CLASSES, activation="softmax", kernel_regularizer=regularizer)(
        x
    )
    return keras.Model(inputs, outputs)


def batch(num_examples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 images in [0, 1) and int32 labels."""
    rng = np.random.default_rng(seed)
    images = rng.random((num_examples, 4, 4, 3), dtype=np.float32)
    return images, rng.integers(0, NUM_CLASSES, num_examples).astype(np.int32)


def run_step(
    step: Callable, devices: list[str], images: np.ndarray, labels: np.ndarray, l2: float = 0.0
) -> StepRun:
    """One call of `step(model, optimizer, images, labels)` under `MirroredStrategy(devices)`.

    The batch is distributed as `experimental_distribute_dataset` does: each
    replica gets consecutive examples. Exceptions from `step` propagate.
    """
    fresh_collective_keys()  # a strategy over devices of an earlier one (tensorflow#61314)
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = tiny_model(l2=l2)
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        optimizer.build(model.trainable_variables)
    before = [w.copy() for w in model.get_weights()]
    ds = tf.data.Dataset.from_tensors((images, labels))
    (dist_images, dist_labels) = next(iter(strategy.experimental_distribute_dataset(ds)))

    @tf.function
    def distributed_step(images, labels):
        losses = strategy.run(lambda x, y: step(model, optimizer, x, y), args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    loss = float(distributed_step(dist_images, dist_labels))
    return StepRun(loss, [after - b for after, b in zip(model.get_weights(), before, strict=True)])


def reference_step(
    images: np.ndarray, labels: np.ndarray, divide_by: int, l2: float = 0.0
) -> StepRun:
    """The same step on one device: per-example losses summed, over `divide_by`, plus the L2."""
    model = tiny_model(l2=l2)
    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    before = [w.copy() for w in model.get_weights()]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(loss_fn(labels, model(images, training=True))) / divide_by
        if model.losses:
            loss += tf.add_n(model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(gradients, model.trainable_variables)
    return StepRun(float(loss), [a - b for a, b in zip(model.get_weights(), before, strict=True)])


def update_difference(run: StepRun, reference: StepRun) -> float:
    """Largest difference between two updates, relative to the largest reference change."""
    return max(
        float(np.max(np.abs(mine - theirs)) / max(np.max(np.abs(theirs)), 1e-30))
        for mine, theirs in zip(run.updates, reference.updates, strict=True)
    )


def update_problems(run: StepRun, reference: StepRun, tolerance: float) -> list[str]:
    """What is wrong with a step's update, against one device's: nothing moved, or differently."""
    if all(not update.any() for update in run.updates):
        return ["the weights did not change: apply the gradients with `optimizer.apply`."]
    if (difference := update_difference(run, reference)) > tolerance:
        return [
            f"the weights moved differently from one device's (largest relative difference "
            f"{difference:.1e}): take the gradient of the loss you return."
        ]
    return []


def call_problem(exc: Exception) -> str:
    """One sentence for a step that raised."""
    first_line = (str(exc).strip().splitlines() or [""])[0][:200]
    hint = " (does it return the loss?)" if "None" in first_line else ""
    return f"calling it raised {type(exc).__name__}: {first_line}{hint}"
