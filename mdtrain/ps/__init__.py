"""Parameter-server training: `ParameterServerStrategy` with a `ClusterCoordinator`.

A cluster of three roles. **Parameter servers** (`ps`) hold the variables,
sharded across them when there are several. **Workers** each hold nothing
of their own: they run whole training steps — the *whole* model, forward
and backward, on a batch of their own — reading the variables from the
parameter servers and sending the updates back. The **chief** (the
coordinator) builds the model and schedules steps; each step goes to
whichever worker is free. Nobody waits for anybody: updates are
*asynchronous*, so a step may compute its gradient from weights that other
workers have changed meanwhile (*stale* gradients), and the weights cannot
equal those of one device.

The chief runs `mdtrain.training.train` with `strategy="ps"`: the same data,
input pipeline, model, exact step, learning-rate schedule and outputs as
every other strategy, in the coordinator's loop (`loop.coordinator_fit`:
Keras 3's `fit` cannot run here). Notebook 07 writes the same training in
plain TensorFlow.

The thread-pool trap, handled here: a worker runs each scheduled function
on its inter-op thread pool, which by default has one thread per core, and
blocking ops (remote variable reads, the input iterator) can hold every
thread of a 2-core machine, so nothing ever runs; `server_config` gives
every server at least `MIN_INTER_OP_THREADS` threads.

Security: the servers speak unauthenticated, unencrypted gRPC, exactly as
under MultiWorkerMirroredStrategy; keep them on loopback or a trusted
network (see `mdtrain.launcher`).

Modules: this one (the servers), `loop` (the chief's loop), `__main__`
(`python -m mdtrain.ps serve|chief`). `mdtrain launch --workers N --ps M`
starts a whole job as local processes.
"""

from __future__ import annotations

import os

import tensorflow as tf

from mdtrain.errors import UsageError
from mdtrain.ps.loop import coordinator_fit

__all__ = ["MIN_INTER_OP_THREADS", "coordinator_fit", "serve", "server_config"]

MIN_INTER_OP_THREADS = 3  # measured: 2 threads (the default on 2 cores) hang every step


def server_config() -> tf.compat.v1.ConfigProto:
    """Session config for a parameter server or worker: enough inter-op threads.

    Returns:
        A `ConfigProto` with `inter_op_parallelism_threads` = the number of
        cores, but at least `MIN_INTER_OP_THREADS` (see the module doc).
    """
    threads = max(MIN_INTER_OP_THREADS, os.cpu_count() or 1)
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)


def serve() -> None:
    """Runs this process as the `ps` or `worker` task named in `TF_CONFIG`, forever.

    What `mdtrain launch --ps M` starts for every parameter server and worker
    (`python -m mdtrain.ps serve`). The server does nothing by itself: the
    chief sends it functions to run and variables to hold. Its inter-op
    thread pool is `server_config()`'s, at least 3.

    Raises:
        UsageError: if `TF_CONFIG` does not name a `ps` or `worker` task.
    """
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
