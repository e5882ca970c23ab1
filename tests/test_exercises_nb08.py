"""Notebook 08's exercise check: a right answer passes, each wrong one is named."""

import pytest
import tensorflow as tf

from mdtrain_course.exercises import ExerciseError
from mdtrain_course.exercises.nb08 import check_resample


def right(images, labels, num_classes, batch_size):
    per_class = [
        tf.data.Dataset.from_tensor_slices((images[labels == c], labels[labels == c]))
        .shuffle(len(labels))
        .repeat()
        for c in range(num_classes)
    ]
    equal = [1 / num_classes] * num_classes
    return tf.data.Dataset.sample_from_datasets(per_class, weights=equal, seed=0).batch(batch_size)


def not_resampled(images, labels, num_classes, batch_size):
    return (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(200, seed=0)
        .repeat()
        .batch(batch_size)
    )


def not_repeated(images, labels, num_classes, batch_size):
    per_class = [
        tf.data.Dataset.from_tensor_slices((images[labels == c], labels[labels == c]))
        for c in range(num_classes)
    ]
    return tf.data.Dataset.sample_from_datasets(per_class, seed=0).batch(batch_size)


def labels_shuffled_apart(images, labels, num_classes, batch_size):
    images_ds = right(images, labels, num_classes, batch_size).map(lambda x, y: x)
    labels_ds = (
        right(images, labels, num_classes, batch_size).map(lambda x, y: y).shuffle(10, seed=1)
    )
    return tf.data.Dataset.zip((images_ds, labels_ds))


def test_the_right_answer_works(capsys):
    assert check_resample(right, strict=True)
    assert "it works" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (None, "still the placeholder"),
        (not_resampled, "the classes' shares are"),
        (not_repeated, "the dataset ended after"),
        (labels_shuffled_apart, "another image's label"),
    ],
)
def test_each_wrong_answer_is_named(answer, problem, capsys):
    assert not check_resample(answer)
    assert problem in capsys.readouterr().out
    with pytest.raises(ExerciseError, match=problem):
        check_resample(answer, strict=True)
