"""Finding, splitting and checking image datasets laid out as class folders.

A dataset is a folder with one sub-folder per class::

    DIR/cats/001.jpg  DIR/dogs/002.png  ...

or a folder holding ``train/`` and ``val/`` (or ``validation/``) that each look
like that. Hidden files and folders and files without an image extension are
ignored. Nothing here imports TensorFlow at import time, and nothing here ever
modifies or deletes a file.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mdtrain.errors import UsageError
from mdtrain.images import decode_image, extension_format, is_image_name, sniff_format

_VAL_NAMES = ("val", "validation", "valid")


@dataclass
class SkippedFile:
    """A file that training leaves out, and why."""

    path: str
    reason: str


@dataclass
class ImageList:
    """Image files and their integer labels, in a fixed order."""

    files: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.files)

    def counts(self, num_classes: int) -> list[int]:
        """Number of images of each class, indexed by label."""
        c = Counter(self.labels)
        return [c.get(i, 0) for i in range(num_classes)]


@dataclass
class Splits:
    """What `load_splits` found: training and validation images and the class names."""

    train: ImageList
    val: ImageList | None
    class_names: list[str]
    skipped: list[SkippedFile] = field(default_factory=list)


def _visible(entries):
    return sorted(e for e in entries if not e.name.startswith("."))


def resolve_layout(data_dir: str | os.PathLike) -> tuple[Path, Path | None]:
    """Finds the training folder and, if the dataset has one, the validation folder.

    Args:
        data_dir: a folder of class folders, or a folder holding `train/` and
            `val/` (also `validation/` or `valid/`).

    Returns:
        `(train_dir, val_dir)`; `val_dir` is None when there is no split folder.

    Raises:
        UsageError: if the folder does not exist.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise UsageError(f"{root}: no such folder; pass a folder with one sub-folder per class")
    subdirs = {p.name for p in _visible(root.iterdir()) if p.is_dir()}
    if "train" in subdirs and subdirs <= {"train", "test", *_VAL_NAMES}:
        val = next((root / n for n in _VAL_NAMES if n in subdirs), None)
        return root / "train", val
    return root, None


def scan_class_folders(
    folder: str | os.PathLike, class_names: list[str] | None = None
) -> tuple[ImageList, list[str]]:
    """Lists image files of a class-folder dataset, sorted by class then name.

    Args:
        folder: folder with one sub-folder per class.
        class_names: classes the folder must have (a validation folder must use
            the training folder's classes). Defaults to the sub-folders found.

    Returns:
        `(images, class_names)`, labels being indices into `class_names`.

    Raises:
        UsageError: if the folder is missing, has fewer than two classes, holds
            no images, or its classes differ from `class_names`.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder; pass a folder with one sub-folder per class")
    found = [p.name for p in _visible(folder.iterdir()) if p.is_dir()]
    if class_names is not None and found != list(class_names):
        raise UsageError(
            f"{folder}: its class folders {found} differ from the training classes "
            f"{list(class_names)}; use the same class folder names in both"
        )
    if len(found) < 2:
        raise UsageError(
            f"{folder}: found {len(found)} class folder(s) {found}; a classifier needs at "
            "least two sub-folders, one per class"
        )
    files, labels = [], []
    for label, name in enumerate(found):
        for dirpath, dirnames, filenames in os.walk(folder / name):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fname in sorted(filenames):
                if not fname.startswith(".") and is_image_name(fname):
                    files.append(os.path.join(dirpath, fname))
                    labels.append(label)
    if not files:
        raise UsageError(
            f"{folder}: no image files (.jpg .jpeg .png .gif .bmp) in its class folders"
        )
    return ImageList(files, labels), found


def split_validation(images: ImageList, fraction: float, seed: int) -> tuple[ImageList, ImageList]:
    """Splits off a stratified, seeded validation set.

    Every class gives the same fraction (rounded, at least one image when the
    class has two or more), so a rare class is not left out of validation.

    Args:
        images: the images to split.
        fraction: share of each class held out, in (0, 1).
        seed: seed of the split; the same seed always gives the same split.

    Returns:
        `(train, val)`, each sorted like the input.
    """
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for i, label in enumerate(images.labels):
        by_class.setdefault(label, []).append(i)
    val_idx: set[int] = set()
    for label in sorted(by_class):
        idx = by_class[label]
        take = round(len(idx) * fraction)
        if len(idx) >= 2:
            take = min(max(take, 1), len(idx) - 1)
        val_idx.update(rng.sample(idx, take))
    pick = lambda keep: ImageList(  # noqa: E731
        [f for i, f in enumerate(images.files) if (i in val_idx) == keep],
        [y for i, y in enumerate(images.labels) if (i in val_idx) == keep],
    )
    return pick(False), pick(True)


def find_undecodable(files: list[str]) -> list[SkippedFile]:
    """Decodes every file with the training decoder and returns those that fail.

    Runs in parallel through tf.data; only failures are decoded a second time
    to capture TensorFlow's reason.

    Args:
        files: image file paths.

    Returns:
        The files that cannot be decoded, with a one-line reason each.
    """
    if not files:
        return []
    import tensorflow as tf

    def ok(i, path):
        return i, tf.shape(decode_image(tf.io.read_file(path)))

    ds = tf.data.Dataset.from_tensor_slices((tf.range(len(files)), files))
    ds = ds.map(ok, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.ignore_errors().batch(4096)
    decoded = {int(i) for batch, _ in ds for i in batch.numpy()}
    bad = []
    for i in sorted(set(range(len(files))) - decoded):
        bad.append(SkippedFile(files[i], _decode_error(files[i])))
    return bad


def _decode_error(path: str) -> str:
    import tensorflow as tf

    if os.path.getsize(path) == 0:
        return "empty file"
    if sniff_format(path) is None:
        return "not a JPEG, PNG, GIF or BMP image"
    try:
        decode_image(tf.io.read_file(path))
    except Exception as e:  # TensorFlow raises several types; any of them means "unreadable"
        return str(getattr(e, "message", e)).strip().splitlines()[0][:200] or type(e).__name__
    return "could not be decoded"


def drop_undecodable(images: ImageList) -> tuple[ImageList, list[SkippedFile]]:
    """Removes files that cannot be decoded; returns the rest and the skipped files."""
    bad = find_undecodable(images.files)
    bad_paths = {b.path for b in bad}
    kept = [(f, y) for f, y in zip(images.files, images.labels, strict=True) if f not in bad_paths]
    return ImageList([f for f, _ in kept], [y for _, y in kept]), bad


def load_splits(
    data_dir: str | os.PathLike,
    val_dir: str | os.PathLike | None = None,
    validation_split: float = 0.0,
    seed: int = 0,
    check_decoding: bool = True,
) -> Splits:
    """Finds training and validation images and the class names of a dataset.

    Validation comes from, in this order: `val_dir`; a `val/` folder beside
    `train/` inside `data_dir`; a stratified `validation_split` of the
    training images; or nowhere (`Splits.val` is None).

    Args:
        data_dir: dataset folder (see `resolve_layout`).
        val_dir: separate validation folder with the same class folders.
            Defaults to None.
        validation_split: share of each class held out when there is no
            validation folder; 0 means no validation. Defaults to 0.
        seed: seed of the split. Defaults to 0.
        check_decoding: decode every file once and skip (and report) those
            that fail. Defaults to True.

    Returns:
        A `Splits`.

    Raises:
        UsageError: on a missing folder, fewer than two classes, no images,
            mismatched validation classes, or a split outside [0, 1).
    """
    if not 0.0 <= validation_split < 1.0:
        raise UsageError(
            f"--validation-split {validation_split}: must be in [0, 1) (0 means no validation)"
        )
    train_dir, found_val = resolve_layout(data_dir)
    train, class_names = scan_class_folders(train_dir)
    val_folder = val_dir if val_dir is not None else found_val
    val = None
    if val_folder is not None:
        val, _ = scan_class_folders(val_folder, class_names)
    elif validation_split > 0:
        train, val = split_validation(train, validation_split, seed)
    skipped: list[SkippedFile] = []
    if check_decoding:
        train, bad = drop_undecodable(train)
        skipped += bad
        if val is not None:
            val, bad = drop_undecodable(val)
            skipped += bad
    if len(train) == 0:
        raise UsageError(f"{data_dir}: none of the training images can be decoded")
    return Splits(train, val, class_names, skipped)


@dataclass
class CheckReport:
    """What `check_dataset` found. `to_dict()` is the `--json` form."""

    root: str
    class_names: list[str]
    counts: dict[str, dict[str, int]]
    unreadable: list[SkippedFile]
    mismatched: list[SkippedFile]
    imbalance: float

    @property
    def ok(self) -> bool:
        return not self.unreadable

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "class_names": self.class_names,
            "counts": self.counts,
            "num_images": sum(sum(c.values()) for c in self.counts.values()),
            "imbalance": self.imbalance,
            "unreadable": [vars(s) for s in self.unreadable],
            "mismatched_extension": [vars(s) for s in self.mismatched],
        }

    def to_text(self) -> str:
        lines = [f"dataset {self.root}: {len(self.class_names)} classes"]
        width = max(len(n) for n in self.class_names)
        splits = list(self.counts)
        lines.append(f"  {'class':<{width}}  " + "  ".join(f"{s:>7}" for s in splits))
        for name in self.class_names:
            row = "  ".join(f"{self.counts[s].get(name, 0):>7}" for s in splits)
            lines.append(f"  {name:<{width}}  {row}")
        lines.append(f"  imbalance (largest / smallest class): {self.imbalance:.2f}")
        for title, items in (("unreadable", self.unreadable), ("mismatched", self.mismatched)):
            lines.append(f"  {len(items)} {title} file(s)")
            lines += [f"    {s.path}: {s.reason}" for s in items[:20]]
            if len(items) > 20:
                lines.append(f"    ... and {len(items) - 20} more")
        return "\n".join(lines)


def check_dataset(data_dir: str | os.PathLike) -> CheckReport:
    """Scans a dataset with the training decoder and reports what it holds.

    Reports classes, images per class (per split when there is a `train/` and
    `val/` layout), the imbalance ratio, files that cannot be decoded, and files
    whose content is another format than their extension says (those still
    train: the decoder goes by content). It never modifies or deletes anything.

    Args:
        data_dir: dataset folder (see `resolve_layout`).

    Returns:
        A `CheckReport`.

    Raises:
        UsageError: if the folder is missing or is not a class-folder dataset.

    Example:

    >>> print(check_dataset("data/demo").to_text())  # doctest: +SKIP
    """
    train_dir, val_dir = resolve_layout(data_dir)
    train, class_names = scan_class_folders(train_dir)
    parts = {"train": train}
    if val_dir is not None:
        parts["val"], _ = scan_class_folders(val_dir, class_names)
    counts, unreadable, mismatched = {}, [], []
    for split, images in parts.items():
        bad = find_undecodable(images.files)
        unreadable += bad
        bad_paths = {b.path for b in bad}
        c = Counter(
            y for f, y in zip(images.files, images.labels, strict=True) if f not in bad_paths
        )
        counts[split] = {name: c.get(i, 0) for i, name in enumerate(class_names)}
        for f in images.files:
            claimed, actual = extension_format(f), sniff_format(f)
            if f not in bad_paths and actual is not None and actual != claimed:
                mismatched.append(SkippedFile(f, f"extension says {claimed}, content is {actual}"))
    per_class = [sum(counts[s][n] for s in counts) for n in class_names]
    imbalance = max(per_class) / max(min(per_class), 1)
    return CheckReport(str(data_dir), class_names, counts, unreadable, mismatched, imbalance)
