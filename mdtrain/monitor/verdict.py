"""Pure diagnosis: from wait share and GPU utilisation to a verdict in words."""

from __future__ import annotations

INPUT_BOUND_SHARE = 0.20
BUSY_UTILIZATION = 70.0
IDLE_UTILIZATION = 40.0


def verdict(
    input_wait_share: float | None,
    gpu_utilization: float | None,
    *,
    input_bound_share: float = INPUT_BOUND_SHARE,
    busy_utilization: float = BUSY_UTILIZATION,
    idle_utilization: float = IDLE_UTILIZATION,
) -> str:
    """Says in words what limits training speed, and what to try.

    The first word is one of ``input-bound``, ``compute-bound``,
    ``under-used`` or ``unknown``, so code can branch on it. The input-wait
    share is the direct evidence; GPU utilisation stands in for it under
    ``model.fit``, where Keras fetches inside its compiled step and no wait
    figure exists.

    Args:
        input_wait_share: Share (0-1) of each step spent waiting for input, or
            ``None`` when unknown.
        gpu_utilization: Mean utilisation (0-100) over the GPUs, or ``None``
            without a GPU.
        input_bound_share: Wait share from which training counts as
            input-bound. Defaults to ``0.20``.
        busy_utilization: Utilisation from which GPUs count as busy.
            Defaults to ``70.0``.
        idle_utilization: Utilisation below which GPUs count as starved.
            Defaults to ``40.0``.

    Returns:
        One sentence.

    Example:

    >>> verdict(0.38, 41.0).split(" — ")[0]
    'input-bound: the devices waited 38% of each step'
    """
    fixes = "cache the dataset, prefetch, or move augmentation onto the device"
    if input_wait_share is not None and input_wait_share >= input_bound_share:
        return f"input-bound: the devices waited {input_wait_share:.0%} of each step — {fixes}"
    if gpu_utilization is not None:
        util = f"the GPUs averaged {gpu_utilization:.0f}% utilisation"
        if input_wait_share is not None:
            util += f" and waited {input_wait_share:.0%} of each step on input"
        if gpu_utilization >= busy_utilization:
            return f"compute-bound: {util} — the input pipeline keeps up"
        if gpu_utilization < idle_utilization and input_wait_share is None:
            return (
                f"input-bound (likely): {util} with no input-wait figure under model.fit — "
                f"{fixes}, or time the loop with mdtrain's custom loop"
            )
        return (
            f"under-used: {util} — raise the batch size, use mixed precision, "
            "or look for host-side work between steps"
        )
    if input_wait_share is not None:
        return (
            f"compute-bound: the loop waited {input_wait_share:.0%} of each step on input — "
            "the input pipeline keeps up (no GPU to sample)"
        )
    return (
        "unknown: no input-wait figure (model.fit) and no GPU to sample — "
        "run mdtrain's custom loop to measure the wait"
    )
