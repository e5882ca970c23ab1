"""Notebook 07's exercise check: a right answer passes, each wrong one is named."""

import pytest

from mdtrain_course.exercises import ExerciseError
from mdtrain_course.exercises.nb07 import check_resume


def right(checkpoint, manager, steps_per_epoch):
    if manager.latest_checkpoint is None:
        return 0, 0
    checkpoint.restore(manager.latest_checkpoint)
    return divmod(int(checkpoint.optimizer.iterations.numpy()), steps_per_epoch)


def epoch_only(checkpoint, manager, steps_per_epoch):
    if manager.latest_checkpoint is None:
        return 0, 0
    checkpoint.restore(manager.latest_checkpoint)
    return int(checkpoint.optimizer.iterations.numpy()) // steps_per_epoch, 0


def no_restore(checkpoint, manager, steps_per_epoch):
    return 0, 0


def fails_without_backup(checkpoint, manager, steps_per_epoch):
    checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    return divmod(int(checkpoint.optimizer.iterations.numpy()), steps_per_epoch)


def test_the_right_answer_works(capsys):
    assert check_resume(right, strict=True)
    assert "it works" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (None, "still the placeholder"),
        (epoch_only, "not (epoch, step) (1, 2)"),
        (no_restore, "optimizer.iterations is 0, not 7"),
        (fails_without_backup, "with no backup yet"),
    ],
)
def test_each_wrong_answer_is_named(answer, problem, capsys):
    assert not check_resume(answer)
    assert problem in capsys.readouterr().out
    with pytest.raises(ExerciseError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        check_resume(answer, strict=True)
