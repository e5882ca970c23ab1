"""Which `tf.distribute` strategies work on this machine, measured: a capability matrix.

`capability_matrix()` runs every strategy the series' articles name on the
same small, fixed data, each in a fresh Python process bounded by a timeout
(so a hang is killed, and each gets its own virtual devices), and returns
one `Row` per strategy:

- does `fit` work (`mdtrain.loop.ExactTrainer.fit`, what `mdtrain train --loop fit` runs)?
- does mdtrain's custom loop work (`mdtrain.loop.custom_fit`; for parameter
  servers the coordinator loop of `mdtrain.ps`)?
- for synchronous strategies: are the final weights those of one device
  (`mdtrain.numerics.compare_with_reference` on `small-cnn`, up to float32
  rounding: below `TOLERANCE`)?
- what one training step costs (median, milliseconds);
- the error text, where something fails or hangs.

Importing this module starts no TensorFlow; only the probes do, each in
its own process. Run one probe by hand with `python -m mdtrain.strategies NAME`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

#: Probe names, in the matrix's order.
PROBES = ("one", "mirrored", "multiworker", "central", "ps", "ps-2-threads", "tpu")
LABELS = {
    "one": "OneDeviceStrategy",
    "mirrored": "MirroredStrategy",
    "multiworker": "MultiWorkerMirroredStrategy (2 local workers)",
    "central": "CentralStorageStrategy",
    "ps": "ParameterServerStrategy (2 workers + 1 ps, loopback)",
    "ps-2-threads": "ParameterServerStrategy, workers with 2 inter-op threads",
    "tpu": "TPUStrategy",
}
MODEL = "small-cnn"  # mdtrain's own model, batch normalization included
TOLERANCE = 1e-4  # as tests/test_numerics.py: rounding ~1e-5 with batch norm; a wrong scale ~1e-1


@dataclass
class Row:
    """One strategy's line of the matrix. `None` means "does not apply"."""

    probe: str
    strategy: str
    replicas: int | None = None
    fit: bool | None = None
    custom_loop: bool | None = None
    max_difference: float | None = None  # vs one device, of the custom loop's (else fit's) weights
    equal_to_one_device: bool | None = None
    step_ms: float | None = None
    status: str = "ok"  # ok | failed | hung | absent
    error: str | None = None
    note: str | None = None

    def cells(self) -> list[str]:
        """The row as table cells (see `format_matrix`)."""

        def yes(value: bool | None) -> str:
            return "-" if value is None else ("yes" if value else "NO")

        equal = yes(self.equal_to_one_device)
        if self.max_difference is not None:
            equal += f" ({self.max_difference:.0e})"
        step = "-" if self.step_ms is None else f"{self.step_ms:.0f}"
        return [
            self.strategy,
            str(self.replicas or "-"),
            yes(self.fit),
            yes(self.custom_loop),
            equal,
            step,
            self.status,
        ]


HEADER = ["strategy", "replicas", "fit", "custom loop", "weights = 1 device", "ms/step", "status"]


def format_matrix(rows: list[Row]) -> str:
    """The matrix as an aligned text table, then each row's error text, if any.

    Args:
        rows: what `capability_matrix` returned.

    Returns:
        The table, one line per strategy, and a numbered note per error.
    """
    table = [HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"- {row.probe}: {row.note}" for row in rows if row.note]
    notes += [f"- {row.probe}: {row.error}" for row in rows if row.error]
    return "\n".join(lines + ([""] + notes if notes else []))


def probe(name: str, *, timeout_s: float = 180.0, smoke: bool = False) -> Row:
    """Runs one strategy's probe in a fresh Python process and returns its row.

    Args:
        name: one of `PROBES`.
        timeout_s: the process is killed after this many seconds and the row
            says "hung". Defaults to 180.
        smoke: less data, for CI. Defaults to False.

    Returns:
        The `Row`.

    Raises:
        ValueError: for an unknown `name`.

    Example:
        >>> probe("one").fit  # doctest: +SKIP
        True
    """
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; choose one of {PROBES}")
    if name == "tpu" and not _tpu_hint():  # skip starting TensorFlow to find nothing
        return Row(name, LABELS[name], status="absent", error=NO_TPU)
    with tempfile.TemporaryDirectory(prefix="mdtrain-probe-") as tmp:
        result = Path(tmp) / "row.json"
        command = [sys.executable, "-m", "mdtrain.strategies", name, "--result", str(result)]
        command += ["--smoke"] if smoke else []
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            killed = f"no result within {timeout_s:.0f} s; the process was killed"
            return Row(name, LABELS[name], status="hung", error=killed)
        if result.exists():
            return Row(**json.loads(result.read_text()))
        tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        return Row(
            name,
            LABELS[name],
            status="failed",
            error=f"exit code {done.returncode}: {tail[0][:300]}",
        )


NO_TPU = "no TPU here (no TPU_NAME, COLAB_TPU_ADDR, /dev/accel0 or /dev/vfio/0)"


def _tpu_hint() -> bool:
    """What `mdtrain.distribute` checks before it asks TensorFlow for a TPU."""
    names = ("TPU_NAME", "COLAB_TPU_ADDR")
    return any(os.environ.get(n) for n in names) or any(
        os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")
    )


def capability_matrix(
    probes: tuple[str, ...] = PROBES, *, timeout_s: float = 180.0, smoke: bool = False
) -> list[Row]:
    """Runs every probe, one after the other, and returns the matrix.

    Args:
        probes: which strategies to try. Defaults to all of `PROBES`.
        timeout_s: per probe (see `probe`). Defaults to 180.
        smoke: less data, for CI. Defaults to False.

    Returns:
        One `Row` per probe, in order.

    Example:
        >>> print(format_matrix(capability_matrix()))  # doctest: +SKIP
    """
    return [probe(name, timeout_s=timeout_s, smoke=smoke) for name in probes]


def rows_to_dicts(rows: list[Row]) -> list[dict]:
    """The rows as plain dictionaries (JSON, a DataFrame)."""
    return [asdict(row) for row in rows]


# The probes: each runs in its own process (`python -m mdtrain.strategies NAME`).


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
    import threading

    import keras
    import numpy as np

    from mdtrain import ps
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model
    from mdtrain.numerics import train_weights

    threads = 2 if name == "ps-2-threads" else None
    strategy, coord = ps.coordinator(ps.in_process_cluster(2, 1, inter_op_threads=threads))
    compare = _datasets(smoke)[0]
    row = Row(name, LABELS[name], replicas=2)  # 2 workers, 1 replica each
    errors = []
    if threads is None:  # with 2 threads fit's first step would hang too
        for loop in ("fit", "custom"):
            try:
                train_weights(strategy, compare, loop=loop, epochs=1)
                row.fit = True if loop == "fit" else row.fit
            except Exception as error:  # noqa: BLE001  (a failing loop is a result)
                row.fit = False if loop == "fit" else row.fit
                errors.append(f"{'fit' if loop == 'fit' else 'custom_fit'}: {_first_line(error)}")
    with strategy.scope():
        trainer = ExactTrainer(build_model("small-cnn", 3, 32, dropout=0.0))
        trainer.compile(optimizer=keras.optimizers.SGD(0.05))
    steps = 24 if smoke else 60
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

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(wait_s)
    if "history" in done:
        h = done["history"]
        row.custom_loop = h.completed == steps and bool(np.isfinite(h.loss).all())
        row.step_ms = (h.seconds[-1] - h.seconds[0]) / (h.steps[-1] - h.steps[0]) * 1000
        row.note = (
            f"coordinator loop: {h.completed}/{steps} asynchronous steps, loss "
            f"{h.loss[0]:.2f} -> {h.loss[-1]:.2f}; weights cannot equal one device's"
        )
    elif "error" in done:
        row.custom_loop, row.status = False, "failed"
        errors.append(f"coordinator loop: {done['error']}")
    else:
        row.custom_loop, row.status = False, "hung"
        errors.append(f"coordinator loop: no step finished within {wait_s:.0f} s")
    if errors:
        row.status = row.status if row.status != "ok" else "partly"
        row.error = "; ".join(errors)
    return row


def _probe_multiworker(smoke: bool, result: Path) -> None:
    """Starts 2 local workers (`mdtrain.launch`) that each run `multiworker-worker`."""
    import io

    from mdtrain.launch import run_workers

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

    parser = argparse.ArgumentParser(description="run one strategy probe")
    parser.add_argument("name", choices=[*PROBES, "multiworker-worker"])
    parser.add_argument("--result", help="write the row here as JSON (default: print it)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    result = Path(args.result) if args.result else Path(tempfile.mkdtemp()) / "row.json"
    _run(args.name, result, args.smoke)
    if not args.result and result.exists():
        print(format_matrix([Row(**json.loads(result.read_text()))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
