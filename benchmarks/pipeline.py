"""The input-pipeline benchmark: what Keras users write, ImageDataGenerator and mdtrain.

Images per second of `image_dataset_from_directory` (with and without Keras'
augmentation layers, and with mdtrain's `FusedAugmentation` layer), the
legacy `ImageDataGenerator` and mdtrain's `InputData`, in one process, on
the same files with the page cache warm, same output size and batch size.
Every variant is timed over whole epochs, each from a fresh pipeline, so a
shuffle buffer or a cache that must fill before the first batch is part of
the time, as it is in training. One untimed epoch right before a variant's
first timing compiles, fills caches and warms the page cache; the repeats are
interleaved (so a change in machine load hits every variant alike), median and
spread kept (`mdtrain_course.timing.time_epochs`), and the ratios taken repeat by repeat.

Usage, from the repository root (`benchmarks/run.sh` writes the committed
`benchmarks/pipeline.json` and `pipeline.png` this way):

    python benchmarks/pipeline.py [--data DIR] [--image-size 224] [--batch-size 32]
        [--repeats 3] [--output benchmarks] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _common import bench_data, check_positive, machine_info, run_main, write_result

from mdtrain.errors import UsageError
from mdtrain_course.image_data_generator import image_data_generator_kwargs
from mdtrain_course.timing import time_epochs

if TYPE_CHECKING:  # TensorFlow is imported where it is used: `--help` stays light
    import keras
    import tensorflow as tf

    from mdtrain.augment import AugmentPolicy
    from mdtrain.pipeline import InputData

#: The augmentation of every augmented variant: ImageDataGenerator's flip, rotation ±20°,
#: zoom ±15% and brightness_range (0.8, 1.2), plus contrast ±20% (Keras' RandomContrast;
#: the generator has no contrast option, so it runs the rest).
BENCH_AUGMENT = dict(brightness=(0.8, 1.2), contrast=0.2)

#: Targets the benchmark checks, as ratios of images per second.
GOALS = {
    "tfdata_vs_keras_directory_layers": 7.0,
    "augment_vs_noaug": 0.8,
    "tfdata_vs_imagedatagenerator": 6.0,
    "noaug_vs_raw_decode": 0.9,
    "cached_vs_raw_decode": 3.0,
}

#: What each goal divides: (numerator, denominator).
RATIOS = {
    "tfdata_vs_keras_directory_layers": ("tfdata", "keras_directory_layers"),
    "augment_vs_noaug": ("tfdata", "tfdata_noaug"),
    "tfdata_vs_imagedatagenerator": ("tfdata", "imagedatagenerator"),
    "noaug_vs_raw_decode": ("tfdata_noaug", "raw_decode"),
    "cached_vs_raw_decode": ("tfdata_cached", "raw_decode"),
    "nearest_vs_noaug": ("tfdata_nearest", "tfdata_noaug"),
    "augment_in_model_vs_noaug": ("tfdata_augment_in_model", "tfdata_noaug"),
    # `mdtrain train`'s default pipeline against the recipe that warps in its pipeline, and
    # against the recipe with the layers in its model (article 003): the pipelines' parts.
    "augment_in_model_vs_keras_directory_layers": (
        "tfdata_augment_in_model",
        "keras_directory_layers",
    ),
    "augment_in_model_vs_keras_directory": ("tfdata_augment_in_model", "keras_directory"),
    "cached_augment_vs_raw_decode": ("tfdata_cached_augment", "raw_decode"),
    "keras_layers_vs_keras_directory": ("keras_directory_layers", "keras_directory"),
    "fused_layer_vs_keras_layers": ("keras_directory_fused", "keras_directory_layers"),
    "cached_augment_vs_keras_layers_cached": (
        "tfdata_cached_augment",
        "keras_directory_layers_cached",
    ),
}

#: The images/sec keys of `pipeline_benchmark`'s result, with their chart labels, in the
#: order a reader meets them: the baselines, then mdtrain.
PIPELINE_KEYS = {
    "imagedatagenerator": "ImageDataGenerator + augment",
    "keras_directory_layers": "image_dataset_from_directory + Keras layers",
    "keras_directory_layers_cached": "image_dataset_from_directory + Keras layers, cached epoch",
    "keras_directory": "image_dataset_from_directory, no augment",
    "keras_directory_fused": "image_dataset_from_directory + FusedAugmentation",
    "tfdata": "mdtrain + augment",
    "tfdata_nearest": "mdtrain + augment, nearest sampling",
    "tfdata_augment_in_model": "mdtrain, augment in the model: the pipeline's part",
    "tfdata_noaug": "mdtrain, no augment",
    "raw_decode": "raw decode + resize",
    "tfdata_cached_augment": "mdtrain + augment, cached epoch",
    "tfdata_cached": "mdtrain, cached epoch",
}

NOTES = (
    "Whole epochs from a fresh pipeline (shuffle-buffer and cache fill included), after one "
    "untimed epoch; imagedatagenerator on IDG_BATCHES batches (it has no fill). "
    "keras_directory: image_dataset_from_directory(...).cache().shuffle(1000).prefetch(AUTOTUNE), "
    "its first epoch; keras_directory_layers: the same with RandomFlip, RandomRotation, "
    "RandomZoom, RandomBrightness and RandomContrast mapped over batches in parallel; "
    "keras_directory_layers_cached: its second epoch, read from its cache; "
    "keras_directory_fused: keras_directory_layers with the five layers replaced by mdtrain's "
    "one FusedAugmentation layer. "
    "tfdata*: InputData with cache='none' (every epoch decodes); tfdata_cached*: a later epoch "
    "of cache='memory'; tfdata_augment_in_model: InputData(augment_in='model'), the pipeline "
    "draws each image's transforms and the training step applies them, so it times the input "
    "pipeline's part only. Augmented variants: flip, rotation 20 deg, zoom 0.15, brightness "
    "(0.8, 1.2), contrast 0.2."
)

#: Batches `imagedatagenerator` is timed on: it runs at about 10 images/s, has no buffer
#: to fill, and a rate is a rate.
IDG_BATCHES = 12


def bench_policy(**overrides) -> AugmentPolicy:
    """The `AugmentPolicy` of the benchmark (`BENCH_AUGMENT`), with `overrides`."""
    from mdtrain.augment import AugmentPolicy

    return AugmentPolicy(**{**BENCH_AUGMENT, **overrides})


def keras_augmentation(policy: AugmentPolicy, seed: int = 0) -> keras.Sequential:
    """The policy as Keras preprocessing layers, as the TensorFlow tutorials write them.

    `RandomFlip("horizontal")`, `RandomRotation`, `RandomZoom` (fill "nearest"),
    and when the policy has colour, `RandomBrightness` (additive: Keras has no
    multiplicative one; ±(hi - 1) of the value range) and `RandomContrast`.
    """
    import keras

    zoom = (-policy.zoom, policy.zoom)
    layers = [
        keras.layers.RandomFlip("horizontal", seed=seed),
        keras.layers.RandomRotation(policy.rotation_degrees / 360, fill_mode="nearest", seed=seed),
        keras.layers.RandomZoom(zoom, zoom, fill_mode="nearest", seed=seed),
    ]
    if policy.brightness is not None:
        delta = max(1 - policy.brightness[0], policy.brightness[1] - 1)
        layers.append(keras.layers.RandomBrightness(delta, value_range=(0, 255), seed=seed))
    if policy.contrast:
        layers.append(keras.layers.RandomContrast(policy.contrast, seed=seed))
    return keras.Sequential(layers)


def keras_directory(
    train_dir: str | os.PathLike,
    image_size: int,
    batch_size: int,
    policy: AugmentPolicy | None = None,
    seed: int = 0,
    fused: bool = False,
) -> tf.data.Dataset:
    """What Keras users write: `image_dataset_from_directory`, cache, shuffle, prefetch.

    As TensorFlow's image-classification tutorial writes it
    (`.cache().shuffle(1000).prefetch(AUTOTUNE)`), and with a policy, its
    data-augmentation tutorial's `map(lambda x, y: (augment(x, training=True), y),
    num_parallel_calls=AUTOTUNE)` before the prefetch.

    Args:
        train_dir: a folder with one sub-folder per class.
        image_size: side of the square images.
        batch_size: images per batch.
        policy: an `AugmentPolicy` to run as Keras layers, or None. Defaults to None.
        seed: seed of the shuffle and the layers. Defaults to 0.
        fused: run the policy as mdtrain's one `FusedAugmentation` layer instead
            of Keras' layers (the same recipe otherwise). Defaults to False.

    Returns:
        A dataset of `(float32 images, int32 labels)` batches. It stops with an
        error on a file it cannot decode.
    """
    import keras
    import tensorflow as tf

    from mdtrain.augment_layer import FusedAugmentation

    ds = keras.utils.image_dataset_from_directory(
        str(train_dir), image_size=(image_size, image_size), batch_size=batch_size,
        shuffle=True, seed=seed, verbose=False,
    )  # fmt: skip
    ds = ds.cache().shuffle(1000, seed=seed)
    if policy is not None:
        layers = FusedAugmentation(policy, seed) if fused else keras_augmentation(policy, seed)
        plain = tf.autograph.experimental.do_not_convert
        ds = ds.map(plain(lambda x, y: (layers(x, training=True), y)),
                    num_parallel_calls=tf.data.AUTOTUNE)  # fmt: skip
    return ds.prefetch(tf.data.AUTOTUNE)


def image_data_generator(
    directory: str | os.PathLike,
    image_size: int,
    batch_size: int,
    policy: AugmentPolicy | None = None,
    shuffle: bool = True,
    seed: int = 0,
):
    """The legacy `ImageDataGenerator().flow_from_directory` with the policy's augmentations.

    What most older Keras tutorials use: PIL decodes and resizes, scipy applies
    the random affine transform, one image at a time, in float32, in one Python
    thread. Keras 3 removed `keras.preprocessing.image`; TensorFlow still ships
    it as `tf.keras.preprocessing.image.ImageDataGenerator` (it needs scipy).

    Args:
        directory: a folder with one sub-folder per class.
        image_size: side of the square output images.
        batch_size: images per batch.
        policy: the `AugmentPolicy` to apply (`image_data_generator_kwargs`),
            or None for none. Defaults to None.
        shuffle: shuffle the files every epoch. Defaults to True.
        seed: seed of the shuffle and of the transforms. Defaults to 0.

    Returns:
        A Keras `DirectoryIterator`, endless: `next(it)` gives `(float32 images
        in 0-255, float32 class indices)`; `len(it)` is the batches per epoch.
    """
    import tensorflow as tf

    kwargs = image_data_generator_kwargs(policy) if policy is not None else {}
    generator = tf.keras.preprocessing.image.ImageDataGenerator(**kwargs)
    return generator.flow_from_directory(
        str(directory),
        target_size=(image_size, image_size),
        batch_size=batch_size,
        class_mode="sparse",
        shuffle=shuffle,
        seed=seed,
        interpolation="bilinear",
    )


def _epoch_1(data: InputData):
    """Epoch 1 of `data`, made afresh for every timing, as training gets it.

    `train_epochs`: prefetched, with the pipeline's options.
    """
    return lambda: data.train_epochs(1, 2)


def _pipeline_variants(data_dir: Path, image_size: int, batch_size: int):
    """The pipelines to time, their warm-ups (`time_epochs`), batches per epoch, images."""
    import tensorflow as tf

    from mdtrain.data import load_splits, resolve_layout, tf_paths
    from mdtrain.pipeline import AUTOTUNE, InputData, load_image

    splits = load_splits(data_dir)  # checks every file once: warms the page cache too
    if splits.skipped:
        raise UsageError(f"{data_dir}: {len(splits.skipped)} unreadable file(s); "
                         "the ImageDataGenerator and Keras baselines cannot skip them")  # fmt: skip
    train_dir, _ = resolve_layout(data_dir)
    files = splits.train.files
    steps = -(-len(files) // batch_size)
    policy = bench_policy()
    idg = image_data_generator(train_dir, image_size, batch_size, policy)
    idg_batches = min(len(idg), IDG_BATCHES)

    def idg_epoch():
        # Endless: one batch pulled untimed (a pipeline's maker runs before the clock starts),
        # then the timed ones. No other warm-up: it has no buffer to fill, nothing to compile.
        next(idg)
        return itertools.islice(idg, idg_batches)

    def raw():
        ds = tf.data.Dataset.from_tensor_slices(tf_paths(files))
        ds = ds.map(lambda p: load_image(p, image_size), num_parallel_calls=AUTOTUNE,
                    deterministic=False)  # fmt: skip
        return ds.batch(batch_size).prefetch(AUTOTUNE)

    def keras(policy=None, fused=False):
        return lambda: keras_directory(train_dir, image_size, batch_size, policy, fused=fused)

    def input_data(cache="none", **kw):
        return InputData(splits, image_size, batch_size, cache=cache, **kw)

    cached_augment = input_data("memory", augment=policy)
    cached = input_data("memory", augment=None)
    pipelines = {
        "imagedatagenerator": idg_epoch,
        # Each timing makes the recipe afresh: its first epoch, cache fill included.
        "keras_directory_layers": keras(policy),
        "keras_directory": keras(),
        "keras_directory_fused": keras(policy, fused=True),
        # One recipe, timed again and again: the warm-up epoch fills its cache.
        "keras_directory_layers_cached": keras_directory(train_dir, image_size, batch_size, policy),
        "tfdata": _epoch_1(input_data(augment=policy)),
        "tfdata_nearest": _epoch_1(input_data(augment=bench_policy(interpolation="nearest"))),
        # --augment-in model: the pipeline only draws the transforms; the step applies them.
        "tfdata_augment_in_model": _epoch_1(input_data(augment=policy, augment_in="model")),
        "tfdata_noaug": _epoch_1(input_data(augment=None)),
        "raw_decode": raw,
        "tfdata_cached_augment": _epoch_1(cached_augment),
        "tfdata_cached": _epoch_1(cached),
    }
    # The others warm up on an epoch like their timed ones; a cached InputData on epoch 0,
    # which fills the cache its timed epochs read.
    warmups = {
        "imagedatagenerator": None,
        "tfdata_cached_augment": cached_augment.train_epochs(0, 1),
        "tfdata_cached": cached.train_epochs(0, 1),
    }
    return pipelines, warmups, steps, len(files)


def _ratios(measured: dict) -> dict[str, dict]:
    """Each ratio repeat by repeat (neighbours in time), with its median and spread."""
    out = {}
    for name, (num, den) in RATIOS.items():
        runs = [a / b for a, b in zip(measured[num]["runs"], measured[den]["runs"], strict=True)]
        out[name] = {"median": round(statistics.median(runs), 2),
                     "min": round(min(runs), 2), "max": round(max(runs), 2)}  # fmt: skip
    return out


def pipeline_benchmark(
    data=None, image_size: int = 224, batch_size: int = 32, repeats: int = 3, output=None
) -> dict:
    """Images per second of the Keras recipes, ImageDataGenerator and mdtrain, side by side.

    Variants (`PIPELINE_KEYS`, `NOTES`): `imagedatagenerator`
    (`flow_from_directory` with the benchmark's augmentation),
    `keras_directory` and `keras_directory_layers` (what Keras users write,
    `keras_directory`), `keras_directory_fused` (the same recipe with
    mdtrain's `FusedAugmentation` layer in place of Keras' five), `tfdata`,
    `tfdata_nearest`, `tfdata_augment_in_model` and `tfdata_noaug`
    (`InputData` streaming every epoch: augmented, augmented with nearest
    sampling, only the transforms drawn for the training step to apply
    (`augment_in="model"`), not augmented),
    `tfdata_cached` and `tfdata_cached_augment` (a later epoch from the memory
    cache) and `raw_decode` (decode + resize only, all cores).

    Args:
        data: dataset folder (class folders, or `train/` + `val/`); None
            makes the 1500-JPEG benchmark set under `data/bench`. Defaults to None.
        image_size: output side in pixels. Defaults to 224.
        batch_size: images per batch. Defaults to 32.
        repeats: timed epochs per variant, interleaved. Defaults to 3.
        output: a folder (gets `pipeline.json` and `pipeline.png`) or a
            `.json` path (the PNG goes beside it). Defaults to None.

    Returns:
        A dict: every `PIPELINE_KEYS` entry (images/sec, median), `spread`
        (min and max of each), `runs` (every repeat), `ratios` (taken repeat
        by repeat: median, min, max), `goals`, `goals_met`, `cpu_count`,
        `machine` (load average included), and the settings.

    Raises:
        UsageError: a bad argument or a dataset with unreadable files.

    Example:

    >>> r = pipeline_benchmark("data/demo", image_size=64, repeats=1)  # doctest: +SKIP
    >>> r["ratios"]["augment_vs_noaug"]["median"]  # doctest: +SKIP
    """
    check_positive(image_size=image_size, batch_size=batch_size, repeats=repeats)
    data_dir = bench_data(data)
    pipelines, warmups, steps, num_images = _pipeline_variants(data_dir, image_size, batch_size)
    start = time.perf_counter()
    load_before = machine_info()["load_average_1_5_15min"]
    measured = time_epochs(pipelines, repeats, batches=steps, warmup=warmups)
    machine = machine_info()
    result = {
        **_pipeline_rates(measured, machine["cpu_count"]),
        "images_per_epoch": num_images,
        "image_size": image_size,
        "batch_size": batch_size,
        "repeats": repeats,
        "seconds": round(time.perf_counter() - start, 1),
        "load_average_before": load_before,
        "machine": machine,
    }
    if output is not None:
        bars = {label: result[k] for k, label in PIPELINE_KEYS.items()}
        title = f"Input pipeline, {image_size} px, batch {batch_size}, {result['cpu_count']} CPUs"
        write_result(result, output, "pipeline", bars, result["raw_decode"], title)
    return result


def _pipeline_rates(measured: dict[str, dict], cpu_count: int) -> dict:
    """The rates, spreads, ratios and goals of `pipeline_benchmark`'s result, in its order."""
    ratios = _ratios(measured)
    return {
        **{k: round(measured[k]["median"], 1) for k in PIPELINE_KEYS},
        "spread": {
            k: [round(measured[k]["min"], 1), round(measured[k]["max"], 1)] for k in PIPELINE_KEYS
        },  # fmt: skip
        "notes": NOTES,
        "augment": BENCH_AUGMENT,
        "cpu_count": cpu_count,
        "ratios": ratios,
        "goals": GOALS,
        "goals_met": {k: ratios[k]["median"] >= g for k, g in GOALS.items()},
        "runs": {name: m["runs"] for name, m in measured.items()},
    }


def main(argv: list[str] | None = None) -> None:
    """`python benchmarks/pipeline.py`: runs `pipeline_benchmark` with the command's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="dataset folder: class folders, or train/ and val/ "
                        "(default: 1500 JPEGs made in data/bench on first use)")  # fmt: skip
    parser.add_argument("--image-size", type=int, default=224, help="output side, pixels")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed epochs per variant, interleaved")  # fmt: skip
    parser.add_argument("--output", help="a folder for pipeline.json and pipeline.png, or a "
                        ".json path (default: nothing written)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    check_positive(image_size=args.image_size, batch_size=args.batch_size, repeats=args.repeats)
    bench_data(args.data)  # bad input: one line, before TensorFlow starts
    from mdtrain.tf_import import import_tensorflow

    import_tensorflow()  # quietly: no TensorFlow C++ start-up chatter
    result = pipeline_benchmark(args.data, args.image_size, args.batch_size, args.repeats,
                                args.output)  # fmt: skip
    if args.json:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run_main(main)
