"""Choosing a `tf.distribute` strategy, and the batch arithmetic that goes with it.

Virtual CPU devices and GPU memory growth can only be configured before
TensorFlow initialises its devices, so call `configure_devices` first thing
in a fresh process (the CLI does).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass

import tensorflow as tf

from mdtrain.choices import CPU_STRATEGY as _CPU
from mdtrain.choices import check_batch_sizes, check_strategy_name
from mdtrain.compat import fresh_collective_keys, without_autotuning
from mdtrain.errors import UsageError, bad_value


def _virtual_cpus(count: int) -> None:
    """Splits the CPU into `count` logical devices, or says in one line why it is too late."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have < count:
            raise UsageError(
                f"--strategy cpu:{count}: TensorFlow already started with {have} CPU device(s); "
                "virtual CPUs must be set before any TensorFlow work: restart the Python "
                "process or notebook kernel and call configure_devices first"
            ) from None


def _processes_on_this_host() -> int:
    """Tasks of the `TF_CONFIG` cluster on this task's host (`mdtrain launch`: all); else 1."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        cluster, task = config["cluster"], config["task"]
        host = cluster[task["type"]][int(task["index"])].rsplit(":", 1)[0]
        addresses = [address for tasks in cluster.values() for address in tasks]
        return max(1, sum(address.rsplit(":", 1)[0] == host for address in addresses))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return 1


def _cpu_runtime(replicas: int) -> None:
    """Pooled CPU memory, and each CPU replica its share of the cores, unless the user set them."""
    # The default CPU allocator's page faults cost a third of a step's CPU time; BFC pools
    # freed memory (benchmarks/README.md, "CPU replicas against plain Keras").
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    if replicas < 2 or tf.config.threading.get_intra_op_parallelism_threads():
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # Virtual CPUs share one intra-op pool whose threads contend: a share each costs less CPU
    # time (the same benchmark), and replicas of one step still run side by side.
    with contextlib.suppress(RuntimeError):  # TensorFlow has started: its pools stay
        tf.config.threading.set_intra_op_parallelism_threads(max(1, (cores or 1) // replicas))


def grow_gpu_memory() -> list:
    """Sets memory growth on every GPU (memory taken as needed, not all up front); returns them."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        # RuntimeError: devices already initialised; growth was set before, or cannot be now.
        # ValueError: the GPU was split into logical GPUs, which have fixed memory limits.
        with contextlib.suppress(RuntimeError, ValueError):
            tf.config.experimental.set_memory_growth(gpu, True)
    return gpus


def configure_devices(strategy: str = "auto", cpu_replicas: int = 2) -> None:
    """Prepares devices for `strategy`: GPU memory growth, virtual CPU replicas.

    Must run before TensorFlow touches a device. Calling it again with the
    same strategy is harmless. Process-wide settings it makes, as asked: GPU
    memory growth; on CPU replicas, the pooling CPU allocator
    (`TF_CPU_ALLOCATOR_USE_BFC`, unless already set) and one share of the
    cores per replica for intra-op threads (unless already set). TensorFlow
    cannot undo them in a running process.

    If you choose GPUs with `CUDA_VISIBLE_DEVICES`, also set
    `CUDA_DEVICE_ORDER=PCI_BUS_ID` (why: docs/multi-worker.md).

    Args:
        strategy: strategy name (see `make_strategy`). Defaults to `"auto"`.
        cpu_replicas: virtual CPU replicas for `"auto"` on a machine with
            neither GPU nor TPU; with either, it is not used, so a notebook
            that asks for `"auto"` uses the accelerators it finds.
            Defaults to 2.

    Raises:
        UsageError: for an unknown name, or virtual CPUs asked for too late.
    """
    check_strategy_name(strategy)
    gpus = grow_gpu_memory()
    cpu_strategy = _CPU.match(strategy)
    replicas = int(cpu_strategy.group(1)) if cpu_strategy else 1
    if cpu_strategy:
        _virtual_cpus(replicas)
    elif strategy == "auto" and not gpus and not _tpu_available():
        replicas = cpu_replicas
        _virtual_cpus(replicas)
    if cpu_strategy or (not gpus and strategy != "tpu"):
        _cpu_runtime(replicas * _processes_on_this_host())


def _tpu_available() -> bool:
    if not (
        os.environ.get("TPU_NAME")
        or os.environ.get("COLAB_TPU_ADDR")
        or os.path.exists("/dev/accel0")
        or os.path.exists("/dev/vfio/0")
    ):
        return False
    try:
        tf.distribute.cluster_resolver.TPUClusterResolver()
        return True
    except (ValueError, RuntimeError):
        return False


def make_strategy(strategy: str = "auto") -> tf.distribute.Strategy:
    """Creates the `tf.distribute.Strategy` named by `strategy`.

    Call `configure_devices(strategy)` before, in the same process.

    Args:
        strategy: the `--strategy` name: `auto`, `mirrored`, `multiworker`,
            `tpu`, `one`, `cpu:N` or `ps`, each described in README.md, "The
            command". Defaults to `"auto"`.

    Returns:
        The strategy; `strategy.num_replicas_in_sync` tells how many replicas.

    Raises:
        UsageError: for an unknown name or a missing device.

    Example:

    >>> configure_devices("cpu:2")
    >>> make_strategy("cpu:2").num_replicas_in_sync
    2
    """
    check_strategy_name(strategy)
    if strategy == "ps":  # this process is the chief: it coordinates (`mdtrain.ps`)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if strategy == "multiworker":
        # First, before anything lists logical devices: MultiWorkerMirroredStrategy must
        # configure its collectives before TensorFlow initialises its runtime.
        return _multiworker_strategy()
    # A new MirroredStrategy over the devices of an earlier one would reuse its
    # collective keys ("Shape mismatch in the collective instance" on the second
    # train() call of a notebook): give each its own.
    fresh_collective_keys()
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if strategy == "auto" and _tpu_available():
        strategy = "tpu"
    elif strategy == "auto":
        strategy = "mirrored" if gpus else f"cpu:{max(2, len(cpus))}"
    elif strategy == "tpu" and not _tpu_available():
        raise UsageError("--strategy tpu: no TPU found; use auto, mirrored or cpu:N")
    if strategy == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if strategy == "mirrored":
        return _mirrored_over_gpus(gpus)
    if strategy == "one":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    replicas = int(_CPU.match(strategy).group(1))
    if len(cpus) < replicas:
        raise UsageError(
            f"--strategy cpu:{replicas}: only {len(cpus)} CPU device(s); call configure_devices"
            f"('cpu:{replicas}') before TensorFlow starts"
        )
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _mirrored_over_gpus(gpus: list) -> tf.distribute.Strategy:
    """MirroredStrategy over every GPU; not NCCL where logical GPUs share a card."""
    # NCCL, the default for GPUs, refuses two ranks on one device ("NCCL: invalid usage",
    # seen on an H100 split in two with `set_logical_device_configuration`).
    if len(gpus) > len(tf.config.list_physical_devices("GPU")):
        return tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.ReductionToOneDevice())
    return tf.distribute.MirroredStrategy()


def _multiworker_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for a cluster described by TF_CONFIG or, failing that, Slurm."""
    # No collective timeout: TF 2.21 starts a thread per collective that sleeps it out (8,800
    # threads per worker after a minute); heartbeats and `mdtrain launch` catch a lost worker.
    if os.environ.get("TF_CONFIG"):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    elif os.environ.get("SLURM_JOB_ID"):
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver()
    else:
        raise UsageError(
            "--strategy multiworker needs a cluster: set TF_CONFIG (see `mdtrain launch`) "
            "or run under Slurm"
        )
    # NCCL between workers with GPUs (AUTO would leave it to the runtime); RING on CPUs.
    kind = tf.distribute.experimental.CommunicationImplementation
    nccl = kind.NCCL if tf.config.list_physical_devices("GPU") else kind.RING
    options = tf.distribute.experimental.CommunicationOptions(implementation=nccl)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options
    )


def resolve_global_batch_size(
    num_replicas: int, per_replica: int | None = None, global_batch: int | None = None
) -> int:
    """Global batch = per-replica batch × replicas, from whichever is given (neither: 32 × N)."""
    check_batch_sizes(per_replica, global_batch)
    if global_batch is None:
        return (32 if per_replica is None else per_replica) * num_replicas
    if global_batch < num_replicas:
        raise bad_value(
            "global_batch_size",
            global_batch,
            f"smaller than the {num_replicas} "
            "replicas; every replica needs at least one example per step",
        )
    if global_batch % num_replicas:
        raise bad_value(
            "global_batch_size",
            global_batch,
            f"not a multiple of the {num_replicas} "
            "replicas; use a multiple, or a per-replica batch size",
        )
    return global_batch


def shard_by_batch(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` as training reads it: the DATA auto-shard policy, no autotuning model."""
    # Each worker slices one machine's global batches, not files: docs/multi-worker.md.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return without_autotuning(dataset.with_options(options))


@dataclass
class BatchGeometry:
    """How a dataset's examples split into steps and replicas."""

    num_examples: int
    global_batch_size: int
    num_replicas: int

    @property
    def per_replica_batch_size(self) -> int:
        return self.global_batch_size // self.num_replicas

    @property
    def steps(self) -> int:
        return -(-self.num_examples // self.global_batch_size)

    @property
    def last_batch_size(self) -> int:
        return self.num_examples - (self.steps - 1) * self.global_batch_size

    def split(self, batch_size: int) -> list[int]:
        """Examples each replica gets from a batch of `batch_size`, as `tf.distribute` cuts it.

        Contiguous slices of `ceil(batch_size / num_replicas)`; on a partial
        batch the last slices are shorter, or empty.

        Example:

        >>> BatchGeometry(5, 5, 4).split(5)
        [2, 2, 1, 0]
        """
        per_replica = -(-batch_size // self.num_replicas)  # rounded up
        return [
            max(0, min(per_replica, batch_size - replica * per_replica))
            for replica in range(self.num_replicas)
        ]

    def describe(self) -> str:
        """One line for the start of a run."""
        text = (
            f"global batch {self.global_batch_size} = {self.per_replica_batch_size} per replica "
            f"x {self.num_replicas} replica(s); {self.num_examples} examples -> {self.steps} "
            "steps per epoch"
        )
        if self.last_batch_size != self.global_batch_size:
            text += f"; last batch {self.last_batch_size} split {self.split(self.last_batch_size)}"
        return text


def task_id(strategy: tf.distribute.Strategy) -> int:
    """This process's index among the workers of its cluster (0 outside a cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(getattr(resolver, "task_id", 0) or 0)


def _cluster(strategy: tf.distribute.Strategy):
    """The strategy's cluster resolver and its cluster as a dict (empty outside a cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver, resolver.cluster_spec().as_dict() if resolver is not None else {}


def task_name(strategy: tf.distribute.Strategy) -> str | None:
    """This process's task in its cluster, such as `"worker-1"`; None outside a cluster."""
    resolver, cluster = _cluster(strategy)
    return f"{resolver.task_type}-{resolver.task_id}" if cluster else None


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True unless this is a non-chief worker: the chief is task `chief`, else worker 0."""
    resolver, cluster = _cluster(strategy)
    if not cluster or resolver.task_type in (None, "chief"):
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in cluster
