"""Notebook 06's transfer-learning recipe in plain Keras against mdtrain's, weight for weight.

The notebook trains both on its data and compares what they learned. Here the
plain code of its sections 5 and 7 (the head, the freeze, the unfreeze) and
mdtrain's `build_model`, `unfreeze_top` and `ExactTrainer` start from the same
weights and the same dropout state, train the head and then fine-tune on the
same batches, and must agree to float32 rounding. EfficientNet-Lite0, whose
ImageNet weights need no network, stands in for EfficientNetV2 as it does offline.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mdtrain import lite0
from mdtrain.loop import ExactTrainer
from mdtrain.models import build_model, unfreeze_top

pytestmark = pytest.mark.slow

SIZE, CLASSES, BATCH, LEARNING_RATE = 32, 5, 8, 2e-3


def plain_model(base: keras.Model) -> keras.Model:
    """Notebook 06, section 5, without the augmentation layers (they draw at random)."""
    inputs = keras.Input((SIZE, SIZE, 3), dtype="uint8")
    x = keras.ops.cast(inputs, "float32")
    x = base(x, training=False)
    x = keras.layers.Dropout(0.2, name="head_dropout")(x)
    x = keras.layers.Dense(CLASSES, name="head_dense")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs)


def plain_unfreeze(base: keras.Model) -> None:
    """Notebook 06, section 7: the top 20 % of the base, BatchNormalization kept frozen."""
    base.trainable = True
    for layer in base.layers[: int(len(base.layers) * 0.8)]:
        layer.trainable = False
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False


def split(model: keras.Model) -> tuple[list[str], list[str]]:
    return sorted(w.path for w in model.trainable_weights), sorted(
        w.path for w in model.non_trainable_weights
    )


def head(model: keras.Model) -> list[tuple]:
    """Type, dtype policy, rate, units and activation of each layer after the base."""
    keys = ("rate", "units", "activation")
    return [(type(x).__name__, x.dtype_policy.name, *(x.get_config().get(k) for k in keys))
            for x in model.layers[2:]]  # fmt: skip


def largest_difference(a: keras.Model, b: keras.Model) -> float:
    pairs = zip(a.get_weights(), b.get_weights(), strict=True)
    return max(float(np.max(np.abs(x - y))) for x, y in pairs)


def test_plain_recipe_and_mdtrain_build_and_train_the_same_model():
    net = build_model("efficientnet-lite0", CLASSES, SIZE, weights="imagenet")  # frozen base
    base = lite0.imagenet_classifier(SIZE).get_layer("base")
    base.trainable = False  # notebook 06, section 4 (Lite0 has no stochastic depth)
    plain = plain_model(base)
    plain.set_weights(net.get_weights())  # the same start, weight for weight
    assert split(plain) == split(net), "the frozen base and the head's weights differ"
    assert head(plain) == head(net), "the heads differ"
    assert head(plain)[-1][1] == "float32"  # the softmax, under any policy
    for model in (plain, net):  # the same dropout masks
        model.get_layer("head_dropout").seed_generator.state.assign([0, 0])
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3 * BATCH, SIZE, SIZE, 3)).astype("uint8")
    labels = rng.integers(0, CLASSES, 3 * BATCH)
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)
    started = [w.copy() for w in net.get_weights()]
    trainer = ExactTrainer(net)
    for phase, learning_rate in enumerate((LEARNING_RATE, LEARNING_RATE / 10)):
        if phase == 1:  # the unfreeze, both ways
            plain_unfreeze(base)
            assert unfreeze_top(net) > 0
            assert split(plain) == split(net), "the unfreeze differs"
        plain.compile(optimizer=keras.optimizers.Adam(learning_rate),
                      loss="sparse_categorical_crossentropy")  # fmt: skip
        trainer.compile(optimizer=keras.optimizers.Adam(learning_rate))
        plain.fit(batches, verbose=0, shuffle=False)
        trainer.fit(batches, verbose=0, shuffle=False)
        moved = max(
            float(np.max(np.abs(w - s))) for w, s in zip(net.get_weights(), started, strict=True)
        )
        assert moved > 0 and largest_difference(plain, net) <= 1e-5 * max(1.0, moved), phase
    batchnorms = [x for x in base.layers if isinstance(x, keras.layers.BatchNormalization)]
    assert batchnorms and not any(x.trainable for x in batchnorms)


def test_under_mixed_precision_both_heads_compute_in_bfloat16_and_the_softmax_in_float32():
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # notebook 06, section 1
    try:
        net = build_model("efficientnet-lite0", CLASSES, SIZE, weights="imagenet")
        plain = plain_model(lite0.imagenet_classifier(SIZE).get_layer("base"))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert head(plain) == head(net)
    assert [policy for _, policy, *_ in head(plain)] == ["mixed_bfloat16"] * 2 + ["float32"]
    images = np.zeros((2, SIZE, SIZE, 3), "uint8")
    assert plain(images).dtype == net(images).dtype == "float32"
