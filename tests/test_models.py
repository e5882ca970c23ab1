"""Model builders: shapes, float32 output under mixed precision, fine-tuning, weights files."""

from __future__ import annotations

import time

import keras
import numpy as np
import pytest

from mdtrain.errors import UsageError
from mdtrain.models import BASE_NAME, build_model, unfreeze_top

SIZE = 32  # EfficientNetV2's minimum; keeps every build fast


@pytest.fixture
def bfloat16_policy():
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(previous)


@pytest.fixture(scope="module")
def b0():
    return build_model("efficientnetv2-b0", 5, SIZE, weights="none")


@pytest.mark.parametrize("name, size", [("small-cnn", 24), ("efficientnetv2-b0", SIZE)])
def test_output_shape_and_probabilities(name, size):
    model = build_model(name, 5, size)
    assert model.input_shape == (None, size, size, 3)
    assert model.output_shape == (None, 5)
    images = np.random.default_rng(0).integers(0, 256, (2, size, size, 3)).astype("uint8")
    probs = np.asarray(model(images, training=False))
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name, size", [("small-cnn", 24), ("efficientnetv2-b0", SIZE)])
def test_float32_output_under_mixed_bfloat16(bfloat16_policy, name, size):
    model = build_model(name, 3, size)
    compute = {layer.dtype_policy.compute_dtype for layer in model.layers if layer.weights}
    assert "bfloat16" in compute  # the body really runs in bfloat16
    assert model.get_layer("probabilities").dtype_policy.compute_dtype == "float32"
    out = model(np.zeros((1, size, size, 3), "uint8"), training=False)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert all(w.dtype == "float32" for w in model.weights)  # variables stay float32


def test_policy_reset_after_fixture():
    assert keras.mixed_precision.dtype_policy().name == "float32"


@pytest.mark.parametrize("name", ["small-cnn", "efficientnetv2-b0", "efficientnet-lite0"])
def test_the_dtype_policy_is_given_to_the_model_not_set_globally(name):
    model = build_model(name, 3, SIZE, dtype="mixed_bfloat16")
    assert keras.config.dtype_policy().name == "float32"
    layers = [x for x in model._flatten_layers() if x.weights and x.name != "probabilities"
              and not isinstance(x, keras.Model)]  # fmt: skip
    assert {x.compute_dtype for x in layers} == {"bfloat16"}, name  # the base's layers too
    assert model.get_layer("probabilities").compute_dtype == "float32"
    out = model(np.zeros((1, SIZE, SIZE, 3), "uint8"), training=False)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


@pytest.mark.parametrize(
    "batch_norm, kind, synchronized",
    [("exact", "ExactBatchNormalization", False), ("synchronized", "BatchNormalization", True),
     ("local", "BatchNormalization", False)],
)  # fmt: skip
@pytest.mark.parametrize("name", ["small-cnn", "efficientnet-lite0"])
def test_the_batch_norm_choice(name, batch_norm, kind, synchronized):
    model = build_model(name, 3, SIZE, batch_norm=batch_norm, dtype="mixed_bfloat16")
    norms = [x for x in model._flatten_layers() if isinstance(x, keras.layers.BatchNormalization)]
    assert len(norms) == (4 if name == "small-cnn" else 49)
    assert {(type(x).__name__, x.synchronized, x.compute_dtype) for x in norms} == {
        (kind, synchronized, "bfloat16")
    }


def test_a_frozen_base_keeps_its_own_batch_norm():
    """Its BatchNormalization runs in inference mode: there is nothing to synchronise."""
    model = build_model("efficientnetv2-b0", 5, SIZE, batch_norm="synchronized")
    norms = [x for x in model._flatten_layers() if isinstance(x, keras.layers.BatchNormalization)]
    assert norms and not any(x.synchronized or x.trainable for x in norms)


def test_efficientnet_base_frozen(b0):
    base = b0.get_layer(BASE_NAME)
    assert not base.trainable
    names = {w.path for w in b0.trainable_weights}
    assert names and all("head_dense" in n for n in names)


def test_unfreeze_top_keeps_batchnorm_frozen():
    model = build_model("efficientnetv2-b0", 5, SIZE)
    before = len(model.trainable_weights)
    n = unfreeze_top(model, fraction=0.2)
    base = model.get_layer(BASE_NAME)
    assert 0 < n < len(base.layers) * 0.2 + 1
    batchnorms = [x for x in base.layers if isinstance(x, keras.layers.BatchNormalization)]
    assert batchnorms and not any(x.trainable for x in batchnorms)
    cut = int(len(base.layers) * 0.8)
    assert not any(x.trainable for x in base.layers[:cut])
    assert any(x.trainable for x in base.layers[cut:])
    assert len(model.trainable_weights) > before
    # BatchNormalization statistics never move: moving mean/variance are not trainable
    assert not any("moving" in w.path for w in model.trainable_weights)


def test_local_weights_file(tmp_path, b0):
    path = tmp_path / "b0_notop.weights.h5"
    b0.get_layer(BASE_NAME).save_weights(path)
    loaded = build_model("efficientnetv2-b0", 5, SIZE, weights=str(path))
    expected = b0.get_layer(BASE_NAME).get_weights()
    got = loaded.get_layer(BASE_NAME).get_weights()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    fresh = build_model("efficientnetv2-b0", 5, SIZE, weights="none")
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(fresh.get_layer(BASE_NAME).get_weights(), expected, strict=True)
    )


@pytest.mark.parametrize("name", ["efficientnetv2-b0", "efficientnet-lite0"])
def test_weights_file_of_another_model_is_one_line_and_no_warnings(tmp_path, name):
    """Keras lists every layer that does not fit (99 for Lite0) and warns for each first."""
    import warnings

    path = tmp_path / "small.weights.h5"
    build_model("small-cnn", 5, 24).save_weights(path)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(UsageError) as error:
        warnings.simplefilter("always")
        build_model(name, 5, SIZE, weights=str(path))
    assert f"cannot be loaded into {name}" in str(error.value)
    assert len(str(error.value).splitlines()) == 1
    assert not caught


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="resnet50"), "resnet50"),
        (dict(name="efficientnetv2-b0", weights="/no/such/b0_notop.h5"), "no such file"),
        (dict(name="efficientnetv2-b0", image_size=16), "at least 32"),
        (dict(name="small-cnn", dropout=1.0), "dropout"),
        (dict(name="small-cnn", batch_norm="sync"), "batch_norm=sync: choose one of exact"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(num_classes=5, image_size=SIZE) | kwargs
    with pytest.raises(UsageError, match=match):
        build_model(**args)


def test_imagenet_offline_is_a_quick_usage_error(monkeypatch):
    from keras.src.utils import file_utils

    calls = []

    def no_network(*args, **kwargs):
        calls.append(kwargs.get("origin", args[1] if len(args) > 1 else None))
        raise Exception("URL fetch failure: [Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(file_utils, "get_file", no_network)
    start = time.perf_counter()
    with pytest.raises(UsageError, match="could not download") as info:
        build_model("efficientnetv2-b0", 5, SIZE, weights="imagenet")
    assert time.perf_counter() - start < 30
    assert calls and "efficientnetv2-b0_notop" in str(calls[0])
    assert "--weights none" in str(info.value)


def test_lite0_exports_exactly_its_three_documented_functions():
    import mdtrain.lite0 as lite0

    namespace = {}
    exec("from mdtrain.lite0 import *", namespace)  # what a star import gives a user
    public = {"imagenet_classifier", "imagenet_class_names", "read_legacy_torch_file"}
    assert set(namespace) - {"__builtins__"} == public == set(lite0.__all__)
    for name in public:
        assert "Returns:" in getattr(lite0, name).__doc__, name
