"""Parameter-server training: what each task runs, `python -m mdtrain.ps serve | chief <args>`.

Parameter servers hold the variables; workers run whole steps, asynchronously,
that the chief schedules in its loop (`loop.coordinator_fit`); `mdtrain launch
--ps M` starts every task. See docs/multi-worker.md; the servers speak
unauthenticated gRPC (`mdtrain.launcher`, "Security").

The thread-pool trap, handled here: a worker runs each scheduled function
on its inter-op thread pool, which by default has one thread per core, and
blocking ops (remote variable reads, the input iterator) can hold every
thread of a 2-core machine, so nothing ever runs; `server_config` gives
every server at least `MIN_INTER_OP_THREADS` threads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import keras
import tensorflow as tf

from mdtrain import cli
from mdtrain.config import TrainConfig
from mdtrain.errors import USAGE_EXIT_CODE, UsageError
from mdtrain.ps.loop import coordinator_fit as coordinator_fit  # re-exported: docs/multi-worker.md

MIN_INTER_OP_THREADS = 3  # measured: 2 threads (the default on 2 cores) hang every step


def server_config() -> tf.compat.v1.ConfigProto:
    """Session config for a parameter server or worker: a thread per core, at least 3."""
    threads = max(MIN_INTER_OP_THREADS, os.cpu_count() or 1)
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)


def serve() -> None:
    """Runs this process as the `ps` or `worker` task named in `TF_CONFIG`, forever."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type not in ("ps", "worker"):
        raise UsageError(
            f"TF_CONFIG task type {resolver.task_type!r}: `serve` runs a ps or worker task"
        )
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        config=server_config(),
    )
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()


class MarkAfter(keras.callbacks.Callback):
    """The fault drill: creates `mark_file` once `steps` steps are done.

    A launcher may kill a worker then (`mdtrain.launcher.kill_worker_when`).
    """

    def __init__(self, steps: int, mark_file: str):
        super().__init__()
        self.steps, self.mark_file, self._epoch = steps, Path(mark_file), 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        done = self._epoch * self.params["steps"] + batch + 1
        if done >= self.steps and not self.mark_file.exists():
            self.mark_file.touch()
            print(f"step {done}: drill mark written", flush=True)


def _chief(argv: list[str]) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--log-every", type=int, default=TrainConfig.log_every,
                       help="steps per point of the loss curve")  # fmt: skip
    extra.add_argument("--mark-after", type=int,
                       help="fault drill: create --mark-file after this many steps")  # fmt: skip
    extra.add_argument("--mark-file", help="fault drill: the file to create")
    ours, rest = extra.parse_known_args(argv)
    args = cli.build_parser().parse_args(["train", *rest])
    args.strategy, args.log_every = "ps", ours.log_every
    drill = ours.mark_after is not None and ours.mark_file
    return cli.run_train(args, [MarkAfter(ours.mark_after, ours.mark_file)] if drill else None)


def main(argv: list[str] | None = None) -> int:
    """`python -m mdtrain.ps serve` (a ps or worker task) or `... chief <train arguments>`."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["serve"]:
            serve()
            return 0
        if argv[:1] == ["chief"]:
            return _chief(argv[1:])
        raise UsageError("usage: python -m mdtrain.ps serve | chief <mdtrain train arguments>")
    except UsageError as error:
        print(f"mdtrain: error: {error.as_option()}", file=sys.stderr)
        return USAGE_EXIT_CODE
