"""Notebook 09's exercise: schedule parameter-server steps with a `ClusterCoordinator`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from mdtrain_course.exercises import not_written, verdict

EXERCISE = "Schedule parameter-server steps"
NUM_STEPS = 8


def _counting_step(strategy: tf.distribute.Strategy):
    """A step that adds its input (1.0) to a variable on the servers and returns it doubled."""
    with strategy.scope():
        total = tf.Variable(0.0)

    @tf.function
    def train_step(iterator):
        def step(value):
            total.assign_add(value)
            return value * 2.0

        return strategy.run(step, args=(next(iterator),))

    return train_step, total


def _run_problems(values, total: float) -> list[str]:
    if not isinstance(values, list | tuple) or len(values) != NUM_STEPS:
        return [
            f"run_steps should return a list of {NUM_STEPS} values, one per step, not {values!r}."
        ]
    if not all(isinstance(value, float | np.floating) for value in values):
        kinds = sorted({type(value).__name__ for value in values})
        return [
            f"it returned {', '.join(kinds)}: fetch each step's value (`.fetch()`), "
            "and make it a float."
        ]
    problems = []
    if total != NUM_STEPS:
        problems.append(f"{total:g} of {NUM_STEPS} steps ran: schedule each one, then `join()`.")
    if any(value != 2.0 for value in values):
        problems.append("the values are not what the steps returned.")
    return problems


def check_run_steps(
    run_steps: Callable | None,
    strategy: tf.distribute.Strategy,
    coordinator,
    *,
    strict: bool = False,
) -> bool:
    """Checks `run_steps(coordinator, train_step, iterator, num_steps) -> list[float]`.

    It must schedule `num_steps` calls of `train_step(iterator)` on the
    cluster's workers, wait for all of them, and return what each returned, as
    floats, in the order they were scheduled. The check runs it with a step of
    its own on the cluster `strategy` and `coordinator` belong to.

    Args:
        run_steps: The learner's function.
        strategy: A `tf.distribute.ParameterServerStrategy`.
        coordinator: Its `tf.distribute.coordinator.ClusterCoordinator`.
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when every step ran and its value came back.
    """
    problems = not_written(run_steps, "run_steps")
    if not problems:
        train_step, total = _counting_step(strategy)
        ones = coordinator.create_per_worker_dataset(
            lambda: tf.data.Dataset.from_tensors(1.0).repeat()
        )
        try:
            values = run_steps(coordinator, train_step, iter(ones), NUM_STEPS)
            coordinator.join()  # what the learner's function left running, before reading the count
            problems = _run_problems(values, float(total.read_value()))
        except Exception as error:  # the learner's code: say what it raised, in one line
            problems = [f"run_steps(...) raised {type(error).__name__}: {error}"]
    return verdict(EXERCISE, problems, strict=strict)
