"""Classifiers: a small CNN, and EfficientNets for transfer learning.

Every model takes images as 0–255 values (uint8 from the pipeline) and does
its own scaling, and ends in a float32 softmax, so it is numerically safe
under mixed precision. Keras' EfficientNetV2 rescales its input itself
(`include_preprocessing=True`): feed it 0–255, not 0–1 — dividing by 255
first is the classic silent mistake that ruins pretrained accuracy.
"""

from __future__ import annotations

import keras
from keras import layers

from mdtrain import choices
from mdtrain.choices import EFFICIENTNETS, LITE0, check_dropout, check_image_size, check_model_name
from mdtrain.errors import UsageError
from mdtrain.lite0 import WEIGHTS_FILE_KIND, imagenet_classifier
from mdtrain.model_parts import classification_head, load_weights_file, resolve_weights
from mdtrain.norm import ExactBatchNormalization, swap_batch_norm

BASE_NAME = "base"
_V2_FILE_KIND = "a Keras weights file of this model without its top (…_notop.h5)"


def _small_cnn(image_size: int, num_classes: int, dropout: float, dtype) -> keras.Model:
    """A four-block CNN that trains in minutes on a CPU, with exact BatchNormalization."""
    inputs = keras.Input((image_size, image_size, 3), name="image")
    features = layers.Rescaling(1 / 255.0, dtype=dtype)(inputs)
    for block, filters in enumerate((32, 64, 128, 128)):
        conv = layers.Conv2D(
            filters, 3, padding="same", use_bias=False, name=f"conv{block}", dtype=dtype
        )
        features = conv(features)
        features = ExactBatchNormalization(momentum=0.9, name=f"norm{block}", dtype=dtype)(features)
        features = layers.Activation("relu", dtype=dtype)(features)
        features = layers.MaxPooling2D(dtype=dtype)(features)
    features = layers.GlobalAveragePooling2D(dtype=dtype)(features)
    head = classification_head(features, num_classes, dropout, dtype=dtype)
    return keras.Model(inputs, head, name="small_cnn")


def _efficientnetv2_base(name: str, image_size: int, weights: str | None) -> keras.Model:
    """Keras' EfficientNetV2 without its top, pooled, named `"base"`; no stochastic depth."""
    try:
        base = getattr(keras.applications, EFFICIENTNETS[name])(
            include_top=False,
            weights="imagenet" if weights == "imagenet" else None,
            input_shape=(image_size, image_size, 3),
            pooling="avg",
            include_preprocessing=True,  # expects 0–255 input
        )
    except Exception as error:  # download failures come as several exception types
        if weights != "imagenet":
            raise
        raise UsageError(
            f"--weights imagenet: could not download the ImageNet weights of {name} "
            f"({type(error).__name__}); without network, attach the …_notop.h5 file and pass "
            "--weights PATH, or use --weights none"
        ) from None
    if weights not in (None, "imagenet"):
        load_weights_file(base, weights, name)
    # Keras 3 passes the outer model's `training` to every nested layer, over build_model's
    # `training=False` (keras-team/keras#20285; functional.py `operation_fn`), so in `fit` the
    # stochastic-depth Dropout layers drop residual branches at random, each replica its own:
    # features differ ~30 % call to call, no two runs train alike. Rate 0 makes them the
    # identity, as inference mode means (a frozen BatchNormalization is in inference mode).
    for layer in base.layers:
        if isinstance(layer, layers.Dropout):
            layer.rate = 0.0
    base.name = BASE_NAME
    return base


def build_model(
    name: str,
    num_classes: int,
    image_size: int,
    weights: str | None = "none",
    dropout: float = 0.2,
    batch_norm: str = "exact",
    dtype=None,
) -> keras.Model:
    """Builds a classifier by name: one of `mdtrain train --model`'s choices.

    An EfficientNet's base is the layer named `"base"`; which bases train, and
    how they normalise: README.md, "The command".

    Args:
        name: `small-cnn`, an EfficientNetV2 variant (`efficientnetv2-b0`…) or
            `efficientnet-lite0` (ImageNet weights without network).
        num_classes: number of classes.
        image_size: side of the square input in pixels.
        weights: EfficientNet weights: `imagenet` (EfficientNetV2's are
            downloaded once; Lite0's come with a package, `mdtrain.lite0`),
            `none`, or a file path (an EfficientNetV2's `…_notop.h5`, or a
            Keras weights file of `mdtrain.lite0.imagenet_classifier`).
            Ignored by `small-cnn`. Defaults to `"none"`.
        dropout: dropout before the last layer. Defaults to 0.2.
        batch_norm: `exact`, `synchronized` or `local` (`mdtrain.norm`), where
            BatchNorm trains: small-cnn, Lite0 from scratch. Defaults to `"exact"`.
        dtype: the dtype policy (name or `keras.DTypePolicy`) of every layer
            but the float32 softmax. Defaults to None: Keras' global policy.

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
    choices.check_one_of("batch_norm", batch_norm, choices.BATCH_NORMS)
    dtype = keras.dtype_policies.get(dtype)
    if name == "small-cnn":
        net = _small_cnn(image_size, num_classes, dropout, dtype)
    else:
        weights = resolve_weights(weights, WEIGHTS_FILE_KIND if name == LITE0 else _V2_FILE_KIND)
        net = _efficientnet(name, num_classes, image_size, weights, dropout, dtype)
    if batch_norm != "exact" and (name == "small-cnn" or weights is None and name == LITE0):
        synchronized = batch_norm == "synchronized"  # Keras' layer, where BatchNorm trains
        net = swap_batch_norm(net, layers.BatchNormalization, synchronized=synchronized)
    return net


def _efficientnet(name, num_classes, image_size, weights, dropout, dtype) -> keras.Model:
    """`build_model`'s EfficientNets: a base named `"base"`, and the head."""
    # `keras.applications` builders, and Lite0's, take no `dtype`: their layers read Keras'
    # global policy (some when built: `Normalization`), set for the build only (per thread).
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype)
    try:
        if name == LITE0:  # offline ImageNet weights; see mdtrain.lite0
            base = imagenet_classifier(image_size, weights).get_layer(BASE_NAME)
        else:
            base = _efficientnetv2_base(name, image_size, weights)
    finally:
        keras.config.set_dtype_policy(previous)
    inputs = keras.Input((image_size, image_size, 3), name="image")
    if weights is not None or name != LITE0:
        # training=False keeps BatchNormalization in inference mode, unfrozen too: updating
        # its statistics on a small dataset would wreck the pretrained features (and
        # inference mode is exact under any strategy).
        base.trainable = False
        features = base(inputs, training=False)
    else:
        features = base(inputs)
    head = classification_head(features, num_classes, dropout, dtype=dtype)
    return keras.Model(inputs, head, name=name.replace("-", "_"))


def unfreeze_top(model: keras.Model, fraction: float = 0.2) -> int:
    """Makes the top `fraction` of the base's layers trainable for fine-tuning.

    BatchNormalization layers stay frozen (and, through `training=False`, in
    inference mode). Recompile the model afterwards, with a lower learning rate.

    Args:
        model: an EfficientNet from `build_model`.
        fraction: share of the base's layers, counted from the top. Defaults to 0.2.

    Returns:
        Number of layers made trainable.

    Raises:
        ValueError: for a model without a base (`small-cnn`).

    Example:

    >>> model = build_model("efficientnetv2-b0", num_classes=5, image_size=32)
    >>> unfreeze_top(model)
    44
    """
    base = model.get_layer(BASE_NAME)
    base.trainable = True
    cut = int(len(base.layers) * (1 - fraction))
    count = 0
    for position, layer in enumerate(base.layers):
        layer.trainable = position >= cut and not isinstance(layer, layers.BatchNormalization)
        count += layer.trainable
    return count
