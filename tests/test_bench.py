"""Benchmarks on tiny data: the shape of the results, never their speed."""

from __future__ import annotations

import json

import pytest

from mdtrain.bench import PIPELINE_KEYS, pipeline_benchmark, tfdata_stage, train_benchmark
from mdtrain.data import load_splits
from mdtrain.errors import UsageError
from mdtrain.sources import make_synthetic_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("bench") / "d", per_class=10, image_size=64
    )


def test_pipeline_benchmark_reports_every_variant_and_ratio(data, tmp_path):
    r = pipeline_benchmark(data, image_size=32, batch_size=16, repeats=1, output=tmp_path,
                           stages=False)  # fmt: skip
    for key in PIPELINE_KEYS:
        assert r[key] > 0 and len(r["runs"][key]) == 1
    assert r["cpu_count"] >= 1 and r["machine"]["cpu_count"] == r["cpu_count"]
    assert r["ratios"]["tfdata_vs_imagedatagenerator"] == pytest.approx(
        r["tfdata"] / r["imagedatagenerator"], abs=0.01
    )
    assert set(r["goals_met"]) == set(r["goals"])
    assert r["images_per_epoch"] == 50 and r["repeats"] == 1
    assert json.loads((tmp_path / "pipeline.json").read_text())["tfdata"] == r["tfdata"]
    assert (tmp_path / "pipeline.png").stat().st_size > 0


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
    r = train_benchmark(data, model="small-cnn", image_size=32, batch_size=8, steps=2,
                        output=tmp_path / "t.json")  # fmt: skip
    assert r["input_bound_ratio"] == pytest.approx(
        r["step_s_real_pipeline"] / r["step_s_cached_batch"], rel=0.01, abs=0.002
    )
    assert r["verdict"].split(":")[0] in ("input-bound", "compute-bound")
    assert r["two_replica_speedup"] > 0 and r["cpu_count"] >= 1
    assert (tmp_path / "t.json").exists() and (tmp_path / "t.png").exists()
