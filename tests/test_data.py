"""Dataset discovery, splitting and checking on real files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from mdtrain import data
from mdtrain.data import (
    cache_folder,
    check_dataset,
    find_undecodable,
    load_splits,
    resolve_layout,
)
from mdtrain.errors import UsageError
from mdtrain.images import load_image, sniff_format


def test_resolve_layout_finds_train_and_val(tiny_dataset):
    train, val = resolve_layout(tiny_dataset)
    assert train == tiny_dataset / "train"
    assert val == tiny_dataset / "val"
    assert resolve_layout(tiny_dataset / "train") == (tiny_dataset / "train", None)


def test_scan_lists_classes_in_order_and_ignores_non_images(messy_dataset):
    splits = load_splits(messy_dataset, check_decoding=False)
    images = splits.train
    assert splits.class_names == ["circle", "cross", "square"]
    names = {os.path.basename(f) for f in images.files}
    assert "README.txt" not in names
    assert "x.jpg" not in names  # inside a hidden folder
    assert {"truncated.jpg", "empty.png", "notes.jpg", "really_a_jpeg.png"} <= names
    assert images.counts(3)[1:] == [8, 8]


def test_load_splits_skips_and_reports_unreadable_files(messy_dataset):
    splits = load_splits(messy_dataset)
    skipped = {os.path.basename(s.path): s.reason for s in splits.skipped}
    assert set(skipped) == {"truncated.jpg", "empty.png", "notes.jpg"}
    assert skipped["empty.png"] == "empty file"
    assert "not a JPEG" in skipped["notes.jpg"]
    kept = {os.path.basename(f) for f in splits.train.files}
    assert "really_a_jpeg.png" in kept
    assert len(splits.train) == 8 * 3 + 1


def test_validation_split_is_stratified_and_seeded(tiny_dataset):
    a = load_splits(tiny_dataset / "train", validation_split=0.25, seed=3, check_decoding=False)
    b = load_splits(tiny_dataset / "train", validation_split=0.25, seed=3, check_decoding=False)
    c = load_splits(tiny_dataset / "train", validation_split=0.25, seed=4, check_decoding=False)
    assert a.val.files == b.val.files and a.val.files != c.val.files
    assert a.val.counts(3) == [2, 2, 2]
    assert not set(a.train.files) & set(a.val.files)


def test_validation_split_leaves_every_class_something_to_train_on(tmp_path):
    for name in ("a/1.jpg", "a/2.jpg", "a/3.jpg", "b/1.jpg"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).touch()
    splits = load_splits(tmp_path, validation_split=0.6, check_decoding=False)
    assert splits.train.counts(2) == [1, 1] and splits.val.counts(2) == [2, 0]


def test_file_names_that_are_not_utf8_are_read(tmp_path):
    from mdtrain.pipeline import decoded_images

    for c in "ab":
        (tmp_path / c).mkdir()
        for i in range(2):
            Image.new("RGB", (20, 20), (40 * i, 90, 200)).save(tmp_path / c / f"{i}.png")
    latin1 = os.fsdecode(b"caf\xe9.png")  # as a Windows zip names it: not UTF-8
    Image.new("RGB", (20, 20)).save(tmp_path / "a" / latin1)
    (tmp_path / "b" / os.fsdecode(b"notes\xe9.jpg")).write_text("not an image")
    splits = load_splits(tmp_path)
    assert [os.path.basename(s.path) for s in splits.skipped] == [os.fsdecode(b"notes\xe9.jpg")]
    assert os.path.join(str(tmp_path), "a", latin1) in splits.train.files
    images = [image for image, _ in decoded_images(splits.train, 16)]
    assert len(images) == 5 and images[0].shape == (16, 16, 3)


def test_split_layout_uses_val_folder(tiny_dataset):
    splits = load_splits(tiny_dataset, check_decoding=False)
    assert len(splits.train) == 24 and len(splits.val) == 3


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.mkdir(), "found 0 class folder"),
        (lambda p: (p / "only").mkdir(parents=True), "at least two"),
        (lambda p: [(p / c).mkdir(parents=True) for c in "ab"], "no image files"),
    ],
)
def test_bad_folders_raise_usage_errors(tmp_path, make, message):
    target = tmp_path / "data"
    make(target)
    with pytest.raises(UsageError, match=message):
        load_splits(target)


def test_validation_classes_must_match(tiny_dataset, tmp_path):
    val = tmp_path / "val"
    shutil.copytree(tiny_dataset / "val", val)
    shutil.rmtree(val / "square")
    (val / "hexagon").mkdir()
    with pytest.raises(UsageError, match="differ from the training classes"):
        load_splits(tiny_dataset / "train", val_dir=val)


@pytest.mark.parametrize("split", [-0.1, 1.0, 1.5])
def test_validation_split_out_of_range(tiny_dataset, split):
    with pytest.raises(UsageError, match=r"\[0, 1\)"):
        load_splits(tiny_dataset, validation_split=split)


def test_check_reports_everything_and_modifies_nothing(messy_dataset):
    before = {p: p.stat().st_mtime_ns for p in messy_dataset.rglob("*")}
    report = check_dataset(messy_dataset)
    after = {p: p.stat().st_mtime_ns for p in messy_dataset.rglob("*")}
    assert before == after
    assert report.class_names == ["circle", "cross", "square"]
    assert report.counts == {"train": {"circle": 9, "cross": 8, "square": 8}}
    assert {os.path.basename(s.path) for s in report.unreadable} == {
        "truncated.jpg",
        "empty.png",
        "notes.jpg",
    }
    assert [os.path.basename(s.path) for s in report.mismatched] == ["really_a_jpeg.png"]
    assert "content is jpeg" in report.mismatched[0].reason
    assert report.imbalance == pytest.approx(9 / 8)
    d = report.to_dict()
    assert d["num_images"] == 25 and len(d["unreadable"]) == 3
    text = report.to_text()
    assert "3 unreadable" in text and "really_a_jpeg.png" in text


def test_sniff_format_goes_by_content(messy_dataset):
    assert sniff_format(messy_dataset / "circle" / "really_a_jpeg.png") == "jpeg"
    assert sniff_format(messy_dataset / "circle" / "notes.jpg") is None


def test_webp_is_listed_decoded_and_named_in_the_reason(tmp_path):
    for name, shade in (("dark", 40), ("light", 200)):
        (tmp_path / name).mkdir()
        Image.new("RGB", (12, 10), (shade,) * 3).save(tmp_path / name / "a.webp", lossless=True)
    (tmp_path / "dark" / "b.webp").write_text("<html>404</html>")
    report = check_dataset(tmp_path)
    assert report.counts["train"] == {"dark": 1, "light": 1} and not report.mismatched
    assert [os.path.basename(s.path) for s in report.unreadable] == ["b.webp"]
    assert report.unreadable[0].reason == "not a JPEG, PNG, GIF, BMP or WebP image"
    assert sniff_format(tmp_path / "light" / "a.webp") == "webp"
    assert int(load_image(str(tmp_path / "light" / "a.webp"), 4).numpy().min()) == 200


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    folder = tmp_path / "mdtrain-cache"
    monkeypatch.setenv("MDTRAIN_CACHE_DIR", str(folder))
    return folder


def _counting_scan(monkeypatch) -> list:
    scanned = []
    real = data._scan

    def scan(files):
        scanned.extend(files)
        return real(files)

    monkeypatch.setattr(data, "_scan", scan)
    return scanned


def test_decode_check_is_remembered_in_mdtraincache_never_in_the_dataset(
    messy_dataset, tmp_path, own_cache, monkeypatch
):
    root = tmp_path / "copy"
    shutil.copytree(messy_dataset, root)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    scanned = _counting_scan(monkeypatch)
    first = load_splits(root)
    assert len(scanned) == 8 * 3 + 4  # every candidate decoded once
    assert list((own_cache / "checked").glob("*.json")) and cache_folder() == own_cache
    scanned.clear()
    second = load_splits(root)
    assert scanned == []  # nothing changed: nothing decoded again
    assert [vars(s) for s in second.skipped] == [vars(s) for s in first.skipped]
    assert second.train.files == first.train.files
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_a_changed_file_is_checked_again(tiny_dataset, tmp_path, own_cache, monkeypatch):
    root = tmp_path / "copy"
    shutil.copytree(tiny_dataset / "train", root)
    files = sorted(str(p) for p in root.rglob("*.jpg"))
    assert find_undecodable(files) == []
    victim = files[3]
    with open(victim, "r+b") as f:  # now truncated: a different size
        f.truncate(150)
    scanned = _counting_scan(monkeypatch)
    bad = find_undecodable(files)
    assert scanned == [victim] and [b.path for b in bad] == [victim]
    os.remove(victim)
    assert "cannot be read" in find_undecodable(files)[0].reason


def test_cache_folder_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("MDTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "mdtrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_folder() == Path.home() / ".cache" / "mdtrain"
