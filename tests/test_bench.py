"""Benchmarks on tiny data: what the committed results promise, never their speed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from mdtrain.bench import (
    BENCH_AUGMENT,
    GOALS,
    PIPELINE_KEYS,
    bench_policy,
    keras_augmentation,
    keras_directory,
    pipeline_benchmark,
    stage_benchmark,
    tfdata_stage,
    train_benchmark,
)
from mdtrain.bench.timing import Variant, measure
from mdtrain.data import load_splits
from mdtrain.errors import UsageError
from mdtrain.sources import make_synthetic_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("bench") / "d", per_class=10, image_size=64
    )


def test_pipeline_benchmark_writes_what_the_readme_quotes(data, tmp_path):
    pipeline_benchmark(data, image_size=32, batch_size=16, repeats=2, output=tmp_path)
    written = json.loads((tmp_path / "pipeline.json").read_text())
    for key in [*PIPELINE_KEYS, "keras_directory", "keras_directory_layers"]:
        low, high = written["spread"][key]
        assert 0 < low <= written[key] <= high and len(written["runs"][key]) == 2
    for name, goal in GOALS.items():  # every goal is judged on a ratio measured in this run
        ratio = written["ratios"][name]
        assert ratio["min"] <= ratio["median"] <= ratio["max"]
        assert written["goals_met"][name] == (ratio["median"] >= goal)
    assert written["machine"]["load_average_1_5_15min"] and written["load_average_before"]
    assert written["images_per_epoch"] == 50
    assert written["augment"] == json.loads(json.dumps(BENCH_AUGMENT))
    assert (tmp_path / "pipeline.png").stat().st_size > 0


def test_whole_epoch_timing_starts_fresh_and_primes_once():
    calls = {"start": 0, "prime": 0}

    def start():
        calls["start"] += 1
        return iter([(np.zeros(4), np.zeros(4))] * 3)  # one epoch: 3 batches of 4

    variant = Variant(start, batches=3, prime=lambda: calls.__setitem__("prime", 1))
    measured = measure({"v": variant}, repeats=3)["v"]
    assert calls == {"start": 3, "prime": 1} and len(measured["runs"]) == 3
    with pytest.raises(StopIteration):  # a timing cannot take more than one epoch
        Variant(start, batches=4).time_one()


def test_keras_recipe_is_image_dataset_from_directory_and_stops_on_a_bad_file(data, tmp_path):
    ds = keras_directory(data / "train", 32, 16, bench_policy())
    images, labels = next(iter(ds))
    assert images.dtype == "float32" and images.shape == (16, 32, 32, 3)
    names = [type(layer).__name__ for layer in keras_augmentation(bench_policy()).layers]
    assert names == ["RandomFlip", "RandomRotation", "RandomZoom", "RandomBrightness",
                     "RandomContrast"]  # fmt: skip
    fused, _ = next(iter(keras_directory(data / "train", 32, 16, bench_policy(), fused=True)))
    plain, _ = next(iter(keras_directory(data / "train", 32, 16)))
    assert fused.dtype == "float32" and fused.shape == plain.shape
    assert not np.array_equal(fused.numpy(), plain.numpy())  # augmented
    broken = tmp_path / "broken"
    shutil.copytree(data / "train", broken)
    (broken / "circle" / "zz_truncated.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in keras_directory(broken, 32, 16):
            pass


def test_pipeline_benchmark_refuses_unreadable_files(data, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(data, broken)
    (broken / "train" / "circle" / "zz_empty.jpg").write_bytes(b"")
    with pytest.raises(UsageError, match="1 unreadable"):
        pipeline_benchmark(broken, image_size=32, batch_size=16, repeats=1)


def test_stage_benchmark_keeps_the_order_of_the_steps(data):
    stages = {"b parallel": dict(augment="none"), "a cached": dict(cache=True, augment="none")}
    rates = stage_benchmark(load_splits(data).train, 32, 16, stages)
    assert list(rates) == ["b parallel", "a cached"] and min(rates.values()) > 0


@pytest.mark.parametrize("augment", ["none", "keras-layers", "fused-op", "fused-xla"])
def test_every_stage_builds_batches(data, augment):
    splits = load_splits(data)
    ds = tfdata_stage(splits.train, 32, 16, parallel=False, cache=True, augment=augment)
    assert [int(y.shape[0]) for _, y in ds] == [16, 16, 16, 2]


@pytest.mark.parametrize(
    "kwargs", [dict(repeats=0), dict(image_size=-1), dict(batch_size=0), dict(data="/no/such/dir")]
)
def test_pipeline_benchmark_rejects_bad_arguments(kwargs):
    with pytest.raises(UsageError):
        pipeline_benchmark(**{"data": "/no/such/dir", **kwargs})


def test_train_benchmark_rejects_bad_arguments(data):
    with pytest.raises(UsageError):
        train_benchmark(data, model="resnet-9000")
    with pytest.raises(UsageError):
        train_benchmark(data, steps=0)
    with pytest.raises(UsageError):
        tfdata_stage(load_splits(data).train, 32, 16, augment="sideways")


@pytest.mark.slow
def test_train_benchmark_reports_ratio_verdict_and_replicas(data, tmp_path):
    """What `mdtrain bench train` promises: the verdict, replica figures, the Keras baseline."""
    r = train_benchmark(data, model="small-cnn", image_size=32, batch_size=8, steps=2,
                        output=tmp_path / "t.json", repeats=1, replica_epochs=2)  # fmt: skip
    assert r["verdict"].split(" (")[0].split(":")[0] in ("input-bound", "compute-bound")
    assert r["step_s_1_replica"] > 0 and r["step_s_2_replicas"] > 0
    versus = r["vs_keras_fit"]
    assert {"mdtrain_vs_keras_fit", "mdtrain_one_vs_keras_fit"} <= set(versus["ratios"])
    for ratio in versus["ratios"].values():
        assert ratio["median"] > 0 and ratio["goal"] == 1.0
        assert ratio["goal_met"] == (ratio["median"] >= 1.0)
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["vs_keras_fit"]["ratios"] == versus["ratios"]  # what the README quotes
    assert (tmp_path / "t.png").exists()
