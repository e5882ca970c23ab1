"""Notebook 06's exercise: fine-tune the top of a pretrained base."""

from __future__ import annotations

from collections.abc import Callable

import keras

from mdtrain_course.exercises import not_written, verdict

EXERCISE = "Fine-tune the top layers"


def _small_base() -> keras.Model:
    """A stand-in for a pretrained base: 12 layers, 3 of them BatchNormalization."""
    layers = [keras.Input((16, 16, 3))]
    for filters in (8, 16, 32):
        layers += [
            keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
        ]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(8)]
    return keras.Sequential(layers, name="base")


def _frozen_model() -> tuple[keras.Model, keras.Model]:
    """(model, base): the base frozen under a new head, compiled as in phase 1."""
    base = _small_base()
    base.trainable = False
    inputs = keras.Input((16, 16, 3))
    outputs = keras.layers.Dense(3, activation="softmax")(base(inputs, training=False))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model, base


def _layer_problems(base: keras.Model, num_layers: int) -> list[str]:
    problems = []
    cut = len(base.layers) - num_layers
    for index, layer in enumerate(base.layers):
        is_norm = isinstance(layer, keras.layers.BatchNormalization)
        wanted = index >= cut and not is_norm
        if layer.trainable != wanted and is_norm:
            problems.append(f"{layer.name} is trainable: keep BatchNormalization frozen.")
        elif layer.trainable != wanted and wanted:
            problems.append(f"{layer.name}, among the top {num_layers} layers, is still frozen.")
        elif layer.trainable != wanted:
            problems.append(f"{layer.name} is below the top {num_layers} layers but trainable.")
    return problems


def _compile_problems(model: keras.Model, old_optimizer, learning_rate: float) -> list[str]:
    if model.optimizer is old_optimizer:
        return ["the model was not compiled again: changes to `trainable` take effect at compile."]
    rate = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    if abs(rate - learning_rate) > 1e-6 * learning_rate:  # stored in float32
        return [f"the new optimizer's learning rate is {rate:g}, not the {learning_rate:g} asked."]
    return []


def check_fine_tune(fine_tune: Callable | None, *, strict: bool = False) -> bool:
    """Checks `fine_tune(model, base, num_layers, learning_rate)` on a small stand-in base.

    It must make the top `num_layers` layers of `base` trainable, except the
    BatchNormalization layers, leave every other layer frozen, and compile
    `model` again with an optimizer at `learning_rate`.

    Args:
        fine_tune: The learner's function.
        strict: Raise instead of printing (the worked solution). Defaults to ``False``.

    Returns:
        ``True`` when the function does all of it.
    """
    problems = not_written(fine_tune, "fine_tune")
    if not problems:
        model, base = _frozen_model()
        old_optimizer = model.optimizer
        try:
            fine_tune(model, base, 5, 1e-4)
        except Exception as error:  # the learner's code: say what it raised, in one line
            problems = [f"fine_tune(model, base, 5, 1e-4) raised {type(error).__name__}: {error}"]
        else:
            problems = _layer_problems(base, 5) + _compile_problems(model, old_optimizer, 1e-4)
    return verdict(EXERCISE, problems, strict=strict)
