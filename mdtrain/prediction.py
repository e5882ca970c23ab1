"""`predict(...)`: class probabilities for image files, from a trained run or ImageNet.

What `mdtrain predict` runs. Images are decoded and resized by the training
pipeline's own code, so a model sees at prediction time exactly what it saw in
training. Files that cannot be decoded are skipped and reported, never fatal.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mdtrain.choices import LITE0
from mdtrain.data import ImageList, SkippedFile, find_undecodable
from mdtrain.errors import UsageError, bad_value
from mdtrain.images import image_files


@dataclass
class Prediction:
    """One image's most likely classes, best first: dicts of `index`, `label`, `probability`."""

    path: str
    top: list[dict]


@dataclass
class PredictResult:
    """What `predict` found; `to_dict()` is the `--json` object."""

    predictions: list[Prediction]
    skipped_files: list[SkippedFile]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if key != "notes"}

    def to_text(self) -> str:
        """One line per image (`path: label 0.93, label 0.04, ...`), then the skipped files."""
        lines = [
            f"{p.path}: " + ", ".join(f"{t['label']} {t['probability']:.3f}" for t in p.top)
            for p in self.predictions
        ]
        lines += [f"skipped {s.path}: {s.reason}" for s in self.skipped_files]
        return "\n".join(lines)


def find_image_files(paths: list[str | os.PathLike]) -> list[str]:
    """The files to classify: each file as given (decoded by content), each folder's image files."""
    files: list[str] = []
    for path in map(Path, paths):
        if path.is_file():
            files.append(str(path))
        elif path.is_dir():
            files += image_files(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    if not files:
        raise UsageError(
            f"no image files (.jpg .jpeg .png .gif .bmp) in {', '.join(map(str, paths))}"
        )
    return files


def _run_class_names(model_file: Path, num_outputs: int) -> tuple[list[str], list[str]]:
    """Class names from the run's report.json; index names (and a note) without one."""
    report = model_file.parent / "report.json"
    try:
        names = json.loads(report.read_text())["class_names"]
    except (OSError, ValueError, KeyError, TypeError):
        problem = "not found or without class_names"
    else:
        if isinstance(names, list) and len(names) == num_outputs:
            return [str(name) for name in names], []
        problem = f"its class names do not fit the model's {num_outputs} outputs (another run's?)"
    return [str(i) for i in range(num_outputs)], [f"{report}: {problem}; labels are class indices"]


def _load(model, model_file, weights: str, image_size: int | None):
    """(Keras model, class names, notes) for the chosen model."""
    if (model is None) == (model_file is None):
        raise UsageError("pass either --model-file RUN/model.keras or --model NAME, not both")
    if model_file is not None:
        model_file = Path(model_file)
        if not model_file.is_file():
            raise UsageError(f"--model-file {model_file}: no such file")
        import keras

        # Register mdtrain's layers for loading: Keras imports only its own modules.
        import mdtrain.augment_layer  # noqa: F401
        import mdtrain.norm  # noqa: F401

        try:
            net = keras.models.load_model(model_file, compile=False)
        except Exception as error:  # Keras raises several types for a file it cannot read
            raise UsageError(
                f"--model-file {model_file}: not a Keras model file ({error})"
            ) from None
        return net, *_run_class_names(model_file, int(net.output_shape[-1]))
    if not isinstance(model, str):  # a Keras model object (the API)
        return model, None, []
    if model != LITE0:
        raise UsageError(
            f"--model {model}: only {LITE0} has ImageNet weights offline; "
            "for a model you trained use --model-file RUN/model.keras"
        )
    if weights == "none":
        raise UsageError("--weights none: an untrained network predicts nothing useful")
    from mdtrain.lite0 import imagenet_class_names, imagenet_classifier

    return imagenet_classifier(image_size or 224, weights), imagenet_class_names(), []


def predict(
    paths: list[str | os.PathLike],
    model_file: str | os.PathLike | None = None,
    model=None,
    weights: str = "imagenet",
    top: int = 5,
    class_names: list[str] | None = None,
    image_size: int | None = None,
    batch_size: int = 32,
) -> PredictResult:
    """Classifies image files with a trained run's model or the ImageNet network.

    Args:
        paths: image files and folders (searched recursively).
        model_file: a saved `model.keras`; its class names come from the
            `report.json` beside it. Defaults to None.
        model: instead of `model_file`, `"efficientnet-lite0"` (with
            `weights`) or a Keras model object. Defaults to None.
        weights: weights of a named model: `"imagenet"` or a weights file.
            Defaults to `"imagenet"`.
        top: how many classes to list per image, best first. Defaults to 5.
        class_names: name of each output; overrides the run's report (and is
            needed for a Keras model object). Defaults to None.
        image_size: input side for a model without a fixed input size (a model
            with one refuses another). Defaults to None (the model's own, else 224).
        batch_size: images per prediction batch. Defaults to 32.

    Returns:
        A `PredictResult`: for each readable image its top classes, and the
        files skipped with the reason.

    Raises:
        UsageError: for missing paths, no images, a bad `top`, both or neither
            of `model_file` and `model`, a model that cannot be loaded,
            missing ImageNet weights, or class names that do not fit the model.

    Example:

    >>> result = predict(["photos/"], model="efficientnet-lite0", top=3)  # doctest: +SKIP
    >>> result.predictions[0].top[0]["label"]
    'Egyptian cat'
    """
    if top < 1:
        raise UsageError(f"--top {top}: must be at least 1")
    files = find_image_files(paths)
    net, names, notes = _load(model, model_file, weights, image_size)
    names = _check_names(list(class_names) if class_names is not None else names, net)
    size = _input_size(net, image_size)
    from mdtrain.compat import without_autotuning
    from mdtrain.pipeline import decoded_images

    skipped = find_undecodable(files)
    bad = {s.path for s in skipped}
    kept = [f for f in files if f not in bad]
    probabilities = []
    if kept:  # the training pipeline's own decoding and resizing: what the model trained on
        images = decoded_images(ImageList(kept, [0] * len(kept)), size)
        images = images.map(lambda image, _label: image).batch(batch_size)
        probabilities = net.predict(without_autotuning(images), verbose=0)
    predictions = []
    for path, image_probabilities in zip(kept, probabilities, strict=True):
        best = (-image_probabilities).argsort(kind="stable")[:top]
        top_k = [
            {"index": int(i), "label": names[i], "probability": float(image_probabilities[i])}
            for i in best
        ]
        predictions.append(Prediction(path, top_k))
    return PredictResult(predictions, skipped, notes)


def _input_size(net, image_size: int | None) -> int:
    fixed = net.input_shape[1]
    if fixed and image_size and image_size != fixed:
        problem = f"the model takes {fixed} px images; leave it out"
        raise bad_value("image_size", image_size, problem)
    return fixed or image_size or 224


def _check_names(names: list[str] | None, net) -> list[str]:
    num_outputs = int(net.output_shape[-1])
    if names is None or len(names) != num_outputs:
        raise UsageError(
            f"the model has {num_outputs} outputs but {0 if names is None else len(names)} "
            "class names were given; pass one name per output"
        )
    return names
