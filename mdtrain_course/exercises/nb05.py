"""Notebook 05's exercise: a learning rate warmed up from η to kη, then a cosine decay."""

from __future__ import annotations

import keras
import numpy as np

from mdtrain_course.exercises import not_written, verdict

EXERCISE = "Write WarmupCosine"
#: (initial, peak, warmup_steps, total_steps, alpha): Goyal et al.'s ramp from η to kη
#: (k = 8 here), and a warm-up from 0 as mdtrain's `--warmup-epochs` does.
CASES = ((0.1, 0.8, 50, 200, 0.0), (0.0, 0.004, 24, 144, 0.1))
TOLERANCE = 1e-5  # relative: float32 arithmetic


def expected_rates(
    initial: float, peak: float, warmup_steps: int, total_steps: int, alpha: float, steps
) -> np.ndarray:
    """The rates Keras' `CosineDecay` with `warmup_target` gives at `steps`."""
    schedule = keras.optimizers.schedules.CosineDecay(
        initial,
        total_steps - warmup_steps,
        alpha=alpha,
        warmup_target=peak,
        warmup_steps=warmup_steps,
    )
    return np.array([float(schedule(step)) for step in steps])


def _case_problems(warmup_cosine, case) -> list[str]:
    initial, peak, warmup_steps, total_steps, alpha = case
    middle = (warmup_steps + total_steps) // 2
    steps = [0, 1, warmup_steps // 2, warmup_steps - 1, warmup_steps, middle, total_steps + 10]
    try:
        schedule = warmup_cosine(initial, peak, warmup_steps, total_steps, alpha)
        rates = np.array([float(schedule(step)) for step in steps])
    except Exception as exc:  # the learner's code: any error is a problem to print
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return [f"WarmupCosine{case} raised {type(exc).__name__}: {first_line}"]
    problems = []
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        problems.append("it is not a `keras.optimizers.schedules.LearningRateSchedule`.")
    wanted = expected_rates(*case, steps)
    for step, rate, want in zip(steps, rates, wanted, strict=True):
        if abs(rate - want) > TOLERANCE * max(abs(want), peak):
            phase = "warm-up" if step < warmup_steps else "decay"
            problems.append(
                f"from {initial:g} to {peak:g} over {warmup_steps} steps, then to "
                f"{alpha:g}×{peak:g} at step {total_steps}: step {step} ({phase}) gives "
                f"{rate:.6g}, not {want:.6g}."
            )
            break  # the first wrong step says enough
    return problems


def check_warmup_cosine(warmup_cosine, *, strict: bool = False) -> bool:
    """Checks `WarmupCosine(initial, peak, warmup_steps, total_steps, alpha)` at chosen steps.

    The rate must rise linearly from `initial` at step 0 to `peak` at
    `warmup_steps` (Goyal et al.'s warm-up, from η to kη), then fall along a
    cosine to `alpha * peak` at `total_steps` and stay there, as Keras'
    `CosineDecay(initial, total_steps - warmup_steps, alpha, warmup_target=peak,
    warmup_steps=warmup_steps)` does.

    Args:
        warmup_cosine: The learner's class (or any callable making the schedule).
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when every rate checked is right.

    Raises:
        ExerciseError: With ``strict=True``, when one is not.

    Example:

    >>> check_warmup_cosine(None)  # doctest: +SKIP
    ✗ Write WarmupCosine: not yet.
    """
    problems = not_written(warmup_cosine, "WarmupCosine")
    for case in CASES if not problems else ():
        problems += _case_problems(warmup_cosine, case)
    return verdict(EXERCISE, problems, strict=strict)
