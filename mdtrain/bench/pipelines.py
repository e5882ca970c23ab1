"""The input-pipeline benchmark: ImageDataGenerator vs tf.data variants, stage by stage."""

from __future__ import annotations

import time
from pathlib import Path

from mdtrain.bench.common import _bench_data, _check_positive, _write, machine_info
from mdtrain.bench.timing import _Variant, measure
from mdtrain.errors import UsageError

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
