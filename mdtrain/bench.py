"""Benchmarks: input pipelines side by side, and whether training waits for input.

`pipeline_benchmark` measures images per second of the legacy
`ImageDataGenerator` and of tf.data variants in one process, on the same
files with the page cache warm, same output size and batch size, warm-up
excluded, repeats interleaved (so a change in machine load hits every variant
alike) and the median kept. `train_benchmark` times training steps fed by the
real pipeline against steps fed one cached batch over and over (the
input-bound ratio), and one replica against two virtual CPU replicas.

Both are behind `mdtrain bench pipeline|train`; `benchmarks/run.sh` writes the
committed results.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mdtrain.errors import UsageError

#: Where `data=None` keeps the benchmark dataset (1500 training JPEGs of about 256 px).
BENCH_DATA = Path(os.environ.get("MDTRAIN_DATA_DIR", "data")) / "bench"

#: Goals of issue 5, as ratios of images per second.
GOALS = {
    "tfdata_vs_imagedatagenerator": 6.0,
    "noaug_vs_raw_decode": 0.9,
    "cached_vs_raw_decode": 3.0,
}

#: The images/sec keys of `pipeline_benchmark`'s result, with their chart labels.
PIPELINE_KEYS = {
    "imagedatagenerator": "ImageDataGenerator",
    "tfdata": "tf.data + augment",
    "tfdata_noaug": "tf.data, no augment",
    "tfdata_cached": "tf.data, cached epoch",
    "tfdata_cached_augment": "tf.data + augment, cached epoch",
    "raw_decode": "raw decode + resize",
}

NOTES = (
    "tfdata_cached: epochs after the first, from the in-memory cache, no host "
    "augmentation (what the host delivers when augmentation runs on the accelerator). "
    "tfdata_cached_augment: the same with the fused augmentation on the CPU; the "
    "bilinear warp costs about as much as a decode, so on CPU alone it stays near "
    "the raw-decode rate."
)

#: Augmentation placements `tfdata_stage` knows.
AUGMENTATIONS = ("none", "keras-layers", "fused-op", "fused-xla")


def machine_info() -> dict:
    """CPU count and model, load average, platform and library versions."""
    import tensorflow as tf

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "cpu_count": usable,
        "cpu_model": model,
        "load_average_1_5_15min": load,
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
    }


def _bench_data(data) -> Path:
    if data is not None:
        return Path(data)
    from mdtrain.sources import ensure_demo_dataset

    return ensure_demo_dataset(BENCH_DATA, classes=5, per_class=300, image_size=256)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} {value!r}: must be a positive integer")


def _output_paths(output, stem: str) -> tuple[Path, Path]:
    out = Path(output)
    if out.suffix == ".json":
        return out, out.with_suffix(".png")
    return out / f"{stem}.json", out / f"{stem}.png"


def _write(result: dict, output, stem: str, bars: dict, limit: float | None, title: str) -> None:
    from mdtrain.plots import benchmark_bars

    json_path, png_path = _output_paths(output, stem)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    fig = benchmark_bars(bars, limit=limit, title=title)
    values = [v for v in bars.values() if v > 0]
    if values and max(values) > 30 * min(values):  # a cached epoch dwarfs everything else
        ax = fig.axes[0]
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 2, max(values) * 4)
        ax.set_xlabel("images / second (log scale)")
    fig.savefig(png_path, dpi=80)


# --------------------------------------------------------------------------- pipelines


def tfdata_stage(
    images,
    image_size: int,
    batch_size: int,
    *,
    parallel: bool = True,
    cache: bool = False,
    prefetch: bool = True,
    augment: str = "fused-xla",
    seed: int = 0,
):
    """A tf.data pipeline with each optimisation switched on or off, to measure it.

    Args:
        images: an `ImageList`.
        image_size: side of the square output images.
        batch_size: images per batch.
        parallel: decode (and augment) on all cores, in any order. Defaults to True.
        cache: keep decoded images in memory after the first pass. Defaults to False.
        prefetch: prepare the next batches while the consumer works. Defaults to True.
        augment: `"none"`, `"keras-layers"` (RandomFlip, RandomRotation and
            RandomZoom over float32 batches: the straightforward recipe),
            `"fused-op"` (one fused affine per image, TensorFlow's
            `ImageProjectiveTransformV3`) or `"fused-xla"` (the same, as an
            XLA kernel: what `InputData` uses). Defaults to `"fused-xla"`.
        seed: seed of the shuffle and the transforms. Defaults to 0.

    Returns:
        A dataset of `(images, int32 labels)` batches; iterate it again for
        another epoch (from the cache, when `cache`).
    """
    import numpy as np
    import tensorflow as tf

    from mdtrain.augment import AugmentPolicy, augment_batch
    from mdtrain.pipeline import load_image

    if augment not in AUGMENTATIONS:
        raise UsageError(f"augment {augment!r}: expected one of {', '.join(AUGMENTATIONS)}")
    ds = tf.data.Dataset.from_tensor_slices((images.files, np.asarray(images.labels, np.int32)))
    if not cache:
        ds = ds.shuffle(len(images), seed=seed)
    order = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": False} if parallel else {}
    plain = tf.autograph.experimental.do_not_convert  # plain TensorFlow code: nothing to convert
    ds = ds.map(plain(lambda p, y: (load_image(p, image_size), y)), **order)
    if cache:
        ds = ds.cache().shuffle(len(images), seed=seed)
    ds = ds.batch(batch_size)
    policy = AugmentPolicy()
    if augment == "keras-layers":
        import keras

        zoom = (-policy.zoom, policy.zoom)
        layers = keras.Sequential([
            keras.layers.RandomFlip("horizontal", seed=seed),
            keras.layers.RandomRotation(
                policy.rotation_degrees / 360, fill_mode="nearest", seed=seed
            ),
            keras.layers.RandomZoom(zoom, zoom, fill_mode="nearest", seed=seed),
        ])  # fmt: skip
        ds = ds.map(plain(lambda x, y: (layers(tf.cast(x, tf.float32), training=True), y)), **order)
    elif augment != "none":
        kernel = "xla" if augment == "fused-xla" else "op"

        def fused(step, batch):
            step_seed = tf.stack([tf.constant(seed, tf.int64), step])
            return augment_batch(batch[0], policy, step_seed, kernel), batch[1]

        ds = ds.enumerate().map(plain(fused), **order)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def _take(iterator, steps: int) -> int:
    """Pulls `steps` batches from an iterator (of a dataset or a generator); returns images."""
    n = 0
    for _ in range(steps):
        batch = next(iterator)
        n += len(batch[0] if isinstance(batch, tuple) else batch)
    return n


class _Variant:
    """One configuration to time, in isolation.

    `start()` returns a fresh iterator; `warmup` batches are pulled untimed
    (start-up, XLA compilation, filling a cache), then `batches` are timed,
    and the iterator is dropped, so no pipeline keeps working in the
    background while another one is timed.
    """

    def __init__(
        self, start: Callable[[], Iterator], batches: int, warmup: int = 3, first_warmup=None
    ):
        self.start, self.batches, self.warmup = start, batches, warmup
        self.first_warmup = warmup if first_warmup is None else first_warmup
        self.rates: list[float] = []

    def time_one(self) -> None:
        iterator = self.start()
        _take(iterator, self.warmup if self.rates else self.first_warmup)
        begin = time.perf_counter()
        n = _take(iterator, self.batches)
        self.rates.append(n / (time.perf_counter() - begin))
        del iterator
        gc.collect()


def measure(variants: dict[str, _Variant], repeats: int) -> dict[str, dict]:
    """Times `repeats` rounds, variants interleaved, so load changes hit all alike."""
    for _ in range(repeats):
        for v in variants.values():
            v.time_one()
    return {
        name: {"median": statistics.median(v.rates), "runs": [round(r, 1) for r in v.rates]}
        for name, v in variants.items()
    }


def _pipeline_variants(data_dir: Path, image_size: int, batch_size: int, stages: bool):
    import tensorflow as tf

    from mdtrain import legacy
    from mdtrain.augment import AugmentPolicy
    from mdtrain.data import load_splits, resolve_layout
    from mdtrain.pipeline import AUTOTUNE, InputData, load_image

    splits = load_splits(data_dir)  # decodes every file once: warms the page cache too
    if splits.skipped:
        raise UsageError(f"{data_dir}: {len(splits.skipped)} unreadable file(s); "
                         "the ImageDataGenerator baseline cannot skip them")  # fmt: skip
    train_dir, _ = resolve_layout(data_dir)
    files = splits.train.files

    steps = -(-len(files) // batch_size)

    def input_data(cache: bool, **kw) -> _Variant:
        data = InputData(splits, image_size, batch_size, cache=cache, **kw)
        # Cached: the first epoch (which fills the cache) is the warm-up; timed is the second.
        # Uncached: a whole epoch the first time (XLA compiles the full and the last,
        # partial batch shape once per process), a few batches after that.
        if cache:
            return _Variant(lambda: iter(data.train_epochs(0, 2)), steps, steps)
        return _Variant(lambda: iter(data.train_epochs(0, 3)), steps, 3, first_warmup=steps + 3)

    idg = legacy.flow_from_directory(train_dir, image_size, batch_size, AugmentPolicy())
    raw = tf.data.Dataset.from_tensor_slices(files).repeat()
    raw = raw.map(lambda p: load_image(p, image_size), num_parallel_calls=AUTOTUNE,
                  deterministic=False).batch(batch_size).prefetch(AUTOTUNE)  # fmt: skip
    variants = {
        "imagedatagenerator": _Variant(lambda: idg, len(idg), warmup=1),
        "tfdata": input_data(cache=False),
        "tfdata_noaug": input_data(cache=False, augment=None),
        "tfdata_cached": input_data(cache=True, augment=None),
        "tfdata_cached_augment": input_data(cache=True),
        "raw_decode": _Variant(lambda: iter(raw), steps),
    }
    if stages:
        for name, kw in STAGES.items():
            # The slow recipes are timed on part of an epoch (a rate is a rate).
            ds = tfdata_stage(splits.train, image_size, batch_size, **kw).repeat()
            variants[name] = _Variant(lambda ds=ds: iter(ds), min(steps, STAGE_BATCHES))
    return variants, len(files)


STAGE_BATCHES = 12

#: The before/after steps `pipeline_benchmark(stages=True)` adds, in the order they were tried.
STAGES = {
    "sequential, keras layers": dict(parallel=False, prefetch=False, augment="keras-layers"),
    "parallel, keras layers": dict(augment="keras-layers"),
    "parallel, fused op": dict(augment="fused-op"),
}


#: tf.data built one optimisation at a time, for `stage_benchmark` (notebook 02).
STEP_BY_STEP = {
    "1 sequential map": dict(parallel=False, prefetch=False, augment="none"),
    "2 parallel map": dict(prefetch=False, augment="none"),
    "3 + cache (2nd epoch)": dict(prefetch=False, cache=True, augment="none"),
    "4 + prefetch": dict(cache=True, augment="none"),
    "5 + Keras layers augmentation": dict(cache=True, augment="keras-layers"),
    "6 + fused affine (TF op)": dict(cache=True, augment="fused-op"),
    "7 + fused affine (XLA)": dict(cache=True, augment="fused-xla"),
}


def stage_benchmark(
    images, image_size: int, batch_size: int, stages: dict | None = None, repeats: int = 1
) -> dict[str, float]:
    """Images per second of `tfdata_stage` configurations, timed one at a time.

    Args:
        images: an `ImageList`.
        image_size: output side in pixels.
        batch_size: images per batch.
        stages: `{name: tfdata_stage keyword arguments}`. Defaults to `STEP_BY_STEP`.
        repeats: timed epochs per stage (median kept). Defaults to 1.

    Returns:
        `{name: images per second}` in the order given; cached stages are
        timed on their second epoch.
    """
    _check_positive(image_size=image_size, batch_size=batch_size, repeats=repeats)
    steps = -(-len(images) // batch_size)
    variants = {}
    for name, kw in (stages or STEP_BY_STEP).items():
        ds = tfdata_stage(images, image_size, batch_size, **kw).repeat()
        warmup = steps if kw.get("cache") else 2
        variants[name] = _Variant(lambda ds=ds: iter(ds), steps, warmup)
    return {name: round(m["median"], 1) for name, m in measure(variants, repeats).items()}


def distributed_rate(strategy, ds, batches: int) -> float:
    """Images per second pulled through `strategy.experimental_distribute_dataset(ds)`."""
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    next(iterator)  # start-up excluded
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        labels = next(iterator)[1]
        n += sum(int(t.shape[0]) for t in strategy.experimental_local_results(labels))
    return n / (time.perf_counter() - start)


def pipeline_benchmark(
    data=None,
    image_size: int = 224,
    batch_size: int = 32,
    repeats: int = 3,
    output=None,
    stages: bool = True,
) -> dict:
    """Images per second of ImageDataGenerator and tf.data variants, side by side.

    Variants: `imagedatagenerator` (`flow_from_directory`, flip, rotation and
    zoom), `tfdata` (`InputData`, the same augmentations, first epoch, no
    cache), `tfdata_noaug`, `tfdata_cached` (`InputData`, epochs after the
    first, from the in-memory cache, augmentation left to the accelerator),
    `tfdata_cached_augment` (the same, augmented on the CPU) and `raw_decode`
    (decode + resize only, all cores: the limit of this machine). With
    `stages`, also the slower tf.data recipes the fast one replaced.

    Args:
        data: dataset folder (class folders, or `train/` + `val/`); None
            makes the 1500-JPEG benchmark set under `data/bench`. Defaults to None.
        image_size: output side in pixels. Defaults to 224.
        batch_size: images per batch. Defaults to 32.
        repeats: timed epochs per variant; the median is reported. Defaults to 3.
        output: a folder (gets `pipeline.json` and `pipeline.png`) or a
            `.json` path (the PNG goes beside it). Defaults to None.
        stages: also time the before/after stages (`STAGES`). Defaults to True.

    Returns:
        A dict: `imagedatagenerator`, `tfdata`, `tfdata_noaug`,
        `tfdata_cached`, `tfdata_cached_augment`, `raw_decode` (images/sec,
        medians), `cpu_count`,
        `ratios` and `goals_met`, `runs` (every repeat), `stages`, `machine`,
        and the settings.

    Raises:
        UsageError: a bad argument or an unreadable dataset.
    """
    _check_positive(image_size=image_size, batch_size=batch_size, repeats=repeats)
    data_dir = _bench_data(data)
    if not data_dir.is_dir():
        raise UsageError(f"--data {data_dir}: not a directory")
    variants, num_images = _pipeline_variants(data_dir, image_size, batch_size, stages)
    start = time.perf_counter()
    measured = measure(variants, repeats)
    rate = {name: round(m["median"], 1) for name, m in measured.items()}
    ratios = {
        "tfdata_vs_imagedatagenerator": rate["tfdata"] / rate["imagedatagenerator"],
        "noaug_vs_raw_decode": rate["tfdata_noaug"] / rate["raw_decode"],
        "cached_vs_raw_decode": rate["tfdata_cached"] / rate["raw_decode"],
        "cached_augment_vs_raw_decode": rate["tfdata_cached_augment"] / rate["raw_decode"],
    }
    machine = machine_info()
    result = {
        **{k: rate[k] for k in PIPELINE_KEYS},
        "notes": NOTES,
        "cpu_count": machine["cpu_count"],
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
        "goals": GOALS,
        "goals_met": {k: ratios[k] >= g for k, g in GOALS.items()},
        "stages": {k: rate[k] for k in STAGES if k in rate},
        "runs": {name: m["runs"] for name, m in measured.items()},
        "images_per_epoch": num_images,
        "image_size": image_size,
        "batch_size": batch_size,
        "repeats": repeats,
        "seconds": round(time.perf_counter() - start, 1),
        "machine": machine,
    }
    if output is not None:
        bars = {label: result[k] for k, label in PIPELINE_KEYS.items()}
        bars |= {f"before: {k}": v for k, v in result["stages"].items()}
        title = f"Input pipeline, {image_size} px, batch {batch_size}, {result['cpu_count']} CPUs"
        _write(result, output, "pipeline", bars, result["raw_decode"], title)
    return result


# --------------------------------------------------------------------------- training


def _step_rate(strategy, trainer, ds, steps: int, warmup: int = 2) -> tuple[float, float]:
    """Seconds per step and share of it spent waiting for the next batch."""
    import tensorflow as tf

    iterator = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def step(batch):
        strategy.run(trainer.train_step, args=(batch,))

    for _ in range(warmup):
        step(next(iterator))
    waited = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(iterator)
        waited += time.perf_counter() - t
        step(batch)
    _ = float(trainer.metrics[0].result())  # wait for the last step to finish
    total = time.perf_counter() - start
    return total / steps, waited / total


def _train_worker(config: dict) -> dict:
    """Runs inside a fresh process: builds both strategies and times their steps."""
    from mdtrain.distribute import configure_devices

    configure_devices("cpu:2")
    import keras
    import tensorflow as tf

    from mdtrain.data import load_splits
    from mdtrain.distribute import make_strategy
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model
    from mdtrain.pipeline import InputData

    keras.utils.set_random_seed(0)
    splits = load_splits(config["data"])
    size, batch, steps = config["image_size"], config["batch_size"], config["steps"]
    inputs = InputData(splits, size, batch)
    epochs = 2 + (3 * (steps + 2)) // max(inputs.steps_per_epoch, 1)
    one_batch = next(iter(inputs.epoch_batches(0)))
    cached = tf.data.Dataset.from_tensors(one_batch).repeat()

    def trainer_for(strategy):
        with strategy.scope():
            net = build_model(config["model"], len(splits.class_names), size, "none")
            trainer = ExactTrainer(net)
            trainer.build((None, size, size, 3))
            trainer.compile(optimizer=keras.optimizers.Adam(1e-3))
            # Built here, not on the first step: creating variables inside the
            # compiled step fails under MirroredStrategy.
            trainer.optimizer.build(trainer.net.trainable_variables)
        return trainer

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    two = make_strategy("cpu:2")
    t_one, t_two = trainer_for(one), trainer_for(two)
    real_step, wait_share = _step_rate(one, t_one, inputs.train_epochs(0, epochs), steps)
    cached_step, _ = _step_rate(one, t_one, cached, steps)
    two_step, _ = _step_rate(two, t_two, cached, steps)
    return {
        "step_s_real_pipeline": real_step,
        "step_s_cached_batch": cached_step,
        "input_wait_share": wait_share,
        "step_s_1_replica": cached_step,
        "step_s_2_replicas": two_step,
    }


def train_benchmark(
    data=None,
    model: str = "efficientnetv2-b0",
    image_size: int = 128,
    batch_size: int = 32,
    steps: int = 20,
    output=None,
) -> dict:
    """Is training input-bound? Step time with the real pipeline vs one cached batch.

    In a fresh Python process (virtual CPU devices must be set before
    TensorFlow starts), times `steps` training steps of `model` on one
    replica fed by `InputData` (decode, augment, first epoch), then fed one
    batch held in memory, then the same global batch on two virtual CPU
    replicas (`cpu:2`, MirroredStrategy).

    Args:
        data: dataset folder; None uses the benchmark set. Defaults to None.
        model: a `mdtrain.models` name. Defaults to "efficientnetv2-b0".
        image_size: input side in pixels. Defaults to 128.
        batch_size: global batch size. Defaults to 32.
        steps: timed steps per configuration (after 2 warm-up steps). Defaults to 20.
        output: a folder (gets `train.json` and `train.png`) or a `.json`
            path. Defaults to None.

    Returns:
        A dict: `step_s_real_pipeline`, `step_s_cached_batch`,
        `input_bound_ratio` (their quotient, 1.0 = not input-bound),
        `input_wait_share`, `verdict` (`mdtrain.monitor.verdict`'s sentence),
        `step_s_1_replica`, `step_s_2_replicas`, `two_replica_speedup`,
        `cpu_count`, `machine` and the settings.

    Raises:
        UsageError: a bad argument, an unknown model or a failed run.
    """
    from mdtrain.choices import check_model_name
    from mdtrain.monitor import verdict

    _check_positive(image_size=image_size, batch_size=batch_size, steps=steps)
    check_model_name(model)
    if batch_size < 2:
        raise UsageError(f"--batch-size {batch_size}: must be at least 2 (two replicas)")
    data_dir = _bench_data(data)
    if not data_dir.is_dir():
        raise UsageError(f"--data {data_dir}: not a directory")
    config = dict(data=str(data_dir), model=model, image_size=image_size,
                  batch_size=batch_size, steps=steps)  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mdtrain.bench", json.dumps(config)],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"bench train failed (exit {proc.returncode}): {tail}")
    timed = json.loads(lines[-1])
    ratio = timed["step_s_real_pipeline"] / timed["step_s_cached_batch"]
    machine = machine_info()
    result = {
        "input_bound_ratio": round(ratio, 3),
        "goal_input_bound_ratio": 1.05,
        "goal_met": ratio <= 1.05,
        **{k: round(v, 4) for k, v in timed.items()},
        "images_per_sec_real_pipeline": round(batch_size / timed["step_s_real_pipeline"], 1),
        "images_per_sec_cached_batch": round(batch_size / timed["step_s_cached_batch"], 1),
        # The monitor's verdict, from the same evidence it uses: the measured input wait.
        "verdict": verdict(timed["input_wait_share"], None),
        "two_replica_speedup": round(timed["step_s_1_replica"] / timed["step_s_2_replicas"], 3),
        "cpu_count": machine["cpu_count"],
        "model": model,
        "image_size": image_size,
        "batch_size": batch_size,
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "machine": machine,
    }
    if output is not None:
        bars = {
            "real pipeline, 1 replica": result["images_per_sec_real_pipeline"],
            "cached batch, 1 replica": result["images_per_sec_cached_batch"],
            "cached batch, 2 CPU replicas": round(batch_size / timed["step_s_2_replicas"], 1),
        }
        title = f"Training {model} at {image_size} px, global batch {batch_size}"
        _write(result, output, "train", bars, None, title)
    return result


def _main(argv: Iterable[str]) -> int:
    (config,) = argv
    print(json.dumps(_train_worker(json.loads(config))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
