"""The datasets mdtrain makes: deterministic, real files, never overwriting."""

from __future__ import annotations

import hashlib

import pytest
from PIL import Image

from mdtrain import sources
from mdtrain.errors import UsageError


def _digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.jpg")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def test_synthetic_dataset_is_deterministic_with_varied_sizes(tmp_path):
    options = dict(classes=3, per_class=6, image_size=64)
    a = sources.make_synthetic_dataset(tmp_path / "a", **options)
    b = sources.make_synthetic_dataset(tmp_path / "b", **options)
    c = sources.make_synthetic_dataset(tmp_path / "c", **options, seed=9)
    assert _digest(a) == _digest(b) != _digest(c)
    assert sorted(p.name for p in (a / "train").iterdir()) == ["circle", "cross", "square"]
    assert len(list((a / "train" / "cross").glob("*.jpg"))) == 6
    assert len(list((a / "val" / "cross").glob("*.jpg"))) == 1
    sizes = {Image.open(p).size for p in a.rglob("*.jpg")}
    assert len(sizes) > 5 and any(w != h for w, h in sizes)
    assert all(Image.open(p).format == "JPEG" for p in a.rglob("*.jpg"))


def test_writers_never_overwrite(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    with pytest.raises(UsageError, match="already exists"):
        sources.make_synthetic_dataset(target, per_class=5)
    with pytest.raises(UsageError, match="already exists"):
        sources.write_digits_dataset(target)
    assert (target / "keep.txt").read_text() == "precious"


def test_ensure_demo_dataset_creates_once_and_reuses(tmp_path):
    out = tmp_path / "demo"
    first = sources.ensure_demo_dataset(out, classes=2, per_class=5, image_size=32)
    stamp = (first / "train" / "circle" / "circle_00000.jpg").stat().st_mtime_ns
    again = sources.ensure_demo_dataset(out, classes=2, per_class=5, image_size=32)
    assert again == first
    assert (first / "train" / "circle" / "circle_00000.jpg").stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"classes": 1}, "--classes"),
        ({"per_class": 2}, "--per-class"),
        ({"image_size": 4}, "--image"),
    ],
)
def test_synthetic_rejects_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        sources.make_synthetic_dataset(tmp_path / "x", **kwargs)


def test_digits_are_real_pngs_split_per_class(tmp_path):
    root = sources.write_digits_dataset(tmp_path / "digits")
    train = sorted((root / "train").iterdir())
    assert [p.name for p in train] == [str(d) for d in range(10)]
    n_train = sum(len(list(p.glob("*.png"))) for p in train)
    n_val = sum(len(list(p.glob("*.png"))) for p in (root / "val").iterdir())
    assert n_train + n_val == 1797
    assert 0.18 < n_val / 1797 < 0.22
    img = Image.open(next((root / "val" / "7").glob("*.png")))
    assert img.format == "PNG" and img.size == (32, 32)


def test_flowers_download_fails_clearly_offline(tmp_path, monkeypatch):
    import keras

    def offline(*args, **kwargs):
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(keras.utils, "get_file", offline)
    with pytest.raises(UsageError, match="could not download the flowers dataset"):
        sources.download_flowers(tmp_path)
