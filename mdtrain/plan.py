"""A training run written down as data: the segments `mdtrain.training` carries out.

A run has one or two phases: training (the head, or the whole small model),
then optionally fine-tuning the top of a pretrained base at a tenth of the
learning rate. A resumed run starts part-way: in the middle of an epoch, in
either phase. `plan_run` turns the configuration, the steps per epoch and the
resume position into a flat list of `Segment`s, each one `fit` call, so the
runner in `mdtrain.training` is a short loop and every branch of the structure
is tested here on plain numbers, without TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ResumePoint:
    """Where a run continues: the next epoch (0-based), steps already done in it, their phase.

    `mdtrain.backup` reads one from the newest backup; `plan_run` plans from it.

    Attributes:
        epoch: the epoch to run next. Defaults to 0.
        step: steps of that epoch already done. Defaults to 0.
        phase: 0 for training, 1 for fine-tuning. Defaults to 0.
        path: the backup holding the state here; None at a fresh start.
        fingerprint: the settings the backup was made under.
        history: one row of metrics per epoch done.
    """

    epoch: int = 0
    step: int = 0
    phase: int = 0
    path: Path | None = None
    fingerprint: dict = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Segment:
    """One `fit` call: epochs `first_epoch` … `last_epoch - 1` of one phase.

    Attributes:
        phase: 0 for training, 1 for fine-tuning.
        first_epoch: the first epoch to run.
        last_epoch: the epoch to stop before.
        skip_steps: steps of `first_epoch` already done (a mid-epoch resume):
            the segment runs only the rest of that one epoch.
        learning_rate: the phase's peak learning rate.
        decay_steps: steps of the whole phase, over which the rate decays.
        starts_phase: compile a fresh optimizer (and, for fine-tuning,
            unfreeze the base) before this segment.
        restore: load the backup before this segment.
        restore_optimizer: load the backup's optimizer state too (it was
            saved in this phase).
    """

    phase: int
    first_epoch: int
    last_epoch: int
    skip_steps: int
    learning_rate: float
    decay_steps: int
    starts_phase: bool
    restore: bool
    restore_optimizer: bool


def plan_run(
    epochs: int,
    fine_tune_epochs: int,
    learning_rate: float,
    steps_per_epoch: int,
    resume: ResumePoint | None = None,
) -> list[Segment]:
    """The segments of a run, from the resume position to the end.

    Args:
        epochs: epochs of the first phase.
        fine_tune_epochs: epochs of fine-tuning after it (0: none).
        learning_rate: peak learning rate of the first phase.
        steps_per_epoch: steps in one epoch.
        resume: where the run continues. Defaults to the start.

    Returns:
        The segments, in order; empty if the run is already complete.

    Example:

    >>> [s.first_epoch for s in plan_run(3, 2, 1e-3, 10, ResumePoint(epoch=1, step=4))]
    [1, 2, 3]
    """
    resume = resume or ResumePoint()
    phases = [(0, epochs, learning_rate)]  # (first epoch, last epoch, learning rate)
    if fine_tune_epochs:  # fine-tuning steps are a tenth of the training steps
        phases.append((epochs, epochs + fine_tune_epochs, learning_rate * 0.1))
    segments: list[Segment] = []
    for phase, (first, last, lr) in enumerate(phases):
        if last <= resume.epoch:
            continue  # finished before the resume point
        start = max(first, resume.epoch)
        skip = resume.step if start == resume.epoch else 0
        # the rest of a half-done epoch, then the whole epochs after it
        pieces = [(start, start + 1, skip), (start + 1, last, 0)] if skip else [(start, last, 0)]
        for i, (begin, end, skip_steps) in enumerate(pieces):
            restore = resume.path is not None and not segments  # the first segment loads it
            if begin < end:
                segments.append(Segment(
                    phase, begin, end, skip_steps, lr, (last - first) * steps_per_epoch,
                    starts_phase=i == 0, restore=restore,
                    restore_optimizer=restore and resume.phase == phase,
                ))  # fmt: skip
    return segments
