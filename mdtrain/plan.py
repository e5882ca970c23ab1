"""A training run written down as data: the segments `mdtrain.training` carries out.

A run has one or two phases (training, then optionally fine-tuning at a tenth
of the learning rate) and may resume part-way through an epoch of either; as a
flat list of `fit` calls its every branch is tested on plain numbers, without TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ResumePoint:
    """Where a run continues: the next epoch (0-based), steps already done in it, their phase."""

    epoch: int = 0
    step: int = 0
    phase: int = 0  # 0 training, 1 fine-tuning
    path: Path | None = None  # the backup holding the state here; None at a fresh start
    fingerprint: dict = field(default_factory=dict)  # the settings the backup was made under
    history: list[dict[str, float]] = field(default_factory=list)  # a row per epoch done


@dataclass(frozen=True)
class Segment:
    """One `fit` call: epochs `first_epoch` … `last_epoch - 1` of one phase."""

    phase: int
    first_epoch: int
    last_epoch: int
    skip_steps: int  # steps of `first_epoch` already done: the segment runs only its rest
    learning_rate: float  # the phase's peak
    decay_steps: int  # steps of the whole phase
    starts_phase: bool  # a fresh optimizer (and, fine-tuning, the base unfrozen) first
    restore: bool  # load the backup first
    restore_optimizer: bool  # with its optimizer state (saved in this phase)
    warmup_steps: int = 0  # the phase's first steps, from 0 up to `learning_rate`

    def schedule(self):
        """The rate by step: linear from 0 over `warmup_steps`, then cosine decay to a tenth."""
        import keras

        return keras.optimizers.schedules.CosineDecay(
            0.0,
            self.decay_steps - self.warmup_steps,
            alpha=0.1,
            warmup_target=self.learning_rate,
            warmup_steps=self.warmup_steps,
        )


def plan_run(
    epochs: int,
    fine_tune_epochs: int,
    learning_rate: float,
    steps_per_epoch: int,
    resume: ResumePoint | None = None,
    warmup_epochs: int = 0,
) -> list[Segment]:
    """The segments of a run from the resume position (default: the start); empty when done."""
    resume = resume or ResumePoint()
    phases = [(0, epochs, learning_rate, warmup_epochs)]  # (first, last epoch, rate, warm-up)
    if fine_tune_epochs:  # fine-tuning steps are a tenth of the training steps
        phases.append((epochs, epochs + fine_tune_epochs, learning_rate * 0.1, 0))
    segments: list[Segment] = []
    for phase, (first, last, lr, warmup) in enumerate(phases):
        if last <= resume.epoch:
            continue  # finished before the resume point
        start = max(first, resume.epoch)
        skip = resume.step if start == resume.epoch else 0
        # the rest of a half-done epoch, then the whole epochs after it
        pieces = [(start, start + 1, skip), (start + 1, last, 0)] if skip else [(start, last, 0)]
        for i, (begin, end, skip_steps) in enumerate(pieces):
            restore = resume.path is not None and not segments  # the first segment loads it
            if begin < end:
                segments.append(
                    Segment(
                        phase,
                        begin,
                        end,
                        skip_steps,
                        lr,
                        (last - first) * steps_per_epoch,
                        starts_phase=i == 0,
                        restore=restore,
                        restore_optimizer=restore and resume.phase == phase,
                        warmup_steps=warmup * steps_per_epoch,
                    )
                )
    return segments
