"""The one output writer of a run: `model.keras`, `history.json`, `report.json`, `monitor.png`."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import keras

from mdtrain.errors import UsageError
from mdtrain.norm import swap_batch_norm


def write_outputs(
    output,
    net: keras.Model,
    history,
    report: dict | Callable[[], dict],
    chief: bool = True,
    chart: bytes | None = None,
) -> None:
    """Writes `model.keras`, `history.json`, a `chart` (`monitor.png`) and, last, `report.json`.

    `model.keras` holds Keras' own layers only (mdtrain's exact BatchNorm as
    Keras' `BatchNormalization`, the same at inference): it loads without mdtrain.

    Args:
        output: the folder, created if needed.
        net: the trained model.
        history: the rows of `history.json`.
        report: the report, or a function that gives it once the other
            files are written (so that it can say how long they took).
        chief: False on the other workers of a multi-worker run: saving can
            involve collectives, so they save too, into a temporary folder
            that is deleted. Defaults to True.
        chart: the monitor's chart as PNG bytes. Defaults to None (none).

    Raises:
        UsageError: when `output` cannot be written; everything is then
            saved to a new temporary folder, which the message names.
    """

    def save(out: Path) -> None:
        swap_batch_norm(net, keras.layers.BatchNormalization).save(out / "model.keras")
        (out / "history.json").write_text(json.dumps(history, indent=1))
        if chart is not None:
            (out / "monitor.png").write_bytes(chart)
        written = report() if callable(report) else report
        (out / "report.json").write_text(json.dumps(written, indent=1))

    if not chief:
        scratch = tempfile.TemporaryDirectory(prefix="mdtrain-worker-", ignore_cleanup_errors=True)
        with scratch as out:
            return save(Path(out))
    try:
        Path(output).mkdir(parents=True, exist_ok=True)
        save(Path(output))
    except OSError as e:  # to a new temporary folder, named in the error
        rescue = Path(tempfile.mkdtemp(prefix="mdtrain-run-"))
        save(rescue)
        raise UsageError(
            f"--output {output}: cannot write ({e.strerror or e}); "
            f"the run's outputs were saved to {rescue} instead"
        ) from None
