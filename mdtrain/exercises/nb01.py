"""Notebook 01's exercises: Keras' own augmentation layers, in a model and in tf.data.

Example:

```python
from mdtrain.exercises import nb01

nb01.check_augmentation_model(augmentation)  # prints what is wrong, or that it works
```
"""

from __future__ import annotations

import numpy as np

from mdtrain.exercises import not_written, verdict

#: The layers the exercise asks for, with the range of the notebook's policy.
LAYERS = ("RandomFlip", "RandomRotation", "RandomZoom", "RandomBrightness", "RandomContrast")
ROTATION_DEGREES = 20.0
ZOOM = 0.15


def _test_batch(image_size: int, batch_size: int = 4) -> np.ndarray:
    """Images with no symmetry (gradients and a bright square), pixels 0-255, float32."""
    ramp = np.linspace(0, 255, image_size, dtype=np.float32)
    image = np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], 128.0), axis=-1)
    image = np.array(image, dtype=np.float32)
    image[image_size // 8 : image_size // 3, image_size // 6 : image_size // 2] = 255.0
    return np.repeat(image[None], batch_size, axis=0)


def _largest(factor) -> float:
    """The largest magnitude of a Keras `factor` (a number or a (low, high) pair)."""
    return float(np.max(np.abs(factor)))


def _layer_problems(model) -> list[str]:
    layers = {type(layer).__name__: layer for layer in getattr(model, "layers", [])}
    problems = [
        f"there is no `keras.layers.{name}` layer." for name in LAYERS if name not in layers
    ]
    if "RandomRotation" in layers:
        degrees = _largest(layers["RandomRotation"].factor) * 360
        if abs(degrees - ROTATION_DEGREES) > 1:
            problems.append(
                f"RandomRotation turns by up to {degrees:.0f}°, not {ROTATION_DEGREES:.0f}°: "
                "its factor is a fraction of a full turn (20 / 360)."
            )
    if "RandomZoom" in layers:
        zoom = _largest(layers["RandomZoom"].height_factor)
        if abs(zoom - ZOOM) > 0.01:
            problems.append(f"RandomZoom zooms by up to {zoom:.0%}, not {ZOOM:.0%}.")
    return problems


def _behaviour_problems(model, image_size: int) -> list[str]:
    batch = _test_batch(image_size)
    try:
        trained = np.asarray(model(batch, training=True))
        inferred = np.asarray(model(batch, training=False))
    except Exception as error:  # the learner's code: say what it raised, never stop the notebook
        return [f"calling it on a batch of {batch.shape} raised {type(error).__name__}: {error}"]
    if trained.shape != batch.shape:
        return [f"it turns a batch of {batch.shape} into {trained.shape}: keep the shape."]
    problems = []
    if trained.min() < -0.5 or trained.max() > 255.5 or trained.max() < 2:
        problems.append(
            f"in training its pixels run from {trained.min():.0f} to {trained.max():.0f}, "
            "not over 0-255: the colour layers take `value_range=(0, 255)` (their default)."
        )
    if np.mean(np.abs(trained - batch) > 0.5) < 0.1:
        problems.append("in training (`training=True`) it leaves the images almost unchanged.")
    if np.abs(inferred - batch).max() > 1e-3:
        problems.append("at inference (`training=False`) it changes the images: it must not.")
    return problems


def check_augmentation_model(model, *, image_size: int = 64, strict: bool = False) -> bool:
    """Checks a `keras.Sequential` of Keras' `Random*` layers for the notebook's policy.

    The model must hold `RandomFlip`, `RandomRotation` (±20°), `RandomZoom` (±15%),
    `RandomBrightness` and `RandomContrast`; called on a batch of pixels in 0-255
    it must keep the shape and the range, change the images in training and leave
    them as they are at inference.

    Args:
        model: The learner's model, or the placeholder `None`.
        image_size: Side of the square test images. Defaults to 64.
        strict: Raise instead of printing (the worked solution). Defaults to False.

    Returns:
        `True` when the model does all of that.

    Raises:
        ExerciseError: With `strict=True`, when it does not.

    Example:

    ```python
    nb01.check_augmentation_model(keras.Sequential([keras.layers.RandomFlip("horizontal")]))
    ```
    """
    title = "Exercise 1, the Keras augmentation model"
    problems = not_written(model, "the model")
    if not problems and not callable(model):
        problems = [f"the model is a {type(model).__name__}, not a Keras model."]
    if not problems:
        problems = _layer_problems(model) + _behaviour_problems(model, image_size)
    return verdict(title, problems, strict=strict)


def check_augmented_dataset(ds, source, *, strict: bool = False) -> bool:
    """Checks a tf.data pipeline that augments `source`'s batches with Keras' layers.

    Each batch must keep its labels and its shape, hold pixels in 0-255, and
    differ from `source`'s batch in its images; two passes over `ds` must
    differ too (a new draw every epoch).

    Args:
        ds: The learner's dataset of `(images, labels)` batches, or `None`.
        source: The same batches, not augmented, in the same order.
        strict: Raise instead of printing (the worked solution). Defaults to False.

    Returns:
        `True` when the dataset does all of that.

    Raises:
        ExerciseError: With `strict=True`, when it does not.

    Example:

    ```python
    nb01.check_augmented_dataset(source.map(lambda x, y: (augmentation(x), y)), source)
    ```
    """
    title = "Exercise 2, augmentation in the tf.data pipeline"
    problems = not_written(ds, "the dataset")
    if not problems:
        problems = _dataset_problems(ds, source)
    return verdict(title, problems, strict=strict)


def _dataset_problems(ds, source) -> list[str]:
    try:
        first, second = _first_batch(ds), _first_batch(ds)
    except Exception as error:  # the learner's code
        return [f"reading a batch from it raised {type(error).__name__}: {error}"]
    if first is None:
        return ["its elements are not `(images, labels)` pairs."]
    images, labels = first
    expected_images, expected_labels = _first_batch(source)
    if images.shape != expected_images.shape:
        return [f"its batches are {images.shape}, not {expected_images.shape} like the source's."]
    problems = []
    if not np.array_equal(labels, expected_labels):
        problems.append("its labels are not the source's: map over (images, labels), keep labels.")
    if images.min() < -0.5 or images.max() > 255.5:
        problems.append(f"its pixels run from {images.min():.0f} to {images.max():.0f}, not 0-255.")
    if np.mean(np.abs(images.astype(np.float32) - expected_images) > 0.5) < 0.1:
        problems.append("its images are the source's: call the layers with `training=True`.")
    elif np.array_equal(images, second[0]):
        problems.append("two passes give the same images: every epoch needs a new draw.")
    return problems


def _first_batch(ds):
    element = next(iter(ds))
    if not isinstance(element, tuple | list) or len(element) != 2:
        return None
    return tuple(np.asarray(part) for part in element)
