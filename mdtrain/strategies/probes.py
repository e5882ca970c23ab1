"""The probes of the capability matrix, each run in its own process.

`python -m mdtrain.strategies NAME [--result FILE] [--smoke]` runs one
(`main`): it trains `MODEL` under the strategy NAME and writes its `Row` as
JSON. `multiworker` starts two local workers that each run
`multiworker-worker`; the `ps` probes start an in-process cluster.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from mdtrain.strategies.matrix import LABELS, MODEL, PROBES, TOLERANCE, Row, format_matrix


def _first_line(error: BaseException) -> str:
    """The error's type and its most telling line (TensorFlow puts a traceback first)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("File ", "in user code"))]
    lines = [line for line in lines if not line.startswith(("raise ", "return ", "outputs = "))]
    told = [line for line in lines if re.search(r"Error|must|cannot|not supported", line)]
    return f"{type(error).__name__}: {(told or lines or [''])[-1][:240]}"


def _datasets(smoke: bool):
    """(fixed data for the weight comparison, data for timing)."""
    from mdtrain.numerics import fixed_dataset

    compare = fixed_dataset(20 if smoke else 36, 8, image_size=16)  # last batch 4 or 4: split 2/2
    timing = fixed_dataset(48, 16, image_size=32, seed=1)
    return compare, timing


def _step_ms(strategy, dataset, steps: int = 10) -> float:
    """Milliseconds per compiled step: `steps` steps timed together, after 2 warm-up steps."""
    import time

    import keras

    from mdtrain.loop import ExactTrainer, build_optimizer, compiled_step
    from mdtrain.models import build_model

    with strategy.scope():
        trainer = ExactTrainer(build_model("small-cnn", 3, 32, dropout=0.0))
        trainer.compile(optimizer=keras.optimizers.SGD(0.01))
    build_optimizer(trainer)
    dist = strategy.experimental_distribute_dataset(dataset.repeat())
    step = compiled_step(strategy, trainer.train_step, dist.element_spec)
    iterator = iter(dist)
    for _ in range(2):
        step(next(iterator))
    start = time.perf_counter()
    for _ in range(steps):
        step(next(iterator))
    float(trainer.net.trainable_variables[0][0, 0, 0, 0])  # waits for the last step
    return (time.perf_counter() - start) / steps * 1000


def _sync_row(name: str, strategy, smoke: bool) -> Row:
    """fit and custom loop vs one device, and the step cost, for a synchronous strategy."""
    from mdtrain.distribute import make_strategy
    from mdtrain.numerics import compare_with_reference

    compare, timing = _datasets(smoke)
    reference = make_strategy("one")  # the GPU where there is one: same kernels as the replicas
    # One epoch at a small step: over many steps of SGD on random labels, rounding
    # differences grow chaotically (2 epochs at 0.1: 5e-2), which says nothing of the sums.
    fit, custom = compare_with_reference(
        [strategy], compare, reference=reference, epochs=1, learning_rate=0.01, model=MODEL
    )
    row = Row(
        name,
        LABELS[name],
        replicas=strategy.num_replicas_in_sync,
        fit=fit.error is None,
        custom_loop=custom.error is None,
    )
    ran = custom if custom.error is None else fit
    if ran.error is None:
        row.max_difference = ran.difference
        row.equal_to_one_device = ran.difference <= TOLERANCE
    runs = (("fit", fit), ("custom loop", custom))
    errors = [f"{what}: {c.error}" for what, c in runs if c.error]
    try:
        row.step_ms = _step_ms(strategy, timing, steps=3 if smoke else 10)
    except Exception as error:  # noqa: BLE001  (a failing strategy is a result)
        errors.append(f"step timing: {_first_line(error)}")
    if errors:
        row.status = "partly" if row.fit or row.custom_loop else "failed"
        row.error = "; ".join(errors)
    return row


def _probe_local(name: str, smoke: bool) -> Row:
    """one, mirrored, central, tpu: strategies of this one process."""
    from mdtrain.distribute import configure_devices, make_strategy
    from mdtrain.errors import UsageError

    if name == "tpu":
        try:
            strategy = make_strategy("tpu")
        except UsageError as error:
            return Row(name, LABELS[name], status="absent", error=str(error))
        return _sync_row(name, strategy, smoke)
    configure_devices("cpu:2")  # 2 virtual CPU devices: real replicas without a GPU
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    devices = gpus or ["/cpu:0", "/cpu:1"]
    if name == "one":
        strategy = make_strategy("one")
    elif name == "mirrored":
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        strategy = tf.distribute.experimental.CentralStorageStrategy(
            devices, parameter_device="/cpu:0"
        )
    return _sync_row(name, strategy, smoke)


def _probe_ps(name: str, smoke: bool, wait_s: float) -> Row:
    """Parameter servers on loopback: Keras fit, custom_fit, and the coordinator loop."""
    from mdtrain import ps

    threads = 2 if name == "ps-2-threads" else None
    strategy, coord = ps.coordinator(ps.in_process_cluster(2, 1, inter_op_threads=threads))
    compare = _datasets(smoke)[0]
    row = Row(name, LABELS[name], replicas=2)  # 2 workers, 1 replica each
    errors = []
    if threads is None:  # with 2 threads fit's first step would hang too
        errors += _try_keras_loops(strategy, compare, row)
    steps = 24 if smoke else 60
    done = _run_coordinator_loop(strategy, coord, smoke, steps, wait_s)
    errors += _read_coordinator_loop(row, done, steps, wait_s)
    if errors:
        row.status = row.status if row.status != "ok" else "partly"
        row.error = "; ".join(errors)
    return row


def _try_keras_loops(strategy, compare, row: Row) -> list[str]:
    """Trains with `fit` and with `custom_fit`; sets `row.fit`; returns their errors."""
    from mdtrain.numerics import train_weights

    errors = []
    for loop in ("fit", "custom"):
        try:
            train_weights(strategy, compare, loop=loop, epochs=1)
            row.fit = True if loop == "fit" else row.fit
        except Exception as error:  # noqa: BLE001  (a failing loop is a result)
            row.fit = False if loop == "fit" else row.fit
            errors.append(f"{'fit' if loop == 'fit' else 'custom_fit'}: {_first_line(error)}")
    return errors


def _run_coordinator_loop(strategy, coord, smoke: bool, steps: int, wait_s: float) -> dict:
    """`{"history": ...}` or `{"error": ...}` of `steps` steps; `{}` if none ended in `wait_s`."""
    import threading

    import keras

    from mdtrain import ps
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    with strategy.scope():
        trainer = ExactTrainer(build_model("small-cnn", 3, 32, dropout=0.0))
        trainer.compile(optimizer=keras.optimizers.SGD(0.05))
    done: dict = {}

    def run() -> None:
        try:
            done["history"] = ps.train_steps(
                strategy,
                coord,
                trainer,
                lambda: _datasets(smoke)[1].repeat(),
                steps,
                log_every=steps // 4,
            )  # the dataset is made on each worker: one made here cannot be sent there
        except Exception as error:  # noqa: BLE001
            done["error"] = _first_line(error)

    # A thread, so a hung step (the thread-pool trap) is a result instead of a hang here.
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(wait_s)
    return done


def _read_coordinator_loop(row: Row, done: dict, steps: int, wait_s: float) -> list[str]:
    """Fills the row's custom-loop cells from `done`; returns the loop's error, if any."""
    import numpy as np

    if "history" in done:
        h = done["history"]
        row.custom_loop = h.completed == steps and bool(np.isfinite(h.loss).all())
        row.step_ms = (h.seconds[-1] - h.seconds[0]) / (h.steps[-1] - h.steps[0]) * 1000
        row.note = (
            f"coordinator loop: {h.completed}/{steps} asynchronous steps, loss "
            f"{h.loss[0]:.2f} -> {h.loss[-1]:.2f}; weights cannot equal one device's"
        )
        return []
    if "error" in done:
        row.custom_loop, row.status = False, "failed"
        return [f"coordinator loop: {done['error']}"]
    row.custom_loop, row.status = False, "hung"
    return [f"coordinator loop: no step finished within {wait_s:.0f} s"]


def _probe_multiworker(smoke: bool, result: Path) -> None:
    """Starts 2 local workers (`mdtrain.launcher`) that each run `multiworker-worker`."""
    import io

    from mdtrain.launcher import run_workers

    command = [
        sys.executable,
        "-m",
        "mdtrain.strategies",
        "multiworker-worker",
        "--result",
        str(result),
    ] + (["--smoke"] if smoke else [])
    log = io.StringIO()
    code = run_workers(command, 2, hang_timeout_s=150, stream=log, gpus_per_worker=None)
    if code != 0 and not result.exists():
        last = [line for line in log.getvalue().splitlines() if line.strip()][-1:] or [""]
        row = Row(
            "multiworker",
            LABELS["multiworker"],
            replicas=2,
            status="failed",
            error=f"launcher exit code {code}: {last[0][:240]}",
        )
        result.write_text(json.dumps(asdict(row)))


def _run(name: str, result: Path, smoke: bool) -> None:
    if name == "multiworker":
        _probe_multiworker(smoke, result)
        return
    if name == "multiworker-worker":
        from mdtrain.distribute import multiworker_strategy

        strategy = multiworker_strategy()
        row = _sync_row("multiworker", strategy, smoke)
        if os.environ.get("MDTRAIN_WORKER_INDEX", "0") == "0":  # the chief reports
            result.write_text(json.dumps(asdict(row)))
        return
    if name.startswith("ps"):
        # A step takes well under a second once traced (the ps row); 20-30 s is a hang.
        hang_s = 20 if smoke else 30
        row = _probe_ps(name, smoke, wait_s=hang_s if name == "ps-2-threads" else 120)
        result.write_text(json.dumps(asdict(row)))
        print(format_matrix([row]), flush=True)
        os._exit(0)  # in-process servers cannot be stopped; a hung step holds a thread
    result.write_text(json.dumps(asdict(_probe_local(name, smoke))))


def main(argv: list[str] | None = None) -> int:
    """`python -m mdtrain.strategies NAME [--result FILE] [--smoke]`: one probe."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mdtrain.strategies", description="run one strategy probe"
    )
    names = [*PROBES, "multiworker-worker"]
    parser.add_argument("name", choices=names, help=f"the probe: {', '.join(names)}")
    parser.add_argument("--result", help="write the row here as JSON (default: print it)")
    parser.add_argument("--smoke", action="store_true", help="less data, for CI")
    args = parser.parse_args(argv)
    result = Path(args.result) if args.result else Path(tempfile.mkdtemp()) / "row.json"
    _run(args.name, result, args.smoke)
    if not args.result and result.exists():
        print(format_matrix([Row(**json.loads(result.read_text()))]))
    return 0
