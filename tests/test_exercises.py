"""The exercises' checks: they print what is wrong, and raise only for a worked solution."""

import pytest

from mdtrain_course.exercises import ExerciseError, not_written, verdict


def test_a_working_answer_is_said_to_work(capsys):
    assert verdict("Write the pipeline", []) is True
    assert "✓ Write the pipeline: it works." in capsys.readouterr().out


def test_a_wrong_answer_gets_each_problem_in_words_and_no_exception(capsys):
    assert (
        verdict("Write the pipeline", ["it has no prefetch.", "", "batch is 16, not 32."]) is False
    )
    out = capsys.readouterr().out
    assert "✗ Write the pipeline: not yet." in out
    assert "  - it has no prefetch." in out and "  - batch is 16, not 32." in out


def test_a_failing_worked_solution_raises_with_its_problems():
    with pytest.raises(ExerciseError, match="Write the pipeline: it has no prefetch."):
        verdict("Write the pipeline", ["it has no prefetch."], strict=True)


@pytest.mark.parametrize("placeholder", [None, ...])
def test_a_placeholder_is_not_written(placeholder):
    assert not_written(placeholder, "train_ds") == [
        "train_ds is still the placeholder: write it in the cell above."
    ]
    assert not_written(object(), "train_ds") == []
