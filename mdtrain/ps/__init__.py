"""Parameter-server training: the servers of the `ps` and `worker` tasks.

Parameter servers hold the variables; workers run whole steps, asynchronously,
that the chief schedules in its loop (`loop.coordinator_fit`); `__main__` is
what `mdtrain launch --ps M` starts in each task. See docs/multi-worker.md;
the servers speak unauthenticated gRPC (`mdtrain.launcher`, "Security").

The thread-pool trap, handled here: a worker runs each scheduled function
on its inter-op thread pool, which by default has one thread per core, and
blocking ops (remote variable reads, the input iterator) can hold every
thread of a 2-core machine, so nothing ever runs; `server_config` gives
every server at least `MIN_INTER_OP_THREADS` threads.
"""

from __future__ import annotations

import os

import tensorflow as tf

from mdtrain.errors import UsageError

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
        start=True,
    )
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()
