"""The benchmark scripts on tiny data: what the committed results promise, never their speed.

The scripts live in `benchmarks/` (not in the package); they are imported from
there as `python benchmarks/pipeline.py` would see them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the scripts import `_common` and `replicas` by name

import _common  # noqa: E402


def _script(name: str):
    """A benchmark script as a module named `benchmarks_<name>` (no clash with other modules)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pipeline = _script("pipeline")
train = _script("train")
step_overhead = _script("step_overhead")
before_after = _script("before_after")
recipe = _script("recipe")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from mdtrain.sources import make_synthetic_dataset

    return make_synthetic_dataset(
        tmp_path_factory.mktemp("bench") / "d", per_class=10, image_size=64
    )


def test_pipeline_benchmark_writes_what_the_readme_quotes(data, tmp_path):
    pipeline.pipeline_benchmark(data, image_size=32, batch_size=16, repeats=2, output=tmp_path)
    written = json.loads((tmp_path / "pipeline.json").read_text())
    for key in pipeline.PIPELINE_KEYS:
        low, high = written["spread"][key]
        assert 0 < low <= written[key] <= high and len(written["runs"][key]) == 2
    for name, (num, den) in pipeline.RATIOS.items():  # repeat by repeat, from the runs written
        runs = [a / b for a, b in zip(written["runs"][num], written["runs"][den], strict=True)]
        assert written["ratios"][name]["min"] <= written["ratios"][name]["median"]
        assert written["ratios"][name]["min"] == pytest.approx(min(runs), abs=0.02)
    for name, goal in pipeline.GOALS.items():  # every goal is judged on a ratio of this run
        assert written["goals_met"][name] == (written["ratios"][name]["median"] >= goal)
    assert written["machine"]["load_average_1_5_15min"] and written["load_average_before"]
    assert written["images_per_epoch"] == 50
    assert written["augment"] == json.loads(json.dumps(pipeline.BENCH_AUGMENT))
    assert (tmp_path / "pipeline.png").stat().st_size > 0


def test_every_timing_counts_one_epoch_of_images(data, monkeypatch):
    import mdtrain_course.timing

    class Clock:  # one tick per reading: a timing's rate is the images it counted
        ticks = itertools.count()

        @classmethod
        def perf_counter(cls):
            return float(next(cls.ticks))

    monkeypatch.setattr(mdtrain_course.timing, "time", Clock)
    pipelines, warmups, steps, images = pipeline._pipeline_variants(data, 32, 16)
    counted = mdtrain_course.timing.time_epochs(pipelines, 2, batches=steps, warmup=warmups)
    # The generator too: any 4 batches in a row of its endless stream hold the 50 images.
    assert {name: c["runs"] for name, c in counted.items()} == {
        name: [images, images] for name in pipeline.PIPELINE_KEYS
    }


class _Generator:
    """An endless iterator like `flow_from_directory`'s, counting the batches pulled."""

    def __init__(self, *args, **kwargs):
        self.pulled = 0

    def __len__(self):
        return 4

    def __iter__(self):
        return self

    def __next__(self):
        self.pulled += 1
        return np.zeros((16, 32, 32, 3)), np.zeros(16)


def test_the_generator_is_timed_after_one_untimed_batch_and_the_caches_fill_from_epoch_0(
    data, monkeypatch
):
    generator = _Generator()
    monkeypatch.setattr(pipeline, "image_data_generator", lambda *args: generator)
    monkeypatch.setattr(pipeline, "IDG_BATCHES", 2)
    pipelines, warmups, steps, images = pipeline._pipeline_variants(data, 32, 16)
    assert set(pipelines) == set(pipeline.PIPELINE_KEYS) and (steps, images) == (4, 50)
    epoch = pipelines["imagedatagenerator"]()  # made before the clock starts: one batch pulled
    assert generator.pulled == 1 and len(list(epoch)) == 2  # then IDG_BATCHES are timed
    assert warmups["imagedatagenerator"] is None  # and it has no other warm-up
    for name in ("tfdata_cached", "tfdata_cached_augment"):  # epoch 0 fills the cache
        assert len(list(warmups[name])) == steps
    assert set(warmups) < set(pipelines)  # the others warm up on an epoch of their own


def test_keras_recipe_is_image_dataset_from_directory_and_stops_on_a_bad_file(data, tmp_path):
    import tensorflow as tf

    policy = pipeline.bench_policy()
    ds = pipeline.keras_directory(data / "train", 32, 16, policy)
    images, labels = next(iter(ds))
    assert images.dtype == "float32" and images.shape == (16, 32, 32, 3)
    names = [type(layer).__name__ for layer in pipeline.keras_augmentation(policy).layers]
    assert names == ["RandomFlip", "RandomRotation", "RandomZoom", "RandomBrightness",
                     "RandomContrast"]  # fmt: skip
    fused, _ = next(iter(pipeline.keras_directory(data / "train", 32, 16, policy, fused=True)))
    plain, _ = next(iter(pipeline.keras_directory(data / "train", 32, 16)))
    assert fused.dtype == "float32" and fused.shape == plain.shape
    assert not np.array_equal(fused.numpy(), plain.numpy())  # augmented
    broken = tmp_path / "broken"
    shutil.copytree(data / "train", broken)
    (broken / "circle" / "zz_truncated.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in pipeline.keras_directory(broken, 32, 16):
            pass


def test_the_recipe_s_accuracy_is_taken_over_every_validation_image(data):
    """`recipe.py` reports the recipe's model on all of `val/`, not what its `fit` read."""
    import keras

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Rescaling(1 / 255), keras.layers.Flatten(), keras.layers.Dense(5)]
    model = keras.Sequential([keras.Input((32, 32, 3)), *layers])
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    one_by_one = keras.utils.image_dataset_from_directory(
        data / "val", shuffle=False, batch_size=1, image_size=(32, 32), verbose=False
    )
    right = [int(np.argmax(model(x), axis=-1)[0] == y[0]) for x, y in one_by_one]
    assert len(right) % 16  # a partial last batch, which a truncated read would leave out
    assert recipe.val_accuracy_on_every_image(model, data, 32, 16) == pytest.approx(
        np.mean(right), abs=1e-6
    )


@pytest.mark.slow
def test_recipe_benchmark_times_both_sides_phase_by_phase_without_the_recipe_s_check(
    data, tmp_path
):
    """One real round of `recipe.py`: both commands' phases add up to their wall times, and the
    evaluation the script adds to the recipe's process is measured and left out of its wall."""
    output = tmp_path / "recipe.json"
    args = ["--data", str(data), "--epochs", "3", "--repeats", "1", "--output", str(output)]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "recipe.py"), *args],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(output.read_text())
    assert output.with_suffix(".png").stat().st_size > 0  # the phases, drawn
    keras_run, mdtrain_run = result["runs"]["recipe"][0], result["runs"]["mdtrain"][0]
    assert keras_run["check_s"] > 0 and "check_s" not in result["summary"]["recipe"]
    assert {"set_up", "after_fit"} <= set(keras_run["phases"])  # the recipe's, around its fit
    assert keras_run["wall_s"] == pytest.approx(keras_run["process_s"] - keras_run["check_s"],
                                                abs=0.02)  # fmt: skip
    for run in (keras_run, mdtrain_run):
        phases = run["phases"]
        assert {"first_step", "training", "validation", "outside"} <= set(phases), phases
        assert min(phases["first_step"], phases["training"], phases["outside"]) > 0, phases
        assert sum(phases.values()) == pytest.approx(run["wall_s"], abs=0.05)
    # 3 epochs of 1 step: both training phases hold the 2 steps after the first call
    assert keras_run["training_step_ms"] == pytest.approx(
        1000 * keras_run["phases"]["training"] / 2, abs=0.01
    )
    assert mdtrain_run["training_step_ms"] == pytest.approx(
        1000 * mdtrain_run["phases"]["training"] / 2, abs=0.01
    )
    ratio = result["summary"]["recipe_training_step_vs_mdtrain"]["median"]
    assert ratio == pytest.approx(
        keras_run["training_step_ms"] / mdtrain_run["training_step_ms"], abs=0.01
    )


def test_image_data_generator_gives_float_batches_and_sparse_labels(data):
    it = pipeline.image_data_generator(data / "train", 32, 16, pipeline.bench_policy(), seed=1)
    assert len(it) == 4 and it.num_classes == 5
    images, labels = next(it)
    assert images.dtype == np.float32 and images.shape == (16, 32, 32, 3)
    assert 0 <= images.min() and images.max() <= 255
    assert set(labels.astype(int)) <= set(range(5))


def test_image_data_generator_augments_and_its_brightness_multiplies(data):
    from mdtrain.augment import AugmentPolicy

    def first(policy):
        return next(pipeline.image_data_generator(data / "train", 32, 16, policy, shuffle=False))[0]

    plain = first(None)
    np.testing.assert_array_equal(plain, first(None))
    assert not np.allclose(plain, first(AugmentPolicy()))
    darker = AugmentPolicy(horizontal_flip=False, rotation_degrees=0, zoom=0, brightness=(0.5, 0.5))
    # brightness_range multiplies (PIL's ImageEnhance.Brightness), as AugmentPolicy.brightness does
    np.testing.assert_allclose(first(darker).mean(), plain.mean() * 0.5, rtol=0.02)


def test_pipeline_benchmark_refuses_unreadable_files(data, tmp_path):
    from mdtrain.errors import UsageError

    broken = tmp_path / "broken"
    shutil.copytree(data, broken)
    (broken / "train" / "circle" / "zz_empty.jpg").write_bytes(b"")
    with pytest.raises(UsageError, match="1 unreadable"):
        pipeline.pipeline_benchmark(broken, image_size=32, batch_size=16, repeats=1)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--repeats", "0"], "--repeats 0: must be a positive integer"),
        (["--image-size", "-1"], "--image-size -1: must be a positive integer"),
        (["--batch-size", "0"], "--batch-size 0: must be a positive integer"),
        (["--data", "/no/such/dir"], "--data /no/such/dir: not a directory"),
    ],
)
def test_pipeline_script_rejects_bad_arguments(args, fragment):
    from mdtrain.errors import UsageError

    with pytest.raises(UsageError, match=fragment):
        pipeline.main(args)


def test_train_benchmark_rejects_bad_arguments(data):
    from mdtrain.errors import UsageError

    with pytest.raises(UsageError, match="resnet-9000"):
        train.train_benchmark(data, model="resnet-9000")
    with pytest.raises(UsageError, match="--steps 0"):
        train.train_benchmark(data, steps=0)


def test_step_overhead_ratios_are_taken_call_by_call_and_failures_kept():
    runs = {  # [whole call steps/s, CPU ms per step, steady-state steps/s] per call
        "default/finite/keras_fit": [[100.0, 4.0, 110.0], [200.0, 3.0, 220.0],
                                     [150.0, 5.0, 100.0]],
        "default/finite/keras_fit_spe16": ["InvalidArgumentError: You must feed a value"],
        "default/finite/exact_fit_spe16": [[250.0, 2.0, 330.0], [300.0, 2.5, 440.0],
                                           [450.0, 1.0, 400.0]],
        "before/default/finite/keras_fit": [[100.0, 4.0, 100.0]] * 3,
        "before/default/finite/exact_fit": [[50.0, 8.0, 50.0], [60.0, 8.0, 70.0],
                                            [40.0, 9.0, 30.0]],
    }  # fmt: skip
    summary = step_overhead._summary(runs)
    assert summary["default/finite/keras_fit_spe16"] == {
        "error": "InvalidArgumentError: You must feed a value"
    }
    spe = summary["default/finite/exact_fit_spe16"]
    assert spe["calls"] == 3 and spe["steps_per_sec"] == 300.0 and spe["spread"] == [250.0, 450.0]
    assert spe["vs_keras_fit"] == 2.5 and spe["vs_keras_fit_spread"] == [1.5, 3.0]
    assert spe["steady_steps_per_sec"] == 400.0 and spe["steady_spread"] == [330.0, 440.0]
    assert spe["steady_vs_keras_fit"] == 3.0 and spe["steady_vs_keras_fit_spread"] == [2.0, 4.0]
    assert spe["cpu_ms_per_step"] == 2.0
    low, high = spe["quartiles"]
    assert 250.0 <= low <= 300.0 <= high <= 450.0
    before = summary["before/default/finite/exact_fit"]
    assert before["vs_keras_fit"] == 0.5  # against its own process's Keras, call by call
    assert before["steady_vs_keras_fit"] == 0.5


@pytest.mark.slow
def test_step_overhead_measures_every_default_variant_on_both_datasets(tmp_path):
    """One real round, tiny: every variant trains on the finite and the repeated dataset."""
    output = tmp_path / "step_overhead.json"
    args = ["--steps", "32", "--repeats", "1", "--calls", "1", "--output", str(output)]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "step_overhead.py"), *args],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(output.read_text())["variants"]
    for dataset in ("finite", "repeated"):
        for name in step_overhead.DEFAULT_VARIANTS:
            entry = variants[f"default/{dataset}/{name}"]
            assert "error" not in entry, (dataset, name, entry)
            assert entry["calls"] == 1 and entry["steps_per_sec"] > 0 and entry["vs_keras_fit"] > 0
            # where the call's time outside its steps went: each part measured
            assert entry["ms_to_first_call_end"] > 0, (dataset, name, entry)
            assert entry["ms_before_begin"] >= 0 and entry["ms_after_last_call"] >= 0


@pytest.mark.parametrize(
    "args, fragment",
    [(["--steps", "0"], "must be a positive integer"),
     (["--calls", "-1"], "must be a positive integer"),
     (["--steps", "16"], "--steps 16: at least 32"),
     (["--settings", "default,fast"], "--settings fast: choose from"),
     (["--variants", "exact_fit"], "must hold keras_fit")],
)  # fmt: skip
def test_step_overhead_rejects_bad_arguments(args, fragment):
    from mdtrain.errors import UsageError

    with pytest.raises(UsageError, match=fragment):
        step_overhead.main(args)


def test_before_after_ratios_are_taken_round_by_round():
    runs = {"now": [{"train": 100.0}, {"train": 90.0}, {"train": 120.0}],
            "before": [{"train": 100.0}, {"train": 60.0}, {"train": 150.0}]}  # fmt: skip
    figure = before_after._summary(runs)["train"]
    assert figure["now"] == 100.0 and figure["now_spread"] == [90.0, 120.0]
    assert figure["before"] == 100.0 and figure["before_spread"] == [60.0, 150.0]
    assert figure["now_vs_before"] == 1.0 and figure["now_vs_before_spread"] == [0.8, 1.5]


@pytest.mark.parametrize("args", [["--before", "HEAD", "--repeats", "0"],
                                  ["--before", "HEAD", "--epochs", "-1"]])  # fmt: skip
def test_before_after_rejects_bad_arguments(args):
    from mdtrain.errors import UsageError

    with pytest.raises(UsageError, match="must be a positive integer"):
        before_after.main(args)


def test_benchmark_bars_in_the_order_given_with_the_decode_limit():
    results = {"imagedatagenerator": 120.0, "tfdata": 900.0, "tfdata_cached": 2500.0}
    (ax,) = _common.benchmark_bars(results, limit=1500.0).axes
    assert [b.get_width() for b in ax.patches] == [120.0, 900.0, 2500.0]  # slowest at the bottom
    assert [t.get_text() for t in ax.get_yticklabels()] == list(results)
    (line,) = ax.lines
    assert line.get_xdata()[0] == 1500.0
    (ax,) = _common.benchmark_bars({"a": 1.0, "b": 2.0}, order="given").axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a"]  # first on top
    assert not ax.lines


@pytest.mark.slow
def test_pipeline_script_bad_option_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "pipeline.py"), "--batch-size", "0"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "pipeline.py: error: --batch-size 0: must be a positive integer"


@pytest.mark.slow
def test_train_benchmark_reports_ratio_verdict_and_replicas(data, tmp_path):
    """What `benchmarks/train.py` promises: the verdict, replica figures, the Keras baseline."""
    r = train.train_benchmark(data, model="small-cnn", image_size=32, batch_size=8, steps=2,
                              output=tmp_path / "t.json", repeats=1, replica_epochs=2)  # fmt: skip
    # The verdict follows the wait it measured (TensorFlow profiler's threshold: 5% of a step),
    # and quotes it.
    share = r["input_wait_share"]
    assert 0 <= share < 1
    assert r["verdict"].startswith("input-bound" if share >= 0.05 else "compute-bound")
    assert f"{share:.0%} of each step" in r["verdict"]
    # The ratio of the unrounded step times; the step times are reported to 0.1 ms.
    ratio = r["step_s_real_pipeline"] / r["step_s_cached_batch"]
    assert r["input_bound_ratio"] == pytest.approx(ratio, rel=0.02)
    assert r["step_s_1_replica"] > 0 and r["step_s_2_replicas"] > 0
    versus = r["vs_keras_fit"]
    assert {"mdtrain_vs_keras_fit", "mdtrain_one_vs_keras_fit"} <= set(versus["ratios"])
    for ratio in versus["ratios"].values():
        assert ratio["median"] > 0 and ratio["goal"] == 1.0
        assert ratio["goal_met"] == (ratio["median"] >= 1.0)
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["vs_keras_fit"]["ratios"] == versus["ratios"]  # what the README quotes
    assert (tmp_path / "t.png").exists()


@pytest.mark.slow
def test_the_gpu_check_runs_every_section_on_cpu_replicas_correctness_first(tmp_path):
    # `benchmarks/gpu.py --dry-run-on-cpu`: every section's code path on 2 CPU replicas with
    # tiny sizes, one run per section where a section has several alike (CI: 2 cores, no GPU).
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu.py"), "--dry-run-on-cpu", "--out", str(tmp_path),
         "--budget-s", "900", "--json"],
        capture_output=True, text=True, timeout=1200, cwd=BENCHMARKS.parent,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert json.loads(proc.stdout.splitlines()[-1])["sections"] == written["sections"]
    status = {sid: section["status"] for sid, section in written["sections"].items()}
    assert status == dict.fromkeys("abnscedipgfh", "ok"), written["sections"]
    assert len(written["source"]["commit"]) == 40 and "dirty" in written["source"]
    cases = written["runs"]["n.cases"]["cases"]
    assert all(isinstance(case["max_relative_difference"], float) for case in cases.values())
    assert all(case["equal"] for case in cases.values() if case["must_equal"])
    overflow = written["runs"]["s.overflow"]
    assert overflow["weights_finite"] and overflow["step_skipped"]
    assert overflow["loss_scale_after"] == overflow["loss_scale_before"] / 2
    assert written["runs"]["c.default"]["empty_replica"]
    assert written["pytest"]["counts"] == {"skipped": 4}  # no GPU: every gpu test skips
    for rid in ("g.recipe", "g.mdtrain"):  # both sides timed by the same epoch timer
        assert written["runs"][rid]["images_per_sec"] > 0
        assert 0 <= written["runs"][rid]["val_accuracy"] <= 1
    assert "2 virtual CPU devices" in written["labels"]["f.all"]
    assert list(written["sections"]) == list("abnscedipgfh")  # correctness first
