"""Notebook 05's exercise check: WarmupCosine against Keras' CosineDecay with warm-up."""

import keras
import numpy as np
import pytest

from mdtrain_course.exercises import ExerciseError, nb05


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, initial, peak, warmup_steps, total_steps, alpha=0.0, ramp_from_zero=False):
        self.initial, self.peak, self.alpha = initial, peak, alpha
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.ramp_from_zero = ramp_from_zero  # a mistake: ignores `initial`

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        start = 0.0 if self.ramp_from_zero else self.initial
        warmup = start + (self.peak - start) * step / self.warmup_steps
        done = keras.ops.minimum(
            (step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 1.0
        )
        cosine = 0.5 * (1.0 + keras.ops.cos(np.pi * done))
        decay = self.peak * (self.alpha + (1 - self.alpha) * cosine)
        return keras.ops.where(step < self.warmup_steps, warmup, decay)


def test_a_right_schedule_works(capsys):
    assert nb05.check_warmup_cosine(WarmupCosine, strict=True)
    assert "✓ Write WarmupCosine: it works." in capsys.readouterr().out


def test_a_ramp_from_zero_instead_of_eta_is_caught_at_its_first_step(capsys):
    def from_zero(*args):
        return WarmupCosine(*args, ramp_from_zero=True)

    assert nb05.check_warmup_cosine(from_zero) is False
    assert "step 0 (warm-up) gives 0, not 0.1." in capsys.readouterr().out


def test_a_plain_function_is_not_a_schedule(capsys):
    def as_function(*args):
        return WarmupCosine(*args).__call__

    assert nb05.check_warmup_cosine(as_function) is False
    assert "not a `keras.optimizers.schedules.LearningRateSchedule`" in capsys.readouterr().out


def test_the_placeholder_and_a_wrong_worked_solution():
    assert nb05.check_warmup_cosine(None) is False
    with pytest.raises(ExerciseError, match="WarmupCosine"):
        nb05.check_warmup_cosine(lambda *args: 1 / 0, strict=True)
