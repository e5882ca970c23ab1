"""Notebook 04's exercise: a training step exact on an uneven, partial batch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mdtrain_course.exercises import not_written, verdict
from mdtrain_course.exercises.steps import (
    batch,
    call_problem,
    reference_step,
    run_step,
    step_devices,
    update_problems,
)

EXERCISE = "The partial batch, exactly"
NUM_EXAMPLES = 3  # on 2 replicas a slice of 2 and a slice of 1: uneven
TOLERANCE = 1e-4  # float32 rounding of a different summation order, with room


def _replica_means(images: np.ndarray, labels: np.ndarray, num_replicas: int) -> float:
    """Keras `fit`'s rule: each replica's mean over num_replicas, summed (slices as distributed)."""
    size = -(-len(labels) // num_replicas)
    slices = [slice(start, start + size) for start in range(0, len(labels), size)]
    return sum(
        reference_step(images[part], labels[part], num_replicas * len(labels[part])).loss
        for part in slices
    )


def check_exact_train_step(exact_train_step: Callable | None, *, strict: bool = False) -> bool:
    """Checks `exact_train_step(model, optimizer, images, labels)` on an uneven batch.

    The step runs once under `MirroredStrategy` on 2 devices (the notebook's
    first two; on a machine with one, on 1 replica), on a batch of 3 examples:
    2 on one replica and 1 on the other. The summed loss it returns must be
    the mean over the 3, and the update what one device makes from it.

    Args:
        exact_train_step: The learner's function.
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when the step is exact.

    Raises:
        ExerciseError: With ``strict=True``, when it is not.

    Example:

    >>> check_exact_train_step(None)  # doctest: +SKIP
    ✗ The partial batch, exactly: not yet.
    """
    problems = not_written(exact_train_step, "exact_train_step")
    if problems:
        return verdict(EXERCISE, problems, strict=strict)
    devices = step_devices(2)
    images, labels = batch(NUM_EXAMPLES)
    try:
        run = run_step(exact_train_step, devices, images, labels)
    except Exception as exc:  # the learner's code: any error is a problem to print
        return verdict(EXERCISE, [call_problem(exc)], strict=strict)
    reference = reference_step(images, labels, NUM_EXAMPLES)
    if abs(run.loss - reference.loss) > TOLERANCE * reference.loss:
        fit_rule = _replica_means(images, labels, len(devices))
        if abs(run.loss - fit_rule) <= TOLERANCE * fit_rule:
            problems.append(
                "each replica's mean is divided by the number of replicas, as `fit` does: an "
                "example on the replica with fewer examples counts more. Divide the sum by the "
                "count of the whole batch (an all-reduce of each replica's count)."
            )
        else:
            problems.append(
                f"the replicas' losses add up to {run.loss:.6f}, not the mean over the "
                f"{NUM_EXAMPLES} examples, {reference.loss:.6f}."
            )
    problems += update_problems(run, reference, TOLERANCE)
    return verdict(EXERCISE, problems, strict=strict)
