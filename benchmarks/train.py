"""The training benchmark: is a step input-bound, and one replica against two CPU replicas.

Times training steps fed by the real pipeline against steps fed one cached
batch over and over (the input-bound ratio), one replica against two virtual
CPU replicas, then plain Keras `fit` against `mdtrain train` on the main
job's model (`replicas.py`). Every measurement runs in a fresh process
(`train.py --worker CONFIG`), because virtual CPU devices must be set before
TensorFlow starts.

Usage, from the repository root (`benchmarks/run.sh` writes the committed
`benchmarks/train.json` and `train.png` this way):

    python benchmarks/train.py [--data DIR] [--model efficientnetv2-b0] [--image-size 128]
        [--batch-size 32] [--steps 20] [--output benchmarks] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from _common import bench_data, check_positive, machine_info, run_main, write_result
from replicas import VARIANTS, replica_benchmark, run_worker, throughput_worker

from mdtrain.errors import UsageError


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


def train_worker(config: dict) -> dict:
    """Times training steps in this process: what `train.py --worker CONFIG` prints.

    Must run in a fresh process, before TensorFlow has started: it makes two
    virtual CPU devices. A config of kind `"throughput"` goes to
    `replicas.throughput_worker` instead.

    Args:
        config: `data`, `model`, `image_size`, `batch_size` and `steps`, as
            `train_benchmark` sends them.

    Returns:
        Seconds per step fed by the real pipeline and by one cached batch,
        the share of a step spent waiting for input, and seconds per step on
        one and on two replicas.

    Example:
        >>> train_worker(dict(data="data/demo", model="small-cnn", image_size=64,
        ...                   batch_size=32, steps=5))  # doctest: +SKIP
    """
    if config.get("kind") == "throughput":
        return throughput_worker(config)
    import tensorflow as tf

    from mdtrain.distribute import configure_devices

    # One process times both strategies, so both get TensorFlow's default pool (all
    # cores) rather than configure_devices' share per replica; the fresh-process
    # comparison (`replica_benchmark`) measures what `mdtrain train` really gets.
    tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count() or 1)
    configure_devices("cpu:2")
    import keras

    from mdtrain.data import load_splits
    from mdtrain.distribute import make_strategy
    from mdtrain.pipeline import InputData

    keras.utils.set_random_seed(0)
    splits = load_splits(config["data"])
    size, batch, steps = config["image_size"], config["batch_size"], config["steps"]
    inputs = InputData(splits, size, batch)
    epochs = 2 + (3 * (steps + 2)) // max(inputs.steps_per_epoch, 1)
    one_batch = next(iter(inputs.epoch_batches(0)))
    cached = tf.data.Dataset.from_tensors(one_batch).repeat()
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    two = make_strategy("cpu:2")
    t_one = _trainer(one, config["model"], len(splits.class_names), size)
    t_two = _trainer(two, config["model"], len(splits.class_names), size)
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


def _trainer(strategy, model: str, num_classes: int, size: int):
    """An `ExactTrainer` of `model` built and compiled under `strategy`."""
    import keras

    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    with strategy.scope():
        net = build_model(model, num_classes, size, "none")
        trainer = ExactTrainer(net)
        trainer.build((None, size, size, 3))
        trainer.compile(optimizer=keras.optimizers.Adam(1e-3))
        # Built here, not on the first step: creating variables inside the
        # compiled step fails under MirroredStrategy.
        trainer.optimizer.build(trainer.net.trainable_variables)
    return trainer


def train_benchmark(
    data=None,
    model: str = "efficientnetv2-b0",
    image_size: int = 128,
    batch_size: int = 32,
    steps: int = 20,
    output=None,
    repeats: int = 3,
    replica_epochs: int = 3,
) -> dict:
    """Is training input-bound, and do CPU replicas pay for themselves?

    In a fresh Python process (virtual CPU devices must be set before
    TensorFlow starts), times `steps` training steps of `model` on one
    replica fed by `InputData` (decode, augment, first epoch), then fed one
    batch held in memory, then the same global batch on two virtual CPU
    replicas (`cpu:2`, MirroredStrategy). Then the README's main job's
    model (small-cnn, at 64 px, global batch 64) in fresh processes, `repeats` rounds
    interleaved: plain Keras `fit` without a strategy, `mdtrain train` and
    `mdtrain train --strategy one` (`replicas.py`).

    Args:
        data: dataset folder; None uses the benchmark set. Defaults to None.
        model: a `mdtrain.models` name. Defaults to "efficientnetv2-b0".
        image_size: input side in pixels. Defaults to 128.
        batch_size: global batch size. Defaults to 32.
        steps: timed steps per configuration (after 2 warm-up steps). Defaults to 20.
        output: a folder (gets `train.json` and `train.png`) or a `.json`
            path. Defaults to None.
        repeats: rounds of the plain-Keras comparison. Defaults to 3.
        replica_epochs: epochs per run of that comparison (the first is
            not timed). Defaults to 3.

    Returns:
        A dict: `step_s_real_pipeline`, `step_s_cached_batch`,
        `input_bound_ratio` (their quotient, 1.0 = not input-bound),
        `input_wait_share`, `verdict` (`mdtrain.monitor.verdict`'s sentence),
        `step_s_1_replica`, `step_s_2_replicas`, `two_replica_speedup`,
        `vs_keras_fit` (`replica_benchmark`'s result: images per second,
        CPU seconds per image and the ratios to plain Keras),
        `cpu_count`, `machine` and the settings.

    Raises:
        UsageError: a bad argument, an unknown model or a failed run.
    """
    _check_train_args(model, image_size, batch_size, steps, repeats, replica_epochs)
    data_dir = bench_data(data)
    config = dict(data=str(data_dir), model=model, image_size=image_size,
                  batch_size=batch_size, steps=steps)  # fmt: skip
    start = time.perf_counter()
    # The worker is this script (`--worker`), in a process TensorFlow has not started in.
    timed = run_worker(config)
    versus = replica_benchmark(str(data_dir), repeats, replica_epochs)
    machine = machine_info()
    result = {
        **_step_figures(timed, batch_size),
        "vs_keras_fit": versus,
        "cpu_count": machine["cpu_count"],
        "model": model,
        "image_size": image_size,
        "batch_size": batch_size,
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "machine": machine,
    }
    if output is not None:
        title = f"Training {model} at {image_size} px, global batch {batch_size}"
        write_result(result, output, "train", _train_bars(result, timed), None, title)
    return result


def _train_bars(result: dict, timed: dict[str, float]) -> dict[str, float]:
    versus = result["vs_keras_fit"]
    return {
        "real pipeline, 1 replica": result["images_per_sec_real_pipeline"],
        "cached batch, 1 replica": result["images_per_sec_cached_batch"],
        "cached batch, 2 CPU replicas": round(result["batch_size"] / timed["step_s_2_replicas"], 1),
        **{f"main job: {versus[k]['what']}": versus[k]["images_per_sec"]["median"]
           for k in VARIANTS},
    }  # fmt: skip


def _check_train_args(model, image_size, batch_size, steps, repeats, replica_epochs) -> None:
    from mdtrain.choices import check_model_name

    check_positive(image_size=image_size, batch_size=batch_size, steps=steps, repeats=repeats)
    if replica_epochs < 2:
        raise UsageError(f"--replica-epochs {replica_epochs}: must be at least 2 (one is warm-up)")
    check_model_name(model)
    if batch_size < 2:
        raise UsageError(f"--batch-size {batch_size}: must be at least 2 (two replicas)")


def _step_figures(timed: dict[str, float], batch_size: int) -> dict:
    """The input-bound ratio and its goal, the worker's timings, rates, verdict and speed-up."""
    from mdtrain.monitor import verdict

    ratio = timed["step_s_real_pipeline"] / timed["step_s_cached_batch"]
    return {
        "input_bound_ratio": round(ratio, 3),
        "goal_input_bound_ratio": 1.05,
        "goal_met": ratio <= 1.05,
        **{k: round(v, 4) for k, v in timed.items()},
        "images_per_sec_real_pipeline": round(batch_size / timed["step_s_real_pipeline"], 1),
        "images_per_sec_cached_batch": round(batch_size / timed["step_s_cached_batch"], 1),
        # The monitor's verdict, from the same evidence it uses: the measured input wait.
        "verdict": verdict(timed["input_wait_share"], None),
        "two_replica_speedup": round(timed["step_s_1_replica"] / timed["step_s_2_replicas"], 3),
    }


def main(argv: list[str] | None = None) -> None:
    """`python benchmarks/train.py`: runs `train_benchmark` with the command's options."""
    from mdtrain.choices import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="dataset folder: class folders, or train/ and val/ "
                        "(default: 1500 JPEGs made in data/bench on first use)")  # fmt: skip
    parser.add_argument("--model", default="efficientnetv2-b0",
                        help=f"the model: {', '.join(MODELS)}")  # fmt: skip
    parser.add_argument("--image-size", type=int, default=128, help="input side, pixels")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="global batch size, at least 2 (two replicas)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20,
                        help="timed steps per configuration, after 2 warm-up steps")  # fmt: skip
    parser.add_argument("--output", help="a folder for train.json and train.png, or a .json "
                        "path (default: nothing written)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--worker", metavar="CONFIG_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:  # a measuring process started by this script
        print(json.dumps(train_worker(json.loads(args.worker))), flush=True)
        return
    options = {k: v for k, v in vars(args).items() if k not in ("json", "worker")}
    result = train_benchmark(**options)
    if args.json:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run_main(main)
