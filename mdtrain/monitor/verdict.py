"""Pure diagnosis: from wait share and GPU utilisation to a verdict in words."""

from __future__ import annotations

# TensorFlow's profiler calls a program HIGHLY input-bound from 20% of step time
# spent waiting for input, MODERATELY from 5% (its input-pipeline analyzer).
HIGHLY_INPUT_BOUND_SHARE = 0.20
MODERATELY_INPUT_BOUND_SHARE = 0.05
BUSY_UTILIZATION = 70.0
IDLE_UTILIZATION = 40.0


def verdict(
    input_wait_share: float | None,
    gpu_utilization: float | None,
    *,
    augments_on_device: bool = False,
) -> str:
    """Says in words what limits training speed, and what to try.

    The first word is one of ``input-bound``, ``compute-bound``,
    ``under-used`` or ``unknown``, so code can branch on it. The input-wait
    share is the direct evidence, judged with the thresholds of TensorFlow's
    profiler: highly input-bound from 20%, moderately from 5%. Below that,
    GPU utilisation tells compute-bound (from 70%) from under-used; below 40%
    it also stands in for a missing wait figure (a plain ``model.fit``).

    Args:
        input_wait_share: Share (0-1) of each step spent waiting for input, or
            ``None`` when unknown.
        gpu_utilization: Mean utilisation (0-100) over the GPUs, or ``None``
            without a GPU.
        augments_on_device: Whether the training step augments already
            (``mdtrain train``'s default, ``--augment-in model``), so the advice leaves
            moving it there out. Defaults to ``False``.

    Returns:
        One sentence.

    Example:

    >>> verdict(0.38, 41.0).split(" — ")[0]
    'input-bound (highly): the devices waited 38% of each step'
    """
    fixes = "cache the dataset, prefetch, or move augmentation onto the device"
    if augments_on_device:
        fixes = "cache the dataset, prefetch, or give the input pipeline more CPU cores"
    wait = input_wait_share
    if wait is not None and wait >= MODERATELY_INPUT_BOUND_SHARE:
        degree = "highly" if wait >= HIGHLY_INPUT_BOUND_SHARE else "moderately"
        return f"input-bound ({degree}): the devices waited {wait:.0%} of each step — {fixes}"
    if gpu_utilization is not None:
        util = f"the GPUs averaged {gpu_utilization:.0f}% utilisation"
        if wait is not None:
            util += f" and waited {wait:.0%} of each step on input"
        if gpu_utilization >= BUSY_UTILIZATION:
            return f"compute-bound: {util} — the input pipeline keeps up"
        if gpu_utilization < IDLE_UTILIZATION and wait is None:
            return (
                f"input-bound (likely): {util} with no input-wait figure — "
                f"{fixes}, or train with mdtrain's ExactTrainer to measure the wait"
            )
        return (
            f"under-used: {util} — raise the batch size, use mixed precision, "
            "or look for host-side work between steps"
        )
    if wait is not None:
        return (
            f"compute-bound: the loop waited {wait:.0%} of each step on input — "
            "the input pipeline keeps up (no GPU to sample)"
        )
    return (
        "unknown: no input-wait figure and no GPU to sample — mdtrain's ExactTrainer "
        "measures the wait under fit and the custom loop (not on parameter servers)"
    )
