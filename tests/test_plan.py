"""The run plan: phases, resume points and fine-tuning as plain numbers (no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdtrain.plan import ResumePoint, plan_run

BACKUP = Path("ckpt-00001-000004")


def _shape(segments):
    return [(s.phase, s.first_epoch, s.last_epoch, s.skip_steps) for s in segments]


def test_a_fresh_run_is_one_segment():
    (segment,) = plan_run(5, 0, 2e-3, steps_per_epoch=10)
    assert (segment.first_epoch, segment.last_epoch, segment.skip_steps) == (0, 5, 0)
    assert segment.starts_phase and not segment.restore and segment.phase == 0
    assert segment.decay_steps == 50 and segment.learning_rate == 2e-3


def test_fine_tuning_is_a_second_phase_at_a_tenth_of_the_rate():
    head, tune = plan_run(3, 2, 1e-3, steps_per_epoch=10)
    assert _shape([head, tune]) == [(0, 0, 3, 0), (1, 3, 5, 0)]
    assert tune.phase == 1 and tune.starts_phase
    assert tune.learning_rate == pytest.approx(1e-4)
    assert tune.decay_steps == 20  # the schedule spans its own phase only


def test_mid_epoch_resume_in_the_first_phase():
    segments = plan_run(3, 2, 1e-3, 10, ResumePoint(epoch=1, step=4, phase=0, path=BACKUP))
    assert _shape(segments) == [(0, 1, 2, 4), (0, 2, 3, 0), (1, 3, 5, 0)]
    rest, whole, tune = segments
    assert rest.restore and rest.restore_optimizer and rest.starts_phase
    assert not whole.restore and not whole.starts_phase  # same optimizer, same schedule
    assert rest.decay_steps == whole.decay_steps == 30
    assert not tune.restore and tune.starts_phase


def test_mid_epoch_resume_in_the_fine_tuning_phase():
    segments = plan_run(3, 2, 1e-3, 10, ResumePoint(epoch=4, step=7, phase=1, path=BACKUP))
    assert _shape(segments) == [(1, 4, 5, 7)]
    assert segments[0].restore and segments[0].restore_optimizer


def test_resume_at_the_phase_boundary_starts_a_fresh_optimizer():
    """A backup that ended training: fine-tuning loads its weights, not its optimizer."""
    (tune,) = plan_run(3, 2, 1e-3, 10, ResumePoint(epoch=3, step=0, phase=0, path=BACKUP))
    assert _shape([tune]) == [(1, 3, 5, 0)]
    assert tune.restore and not tune.restore_optimizer and tune.starts_phase


def test_resume_at_an_epoch_start():
    (segment,) = plan_run(4, 0, 1e-3, 10, ResumePoint(epoch=2, step=0, phase=0, path=BACKUP))
    assert _shape([segment]) == [(0, 2, 4, 0)]
    assert segment.restore and segment.restore_optimizer


def test_resume_in_the_last_epoch_leaves_one_segment():
    (rest,) = plan_run(2, 0, 1e-3, 10, ResumePoint(epoch=1, step=9, phase=0, path=BACKUP))
    assert _shape([rest]) == [(0, 1, 2, 9)]  # 1 step left of 10


def test_a_finished_run_has_nothing_left():
    assert plan_run(2, 1, 1e-3, 10, ResumePoint(epoch=3, path=BACKUP)) == []


def test_warm_up_belongs_to_the_training_phase_and_survives_a_resume():
    point = ResumePoint(epoch=1, step=4, phase=0, path=BACKUP)
    rest, whole, tune = plan_run(3, 2, 1e-3, 10, point, warmup_epochs=2)
    assert rest.warmup_steps == whole.warmup_steps == 20 and tune.warmup_steps == 0
    assert rest.schedule().get_config() == whole.schedule().get_config()  # one schedule


def test_the_learning_rate_rises_from_0_then_decays_to_a_tenth():
    pytest.importorskip("keras")
    (segment,) = plan_run(4, 0, 1e-3, 10, warmup_epochs=1)
    rate = segment.schedule()
    at = {step: float(rate(step)) for step in (0, 5, 10, 25, 40)}
    assert at[0] == 0.0 and at[5] == pytest.approx(5e-4) and at[10] == pytest.approx(1e-3)
    assert 1e-4 < at[25] < 1e-3 and at[40] == pytest.approx(1e-4)
    (plain,) = plan_run(4, 0, 1e-3, 10)
    assert float(plain.schedule()(0)) == pytest.approx(1e-3)  # no warm-up: the peak at once
