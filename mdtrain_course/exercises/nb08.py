"""Notebook 08's exercise: resample an imbalanced dataset to equal class frequencies."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from mdtrain_course.exercises import not_written, verdict

EXERCISE = "Resample to equal classes"
COUNTS = (6, 60, 60)  # class 0 is rare
BATCH_SIZE = 16
BATCHES = 60


def _imbalanced() -> tuple[np.ndarray, np.ndarray]:
    """Tiny images whose pixels all hold their label, so a mismatched pair shows."""
    labels = np.concatenate([np.full(count, c, np.int32) for c, count in enumerate(COUNTS)])
    images = np.broadcast_to(labels[:, None, None, None], (len(labels), 2, 2, 1))
    return images.astype(np.float32), labels


def _batches(dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    images, labels = [], []
    for batch_images, batch_labels in dataset.take(BATCHES):
        images.append(np.asarray(batch_images))
        labels.append(np.asarray(batch_labels))
    return images, labels


def _stream_problems(images: list[np.ndarray], labels: list[np.ndarray]) -> list[str]:
    if len(labels) < BATCHES:
        return [f"the dataset ended after {len(labels)} batches: make each class's stream repeat."]
    sizes = {len(batch) for batch in labels}
    if sizes != {BATCH_SIZE}:
        return [f"batches hold {sorted(sizes)} examples, not {BATCH_SIZE}."]
    pairs_match = all(
        np.all(batch_images.reshape(len(batch_images), -1) == batch_labels[:, None])
        for batch_images, batch_labels in zip(images, labels, strict=True)
    )
    problems = [] if pairs_match else ["some images come with another image's label."]
    drawn = np.concatenate(labels)
    shares = np.bincount(drawn, minlength=len(COUNTS)) / len(drawn)
    equal = 1 / len(COUNTS)
    tolerance = 4 * np.sqrt(equal * (1 - equal) / len(drawn))  # four binomial deviations
    if np.any(np.abs(shares - equal) > tolerance):
        shown = ", ".join(f"{share:.2f}" for share in shares)
        problems.append(f"the classes' shares are {shown}, not about {equal:.2f} each.")
    return problems


def check_resample(resample: Callable | None, *, strict: bool = False) -> bool:
    """Checks `resample(images, labels, num_classes, batch_size) -> tf.data.Dataset`.

    The dataset must give endless batches of `(images, labels)` of
    `batch_size` examples in which every class is about equally frequent,
    each image with its own label. The check feeds it 6, 60 and 60 examples of
    three classes and reads 60 batches of 16.

    Args:
        resample: The learner's function.
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when the batches are right.
    """
    problems = not_written(resample, "resample")
    if not problems:
        try:
            dataset = resample(*_imbalanced(), len(COUNTS), BATCH_SIZE)
            if not isinstance(dataset, tf.data.Dataset):
                problems = [f"resample returned a {type(dataset).__name__}, not a tf.data.Dataset."]
            else:
                problems = _stream_problems(*_batches(dataset))
        except Exception as error:  # the learner's code: say what it raised, in one line
            problems = [f"resample(...) raised {type(error).__name__}: {error}"]
    return verdict(EXERCISE, problems, strict=strict)
