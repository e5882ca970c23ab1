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

mdtrain runs the same exact step as every other strategy
(`mdtrain.loop.ExactTrainer.train_step`) and the same input pipeline
(`mdtrain.pipeline.InputData`, built on each worker through
`ClusterCoordinator.create_per_worker_dataset`). Keras' own `fit` cannot run
here: Keras 3 does not support parameter-server training
(keras-team/keras#18624), and `fit` fails asking for
`create_per_worker_dataset`.

The thread-pool trap, handled here: a worker runs each scheduled function
on its inter-op thread pool, which by default has one thread per core, and
blocking ops (remote variable reads, the input iterator) can hold every
thread of a 2-core machine, so nothing ever runs; `server_config` gives
every server at least `MIN_INTER_OP_THREADS` threads.

Security: the servers speak unauthenticated, unencrypted gRPC, exactly as
under MultiWorkerMirroredStrategy; keep them on loopback or a trusted
network (see `mdtrain.launch`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import keras
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
    from mdtrain.launch import free_ports

    ports = free_ports(num_workers + num_ps)
    spec = tf.train.ClusterSpec(
        {
            "worker": [f"127.0.0.1:{p}" for p in ports[:num_workers]],
            "ps": [f"127.0.0.1:{p}" for p in ports[num_workers:]],
        }
    )
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


@dataclass
class PSHistory:
    """What an asynchronous run did, one entry per block of `log_every` steps."""

    steps: list[int] = field(default_factory=list)  # steps done at the end of each block
    loss: list[float] = field(default_factory=list)  # mean training loss within the block
    accuracy: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # since the first step was scheduled
    scheduled: int = 0
    completed: int = 0
    events: list[str] = field(default_factory=list)

    def steps_per_sec(self) -> list[float]:
        """Throughput of each block (steps / seconds)."""
        edges = [0.0, *self.seconds]
        starts = [0, *self.steps]
        return [
            (s - s0) / max(t - t0, 1e-9)
            for s0, s, t0, t in zip(starts, self.steps, edges, self.seconds, strict=False)
        ]


def train_steps(
    strategy,
    coord,
    trainer,
    dataset_fn,
    num_steps: int,
    *,
    log_every: int = 10,
    on_block=None,
) -> PSHistory:
    """Schedules `num_steps` asynchronous training steps and waits for them.

    Each step is `trainer.train_step` on the next batch of the worker that
    runs it. Every `log_every` steps the coordinator waits for all scheduled
    steps (`join`), reads the training metrics, which live on the parameter
    servers, and resets them: one point of the loss curve. Keras 3 updates a
    variable by reading it and writing the sum back (`assign_add`), so two
    workers' metric or optimizer updates can interleave and one be lost:
    the curve is approximate (an accuracy above 1 has been seen).

    Args:
        strategy: a `ParameterServerStrategy`.
        coord: its `ClusterCoordinator`.
        trainer: a compiled `mdtrain.loop.ExactTrainer`, created in `strategy.scope()`.
        dataset_fn: a function returning a repeated `(images, labels)` dataset;
            every worker builds its own from it.
        num_steps: steps to run in all, over all workers.
        log_every: steps per point of the curve. Defaults to 10.
        on_block: called as `on_block(history)` after each point. Defaults to None.

    Returns:
        The `PSHistory`.
    """
    from mdtrain.loop import build_optimizer

    build_optimizer(trainer)  # on the ps, before any step
    iterator = iter(coord.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        strategy.run(trainer.train_step, args=(next(it),))

    history, start = PSHistory(), time.perf_counter()
    trainer.reset_metrics()
    while history.scheduled < num_steps:
        block = min(log_every, num_steps - history.scheduled)
        remote = [coord.schedule(step, args=(iterator,)) for _ in range(block)]
        history.scheduled += block
        coord.join()  # raises if a step failed for a reason other than a lost worker
        for r in remote:
            r.fetch()  # raises if this step failed; a lost worker's steps were rerun elsewhere
        history.completed += block
        history.steps.append(history.completed)
        history.loss.append(float(trainer.loss_tracker.result()))
        history.accuracy.append(float(trainer.accuracy_metric.result()))
        history.seconds.append(time.perf_counter() - start)
        trainer.reset_metrics()
        if on_block is not None:
            on_block(history)
    return history


_UNSUPPORTED = (
    ("backup_dir", None, "--backup-dir: not under parameter-server training"),
    ("fine_tune_epochs", 0, "--fine-tune-epochs: not under parameter-server training"),
    ("mixed_precision", False, "--mixed-precision: not under parameter-server training"),
    ("deterministic", False, "--deterministic: asynchronous updates cannot be reproduced"),
)
_NO_DISK_CACHE = "--cache disk: every worker would write the same cache files; use memory or none"


def check_config(config) -> None:
    """Raises `UsageError` for a `TrainConfig` option parameter-server training lacks.

    Raises:
        UsageError: one line naming the option, pointing to notebook 07.
    """
    for name, default, message in _UNSUPPORTED:
        if getattr(config, name) != default:
            raise UsageError(f"{message} (see notebooks/07_choosing_a_strategy.ipynb)")
    if config.cache == "disk":
        raise UsageError(f"{_NO_DISK_CACHE} (see notebooks/07_choosing_a_strategy.ipynb)")


def _dataset_fn(splits, image_size: int, batch_size: int, config):
    from mdtrain.augment import AugmentPolicy
    from mdtrain.pipeline import InputData

    def dataset_fn():
        # Built on each worker: a dataset made on the chief cannot be copied to one.
        inputs = InputData(
            splits,
            image_size,
            batch_size,
            seed=config.seed,
            augment=AugmentPolicy() if config.augment else None,
            # In each worker's memory: a disk cache would be one set of files for all.
            cache="none" if config.cache in ("none", False) else "memory",
        )
        # Unseeded: each worker visits the same batches in its own order.
        return inputs.train_epochs(0, 1).shuffle(64).repeat()

    return dataset_fn


def _val_accuracy(net, val_ds) -> float | None:
    if val_ds is None:
        return None
    right = total = 0
    for images, labels in val_ds:  # on the chief; the weights are read from the ps
        predicted = tf.argmax(net(images, training=False), axis=-1, output_type=tf.int32)
        right += int(tf.reduce_sum(tf.cast(predicted == labels, tf.int32)))
        total += int(labels.shape[0])
    return right / max(total, 1)


def train(
    config,
    resolver=None,
    *,
    log_every: int = 10,
    mark_after: int | None = None,
    mark_file: str | os.PathLike | None = None,
) -> dict:
    """Trains `config`'s model with parameter-server training; runs on the chief.

    What `mdtrain launch --workers N --ps M` runs in its chief. The run is
    `epochs × steps_per_epoch` steps of `global_batch_size` examples, shared
    by the workers as they come free.

    Args:
        config: a `mdtrain.train.TrainConfig`; `strategy` is ignored.
        resolver: the cluster. Defaults to None: `TF_CONFIG`'s.
        log_every: steps per point of the loss curve. Defaults to 10.
        mark_after: for a fault drill: after this many steps, create
            `mark_file` (a launcher may kill a worker then). Defaults to None.
        mark_file: the file to create. Defaults to None.

    Returns:
        A JSON-able summary: `steps`, `loss`, `accuracy`, `seconds` (per
        point), `steps_per_sec`, `scheduled`, `completed`, `val_accuracy`,
        `num_workers`, `num_ps`, `global_batch_size`, `num_train`, `class_names`.

    Raises:
        UsageError: for an option parameter-server training lacks, or bad data.

    Example:

    >>> train(TrainConfig(epochs=2), in_process_cluster())  # doctest: +SKIP
    """
    from mdtrain.data import load_splits
    from mdtrain.distribute import resolve_global_batch_size
    from mdtrain.imbalance import class_weights_for
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model
    from mdtrain.sources import ensure_demo_dataset

    config.validate()
    check_config(config)
    resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy, coord = coordinator(resolver)
    cluster = resolver.cluster_spec().as_dict()
    workers, servers = len(cluster.get("worker", [])), len(cluster.get("ps", []))
    data_dir = config.data if config.data is not None else str(ensure_demo_dataset())
    splits = load_splits(data_dir, config.val_data, config.validation_split, config.seed)
    batch = resolve_global_batch_size(1, config.batch_size_per_replica, config.global_batch_size)
    size, classes = config.resolved_image_size, splits.class_names
    weights = class_weights_for(config.class_weight, splits.train.counts(len(classes)))
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        net = build_model(config.model, len(classes), size, config.weights, config.dropout)
        trainer = ExactTrainer(net, class_weights=weights)
        trainer.compile(optimizer=keras.optimizers.Adam(config.learning_rate))
    num_steps = config.epochs * -(-len(splits.train) // batch)
    print(
        f"parameter-server training: {workers} worker(s), {servers} ps; {num_steps} steps "
        f"of {batch} examples, asynchronous",
        flush=True,
    )

    def report(history: PSHistory) -> None:
        if config.verbose:
            done, loss, accuracy = history.steps[-1], history.loss[-1], history.accuracy[-1]
            print(
                f"step {done}/{num_steps}: loss {loss:.4f} accuracy {accuracy:.3f} "
                f"({history.seconds[-1]:.1f} s)",
                flush=True,
            )
        if mark_after is not None and history.steps[-1] >= mark_after and mark_file:
            if not Path(mark_file).exists():
                Path(mark_file).touch()
                history.events.append(f"step {history.steps[-1]}: drill mark written")

    dataset_fn = _dataset_fn(splits, size, batch, config)
    history = train_steps(
        strategy, coord, trainer, dataset_fn, num_steps, log_every=log_every, on_block=report
    )
    summary = asdict(history) | {
        "steps_per_sec": history.steps_per_sec(),
        "num_workers": workers,
        "num_ps": servers,
        "global_batch_size": batch,
        "num_train": len(splits.train),
        "class_names": classes,
        "val_accuracy": _val_accuracy(net, _val_ds(splits, size, batch)),
    }
    if config.output:
        _write_outputs(config.output, net, summary)
    return summary


def _val_ds(splits, image_size: int, batch: int):
    from mdtrain.pipeline import InputData

    return InputData(splits, image_size, batch, augment=None, cache="none").val_ds


def _write_outputs(folder, net, summary: dict) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    net.save(out / "model.keras")
    (out / "report.json").write_text(json.dumps(summary, indent=1))


def run_local(
    train_args: list[str],
    num_workers: int = 2,
    num_ps: int = 1,
    *,
    log_every: int = 10,
    kill_worker: int | None = None,
    kill_after: int | None = None,
    stream=None,
    hang_timeout_s: float = 300.0,
) -> dict:
    """Runs parameter-server training as separate local processes; returns its summary.

    `mdtrain launch --workers N --ps M` from Python: ps, workers and the chief
    are processes on 127.0.0.1 with their own `TF_CONFIG`. For a fault drill,
    worker `kill_worker` is killed (SIGKILL) once `kill_after` steps are done.

    Args:
        train_args: `mdtrain train` arguments (`--data`, `--epochs`, ...).
        num_workers: workers. Defaults to 2.
        num_ps: parameter servers. Defaults to 1.
        log_every: steps per point of the loss curve. Defaults to 10.
        kill_worker: the worker to kill. Defaults to None: none.
        kill_after: steps after which to kill it. Defaults to None.
        stream: where the tasks' prefixed output goes. Defaults to None: `sys.stdout`.
        hang_timeout_s: stop after this many silent seconds. Defaults to 300.

    Returns:
        The chief's summary (see `train`) plus `exit_code`.

    Raises:
        UsageError: if the job fails.
    """
    import tempfile

    from mdtrain.launch import kill_worker_when, launch

    out = Path(tempfile.mkdtemp(prefix="mdtrain-ps-"))
    args = [*train_args, "--output", str(out / "run"), "--log-every", str(log_every)]
    if kill_worker is not None:
        args += ["--mark-after", str(kill_after or 1), "--mark-file", str(out / "mark")]
        kill_worker_when(out / "mark", kill_worker, timeout_s=hang_timeout_s)
    code = launch(
        num_workers,
        args,
        num_ps=num_ps,
        log_dir=out / "logs",
        stream=stream,
        hang_timeout_s=hang_timeout_s,
    )
    report = out / "run" / "report.json"
    if code != 0 or not report.exists():
        raise UsageError(f"parameter-server job failed with exit code {code}; logs in {out}")
    return json.loads(report.read_text()) | {"exit_code": code}


def _chief(argv: list[str]) -> int:
    import argparse

    from mdtrain.cli import build_parser
    from mdtrain.train import TrainConfig

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--log-every", type=int, default=10)
    extra.add_argument("--mark-after", type=int)
    extra.add_argument("--mark-file")
    ours, rest = extra.parse_known_args(argv)
    args = build_parser().parse_args(["train", *rest])
    options = {k: v for k, v in vars(args).items() if k not in ("command", "json")}
    summary = train(
        TrainConfig(**options),
        log_every=ours.log_every,
        mark_after=ours.mark_after,
        mark_file=ours.mark_file,
    )
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0


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
        print(f"mdtrain: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
