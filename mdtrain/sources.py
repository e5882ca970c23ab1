"""Datasets you can make or fetch: the synthetic demo, scikit-learn's digits, TF flowers.

Each is an ordinary class-folder dataset (``train/`` and ``val/``). Writers never
touch an existing folder: they build in a temporary folder beside the target and
rename it into place, which also makes concurrent writers (workers started at once) safe.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from mdtrain.choices import check_seed
from mdtrain.errors import UsageError

#: Classes of the synthetic demo dataset, in label order.
SHAPES = ("circle", "cross", "square", "star", "triangle")

FLOWERS_URL = (
    "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
)
_MARKER = "mdtrain-dataset.json"


def default_demo_dir() -> Path:
    """Where `mdtrain train` keeps the demo dataset: `$MDTRAIN_DATA_DIR/demo`, else `data/demo`."""
    return Path(os.environ.get("MDTRAIN_DATA_DIR", "data")) / "demo"


def _shape_polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list:
    """The corners of `shape` of radius `r` about `(cx, cy)`, turned by `angle` radians."""
    if shape == "square":
        corners = [(0.8, 0.8), (-0.8, 0.8), (-0.8, -0.8), (0.8, -0.8)]
    elif shape == "triangle":
        corners = [(math.cos(a), math.sin(a)) for a in np.linspace(0, 2 * math.pi, 4)[:3]]
    elif shape == "star":  # ten corners, alternately on the unit circle and at 0.45
        polar = zip([1.0, 0.45] * 5, np.linspace(0, 2 * math.pi, 11)[:10], strict=True)
        corners = [(k * math.cos(a), k * math.sin(a)) for k, a in polar]
    else:  # cross: arms of half-width 0.32
        arm = 0.32
        corners = [(arm, 1), (-arm, 1), (-arm, arm), (-1, arm), (-1, -arm), (-arm, -arm),
                   (-arm, -1), (arm, -1), (arm, -arm), (1, -arm), (1, arm), (arm, arm)]  # fmt: skip
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + r * (c * x - s * y), cy + r * (s * x + c * y)) for x, y in corners]


def _clutter(rng: np.random.Generator, size: int) -> tuple[Image.Image, bool]:
    """A noisy vertical gradient with sides ±25% around `size`, and whether it is light."""
    width, height = (int(size * factor) for factor in rng.uniform(0.75, 1.25, 2))
    top, bottom = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    blend = np.linspace(0, 1, height)[:, None, None]
    pixels = (1 - blend) * top + blend * bottom + rng.normal(0, 10, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return image, ((top + bottom) / 2).mean() > 127


def _draw_distractors(draw: ImageDraw.ImageDraw, rng: np.random.Generator, width, height) -> None:
    """Up to two distractors of random colour: lines and hollow ellipses."""
    for _ in range(rng.integers(0, 3)):
        x0, y0, x1, y1 = rng.uniform(0, [width, height, width, height])
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.line([(x0, y0), (x1, y1)], fill=colour, width=int(rng.integers(1, 3)))
        else:
            box = [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]
            draw.ellipse(box, outline=colour, width=2)


def _draw_shape_image(shape: str, rng: np.random.Generator, size: int) -> Image.Image:
    """One demo image: a shape of random colour, size, angle and place on clutter."""
    # A noisy gradient, outlined distractors, sides ±25% around `size`: a few epochs to learn.
    image, light_background = _clutter(rng, size)
    width, height = image.size
    draw = ImageDraw.Draw(image)
    _draw_distractors(draw, rng, width, height)
    radius = min(width, height) * rng.uniform(0.22, 0.40)
    cx, cy = rng.uniform(0.25, 0.75) * width, rng.uniform(0.25, 0.75) * height
    # Any hue, but clearly darker or lighter than the background behind it:
    # shape, not contrast, is what the classes differ in.
    shade = rng.integers(0, 90, 3) if light_background else rng.integers(165, 256, 3)
    colour = tuple(int(v) for v in shade)
    if shape == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    else:
        corners = _shape_polygon(shape, cx, cy, radius, rng.uniform(0, 2 * math.pi))
        draw.polygon(corners, fill=colour)
    return image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.2)))


def _write_atomically(out: Path, build) -> Path:
    """Runs `build(tmp_dir)` and renames the result to `out`; refuses an existing `out`."""
    if out.exists():
        raise UsageError(f"{out} already exists; choose a new folder (nothing was overwritten)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    except OSError as error:  # a parent that is a file, a read-only folder, ...
        raise UsageError(
            f"{out}: cannot create it ({error.strerror}); choose another folder"
        ) from None
    try:
        build(tmp)
        os.rename(tmp, out)
    except OSError:
        if out.is_dir() and (out / _MARKER).exists():  # another process won the race
            return out
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def make_synthetic_dataset(
    out: str | os.PathLike,
    classes: int = 5,
    per_class: int = 300,
    image_size: int = 256,
    seed: int = 0,
) -> Path:
    """Writes the deterministic synthetic demo dataset as JPEG class folders.

    `out/train/<shape>/` gets `per_class` images per class and `out/val/<shape>/`
    a fifth as many. The same arguments always produce the same files.

    Args:
        out: folder to create; must not exist.
        classes: number of shape classes, 2 to 5. Defaults to 5.
        per_class: training images per class. Defaults to 300.
        image_size: nominal image side; sizes vary by ±25% and are rarely
            square. Defaults to 256.
        seed: seed of the drawing. Defaults to 0.

    Returns:
        The dataset folder.

    Raises:
        UsageError: on bad arguments or an existing `out`.

    Example:

    >>> make_synthetic_dataset("/tmp/demo", per_class=50)  # doctest: +SKIP
    """
    if not 2 <= classes <= len(SHAPES):
        raise UsageError(f"--classes {classes}: must be between 2 and {len(SHAPES)}")
    if per_class < 5:
        raise UsageError(f"--per-class {per_class}: must be at least 5")
    if not 16 <= image_size <= 4096:
        raise UsageError(f"--image-size {image_size}: must be between 16 and 4096 pixels")
    check_seed(seed)
    params = dict(
        kind="synth", classes=classes, per_class=per_class, image_size=image_size, seed=seed
    )

    def build(tmp: Path) -> None:
        for split, count, offset in (("train", per_class, 0), ("val", max(per_class // 5, 1), 1)):
            for label, shape in enumerate(SHAPES[:classes]):
                folder = tmp / split / shape
                folder.mkdir(parents=True)
                for index in range(count):
                    rng = np.random.default_rng([seed, offset, label, index])
                    image = _draw_shape_image(shape, rng, image_size)
                    image.save(folder / f"{shape}_{index:05d}.jpg", quality=90)
        (tmp / _MARKER).write_text(json.dumps(params))

    return _write_atomically(Path(out), build)


def ensure_demo_dataset(out: str | os.PathLike | None = None, **kwargs) -> Path:
    """The demo dataset folder (`default_demo_dir()` unless `out`), made on first use."""
    out = Path(out) if out is not None else default_demo_dir()
    if (out / _MARKER).exists():
        return out
    return make_synthetic_dataset(out, **kwargs)


def dataset_dir(data_dir: str | os.PathLike | None = None, smoke: bool = False) -> Path:
    """The folder to train on: yours, or the demo dataset (made on first use).

    Args:
        data_dir: your dataset: class folders, optionally under `train/` and
            `val/`. Defaults to None: the demo dataset.
        smoke: without `data_dir`, a small demo dataset (20 images per class)
            for quick runs such as CI's. Defaults to False.

    Returns:
        The dataset folder.

    Example:

    >>> dataset_dir("/kaggle/input/ai-or-not")  # doctest: +SKIP
    PosixPath('/kaggle/input/ai-or-not')
    """
    if data_dir is not None:
        return Path(data_dir)
    if smoke:
        return ensure_demo_dataset(default_demo_dir().with_name("demo-smoke"), per_class=20)
    return ensure_demo_dataset()


def write_digits_dataset(out: str | os.PathLike) -> Path:
    """Writes scikit-learn's 1,797 8×8 digits at 32 px as PNG class folders, a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)

    def build(tmp: Path) -> None:
        for label in range(10):
            indices = np.flatnonzero(digits.target == label)
            rng.shuffle(indices)
            num_val = round(len(indices) * 0.2)
            for split, part in (("val", indices[:num_val]), ("train", indices[num_val:])):
                folder = tmp / split / str(label)
                folder.mkdir(parents=True)
                for index in sorted(part):
                    pixels = (digits.images[index] * (255 / 16)).astype(np.uint8)
                    image = Image.fromarray(pixels, "L").resize((32, 32), Image.Resampling.BICUBIC)
                    image.save(folder / f"digit_{index:04d}.png")
        (tmp / _MARKER).write_text(json.dumps({"kind": "digits", "scale": 4, "seed": 0}))

    return _write_atomically(Path(out), build)


def download_flowers(cache_dir: str | os.PathLike = "data") -> Path:
    """Downloads TensorFlow's flower photos (3,670 JPEGs, 5 classes, no split) once."""
    import keras

    try:
        path = keras.utils.get_file(
            "flower_photos", origin=FLOWERS_URL, untar=True, cache_dir=os.path.abspath(cache_dir)
        )
    except Exception as error:  # urllib raises several types; all mean "could not fetch"
        raise UsageError(
            f"could not download the flowers dataset from {FLOWERS_URL} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); without network, use "
            "`mdtrain data synth` or `mdtrain data digits`"
        ) from None
    path = Path(path)
    inner = path / "flower_photos"
    return inner if inner.is_dir() else path
