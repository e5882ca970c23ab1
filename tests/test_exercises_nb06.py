"""Notebook 06's exercise check: a right answer passes, each wrong one is named."""

import keras
import pytest

from mdtrain_course.exercises import ExerciseError
from mdtrain_course.exercises.nb06 import check_fine_tune


def right(model, base, num_layers, learning_rate):
    base.trainable = True
    for layer in base.layers[:-num_layers]:
        layer.trainable = False
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy"
    )


def norm_left_trainable(model, base, num_layers, learning_rate):
    base.trainable = True
    for layer in base.layers[:-num_layers]:
        layer.trainable = False
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy"
    )


def not_recompiled(model, base, num_layers, learning_rate):
    base.trainable = True
    for layer in base.layers[:-num_layers]:
        layer.trainable = False
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False


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
