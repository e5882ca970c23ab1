"""The servers of a parameter-server cluster, and the chief's handle on them.

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
    """Session config for a parameter server or worker: enough inter-op threads.

    Returns:
        A `ConfigProto` with `inter_op_parallelism_threads` = the number of
        cores, but at least `MIN_INTER_OP_THREADS` (see the module doc).
    """
    threads = max(MIN_INTER_OP_THREADS, os.cpu_count() or 1)
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)


def serve(inter_op_threads: int | None = None) -> None:
    """Runs this process as the `ps` or `worker` task named in `TF_CONFIG`, forever.

    What `mdtrain launch --ps M` starts for every parameter server and worker
    (`python -m mdtrain.ps serve`). The server does nothing by itself: the
    chief sends it functions to run and variables to hold.

    Args:
        inter_op_threads: the server's inter-op thread pool. Defaults to
            None: `server_config()`'s, at least 3. Pass 2 to watch the hang.

    Raises:
        UsageError: if `TF_CONFIG` does not name a `ps` or `worker` task.
    """
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type not in ("ps", "worker"):
        raise UsageError(
            f"TF_CONFIG task type {resolver.task_type!r}: `serve` runs a ps or worker task"
        )
    config = server_config()
    if inter_op_threads is not None:
        config.inter_op_parallelism_threads = inter_op_threads
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        config=config,
        start=True,
    )
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()


def in_process_cluster(
    num_workers: int = 2, num_ps: int = 1, inter_op_threads: int | None = None
) -> tf.distribute.cluster_resolver.ClusterResolver:
    """Starts `num_workers` workers and `num_ps` parameter servers inside this process.

    The quickest cluster for a test or a probe: the servers are threads of
    this process on 127.0.0.1 and live as long as it does (they cannot be
    stopped or killed; use `mdtrain launch --ps` for separate processes).

    Args:
        num_workers: workers to start. Defaults to 2.
        num_ps: parameter servers to start. Defaults to 1.
        inter_op_threads: the servers' inter-op threads. Defaults to None:
            `server_config()`'s.

    Returns:
        A cluster resolver for `tf.distribute.ParameterServerStrategy`.
    """
    from mdtrain.launcher import ps_cluster

    cluster = ps_cluster(num_workers, num_ps)  # free loopback ports; its chief is this process
    spec = tf.train.ClusterSpec({"worker": cluster["worker"], "ps": cluster["ps"]})
    config = server_config()
    if inter_op_threads is not None:
        config.inter_op_parallelism_threads = inter_op_threads
    for job, count in (("worker", num_workers), ("ps", num_ps)):
        for index in range(count):
            tf.distribute.Server(spec, job, index, protocol="grpc", config=config, start=True)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")


def coordinator(resolver=None):
    """`(strategy, coordinator)` for the cluster of `resolver`, or of `TF_CONFIG`.

    Args:
        resolver: a cluster resolver. Defaults to None: `TF_CONFIG`'s.

    Returns:
        A `ParameterServerStrategy` and its `ClusterCoordinator`.
    """
    resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)
