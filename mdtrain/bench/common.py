"""What every benchmark shares: its dataset, the machine it ran on, its result files."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from mdtrain.errors import UsageError

#: Where `data=None` keeps the benchmark dataset (1500 training JPEGs of about 256 px).
BENCH_DATA = Path(os.environ.get("MDTRAIN_DATA_DIR", "data")) / "bench"


def machine_info() -> dict:
    """CPU count and model, load average, platform and library versions."""
    import tensorflow as tf

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "cpu_count": usable,
        "cpu_model": model,
        "load_average_1_5_15min": load,
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
    }


def bench_data(data: str | os.PathLike | None) -> Path:
    """The dataset folder a benchmark runs on.

    Args:
        data: a dataset folder, or None for the benchmark set under
            `BENCH_DATA` (1500 JPEGs of 5 classes at 256 px, made on first use).

    Returns:
        The folder's path.

    Raises:
        UsageError: If the folder does not exist.

    Example:
        >>> bench_data("data/demo")  # doctest: +SKIP
        PosixPath('data/demo')
    """
    if data is not None:
        data_dir = Path(data)
    else:
        from mdtrain.sources import ensure_demo_dataset

        data_dir = ensure_demo_dataset(BENCH_DATA, classes=5, per_class=300, image_size=256)
    if not data_dir.is_dir():
        raise UsageError(f"--data {data_dir}: not a directory")
    return data_dir


def check_positive(**values: int) -> None:
    """Checks that every keyword's value is a positive integer.

    Args:
        **values: settings by name, as the CLI spells them with `-` for `_`.

    Raises:
        UsageError: naming the first setting that is not a positive integer.

    Example:
        >>> check_positive(batch_size=32, repeats=0)
        Traceback (most recent call last):
        mdtrain.errors.UsageError: --repeats 0: must be a positive integer
    """
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} {value!r}: must be a positive integer")


def _output_paths(output, stem: str) -> tuple[Path, Path]:
    out = Path(output)
    if out.suffix == ".json":
        return out, out.with_suffix(".png")
    return out / f"{stem}.json", out / f"{stem}.png"


def write_result(
    result: dict,
    output: str | os.PathLike,
    stem: str,
    bars: dict[str, float],
    limit: float | None,
    title: str,
) -> None:
    """Saves a benchmark's result as JSON and its images per second as a bar chart.

    Args:
        result: what the benchmark returns; written with `json.dumps`.
        output: a folder (gets `{stem}.json` and `{stem}.png`) or a `.json`
            path (the PNG goes beside it).
        stem: the file name without suffix inside a folder `output`.
        bars: `{label: images per second}`, drawn in the order given
            (baselines first).
        limit: a ceiling drawn as a vertical line (raw decode speed), or None.
        title: the chart's title.

    Example:
        >>> write_result({"x": 1.0}, "out", "demo", {"x": 1.0}, None, "Demo")  # doctest: +SKIP
    """
    from mdtrain.plots import DPI, benchmark_bars

    json_path, png_path = _output_paths(output, stem)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    # The order given (baselines first); a log axis when a cached epoch dwarfs the rest.
    benchmark_bars(bars, limit=limit, title=title, order="given").savefig(png_path, dpi=DPI)
