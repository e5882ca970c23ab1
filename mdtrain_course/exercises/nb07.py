"""Notebook 07's exercise: resume a training loop from `tf.train.CheckpointManager`."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from mdtrain_course.exercises import not_written, verdict

EXERCISE = "Resume from a CheckpointManager"
STEPS_PER_EPOCH = 5
STEPS_DONE = 7  # epoch 1 (from 0), step 2 of it


def _model_and_optimizer(seed: int) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _trained_backup(folder: str) -> list[np.ndarray]:
    """Trains STEPS_DONE steps, saves them with a CheckpointManager; returns the weights."""
    model, optimizer = _model_and_optimizer(seed=1)
    images = np.random.default_rng(0).random((8, 4), dtype=np.float32)
    for _ in range(STEPS_DONE):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(images) ** 2)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    tf.train.CheckpointManager(checkpoint, folder, max_to_keep=1).save()
    return model.get_weights()


def _resume_problems(resume: Callable, folder: str, saved: list[np.ndarray] | None) -> list[str]:
    """Calls `resume` on a fresh model; the problems with what it restored and returned."""
    model, optimizer = _model_and_optimizer(seed=2)
    initial = model.get_weights()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=1)
    where = "after 7 saved steps" if saved is not None else "with no backup yet"
    try:
        position = resume(checkpoint, manager, STEPS_PER_EPOCH)
    except Exception as error:  # the learner's code: say what it raised, in one line
        return [f"{where}, resume(...) raised {type(error).__name__}: {error}"]
    wanted_weights = saved if saved is not None else initial
    wanted_position = divmod(STEPS_DONE, STEPS_PER_EPOCH) if saved is not None else (0, 0)
    problems = []
    if not all(
        np.array_equal(a, b) for a, b in zip(model.get_weights(), wanted_weights, strict=True)
    ):
        problems.append(f"{where}, the model's weights are not the ones wanted.")
    if saved is not None and int(optimizer.iterations.numpy()) != STEPS_DONE:
        problems.append(
            f"{where}, optimizer.iterations is {int(optimizer.iterations.numpy())}, not 7."
        )
    if tuple(position or ()) != wanted_position:
        problems.append(f"{where}, it returned {position!r}, not (epoch, step) {wanted_position}.")
    return problems


def check_resume(resume: Callable | None, *, strict: bool = False) -> bool:
    """Checks `resume(checkpoint, manager, steps_per_epoch) -> (epoch, step)`.

    With a backup in the manager's folder, it must restore it (the model's
    weights and the optimizer, its step count included) and return where to
    go on: the epoch and the step within it, both counted from 0. With none,
    it must leave the model as it is and return ``(0, 0)``.

    Args:
        resume: The learner's function.
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when it does both.
    """
    problems = not_written(resume, "resume")
    if not problems:
        with tempfile.TemporaryDirectory() as saved_in, tempfile.TemporaryDirectory() as empty:
            problems = _resume_problems(resume, saved_in, _trained_backup(saved_in))
            problems += _resume_problems(resume, empty, None)
    return verdict(EXERCISE, problems, strict=strict)
