"""What does `monitor.watch(dataset)` cost a step of plain Keras `fit`?

The smallest step the issue measured (one 8-filter convolution, 16x16
images, batches of 16, 2 CPU replicas, 320 steps a call, a finite cached
dataset) is where a fixed cost per batch weighs most. Each round trains one
`fit` call on the dataset as it is and one on the dataset watched, the
monitor a callback in both, in alternating order; the result is the median
step time of each and their ratio. A second figure, free of `fit`, is the
time per batch of iterating the cached dataset, watched and not.

Run from the repo root (prints JSON; ``--out FILE`` also writes it):

    python benchmarks/watch_overhead.py --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS, BATCH, SIZE = 320, 16, 16


def tiny_setup():
    """The strategy, the compiled tiny model and its finite dataset."""
    import mdtrain

    mdtrain.configure_devices("cpu:2")
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.random((STEPS * BATCH, SIZE, SIZE, 3), np.float32)
    labels = rng.integers(0, 10, STEPS * BATCH)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH).cache()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((SIZE, SIZE, 3)),
                keras.layers.Conv2D(8, 3, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
            ]
        )
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, dataset.prefetch(8)


def fit_step_s(model, dataset, watched: bool) -> tuple[float, float]:
    """Wall and CPU seconds per step of one `fit` call, the monitor a callback, watched or not.

    The CPU seconds are the process's, all its threads: on a machine shared with
    other work they move less than the wall time does.
    """
    from mdtrain.monitor import make_monitor

    monitor = make_monitor(BATCH, display="none")
    data = monitor.watch(dataset) if watched else dataset
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(data, epochs=1, verbose=0, callbacks=[monitor])
    monitor.summary()  # the stamps are matched to the steps when read: part of the cost
    return (time.perf_counter() - wall) / STEPS, (time.process_time() - cpu) / STEPS


def iterate_batch_s(dataset, watched: bool) -> tuple[float, float]:
    """Wall and CPU seconds per batch of iterating ``dataset`` (cached), watched or not."""
    from mdtrain.monitor import make_monitor

    monitor = make_monitor(BATCH, display="none")
    data = monitor.watch(dataset) if watched else dataset
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in data:
        pass
    return (time.perf_counter() - wall) / STEPS, (time.process_time() - cpu) / STEPS


def median_pair(measure, rounds: int) -> dict:
    """Medians of ``measure(watched)``'s (wall, CPU) over ``rounds`` rounds, order alternating."""
    figures = {False: [], True: []}
    for index in range(rounds):
        for watched in (False, True) if index % 2 == 0 else (True, False):
            figures[watched].append(measure(watched))
    medians = {}
    for clock, column in (("wall", 0), ("cpu", 1)):
        plain, watched = (statistics.median(f[column] for f in figures[w]) for w in (False, True))
        medians[clock] = {"plain": plain, "watched": watched, "ratio": watched / plain}
    return medians


def rounded(medians: dict, scale: float) -> dict:
    """``medians`` in the unit ``scale`` gives (1e3: ms, 1e6: µs), ratios to 4 places."""
    return {
        clock: {
            name: round(value, 4) if name == "ratio" else round(value * scale, 3)
            for name, value in figures.items()
        }
        for clock, figures in medians.items()
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    model, dataset = tiny_setup()
    fit_step_s(model, dataset, watched=True)  # traces and compiles, fills the cache
    steps = median_pair(lambda watched: fit_step_s(model, dataset, watched), args.rounds)
    batches = median_pair(lambda watched: iterate_batch_s(dataset, watched), args.rounds)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average_1min": round(os.getloadavg()[0], 1),
        "rounds": args.rounds,
        "fit_step_ms": rounded(steps, 1e3),
        "tf_data_batch_us": rounded(batches, 1e6),
        "note": (
            f"{STEPS} steps of batch {BATCH}, {SIZE}x{SIZE} images, one 8-filter conv, "
            "2 CPU replicas; medians of interleaved rounds, the monitor a callback in both"
        ),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
