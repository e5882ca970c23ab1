"""A worker's share of the decoding: one epoch's input on 1 worker and on each of 2.

Under `--strategy multiworker` each worker builds its own input
(`InputData.for_strategy`). It used to be the whole pipeline, every image of every
global batch decoded, of which tf.distribute's DATA auto-shard kept the worker's
slice; each worker now decodes only its replicas' slices. This script builds,
in one process, the per-worker input exactly as `distribute_datasets_from_function`
asks for it (`InputData.train_epochs(context=...)`) and measures, over one epoch
of the same images streamed (`cache="none"`, as for sets larger than memory):

- the images each worker decodes, counted by a counter around every decode;
- the process CPU time (user + system, every thread) and wall time of the epoch.

Variants: `one_worker` (the whole input, as 1 worker of 1 builds it), `old_worker0_of_2`
(the input worker 0 of 2 got before: the global pipeline sharded with the DATA policy, as
`experimental_distribute_dataset` does on each worker), `worker0_of_2` and `worker1_of_2`.
Repeats are interleaved, median and spread kept, ratios taken repeat by repeat.

Usage, from the repository root:

    python benchmarks/worker_decode.py [--data DIR] [--image-size 224] [--batch-size 32]
        [--repeats 5] [--output benchmarks/worker_decode.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _common import bench_data, check_positive, machine_info, run_main

GOAL = 0.6  # a worker of 2 decodes, and spends CPU time on, at most this share of 1 worker's
VARIANTS = ("one_worker", "old_worker0_of_2", "worker0_of_2", "worker1_of_2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="dataset folder (default: the benchmark set)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32, help="the global batch size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default="benchmarks/worker_decode.json")
    args = parser.parse_args()
    check_positive(image_size=args.image_size, batch_size=args.batch_size, repeats=args.repeats)
    data_dir = bench_data(args.data)
    load_before = list(os.getloadavg())

    import tensorflow as tf

    import mdtrain.pipeline as pipeline
    from mdtrain.data import load_splits

    inputs = pipeline.InputData(load_splits(data_dir), args.image_size, args.batch_size, seed=1,
                                augment_in="model", cache="none")  # fmt: skip
    build = {
        "one_worker": lambda: inputs.train_epochs(0, 1),
        "old_worker0_of_2": lambda: _data_sharded(inputs.train_epochs(0, 1), 2, 0, args.batch_size),
        "worker0_of_2": lambda: inputs.train_epochs(context=tf.distribute.InputContext(2, 0, 2)),
        "worker1_of_2": lambda: inputs.train_epochs(context=tf.distribute.InputContext(2, 1, 2)),
    }
    decoded = _count_decodes(pipeline, build)
    runs = {name: {"cpu_s": [], "wall_s": [], "images_out": None} for name in VARIANTS}
    for name in VARIANTS:  # untimed: traces, compiles, warms the page cache
        runs[name]["images_out"] = _epoch(build[name]())[2]
    for repeat in range(args.repeats):
        order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
        for name in order:  # rotated, so that no variant always runs first
            cpu, wall, _ = _epoch(build[name]())
            runs[name]["cpu_s"].append(cpu)
            runs[name]["wall_s"].append(wall)
    result = {
        "images": inputs.num_train,
        "image_size": args.image_size,
        "global_batch_size": args.batch_size,
        "repeats": args.repeats,
        "images_decoded": decoded,
        "decoded_ratio": {name: decoded[name] / decoded["one_worker"] for name in VARIANTS[1:]},
        "runs": {
            name: {**run, "cpu_s_median": round(statistics.median(run["cpu_s"]), 3)}
            for name, run in runs.items()
        },  # fmt: skip
        "cpu_ratio": {
            name: _ratio(runs[name]["cpu_s"], runs["one_worker"]["cpu_s"]) for name in VARIANTS[1:]
        },
        "goal_cpu_ratio_at_most": GOAL,
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "machine": machine_info(),
    }
    new = ("worker0_of_2", "worker1_of_2")
    worst = max(max(result["cpu_ratio"][w]["median"], result["decoded_ratio"][w]) for w in new)
    result["verdict"] = "met" if worst <= GOAL else "not met"
    with open(args.output, "w") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("decoded_ratio", "cpu_ratio", "verdict")}))


def _data_sharded(dataset, workers: int, index: int, global_batch: int):
    """What `experimental_distribute_dataset` made of the global batches on worker `index`.

    Its own steps, one replica per worker: rebatch to the replicas' sizes, then the
    DATA auto-shard rewrite (TensorFlow's private ops, as `input_lib` calls them).
    """
    from tensorflow.python.data.experimental.ops import distribute

    sizes = distribute.batch_sizes_for_worker(global_batch, workers, 1, index)
    return distribute._AutoShardDataset(dataset.rebatch(sizes), workers, index, workers)


def _epoch(dataset) -> tuple[float, float, int]:
    """Reads `dataset` to its end: CPU seconds (all threads), wall seconds, images."""
    images = 0
    cpu, wall = os.times(), time.perf_counter()
    for element in dataset:
        images += int(element[1].shape[0])
    after = os.times()
    cpu_s = (after.user - cpu.user) + (after.system - cpu.system)
    return round(cpu_s, 3), round(time.perf_counter() - wall, 3), images


def _count_decodes(pipeline, build) -> dict[str, int]:
    """The images each variant's epoch decodes, counted around `load_image` itself."""
    import tensorflow as tf

    counter, real = tf.Variable(0, dtype=tf.int64), pipeline.load_image

    def counted(path, size):
        with tf.control_dependencies([counter.assign_add(1)]):
            return real(path, size)

    pipeline.load_image = counted
    try:
        counts = {}
        for name in VARIANTS:
            counter.assign(0)
            _epoch(build[name]())
            counts[name] = int(counter.numpy())
        return counts
    finally:
        pipeline.load_image = real


def _ratio(numerators: list[float], denominators: list[float]) -> dict[str, float]:
    """Median, min and max of the repeat-by-repeat ratios."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    return {"median": round(statistics.median(ratios), 2), "min": round(min(ratios), 2),
            "max": round(max(ratios), 2)}  # fmt: skip


if __name__ == "__main__":
    run_main(main)
