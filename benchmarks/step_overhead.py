"""What a training step costs the host: mdtrain's exact step against plain Keras `fit`.

A model too small for its arithmetic to matter (one 8-filter convolution on
16x16 images, global batches of 16, 2 CPU replicas): what is left is the
loop's own cost per step, which on a GPU, where a small model's step takes a
millisecond or two, is the throughput. Variants, each trained on the same
in-memory batches under the same `MirroredStrategy`:

- `keras_fit`: plain `keras.Model.fit` with `compile(loss=...)` (Keras' own,
  inexact, loss scaling);
- `keras_fit_spe16`: the same with `compile(steps_per_execution=16)` (fails
  under a strategy in TF 2.21 / Keras 3.15: recorded, not in the default run);
- `exact_fit`: `mdtrain.ExactTrainer.fit`, one step per call;
- `exact_fit_spe16`: `ExactTrainer.compile(steps_per_execution=16)`;
- `exact_custom_fit` and `exact_custom_fit_spe16`: `mdtrain.loop.custom_fit`.

Two datasets, both of the same 320 batches:

- `finite`: `from_tensor_slices(...).batch(16).cache().prefetch(8)`, no
  `repeat()`, as users write it: each `fit` call is one pass;
- `repeated`: the same with `repeat()` before `prefetch`, and
  `steps_per_epoch=320`.

Each process (a round; virtual CPU devices are fixed when TensorFlow starts)
builds every variant on both datasets, traces each with a warm-up call of 16
steps, then makes `--calls` timed calls of each, interleaved: call 1 of every
variant in a shuffled order, then call 2, and so on. A timed call runs from
`fit` (or `custom_fit`) to `on_train_end`: its iterator, callbacks and last
wait included, the iterator's deletion after it left out (it can stall for
seconds in any variant: `mdtrain.compat.without_autotuning`). Its steady state
runs from the end of its first call of the train function to the end of its
last (no iterator creation, no first fetch). Each variant's ratio to
`keras_fit` is taken call by call (the same process, dataset and call
number); the result holds medians, quartiles and the min-max spread of the
rates and ratios, every call's figures (`runs`, in the order of `FIGURES`:
whole-call steps/s, CPU ms per step, steady steps/s, and the milliseconds
before training begins, to the end of the first call, and after the last),
their medians, and the process's CPU ms per step.

`--settings` runs the same rounds under host thread settings, one process per
setting per round, in an order rotated round by round (`SETTINGS` lists
them: TensorFlow's inter- and intra-op pools, tf.data's private pool and
autotuning, OpenMP/oneDNN): what decides which "level" a call lands on
(benchmarks/README.md). `--before REF` also runs the package at an earlier git
commit (from a temporary worktree), in rounds interleaved with the current one.

Usage, from the repository root (the default: 3 processes of 3 calls per
variant and dataset, 9 calls each; about 5 minutes on 2 idle cores):

    python benchmarks/step_overhead.py [--steps 320] [--repeats 3] [--calls 3]
        [--settings default,inter1] [--before REF] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import (
    REPO,
    check_positive,
    checkout,
    machine_info,
    package_env,
    run_main,
    write_result,
)

from mdtrain.errors import UsageError

BATCH, IMAGE_SIZE, CLASSES, REPLICAS, SPE = 16, 16, 10, 2, 16
VARIANTS = ("keras_fit", "keras_fit_spe16", "exact_fit", "exact_fit_spe16", "exact_custom_fit",
            "exact_custom_fit_spe16")  # fmt: skip
DEFAULT_VARIANTS = ("keras_fit", "exact_fit", "exact_fit_spe16", "exact_custom_fit_spe16")
DATASETS = ("finite", "repeated")
#: What each timed call records, in this order (`runs`): its rates, then where the time
#: outside its steps goes: before training begins (`fit`'s data adapter and callbacks), from
#: then to the end of the first call of the train function (the distributed iterator made, and
#: the call's own steps), and from the end of the last call to `on_train_end` (the epoch's end:
#: under Keras' `fit`, a spare iterator for a next epoch).
FIGURES = ("steps_per_sec", "cpu_ms_per_step", "steady_steps_per_sec",
           "ms_before_begin", "ms_to_first_call_end", "ms_after_last_call")  # fmt: skip
#: Host thread settings a round can run under: TensorFlow's pools (set before it starts its
#: devices), tf.data's (on the dataset), or the process's environment (OpenMP, oneDNN).
SETTINGS = {
    "default": {},
    "inter1": {"inter_op": 1},
    "inter2": {"inter_op": 2},
    "intra1": {"intra_op": 1},
    "inter1_intra1": {"inter_op": 1, "intra_op": 1},
    "private1": {"private_threadpool_size": 1},
    "no_autotune": {"autotune": False},
    "omp1": {"env": {"OMP_NUM_THREADS": "1"}},
    "no_onednn": {"env": {"TF_ENABLE_ONEDNN_OPTS": "0"}},
}


def _model(name: str, strategy):
    """The tiny network, compiled as variant `name` compiles it."""
    import keras

    from mdtrain.loop import ExactTrainer

    keras.utils.set_random_seed(0)
    options = {"steps_per_execution": SPE} if name.endswith("spe16") else {}
    with strategy.scope():
        inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
        features = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
        features = keras.layers.GlobalAveragePooling2D()(features)
        outputs = keras.layers.Dense(CLASSES, activation="softmax")(features)
        net = keras.Model(inputs, outputs)
        if name.startswith("keras"):
            net.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy", **options)
            return net
        model = ExactTrainer(net)
        model.compile(keras.optimizers.SGD(0.01), **options)
        return model


def _clock():
    """A Keras callback: when each call of the train function ended, and when training did."""
    import keras

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()
            self.calls = []  # (time, steps done so far) at the end of each call

        def on_train_batch_end(self, batch, logs=None):
            self.calls.append((time.perf_counter(), batch + 1))

        def on_train_end(self, logs=None):
            self.at = (time.perf_counter(), time.process_time())

    return Clock()


def _timed_call(name: str, model, strategy, dataset, steps: int | None) -> list[float]:
    """One `fit` (or `custom_fit`) call: its figures, in the order of `FIGURES`.

    `steps` None: one pass over a finite dataset (its length is the epoch).
    """
    from mdtrain.loop import custom_fit

    clock = _clock()
    wall, cpu = time.perf_counter(), time.process_time()
    options = dict(epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    if "custom" in name:  # custom_fit is told an epoch's steps: a finite dataset's length
        length = steps if steps is not None else int(dataset.cardinality())
        custom_fit(model, strategy, dataset, **(options | dict(steps_per_epoch=length)))
    else:
        model.fit(dataset, shuffle=False, **options)
    # Until `on_train_end`: `fit` makes its iterator inside its epoch, `custom_fit` before its
    # callbacks start, so only the whole call holds the same work for both; the iterator's
    # deletion after it can stall for seconds in any variant (`compat.without_autotuning`).
    done = clock.calls[-1][1]
    (first, first_done), (last, _) = clock.calls[0], clock.calls[-1]
    return [
        done / (clock.at[0] - wall),
        1e3 * (clock.at[1] - cpu) / done,
        (done - first_done) / (last - first),
        1e3 * (clock.begin - wall),
        1e3 * (first - clock.begin),
        1e3 * (clock.at[0] - last),
    ]


def _datasets(steps: int, setting: dict) -> dict:
    """Both datasets of `steps` batches, with the setting's tf.data options."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.random((BATCH * steps, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH * steps).astype(np.int32)
    cached = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH).cache()
    options = tf.data.Options()
    if "private_threadpool_size" in setting:
        options.threading.private_threadpool_size = setting["private_threadpool_size"]
    if setting.get("autotune") is False:
        options.autotune.enabled = False
    return {"finite": cached.prefetch(8).with_options(options),
            "repeated": cached.repeat().prefetch(8).with_options(options)}  # fmt: skip


def _configure(setting: dict) -> None:
    """TensorFlow's devices and thread pools, before it starts them."""
    from mdtrain.distribute import configure_devices

    configure_devices(f"cpu:{REPLICAS}")
    import tensorflow as tf

    if "inter_op" in setting:
        tf.config.threading.set_inter_op_parallelism_threads(setting["inter_op"])
    if "intra_op" in setting:
        tf.config.threading.set_intra_op_parallelism_threads(setting["intra_op"])


def _error_line(error: Exception) -> str:
    lines = str(error).strip().splitlines() or [""]
    line = next((x for x in lines if "must feed" in x), lines[0]).strip()
    return f"{type(error).__name__}: {line[:200]}"


def worker(config: dict) -> dict:
    """One round in this process: `{dataset/variant: [per call figures] or an error}`."""
    setting = SETTINGS[config.get("setting", "default")]
    _configure(setting)
    import tensorflow as tf

    from mdtrain.compat import fresh_collective_keys

    steps = config["steps"]
    datasets = _datasets(steps, setting)
    models, out = {}, {}
    for dataset_name in DATASETS:
        for name in config["order"]:
            key = f"{dataset_name}/{name}"
            gc.collect()  # the previous variant's iterators
            fresh_collective_keys()
            strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
            try:
                model = _model(name, strategy)
                # tracing: two calls of the train function, so its steady state has a span
                _timed_call(name, model, strategy, datasets[dataset_name], 2 * SPE)
                models[key], out[key] = (model, strategy), []
            except Exception as error:  # recorded: plain Keras' spe under a strategy fails
                out[key] = _error_line(error)
    for call in range(config["calls"]):
        order = random.Random(call).sample(sorted(models), len(models))
        for key in order:
            dataset_name, name = key.split("/")
            model, strategy = models[key]
            epoch = None if dataset_name == "finite" else steps
            out[key].append(_timed_call(name, model, strategy, datasets[dataset_name], epoch))
    return out


def _environment(source: Path, setting: str) -> dict:
    return {**package_env(source), **SETTINGS[setting].get("env", {})}


def _round(config: dict, source: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)],
                          env=_environment(source, config["setting"]),
                          cwd=REPO, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"round {config} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values: list[float], digits: int) -> dict:
    """Median, quartiles and min-max of `values`."""
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": round(statistics.median(values), digits),
            "quartiles": [round(quartiles[0], digits), round(quartiles[2], digits)],
            "spread": [round(min(values), digits), round(max(values), digits)]}  # fmt: skip


def _summary(runs: dict[str, list]) -> dict:
    """Per key (`[prefix/]dataset/variant`): median steps/s (whole call and steady state),
    quartiles, spread, CPU ms per step and where a call's other time goes; its ratio to
    `keras_fit` call by call."""
    result = {}
    for key, values in runs.items():
        errors = [value for value in values if isinstance(value, str)]
        if errors:
            result[key] = {"error": errors[0]}
            continue
        base = runs.get(key.rsplit("/", 1)[0] + "/keras_fit")
        entry = {"calls": len(values),
                 "cpu_ms_per_step": round(statistics.median(v[1] for v in values), 2)}  # fmt: skip
        for index, figure in enumerate(FIGURES[3:], start=3):  # older records lack them
            if all(len(value) > index for value in values):
                entry[figure] = round(statistics.median(value[index] for value in values), 1)
        for figure, index in (("", 0), ("steady_", 2)):
            rates = [value[index] for value in values]
            stats = _spread(rates, 1)
            entry |= {f"{figure}steps_per_sec": stats["median"],
                      f"{figure}quartiles": stats["quartiles"],
                      f"{figure}spread": stats["spread"]}  # fmt: skip
            if base and not any(isinstance(value, str) for value in base):
                ratios = [r / b[index] for r, b in zip(rates, base, strict=True)]
                stats = _spread(ratios, 2)
                entry |= {f"{figure}vs_keras_fit": stats["median"],
                          f"{figure}vs_keras_fit_quartiles": stats["quartiles"],
                          f"{figure}vs_keras_fit_spread": stats["spread"]}  # fmt: skip
        result[key] = entry
    return result


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=320, help="steps per timed call (an epoch)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds: processes per setting")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per variant, dataset "
                        "and process, interleaved")  # fmt: skip
    parser.add_argument("--before", help="git commit of an earlier package to run beside this one")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)}")  # fmt: skip
    parser.add_argument(
        "--settings",
        default="default",
        help=f"comma-separated host thread settings, of {', '.join(SETTINGS)}",
    )
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "step_overhead.json"))
    parser.add_argument("--json", action="store_true", help="last line: the result as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    check_positive(steps=args.steps, repeats=args.repeats, calls=args.calls)
    if args.steps < 2 * SPE:  # the steady state runs from the first call's end to the last's
        raise UsageError(f"--steps {args.steps}: at least {2 * SPE}, two calls of {SPE} steps")
    for name, choices in (("variants", VARIANTS), ("settings", SETTINGS)):
        unknown = set(getattr(args, name).split(",")) - set(choices)
        if unknown:
            raise UsageError(f"--{name} {','.join(sorted(unknown))}: choose from "
                             f"{', '.join(choices)}")  # fmt: skip
    if "keras_fit" not in args.variants.split(","):
        raise UsageError("--variants: must hold keras_fit, the ratios' baseline")


def _rounds(args: argparse.Namespace, sources: dict[str, Path]) -> dict[str, list]:
    """Every round: one process per source and setting, in an order rotated round by round."""
    variants, settings = args.variants.split(","), args.settings.split(",")
    processes = [(prefix, setting) for prefix in sources for setting in settings]
    runs: dict[str, list] = {}
    for number in range(args.repeats):
        order = random.Random(number).sample(variants, len(variants))  # no fixed neighbours
        turn = number % len(processes)
        for prefix, setting in processes[turn:] + processes[:turn]:
            config = {"order": order, "steps": args.steps, "calls": args.calls,
                      "setting": setting}  # fmt: skip
            got = _round(config, sources[prefix])
            label = f"{prefix}{setting}/"
            print(f"round {number + 1} {label}: " + json.dumps(
                {k: [round(c[0]) for c in v] if isinstance(v, list) else v
                 for k, v in got.items()}), file=sys.stderr, flush=True)  # fmt: skip
            for key, values in got.items():
                runs.setdefault(label + key, [])
                runs[label + key] += values if isinstance(values, list) else [values]
    return runs


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    _check(args)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.time()
    with checkout(args.before) if args.before else contextlib.nullcontext() as before:
        sources = {"": REPO} | ({"before/": before} if args.before else {})
        runs = _rounds(args, sources)
    setup = dict(steps=args.steps, repeats=args.repeats, calls=args.calls,
                 global_batch_size=BATCH, image_size=IMAGE_SIZE, replicas=REPLICAS,
                 steps_per_execution=SPE, before=args.before,
                 settings={name: SETTINGS[name] for name in args.settings.split(",")},
                 command=" ".join(["python", "benchmarks/step_overhead.py",
                                   *(argv if argv is not None else sys.argv[1:])]))  # fmt: skip
    result = {
        "variants": _summary(runs),
        "runs": runs,
        "setup": setup,
        "seconds": round(time.time() - started),
        "load_average_before": load_before,
        "machine": machine_info(),
    }
    bars = {name: entry["steps_per_sec"] * BATCH for name, entry in result["variants"].items()
            if "steps_per_sec" in entry}  # fmt: skip
    title = f"one 8-filter conv, batches of {BATCH}, 2 CPU replicas: training images/s"
    write_result(result, args.output, "step_overhead", bars, None, title)
    print(json.dumps(result) if args.json else json.dumps(result["variants"], indent=1))
    print(f"command: {setup['command']}", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)
