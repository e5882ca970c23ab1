"""Plain Keras `fit` against `mdtrain train` on CPU replicas: images per second, side by side.

`train.py` runs this comparison as part of its benchmark (`vs_keras_fit`);
run alone, it stores a new `vs_keras_fit` in `benchmarks/train.json`, keeping
the input-bound figures already there, then redraws `benchmarks/train.png`:

    python benchmarks/replicas.py [--repeats 3] [--epochs 3] [--redraw]

Every run is a fresh Python process, because virtual CPU devices, thread pools
and the CPU allocator are fixed when TensorFlow starts. Each trains the README's
main job's model on the same data: small-cnn at 64 px, global batch 64, the same
cached `InputData` batches, augmented in the input pipeline (`--augment-in
pipeline` for mdtrain: the loops are compared, not where the warp runs), the
same learning-rate schedule, validation after every epoch. Three variants,
one after the other in every round, rounds repeated, so a change in machine
load hits all of them alike:

- `keras_fit`: plain `keras.Model.fit`, no strategy, Keras' own loss and
  metrics, TensorFlow's default settings (what a Keras user runs);
- `mdtrain`: `mdtrain train` as the README runs it (2 virtual CPU replicas
  where there is no GPU, the exact step, the monitor), augmenting in the pipeline;
- `mdtrain_one`: `mdtrain train --strategy one`.

The rate counts the training part of every epoch after the first (the
first one decodes the files and traces the step); validation is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import bench_data, machine_info, run_main, write_result

from mdtrain.errors import UsageError

HERE = Path(__file__).resolve().parent

#: The workload the variants are compared on: the main job's model and global batch, at the
#: 64 px it used when `benchmarks/train.json` was measured (the default is 32 px since).
MAIN_JOB = {"model": "small-cnn", "image_size": 64, "batch_size": 64}
VARIANTS = {
    "keras_fit": "plain keras.Model.fit, one device, no strategy",
    "mdtrain": "mdtrain train (default: 2 virtual CPU replicas)",
    "mdtrain_one": "mdtrain train --strategy one",
}
STRATEGY = {"mdtrain": "auto", "mdtrain_one": "one"}


def run_worker(config: dict) -> dict:
    """Runs `train.py --worker CONFIG` in a fresh process; returns its JSON line.

    Raises:
        UsageError: if the process fails or prints nothing.
    """
    proc = subprocess.run(
        [sys.executable, str(HERE / "train.py"), "--worker", json.dumps(config)],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"bench train failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def _epoch_timer():
    """A Keras callback timing the training part of each epoch (wall and CPU seconds)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.wall, self.cpu, self.logs, self._start = [], [], {}, None

        def on_epoch_begin(self, epoch, logs=None):
            self._start = (time.perf_counter(), time.process_time())

        def on_test_begin(self, logs=None):  # validation starts: the epoch's steps are done
            if self._start is not None:
                self.wall.append(time.perf_counter() - self._start[0])
                self.cpu.append(time.process_time() - self._start[1])
                self._start = None

        def on_epoch_end(self, epoch, logs=None):
            self.logs = dict(logs or {})

    return EpochTimer()


def _keras_fit(data: str, epochs: int, timer) -> int:
    """Plain Keras: the same model, data and schedule, no strategy, no mdtrain step."""
    import keras

    from mdtrain.data import load_splits
    from mdtrain.models import build_model
    from mdtrain.pipeline import InputData

    keras.utils.set_random_seed(0)
    inputs = InputData(load_splits(data), MAIN_JOB["image_size"], MAIN_JOB["batch_size"])
    net = build_model(MAIN_JOB["model"], len(inputs.class_names), MAIN_JOB["image_size"], "none")
    schedule = keras.optimizers.schedules.CosineDecay(
        2e-3, decay_steps=epochs * inputs.steps_per_epoch, alpha=0.1
    )
    net.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    net.fit(inputs.train_epochs(0, epochs), epochs=epochs, steps_per_epoch=inputs.steps_per_epoch,
            validation_data=inputs.val_ds, verbose=0, callbacks=[timer])  # fmt: skip
    return inputs.num_train


def throughput_worker(config: dict) -> dict:
    """Runs inside a fresh process: trains one variant, returns its rates.

    Args:
        config: `variant` (a key of `VARIANTS`), `data`, `epochs` (at least 2).

    Returns:
        `images_per_sec` and `cpu_s_per_image` over the timed epochs,
        `val_accuracy` of the last epoch, `replicas`.
    """
    timer, variant = _epoch_timer(), config["variant"]
    replicas = 1
    if variant == "keras_fit":
        num_train = _keras_fit(config["data"], config["epochs"], timer)
    else:
        from mdtrain.training import TrainConfig, train

        result = train(
            TrainConfig(data=config["data"], strategy=STRATEGY[variant], epochs=config["epochs"],
                        image_size=MAIN_JOB["image_size"], global_batch_size=MAIN_JOB["batch_size"],
                        augment_in="pipeline", verbose=0, monitor="none"),
            callbacks=[timer],
        )  # fmt: skip
        num_train, replicas = result.num_train, result.replicas
    wall, cpu = sum(timer.wall[1:]), sum(timer.cpu[1:])
    images = num_train * len(timer.wall[1:])
    return {
        "images_per_sec": images / wall,
        "cpu_s_per_image": cpu / images,
        "val_accuracy": float(timer.logs.get("val_accuracy", float("nan"))),
        "replicas": replicas,
    }


def _spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "runs": [round(v, 3) for v in values],
    }


def replica_benchmark(data: str, repeats: int = 3, epochs: int = 3) -> dict:
    """`mdtrain train` (default and `--strategy one`) against plain Keras `fit`, interleaved.

    Args:
        data: dataset folder (the demo dataset's layout).
        repeats: rounds; each runs every variant once. Defaults to 3.
        epochs: epochs per run; all but the first are timed. Defaults to 3.

    Returns:
        A dict: per variant `images_per_sec` and `cpu_s_per_image` (median,
        min, max, runs), `replicas`; `ratios`: each mdtrain variant's rate ÷
        plain Keras' rate of the same round (median, min, max), with the
        goal (≥ 1.0) and whether the median meets it.

    Raises:
        UsageError: if a run fails.
    """
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name in VARIANTS:
            config = {"kind": "throughput", "variant": name, "data": data, "epochs": epochs}
            runs[name].append(run_worker(config))
            rate = runs[name][-1]["images_per_sec"]
            print(f"bench train: {name} {rate:.1f} images/s", file=sys.stderr, flush=True)
    out: dict = {"workload": dict(MAIN_JOB, epochs=epochs, timed_epochs=epochs - 1)}
    for name, rs in runs.items():
        out[name] = {
            "what": VARIANTS[name],
            "replicas": rs[0]["replicas"],
            "images_per_sec": _spread([r["images_per_sec"] for r in rs]),
            "cpu_s_per_image": _spread([r["cpu_s_per_image"] for r in rs]),
            "val_accuracy": _spread([r["val_accuracy"] for r in rs]),
        }
    base = [r["images_per_sec"] for r in runs["keras_fit"]]
    out["ratios"] = {}
    for name in ("mdtrain", "mdtrain_one"):
        ratio = _spread([r["images_per_sec"] / b for r, b in zip(runs[name], base, strict=True)])
        out["ratios"][f"{name}_vs_keras_fit"] = {**ratio, "goal": 1.0,
                                                 "goal_met": ratio["median"] >= 1.0}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved rounds of the comparison (default: 3)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per run, the first not timed (default: 3)")  # fmt: skip
    parser.add_argument("--redraw", action="store_true",
                        help="redraw train.png from train.json (default: measure)")  # fmt: skip
    args = parser.parse_args()
    result = json.loads((HERE / "train.json").read_text())
    if not args.redraw:
        start = time.perf_counter()
        versus = replica_benchmark(str(bench_data(None)), args.repeats, args.epochs)
        versus["seconds"] = round(time.perf_counter() - start, 1)
        versus["machine"] = machine_info()  # the load average when the comparison ended
        result["vs_keras_fit"] = versus
    write_result(result, HERE, "train", _bars(result), None, "Training, images per second")
    print(json.dumps(result["vs_keras_fit"]["ratios"]))


def _bars(result: dict) -> dict[str, float]:
    """The input-bound figures (EfficientNetV2 steps), then the main job's three variants."""
    versus, model = result["vs_keras_fit"], f"{result['model']} {result['image_size']} px"
    size = versus["workload"]["image_size"]
    return {
        f"{model}: real pipeline, 1 replica": result["images_per_sec_real_pipeline"],
        f"{model}: cached batch, 1 replica": result["images_per_sec_cached_batch"],
        f"{model}: cached batch, 2 CPU replicas": round(
            result["batch_size"] / result["step_s_2_replicas"], 1
        ),
        **{
            f"small-cnn {size} px: {VARIANTS[k]}": versus[k]["images_per_sec"]["median"]
            for k in VARIANTS
        },
    }


if __name__ == "__main__":
    run_main(main)
