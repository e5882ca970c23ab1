"""Notebook 03's exercise: a per-replica training step, regularization included."""

from __future__ import annotations

from collections.abc import Callable

from mdtrain_course.exercises import not_written, verdict
from mdtrain_course.exercises.steps import (
    batch,
    call_problem,
    reference_step,
    run_step,
    step_devices,
    update_problems,
)

EXERCISE = "A training step with weight decay"
GLOBAL_BATCH_SIZE = 8
L2 = 0.05  # large enough that counting the penalty twice moves the update visibly
TOLERANCE = 1e-4  # float32 rounding of a different summation order, with room


def _loss_problems(loss: float, images, labels, num_replicas: int, examples: int) -> list[str]:
    """Names the rule behind a wrong summed loss, or says how far off it is."""
    data = reference_step(images, labels, GLOBAL_BATCH_SIZE).loss
    right = reference_step(images, labels, GLOBAL_BATCH_SIZE, L2).loss
    penalty = right - data
    own_mean = reference_step(images, labels, examples // num_replicas).loss
    if abs(loss - right) <= TOLERANCE * abs(right):
        return []
    known = {
        data: "the regularization losses (`model.losses`) are missing from the loss.",
        data + num_replicas * penalty: (
            f"the regularization is counted once on each of the {num_replicas} replicas: "
            "scale it with `tf.nn.scale_regularization_loss`."
        ),
        own_mean + penalty: (
            "each replica divides by its own number of examples: divide the per-example "
            "losses' sum by `global_batch_size` (`tf.nn.compute_average_loss`)."
        ),
    }
    for wrong, problem in known.items():
        if abs(loss - wrong) <= TOLERANCE * abs(wrong):
            return [problem]
    return [
        f"the replicas' losses add up to {loss:.6f}, not the global batch's mean loss plus "
        f"the penalty, {right:.6f}."
    ]


def check_train_step(train_step: Callable | None, *, strict: bool = False) -> bool:
    """Checks `train_step(model, optimizer, images, labels, global_batch_size)` on replicas.

    The step runs once under `MirroredStrategy` on 2 devices (the notebook's
    first two; on a machine with one, on 1 replica with half a global batch),
    on a small model with an L2 penalty, trained by SGD. The summed loss it
    returns must be the global batch's mean loss plus the penalty, and the
    update what one device makes from that loss.

    Args:
        train_step: The learner's function.
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when the step is right.

    Raises:
        ExerciseError: With ``strict=True``, when it is not.

    Example:

    >>> check_train_step(None)  # doctest: +SKIP
    ✗ A training step with weight decay: not yet.
    """
    problems = not_written(train_step, "train_step")
    if problems:
        return verdict(EXERCISE, problems, strict=strict)
    devices = step_devices(2)
    # One device: half the global batch, so a per-replica mean still differs from the right rule.
    examples = GLOBAL_BATCH_SIZE if len(devices) > 1 else GLOBAL_BATCH_SIZE // 2
    images, labels = batch(examples)

    def step(model, optimizer, x, y):
        return train_step(model, optimizer, x, y, GLOBAL_BATCH_SIZE)

    try:
        run = run_step(step, devices, images, labels, l2=L2)
    except Exception as exc:  # the learner's code: any error is a problem to print
        return verdict(EXERCISE, [call_problem(exc)], strict=strict)
    problems = _loss_problems(run.loss, images, labels, len(devices), examples)
    reference = reference_step(images, labels, GLOBAL_BATCH_SIZE, L2)
    problems += update_problems(run, reference, TOLERANCE)
    return verdict(EXERCISE, problems, strict=strict)
