"""Parameter-server training: `python -m mdtrain.ps serve` runs a ps or worker task.

Workers run the steps that the chief (`mdtrain train --strategy ps`) schedules in
`loop.coordinator_fit`: docs/multi-worker.md, "Parameter servers" (why each server
gets `MIN_INTER_OP_THREADS` inter-op threads or more) and "Security".
"""

from __future__ import annotations

import os
import sys

import tensorflow as tf

from mdtrain.distribute import grow_gpu_memory
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
    grow_gpu_memory()  # before the server starts its devices
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        config=server_config(),
    )
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()


def main(argv: list[str] | None = None) -> int:
    """`python -m mdtrain.ps serve`: a ps or worker task (the chief runs `mdtrain train`)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv != ["serve"]:
            raise UsageError(
                "usage: python -m mdtrain.ps serve (the chief: mdtrain train --strategy ps)"
            )
        serve()
        return 0
    except UsageError as error:
        print(f"mdtrain: error: {error.as_option()}", file=sys.stderr)
        return USAGE_EXIT_CODE
