"""Benchmarks: input pipelines side by side, and whether training waits for input.

`pipeline_benchmark` measures images per second of what Keras users write
(`image_dataset_from_directory`, with and without augmentation layers), the
legacy `ImageDataGenerator` and mdtrain's tf.data variants in one process,
on the same files with the page cache warm, same output size and batch size,
whole epochs from fresh pipelines (fills included), warm-up excluded, repeats
interleaved (so a change in machine load hits every variant alike), median
and spread kept. `train_benchmark` times training steps fed by the
real pipeline against steps fed one cached batch over and over (the
input-bound ratio), and one replica against two virtual CPU replicas.

Both are behind `mdtrain bench pipeline|train`; `benchmarks/run.sh` writes the
committed results.

Modules: `common` (the benchmark dataset, machine description, result
files), `timing` (interleaved, isolated timing of iterators), `pipelines`
(`pipeline_benchmark` and the tf.data stages of notebook 02), `training`
(`train_benchmark`, whose worker process runs `python -m mdtrain.bench`).
"""

from __future__ import annotations

from mdtrain.bench.common import BENCH_DATA, machine_info
from mdtrain.bench.pipelines import (
    AUGMENTATIONS,
    BENCH_AUGMENT,
    GOALS,
    NOTES,
    PIPELINE_KEYS,
    RATIOS,
    STEP_BY_STEP,
    bench_policy,
    distributed_rate,
    keras_augmentation,
    keras_directory,
    pipeline_benchmark,
    stage_benchmark,
    tfdata_stage,
)
from mdtrain.bench.timing import measure
from mdtrain.bench.training import train_benchmark

__all__ = [
    "AUGMENTATIONS",
    "BENCH_AUGMENT",
    "BENCH_DATA",
    "GOALS",
    "NOTES",
    "PIPELINE_KEYS",
    "RATIOS",
    "STEP_BY_STEP",
    "bench_policy",
    "distributed_rate",
    "keras_augmentation",
    "keras_directory",
    "machine_info",
    "measure",
    "pipeline_benchmark",
    "stage_benchmark",
    "tfdata_stage",
    "train_benchmark",
]
