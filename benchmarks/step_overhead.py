"""What a training step costs the host: mdtrain's exact step against plain Keras `fit`.

A model too small for its arithmetic to matter (one 8-filter convolution on
16x16 images, global batches of 16, 2 CPU replicas): what is left is the
loop's own cost per step, which on a GPU, where a small model's step takes a
millisecond or two, is the throughput. Variants, each trained on the same
in-memory batches under the same `MirroredStrategy`:

- `keras_fit`: plain `keras.Model.fit` with `compile(loss=...)` (Keras' own,
  inexact, loss scaling);
- `keras_fit_spe16`: the same with `compile(steps_per_execution=16)`;
- `exact_fit`: `mdtrain.ExactTrainer.fit`, one step per call;
- `exact_fit_spe16`: `ExactTrainer.compile(steps_per_execution=16)`;
- `exact_custom_fit` and `exact_custom_fit_spe16`: `mdtrain.loop.custom_fit`.

Every round is one fresh process (virtual CPU devices are fixed when
TensorFlow starts) that runs every variant, in an order shuffled round by
round: a warm-up `fit` of 16 steps (tracing), then one timed call of an epoch
of `--steps` steps, from the call to `on_train_end`: its iterator, callbacks
and last wait included (`fit` and `custom_fit` make their iterators at
different points of a call), the iterator's deletion after it left out (it can
stall for seconds in any variant: `mdtrain.compat.without_autotuning`); and
the same call's steady state, from the end of its first call of the train
function to the end of its last (without the distributed iterator's creation,
which costs every variant about 150 ms here, and without the first fetch). The
result holds each variant's median steps/s (both), its spread, its ratio to
`keras_fit` computed round by round, and the process's CPU milliseconds per
step (what the host spends, less moved by the machine's other tenants). A
variant that fails records its error. `--before REF` also runs the package at
an earlier git commit (from a temporary worktree), in rounds interleaved with
the current one.

Usage, from the repository root (about 10 minutes on 2 cores with `--before`, 5 rounds):

    python benchmarks/step_overhead.py [--steps 320] [--repeats 3] [--before REF] [--json]
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

BATCH, IMAGE_SIZE, CLASSES, REPLICAS, SPE = 16, 16, 10, 2, 16
VARIANTS = ("keras_fit", "keras_fit_spe16", "exact_fit", "exact_fit_spe16", "exact_custom_fit",
            "exact_custom_fit_spe16")  # fmt: skip


def _variant(name: str, strategy, dataset, steps: int) -> list[float]:
    """Trains variant `name` for a warm-up and a timed epoch: steps/s, CPU ms per step, and
    steps/s in the steady state."""
    import keras

    from mdtrain.loop import ExactTrainer, custom_fit

    keras.utils.set_random_seed(0)
    spe = SPE if name.endswith("spe16") else 1
    with strategy.scope():
        inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
        x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
        x = keras.layers.GlobalAveragePooling2D()(x)
        net = keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(x))
        options = {"steps_per_execution": spe} if spe > 1 else {}
        if name.startswith("keras"):
            model = net
            model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy", **options)
        else:
            model = ExactTrainer(net)
            model.compile(keras.optimizers.SGD(0.01), **options)

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.calls = []  # when each call of the train function ended, and its last step

        def on_train_batch_end(self, batch, logs=None):
            self.calls.append((time.perf_counter(), batch + 1))

        def on_train_end(self, logs=None):
            self.at = (time.perf_counter(), time.process_time())

    def call(epoch_steps: int) -> tuple[float, float, list]:  # one epoch: wall, CPU s, calls
        end = Clock()
        wall, cpu = time.perf_counter(), time.process_time()
        if "custom" in name:
            custom_fit(model, strategy, dataset, epochs=1, steps_per_epoch=epoch_steps, verbose=0,
                       callbacks=[end])  # fmt: skip
        else:
            model.fit(dataset, epochs=1, steps_per_epoch=epoch_steps, shuffle=False, verbose=0,
                      callbacks=[end])  # fmt: skip
        return end.at[0] - wall, end.at[1] - cpu, end.calls

    call(SPE)  # warm-up: tracing
    # From the call to `on_train_end`: `fit` makes its iterator inside its epoch, `custom_fit`
    # before its callbacks start, so only the whole call holds the same work for both. What
    # follows `on_train_end`, the iterator's deletion, can stall for seconds in any variant
    # (tf.data's autotuning thread, `compat.without_autotuning`): left out.
    wall, cpu, calls = call(steps)
    # The steady state: from the first call's end to the last's (no iterator, no first fetch).
    (first, done), (last, steps_done) = calls[0], calls[-1]
    return [steps / wall, 1e3 * cpu / steps, (steps_done - done) / (last - first)]


def worker(config: dict) -> dict:
    """One round in this process: every variant in `config["order"]`; steps/s or an error each."""
    from mdtrain.distribute import configure_devices

    configure_devices(f"cpu:{REPLICAS}")
    import numpy as np
    import tensorflow as tf

    from mdtrain.compat import fresh_collective_keys
    from mdtrain.distribute import shard_by_batch

    rng = np.random.default_rng(0)
    images = rng.random((BATCH * 64, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH * 64).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH).cache()
    dataset = shard_by_batch(dataset.repeat().prefetch(2))
    out = {}
    for name in config["order"]:
        gc.collect()  # the previous variant's model and iterators
        fresh_collective_keys()
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
        try:
            out[name] = _variant(name, strategy, dataset, config["steps"])
        except Exception as error:  # recorded: plain Keras' spe under a strategy fails here
            lines = str(error).strip().splitlines() or [""]
            line = next((x for x in lines if "must feed" in x), lines[0]).strip()
            out[name] = f"{type(error).__name__}: {line[:200]}"
    return out


def _round(config: dict, source: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)],
                          env=package_env(source),
                          cwd=REPO, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"round {config} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(runs: dict[str, list]) -> dict:
    """Per variant: median steps/s (whole call and steady state), spread, CPU ms per step, ratio
    to `keras_fit` round by round."""
    result = {}
    for name, values in runs.items():
        if any(isinstance(v, str) for v in values):
            result[name] = {"error": next(v for v in values if isinstance(v, str))}
            continue
        base = runs.get(name.split("/")[0] + "/keras_fit") or runs["keras_fit"]
        result[name] = {"cpu_ms_per_step": round(statistics.median(v[1] for v in values), 2)}
        for key, i in (("", 0), ("steady_", 2)):
            rates = [v[i] for v in values]
            ratios = [r / b[i] for r, b in zip(rates, base, strict=True)]
            result[name] |= {f"{key}steps_per_sec": round(statistics.median(rates), 1),
                             f"{key}spread": [round(min(rates), 1), round(max(rates), 1)],
                             f"{key}vs_keras_fit": round(statistics.median(ratios), 2),
                             f"{key}vs_keras_fit_spread": [round(min(ratios), 2),
                                                           round(max(ratios), 2)]}  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=320, help="timed steps per variant")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, variants interleaved")
    parser.add_argument("--before", help="git commit of an earlier package to run beside this one")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "step_overhead.json"))
    parser.add_argument("--json", action="store_true", help="last line: the result as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    check_positive(steps=args.steps, repeats=args.repeats)
    variants = args.variants.split(",")
    load_before = [round(x, 2) for x in os.getloadavg()]
    with checkout(args.before) if args.before else contextlib.nullcontext() as before:
        sources = {"": REPO} | ({"before/": before} if args.before else {})
        runs: dict[str, list] = {p + v: [] for p in sources for v in variants}
        for r in range(args.repeats):
            order = random.Random(r).sample(variants, len(variants))  # no fixed neighbours
            for prefix, source in list(sources.items())[:: 1 if r % 2 == 0 else -1]:
                got = _round({"order": order, "steps": args.steps}, source)
                print(f"round {r + 1} {prefix or 'now/'}: {got}", file=sys.stderr, flush=True)
                for name, value in got.items():
                    runs[prefix + name].append(value)
    setup = dict(steps=args.steps, repeats=args.repeats, global_batch_size=BATCH,
                 image_size=IMAGE_SIZE, replicas=REPLICAS, steps_per_execution=SPE,
                 before=args.before)  # fmt: skip
    result = {
        "variants": _summary(runs),
        "runs": runs,
        "setup": setup,
        "load_average_before": load_before,
        "machine": machine_info(),
    }
    bars = {n: v["steps_per_sec"] * BATCH for n, v in result["variants"].items()
            if "steps_per_sec" in v}  # fmt: skip
    title = f"one 8-filter conv, batches of {BATCH}, 2 CPU replicas: training images/s"
    write_result(result, args.output, "step_overhead", bars, None, title)
    print(json.dumps(result) if args.json else json.dumps(result["variants"], indent=1))


if __name__ == "__main__":
    run_main(main)
