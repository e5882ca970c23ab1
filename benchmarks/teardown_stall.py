"""The tf.data teardown stall, reproduced with TensorFlow alone (no mdtrain code in the loop).

An input pipeline is distributed by `MirroredStrategy` over 2 virtual CPUs and
iterated for `--seconds` (long enough for the autotuning threads' sleep period
to grow towards its 60 s cap); then the iterator is deleted and the deletion is
timed. TensorFlow runs a cancellation callback before it marks the manager
cancelled, so a woken autotuning thread can go back to sleep for the rest of its
period while the deletion waits for it (see `mdtrain/compat.py`). Each round
runs the pipeline as TensorFlow builds it by default (`autotune`) and with the
autotuning model off everywhere, as mdtrain runs it (`no_autotune`):

    python benchmarks/teardown_stall.py --rounds 3 --seconds 70 --out benchmarks/teardown_stall.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

_default_device_dataset = multi_device_iterator_ops._create_device_dataset


def _per_device_autotune(enabled: bool) -> None:
    """Sets autotuning of the per-replica datasets `MultiDeviceIterator` makes."""

    def create(*args, **kwargs):
        options = tf.data.Options()
        options.autotune.enabled = False
        return _default_device_dataset(*args, **kwargs).with_options(options)

    multi_device_iterator_ops._create_device_dataset = (
        _default_device_dataset if enabled else create
    )


def _pipeline(autotune: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.range(10**9)
    ds = ds.map(
        lambda i: tf.reduce_sum(tf.random.stateless_uniform([64, 64, 3], [i, 0])),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.autotune.enabled = autotune
    return ds.with_options(options)


def one_round(strategy, autotune: bool, seconds: float) -> float:
    """Iterates for `seconds`, then returns how long deleting the iterator took."""
    _per_device_autotune(autotune)
    iterator = iter(strategy.experimental_distribute_dataset(_pipeline(autotune)))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        next(iterator)
        time.sleep(0.02)  # a training step's worth of consumer time
    start = time.monotonic()
    del iterator
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=70.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    deletion = {"autotune": [], "no_autotune": []}
    for round_ in range(args.rounds):
        for name in deletion:  # interleaved
            seconds = one_round(strategy, name == "autotune", args.seconds)
            deletion[name].append(round(seconds, 3))
            print(f"round {round_ + 1}: {name:12s} iterator deleted in {seconds:.2f} s", flush=True)
    result = {
        "tensorflow": tf.__version__,
        "iterate_seconds": args.seconds,
        "deletion_seconds": deletion,
        "median": {k: statistics.median(v) for k, v in deletion.items()},
        "max": {k: max(v) for k, v in deletion.items()},
        "rounds_over_1s": {k: sum(s > 1.0 for s in v) for k, v in deletion.items()},
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
