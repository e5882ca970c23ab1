"""InputData: global batches, epoch-determined order, resume, cache modes, skipped files, uint8."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from mdtrain.data import load_splits
from mdtrain.errors import UsageError
from mdtrain.images import decode_image
from mdtrain.pipeline import InputData, decoded_images, load_image, resolve_cache
from mdtrain.sources import make_synthetic_dataset

SIZE, BATCH = 32, 16


@pytest.fixture(autouse=True)
def _own_cache_folder(tmp_path, monkeypatch):
    """Disk caches and decode manifests go to a folder of this test's own."""
    monkeypatch.setenv("MDTRAIN_CACHE_DIR", str(tmp_path / "mdtrain-cache"))


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = make_synthetic_dataset(
        tmp_path_factory.mktemp("pipe") / "d", per_class=10, image_size=64
    )
    return load_splits(root)  # 5 classes: 50 train, 10 val


def _batches(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


def _inputs(splits, **kw):
    kw.setdefault("deterministic", True)
    return InputData(splits, SIZE, BATCH, seed=3, **kw)


def test_global_batches_keep_the_partial_last_batch_as_uint8(splits):
    data = _inputs(splits, cache=False)
    batches = _batches(data.train_epochs(0, 1))
    assert [len(y) for _, y in batches] == [16, 16, 16, 2]
    assert data.steps_per_epoch == 4 and data.num_train == 50 and data.num_val == 10
    images, labels = batches[0]
    assert images.dtype == np.uint8 and images.shape == (16, SIZE, SIZE, 3)
    assert labels.dtype == np.int32
    assert sorted(np.concatenate([y for _, y in batches])) == sorted(splits.train.labels)
    assert [len(y) for _, y in _batches(data.val_ds)] == [10]


def test_order_depends_only_on_seed_and_epoch(splits):
    a = _batches(_inputs(splits, cache=False).epoch_batches(1))
    b = _batches(_inputs(splits, cache=False).epoch_batches(1))
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)
    c = _batches(_inputs(splits, cache=False).epoch_batches(2))
    assert not np.array_equal(np.concatenate([y for _, y in a]), np.concatenate([y for _, y in c]))


@pytest.mark.parametrize("cache", ["none", "memory", "disk", False, True])
def test_resumed_epochs_equal_the_tail_of_an_uninterrupted_run(splits, cache):
    full = _batches(_inputs(splits, cache=cache).train_epochs(0, 3))
    resumed = _batches(_inputs(splits, cache=cache).train_epochs(2, 3))
    assert len(full) == 12 and len(resumed) == 4
    for (xa, ya), (xb, yb) in zip(full[8:], resumed, strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_memory_cache_and_streaming_give_the_same_batches(splits, epoch):
    cached = _inputs(splits, cache="memory")
    assert cached.cache_mode == "memory"
    first = _batches(cached.epoch_batches(epoch))  # epoch 0 fills the cache while streaming
    again = _batches(cached.epoch_batches(epoch))  # served from the cache
    streamed = _batches(_inputs(splits, cache="none").epoch_batches(epoch))
    for (xa, ya), (xb, _), (xc, yc) in zip(first, again, streamed, strict=True):
        np.testing.assert_array_equal(ya, yc)
        np.testing.assert_array_equal(xa, xc)
        np.testing.assert_array_equal(xa, xb)


def test_disk_cache_writes_only_to_its_folder_and_keeps_every_image(splits, tmp_path):
    data_root = splits.train.files[0].rsplit("/", 3)[0]
    before = sorted(str(p) for p in Path(data_root).rglob("*"))
    disk = _inputs(splits, cache="disk", cache_dir=tmp_path / "cache")
    streamed = _inputs(splits, cache="none")
    first = _batches(disk.epoch_batches(0))
    for (xa, ya), (xb, yb) in zip(first, _batches(streamed.epoch_batches(0)), strict=True):
        np.testing.assert_array_equal(ya, yb)  # epoch 0 is the same streamed order
        np.testing.assert_array_equal(xa, xb)
    later = np.concatenate([y for _, y in _batches(disk.epoch_batches(1))])
    assert sorted(later) == sorted(splits.train.labels)
    assert list((tmp_path / "cache").glob("mdtrain-*/train.index"))
    after = sorted(str(p) for p in Path(data_root).rglob("*"))
    assert before == after  # nothing written beside the user's images


def test_each_worker_fills_a_disk_cache_of_its_own(splits, tmp_path):
    workers = [
        _inputs(splits, cache="disk", cache_dir=tmp_path, cache_task=f"worker-{i}") for i in (0, 1)
    ]
    # Filled at the same time, as two workers do; one shared file prefix would fail here.
    for (xa, ya), (xb, yb) in zip(*(w.epoch_batches(0) for w in workers), strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)
    filled = sorted(p.name for p in tmp_path.glob("mdtrain-*/train*.index"))
    assert filled == ["train-worker-0.index", "train-worker-1.index"]


# Starts filling the disk cache of `_inputs(splits, cache="disk", ...)`, then waits. (Its
# batch size and augmentation do not change what is cached; one image per batch and no
# augmentation map reading batches ahead leave the cache unfinished.)
_FILLER = """
import sys, time
from mdtrain.data import load_splits
from mdtrain.pipeline import InputData
inputs = InputData(load_splits(sys.argv[1]), 32, 1, seed=3, cache="disk", augment=None,
                   cache_dir=sys.argv[2], deterministic=True)
images = iter(inputs.epoch_batches(0))  # kept: a dropped iterator discards its partial cache
next(images)  # the first image: TensorFlow's lockfile exists now
print("filling", flush=True)
time.sleep(600)
"""


def _start_filler(splits, cache_dir) -> subprocess.Popen:
    data_root = Path(splits.train.files[0]).parents[2]
    filler = subprocess.Popen(
        [sys.executable, "-c", _FILLER, str(data_root), str(cache_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert filler.stdout.readline().strip() == "filling"
    return filler


@pytest.mark.slow
def test_a_disk_cache_whose_filler_was_killed_is_filled_again(splits, tmp_path):
    filler = _start_filler(splits, tmp_path)
    filler.send_signal(signal.SIGKILL)  # preempted, or out of memory
    filler.wait()
    assert list(tmp_path.glob("mdtrain-*/train_0.lockfile"))  # what TensorFlow leaves
    disk = _inputs(splits, cache="disk", cache_dir=tmp_path)
    streamed = _inputs(splits, cache="none")
    batches = zip(_batches(disk.epoch_batches(0)), _batches(streamed.epoch_batches(0)), strict=True)
    for (xa, ya), (xb, yb) in batches:
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)
    assert list(tmp_path.glob("mdtrain-*/train.index"))


@pytest.mark.slow
def test_a_disk_cache_being_filled_by_a_live_process_is_one_clear_error(splits, tmp_path):
    filler = _start_filler(splits, tmp_path)
    try:
        with pytest.raises(UsageError, match="another process is filling the cache"):
            _inputs(splits, cache="disk", cache_dir=tmp_path)
    finally:
        filler.kill()
        filler.wait()


def test_cache_modes_resolve_by_the_memory_available():
    need = 1000 * 224 * 224 * 3  # bytes of 1,000 decoded uint8 RGB images
    assert resolve_cache("auto", 1000, 224, available=4 * need) == "memory"
    assert resolve_cache("auto", 1000, 224, available=2 * need) == "none"
    assert resolve_cache("auto", 1000, 224, "/tmp/x", available=2 * need) == "disk"
    assert resolve_cache(True, 1000, 224) == "memory" and resolve_cache(False, 1, 8) == "none"
    for mode in ("memory", "disk", "none"):
        assert resolve_cache(mode, 10**9, 224, available=1) == mode
    with pytest.raises(UsageError, match="--cache 'ram'"):
        resolve_cache("ram", 10, 8)


def test_streaming_holds_names_not_images_in_its_shuffle(splits):
    """`none` shuffles file names: its graph has no shuffle after the decoder."""
    ds = _inputs(splits, cache="none").epoch_batches(3)
    graph = ds._as_serialized_graph().numpy().decode("latin-1")
    assert graph.index("ShuffleDataset") < graph.index("ParallelMapDatasetV2")


def test_non_deterministic_order_keeps_every_image(splits):
    data = InputData(splits, SIZE, BATCH, augment=None, cache=False, deterministic=False)
    labels = np.concatenate([y for _, y in _batches(data.train_epochs(0, 1))])
    assert sorted(labels) == sorted(splits.train.labels)


def test_unreadable_files_are_skipped_upstream(tmp_path, splits):
    root = tmp_path / "messy"
    shutil.copytree(splits.train.files[0].rsplit("/", 2)[0], root)
    (root / "circle" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    (root / "circle" / "empty.png").write_bytes(b"")
    messy = load_splits(root)
    assert len(messy.skipped) == 2
    data = InputData(messy, SIZE, BATCH, cache=False)
    assert data.num_train == 50 and len(data.splits.skipped) == 2
    assert sum(len(y) for _, y in _batches(data.train_epochs(0, 1))) == 50


def test_large_jpeg_is_decoded_at_reduced_scale(tmp_path):
    y, x = np.mgrid[0:400, 0:360]
    smooth = np.stack([x * 255 / 360, y * 255 / 400, (x + y) * 255 / 760], -1).astype(np.uint8)
    Image.fromarray(smooth).save(tmp_path / "big.jpg", quality=95)
    Image.fromarray(smooth).save(tmp_path / "big.png")
    for name in ("big.jpg", "big.png"):
        path = str(tmp_path / name)
        fast = load_image(tf.constant(path), 64).numpy().astype(float)
        full = tf.image.resize(decode_image(tf.io.read_file(path)), [64, 64]).numpy()
        assert fast.shape == (64, 64, 3)
        assert np.abs(fast - full).mean() < 2.0, name


def test_decoded_images_in_file_order(splits):
    ds = decoded_images(splits.val, SIZE)
    labels = [int(y) for _, y in ds]
    assert labels == list(splits.val.labels)


def test_training_and_validation_datasets_run_without_the_autotuning_model(splits):
    """Deleting an autotuning iterator can stall up to 60 s (mdtrain.compat.without_autotuning)."""
    data = _inputs(splits)
    for ds in (data.train_epochs(0, 2), data.val_ds):
        assert ds.options().autotune.enabled is False


# --- several workers: each decodes only its replicas' slices ---------------------------


def _split(batch, parts: int) -> list:
    """`batch` cut into `parts` contiguous slices as `tf.distribute` cuts it (`BatchGeometry`)."""
    from mdtrain.distribute import BatchGeometry

    sizes = BatchGeometry(len(batch[1]), len(batch[1]), parts).split(len(batch[1]))
    ends = np.cumsum(sizes)
    return [tuple(x[e - n : e] for x in batch) for n, e in zip(sizes, ends, strict=True)]


def _worker_elements(data, workers: int, per_worker: int, **kw) -> list[list]:
    """Each worker's per-replica batches, as `distribute_datasets_from_function` builds them."""
    contexts = [
        tf.distribute.InputContext(workers, w, workers * per_worker) for w in range(workers)
    ]
    return [[tuple(x.numpy() for x in e) for e in data.train_epochs(context=c, **kw)]
            for c in contexts]  # fmt: skip


@pytest.mark.parametrize(
    "cache, augment_in, workers, per_worker",
    [("none", "pipeline", 2, 1), ("none", "model", 2, 2), ("memory", "pipeline", 3, 1)],
)
def test_worker_slices_are_the_one_process_batches_cut_as_tf_distribute_cuts_them(
    splits, cache, augment_in, workers, per_worker
):
    # 50 images in batches of 16 end with a batch of 2: some replicas get empty slices.
    whole = [tuple(x.numpy() for x in b) for b in
             _inputs(splits, cache=cache, augment_in=augment_in).train_epochs(0, 2)]  # fmt: skip
    sliced = _worker_elements(_inputs(splits, cache=cache, augment_in=augment_in), workers,
                              per_worker, first_epoch=0, last_epoch=2)  # fmt: skip
    replicas = workers * per_worker
    for w, elements in enumerate(sliced):
        assert len(elements) == len(whole) * per_worker
        for step, batch in enumerate(whole):
            expected = _split(batch, replicas)[w * per_worker : (w + 1) * per_worker]
            got = elements[step * per_worker : (step + 1) * per_worker]
            for a, b in zip(expected, got, strict=True):
                assert len(a) == len(b) and all(
                    np.array_equal(x, y) for x, y in zip(a, b, strict=True)
                )
    # The last batch of 2 leaves the last worker's replicas empty when there are more than 2.
    assert (len(sliced[-1][-1][1]) == 0) == (replicas > 2)


def test_a_worker_decodes_only_its_slices(splits, monkeypatch):
    import mdtrain.pipeline as pipeline

    decoded = tf.Variable(0, dtype=tf.int64)

    def counting(path, size):
        with tf.control_dependencies([decoded.assign_add(1)]):
            return load_image(path, size)

    monkeypatch.setattr(pipeline, "load_image", counting)
    data = _inputs(splits, cache="none")
    (elements,) = _worker_elements(data, 1, 1)  # one worker: the whole epoch
    assert decoded.numpy() == 50 and sum(len(e[1]) for e in elements) == 50
    decoded.assign(0)
    _worker_elements(data, 2, 1)  # each of 2 workers: its half
    assert decoded.numpy() == 50


def test_resumed_worker_skips_whole_steps(splits):
    data = _inputs(splits, cache="none", augment_in="model")
    full = _worker_elements(data, 2, 2, first_epoch=0, last_epoch=2)
    resumed = _worker_elements(data, 2, 2, first_epoch=0, last_epoch=2, skip_steps=3)
    for a, b in zip(full, resumed, strict=True):
        assert len(b) == len(a) - 3 * 2
        assert all(np.array_equal(x, y) for e, f in zip(a[6:], b, strict=True)
                   for x, y in zip(e, f, strict=True))  # fmt: skip


def test_worker_validation_slices(splits):
    data = _inputs(splits, cache="none")
    (batch,) = _batches(data.val_ds)  # 10 images
    for w, expected in enumerate(_split(batch, 2)):
        context = tf.distribute.InputContext(2, w, 2)
        (got,) = _batches(data._val_batches(context))  # what for_strategy gives worker w
        assert all(np.array_equal(x, y) for x, y in zip(expected, got, strict=True))
