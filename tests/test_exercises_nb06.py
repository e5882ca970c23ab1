"""Notebook 06's exercise check: a right answer passes, each wrong one is named."""

import functools

import keras
import pytest

from mdtrain_course.exercises import ExerciseError
from mdtrain_course.exercises.nb06 import check_fine_tune


def fine_tune(model, base, num_layers, learning_rate, *, freeze_norm=True, recompile=True):
    """The worked answer, with one of its two steps left out on request."""
    base.trainable = True
    for layer in base.layers[:-num_layers]:
        layer.trainable = False
    for layer in base.layers if freeze_norm else ():
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
    if recompile:
        optimizer = keras.optimizers.Adam(learning_rate)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")


right = fine_tune
norm_left_trainable = functools.partial(fine_tune, freeze_norm=False)
not_recompiled = functools.partial(fine_tune, recompile=False)


def test_the_right_answer_works(capsys):
    assert check_fine_tune(right, strict=True)
    assert "it works" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (None, "still the placeholder"),
        (norm_left_trainable, "keep BatchNormalization frozen"),
        (not_recompiled, "was not compiled again"),
    ],
)
def test_each_wrong_answer_is_named(answer, problem, capsys):
    assert not check_fine_tune(answer)
    assert problem in capsys.readouterr().out
    with pytest.raises(ExerciseError, match=problem):
        check_fine_tune(answer, strict=True)
