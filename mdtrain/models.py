"""Classifiers: a small CNN, and EfficientNetV2 for transfer learning.

Every model takes images as 0–255 values (uint8 from the pipeline) and does
its own scaling, and ends in a float32 softmax, so it is numerically safe
under mixed precision. Keras' EfficientNetV2 rescales its input itself
(`include_preprocessing=True`): feed it 0–255, not 0–1 — dividing by 255
first is the classic silent mistake that ruins pretrained accuracy.
"""

from __future__ import annotations

import os

import keras
from keras import layers

from mdtrain.choices import EFFICIENTNETS as _EFFICIENTNETS
from mdtrain.choices import LITE0, MODELS, check_dropout, check_image_size, check_model_name
from mdtrain.errors import UsageError, first_line, warnings_only_if_it_succeeds
from mdtrain.norm import ExactBatchNormalization

BASE_NAME = "base"
__all__ = ["MODELS", "build_model", "efficientnetv2", "small_cnn", "unfreeze_top"]


def classification_head(x, num_classes: int, dropout: float):
    if dropout:
        x = layers.Dropout(dropout, name="head_dropout")(x)
    x = layers.Dense(num_classes, name="head_dense")(x)
    return layers.Activation("softmax", dtype=probabilities_dtype(), name="probabilities")(x)


def probabilities_dtype() -> str:
    """The softmax's dtype: float32 at least (float16 loses small probabilities), else float64.

    Returns:
        `"float64"` under a float64 dtype policy (as `tests/numerics_harness.py` trains),
        otherwise `"float32"`.
    """
    return "float64" if keras.config.dtype_policy().compute_dtype == "float64" else "float32"


def small_cnn(image_size: int, num_classes: int, dropout: float = 0.2) -> keras.Model:
    """A four-block CNN that trains in minutes on a CPU.

    Its batch normalization uses the statistics of the whole global batch
    (`mdtrain.norm.ExactBatchNormalization`), so N replicas train exactly the
    weights one device trains, at the price of two small all-reduces per
    layer and step.

    Args:
        image_size: side of the square input.
        num_classes: number of classes.
        dropout: dropout rate before the last layer. Defaults to 0.2.

    Returns:
        An uncompiled functional model.
    """
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = layers.Rescaling(1 / 255.0)(inputs)
    for i, filters in enumerate((32, 64, 128, 128)):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = ExactBatchNormalization(momentum=0.9, name=f"norm{i}")(x)
        x = layers.Activation("relu")(x)
        x = layers.MaxPooling2D()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, classification_head(x, num_classes, dropout), name="small_cnn")


def _resolve_weights(weights: str | None) -> str | None:
    if weights in (None, "none", "None"):
        return None
    if weights == "imagenet":
        return "imagenet"
    if not os.path.isfile(weights):
        raise UsageError(
            f"--weights {weights}: no such file; pass imagenet, none, or the path of a "
            "Keras weights file for this model without its top (…_notop.h5)"
        )
    return weights


def efficientnetv2(
    name: str,
    image_size: int,
    num_classes: int,
    weights: str | None = "imagenet",
    dropout: float = 0.2,
) -> keras.Model:
    """EfficientNetV2 base with a new classification head.

    The base is frozen and runs BatchNormalization in inference mode, also
    after `unfreeze_top`, so it is exact under any strategy. (To train an
    EfficientNet from random initialisation, use `efficientnet-lite0` with
    `weights="none"`: its whole network trains, with exact BatchNormalization.)

    Args:
        name: one of `efficientnetv2-b0` … `-b3`, `-s`.
        image_size: side of the square input.
        num_classes: number of classes.
        weights: `"imagenet"` (downloaded once; needs network), None/`"none"`
            (random initialisation), or a local `…_notop.h5` file. Defaults to
            `"imagenet"`.
        dropout: dropout rate before the last layer. Defaults to 0.2.

    Returns:
        An uncompiled model whose base layer is named `"base"`.

    Raises:
        UsageError: if the weights cannot be found or downloaded.
    """
    weights = _resolve_weights(weights)
    constructor = getattr(keras.applications, _EFFICIENTNETS[name])
    try:
        with warnings_only_if_it_succeeds():
            base = constructor(
                include_top=False,
                weights=weights,
                input_shape=(image_size, image_size, 3),
                pooling="avg",
                include_preprocessing=True,  # expects 0–255 input
            )
    except ValueError as e:
        raise UsageError(
            f"--weights {weights}: cannot be loaded into {name}: {first_line(e)}"
        ) from None
    except Exception as e:  # download failures come as several exception types
        raise UsageError(
            f"--weights imagenet: could not download the ImageNet weights of {name} "
            f"({type(e).__name__}); without network, attach the …_notop.h5 file and pass "
            "--weights PATH, or use --weights none"
        ) from None
    base.name = BASE_NAME
    base.trainable = False
    # Keras 3 passes the outer model's `training` to every nested layer, over the
    # `training=False` below (keras/src/models/functional.py, `operation_fn`;
    # keras-team/keras#20285), so in `fit` the base's stochastic-depth Dropout layers
    # (`survival_probability`) drop residual branches at random, each replica its own:
    # features differ by ~30 % call to call and no two runs train alike. Rate 0 makes
    # them the identity, as inference mode means. (Its BatchNormalization is safe: a
    # frozen one always runs in inference mode.)
    for layer in base.layers:
        if isinstance(layer, layers.Dropout):
            layer.rate = 0.0
    inputs = keras.Input((image_size, image_size, 3), name="image")
    # training=False keeps BatchNormalization in inference mode even after the
    # base is unfrozen for fine-tuning: updating its statistics on a small
    # dataset would wreck the pretrained features (and inference mode is
    # exact under any strategy).
    x = base(inputs, training=False)
    return keras.Model(
        inputs, classification_head(x, num_classes, dropout), name=name.replace("-", "_")
    )


def build_model(
    name: str,
    num_classes: int,
    image_size: int,
    weights: str | None = "none",
    dropout: float = 0.2,
) -> keras.Model:
    """Builds a classifier by name; see `MODELS`.

    Args:
        name: `small-cnn`, an EfficientNetV2 variant (`efficientnetv2-b0`…) or
            `efficientnet-lite0` (ImageNet weights without network).
        num_classes: number of classes.
        image_size: side of the square input in pixels.
        weights: EfficientNet weights: `imagenet`, `none`, or a file path.
            Ignored by `small-cnn`. Defaults to `"none"`.
        dropout: dropout before the last layer. Defaults to 0.2.

    Returns:
        An uncompiled Keras model taking 0–255 images and giving class
        probabilities.

    Raises:
        UsageError: for an unknown model or unusable weights.

    Example:

    >>> build_model("small-cnn", num_classes=5, image_size=64).output_shape
    (None, 5)
    """
    check_model_name(name)
    check_dropout(dropout)
    check_image_size(name, image_size)
    if name == "small-cnn":
        return small_cnn(image_size, num_classes, dropout)
    if name in _EFFICIENTNETS:
        return efficientnetv2(name, image_size, num_classes, weights, dropout)
    if name == LITE0:  # offline ImageNet weights; see mdtrain.lite0
        from mdtrain.lite0 import efficientnet_lite0

        return efficientnet_lite0(image_size, num_classes, weights, dropout)
    raise AssertionError(f"{name} is listed in MODELS but has no builder")


def unfreeze_top(model: keras.Model, fraction: float = 0.2) -> int:
    """Makes the top `fraction` of the base's layers trainable for fine-tuning.

    BatchNormalization layers stay frozen (and, through `training=False`, in
    inference mode). Recompile the model afterwards, with a lower learning rate.

    Args:
        model: a model from `efficientnetv2`.
        fraction: share of the base's layers, counted from the top. Defaults to 0.2.

    Returns:
        Number of layers made trainable.
    """
    base = model.get_layer(BASE_NAME)
    base.trainable = True
    cut = int(len(base.layers) * (1 - fraction))
    count = 0
    for i, layer in enumerate(base.layers):
        layer.trainable = i >= cut and not isinstance(layer, layers.BatchNormalization)
        count += layer.trainable
    return count
