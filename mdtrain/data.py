"""Finding, splitting and checking image datasets laid out as class folders (data/README.md).

Nothing here imports TensorFlow at import time or ever modifies a dataset's file:
what mdtrain remembers about a dataset (which files decode) lives in its own `cache_folder()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import compress
from pathlib import Path

from mdtrain.errors import UsageError
from mdtrain.images import decode_image, extension_format, image_files, sniff_format

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
        per_label = Counter(self.labels)
        return [per_label.get(label, 0) for label in range(num_classes)]

    def where(self, keep: list[bool]) -> ImageList:
        """The images whose entry in `keep` is true, in the same order."""
        return ImageList(list(compress(self.files, keep)), list(compress(self.labels, keep)))


@dataclass
class Splits:
    """What `load_splits` found: training and validation images and the class names."""

    train: ImageList
    val: ImageList | None
    class_names: list[str]
    skipped: list[SkippedFile] = field(default_factory=list)


def tf_paths(files: list[str]) -> list[bytes]:
    """`files` as bytes: a name that is not UTF-8 (surrogate escapes) fails as a string tensor."""
    return [os.fsencode(f) for f in files]


def _subfolders(folder: Path) -> list[str]:
    """The names of `folder`'s sub-folders, sorted, hidden ones left out."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder; pass a folder with one sub-folder per class")
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def resolve_layout(data_dir: str | os.PathLike) -> tuple[Path, Path | None]:
    """`(train_dir, val_dir)` of a dataset; `val_dir` is None when it has no split folder."""
    root = Path(data_dir)
    subdirs = set(_subfolders(root))
    if "train" in subdirs and subdirs <= {"train", "test", *_VAL_NAMES}:
        val = next((root / n for n in _VAL_NAMES if n in subdirs), None)
        return root / "train", val
    return root, None


def _class_folders(folder, class_names: list[str] | None = None) -> tuple[ImageList, list[str]]:
    """`(images, class_names)` of a folder of class folders (those of `class_names` if given)."""
    folder = Path(folder)
    found = _subfolders(folder)
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
    per_class = [image_files(folder / name) for name in found]
    files = [f for class_files in per_class for f in class_files]
    labels = [label for label, class_files in enumerate(per_class) for _ in class_files]
    if not files:
        raise UsageError(
            f"{folder}: no image files (.jpg .jpeg .png .gif .bmp) in its class folders"
        )
    return ImageList(files, labels), found


def _split_validation(images: ImageList, fraction: float, seed: int) -> tuple[ImageList, ImageList]:
    """`(train, val)`: a seeded, stratified share of each class held out; sorted like `images`."""
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for position, label in enumerate(images.labels):
        by_class.setdefault(label, []).append(position)
    held_out: set[int] = set()
    for label in sorted(by_class):
        positions = by_class[label]
        # At least one validation image, and at least one left to train on: a class
        # of one image stays in training.
        take = min(max(round(len(positions) * fraction), 1), len(positions) - 1)
        held_out.update(rng.sample(positions, take))
    in_val = [position in held_out for position in range(len(images))]
    return images.where([not held for held in in_val]), images.where(in_val)


def cache_folder() -> Path:
    """mdtrain's cache folder: `$MDTRAIN_CACHE_DIR`, else `mdtrain` in the user's cache folder."""
    if os.environ.get("MDTRAIN_CACHE_DIR"):
        return Path(os.environ["MDTRAIN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mdtrain"


def _stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


#: Version of the decode-check manifest; a manifest of another version is scanned again.
_MANIFEST_VERSION = 3  # 3: the reasons name WebP


def find_undecodable(files: list[str]) -> list[SkippedFile]:
    """The files the decoder cannot decode, with a one-line reason; cached by path, size, mtime."""
    if not files:
        return []
    root = os.fsencode(os.path.commonpath([os.path.abspath(f) for f in files]))
    manifest = cache_folder() / "checked" / f"{hashlib.sha256(root).hexdigest()[:16]}.json"
    known = _read_manifest(manifest)
    keys = {f: _stat_key(f) for f in files}
    todo = [f for f in files if f not in known or known[f][:2] != keys[f]]
    reasons = {f: known[f][2] for f in files if f not in todo}
    reasons.update(_scan(todo))
    if todo:
        known.update({f: [*keys[f], reasons[f]] for f in todo if keys[f] is not None})
        _write_manifest(manifest, known)
    return [SkippedFile(f, reasons[f]) for f in files if reasons[f] is not None]


def _read_manifest(manifest: Path) -> dict[str, list]:
    """`{path: [size, mtime, reason or None]}` of an earlier scan; empty if none or unreadable."""
    try:
        saved = json.loads(manifest.read_text())
        return saved["files"] if saved["version"] == _MANIFEST_VERSION else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # none yet, or unreadable: scan again


def _write_manifest(manifest: Path, known: dict[str, list]) -> None:
    """Writes `known` atomically; a manifest that cannot be written costs a rescan next time."""
    with contextlib.suppress(OSError):
        manifest.parent.mkdir(parents=True, exist_ok=True)
        descriptor, tmp = tempfile.mkstemp(dir=manifest.parent, suffix=".tmp")
        with os.fdopen(descriptor, "w") as out:
            json.dump({"version": _MANIFEST_VERSION, "files": known}, out)
        os.replace(tmp, manifest)


def _scan(files: list[str]) -> dict[str, str | None]:
    """`{path: None if it decodes, else the reason}`, decoding in parallel."""
    if not files:
        return {}
    from mdtrain.tf_import import LIBJPEG_NOISE, import_tensorflow, stderr_without

    import_tensorflow()  # without its start-up lines: `mdtrain data check` prints only ours
    import tensorflow as tf

    from mdtrain.compat import without_autotuning
    from mdtrain.images import load_image

    def decode(position, path):  # size 1: JPEGs of 8 px and more decode at 1/8 scale
        return position, load_image(path, 1)

    paths = tf.data.Dataset.from_tensor_slices((tf.range(len(files)), tf_paths(files)))
    decoded = paths.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    decoded = without_autotuning(decoded.ignore_errors().batch(4096))
    with stderr_without(LIBJPEG_NOISE):  # each bad file's reason is reported, once
        good = {int(position) for batch, _ in decoded for position in batch.numpy()}
        return {f: None if at in good else _decode_error(f) for at, f in enumerate(files)}


def _decode_error(path: str) -> str:
    import tensorflow as tf

    try:
        if os.path.getsize(path) == 0:
            return "empty file"
    except OSError as error:
        return f"cannot be read: {error.strerror}"
    if sniff_format(path) is None:
        return "not a JPEG, PNG, GIF, BMP or WebP image"
    try:
        decode_image(tf.io.read_file(os.fsencode(path)))
    except Exception as error:  # TensorFlow raises several types; any means "unreadable"
        return _one_line(str(getattr(error, "message", error))) or type(error).__name__
    return "could not be decoded"


def _one_line(message: str) -> str:
    """TensorFlow's error without its graph-node prefix and op suffix, on one line."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = re.sub(r"\{\{[^}]*\}\}\s*", "", line)  # {{function_node ...}}
    return re.sub(r"\s*\[Op:\w+\].*$", "", line).strip()[:200]


def _dataset_folders(
    data_dir: str | os.PathLike, val_dir: str | os.PathLike | None = None
) -> tuple[ImageList, ImageList | None, list[str]]:
    """`(train, val, class_names)` of a dataset's folders; `val` is None without a folder."""
    train_dir, found_val = resolve_layout(data_dir)
    train, class_names = _class_folders(train_dir)
    val_folder = val_dir if val_dir is not None else found_val
    val = None if val_folder is None else _class_folders(val_folder, class_names)[0]
    return train, val, class_names


def drop_undecodable(images: ImageList) -> tuple[ImageList, list[SkippedFile]]:
    """Removes files that cannot be decoded; returns the rest and the skipped files."""
    bad = find_undecodable(images.files)
    bad_paths = {b.path for b in bad}
    return images.where([f not in bad_paths for f in images.files]), bad


def load_splits(
    data_dir: str | os.PathLike,
    val_dir: str | os.PathLike | None = None,
    validation_split: float = 0.0,
    seed: int = 0,
    check_decoding: bool = True,
) -> Splits:
    """Finds training and validation images and the class names of a dataset.

    Where validation comes from, in which order: data/README.md.

    Args:
        data_dir: a folder of class folders, or one holding `train/` and `val/` ones.
        val_dir: separate validation folder with the same class folders.
            Defaults to None.
        validation_split: share of each class held out when there is no
            validation folder; 0 means no validation. Defaults to 0.
        seed: seed of the split. Defaults to 0.
        check_decoding: decode every file once and skip (and report) those
            that fail. Defaults to True.

    Returns:
        A `Splits`, whose `val` is None without validation.

    Raises:
        UsageError: on a missing folder, fewer than two classes, no images,
            mismatched validation classes, or a split outside [0, 1).
    """
    if not 0.0 <= validation_split < 1.0:
        raise UsageError(
            f"--validation-split {validation_split}: must be in [0, 1) (0 means no validation)"
        )
    train, val, class_names = _dataset_folders(data_dir, val_dir)
    if val is None and validation_split > 0:
        train, val = _split_validation(train, validation_split, seed)
    skipped: list[SkippedFile] = []
    if check_decoding:
        train, skipped = drop_undecodable(train)
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
        fields = asdict(self)  # the skipped files become dicts too
        fields["mismatched_extension"] = fields.pop("mismatched")
        images = sum(sum(per_class.values()) for per_class in self.counts.values())
        return {**fields, "num_images": images}

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


def _mismatched_extensions(files: list[str]) -> list[SkippedFile]:
    """The files whose content is another format than their extension says."""
    found = []
    for path in files:
        claimed, actual = extension_format(path), sniff_format(path)
        if actual is not None and actual != claimed:
            found.append(SkippedFile(path, f"extension says {claimed}, content is {actual}"))
    return found


def check_dataset(data_dir: str | os.PathLike) -> CheckReport:
    """Scans a dataset with the training decoder and reports what it holds.

    Reports classes, images per class and split, the imbalance ratio, files that
    cannot be decoded, and files whose extension names another format (which still
    train: data/README.md).

    Args:
        data_dir: a folder of class folders, or one holding `train/` and `val/` ones.

    Returns:
        A `CheckReport`.

    Raises:
        UsageError: if the folder is missing or is not a class-folder dataset.

    Example:

    >>> print(check_dataset("data/demo").to_text())  # doctest: +SKIP
    """
    train, val, class_names = _dataset_folders(data_dir)
    parts = {"train": train} if val is None else {"train": train, "val": val}
    counts, unreadable, mismatched = {}, [], []
    for split, images in parts.items():
        kept, bad = drop_undecodable(images)
        unreadable += bad
        counts[split] = dict(zip(class_names, kept.counts(len(class_names)), strict=True))
        mismatched += _mismatched_extensions(kept.files)
    per_class = [sum(counts[s][n] for s in counts) for n in class_names]
    imbalance = max(per_class) / max(min(per_class), 1)
    return CheckReport(str(data_dir), class_names, counts, unreadable, mismatched, imbalance)
