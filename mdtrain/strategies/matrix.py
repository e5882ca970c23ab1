"""The capability matrix: one `Row` per strategy, each probed in a fresh process.

Importing this module starts no TensorFlow; only the probes do
(`mdtrain.strategies.probes`), each in its own process bounded by a timeout.
"""

from __future__ import annotations

import json
import os
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
