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


def _bench_data(data) -> Path:
    if data is not None:
        return Path(data)
    from mdtrain.sources import ensure_demo_dataset

    return ensure_demo_dataset(BENCH_DATA, classes=5, per_class=300, image_size=256)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} {value!r}: must be a positive integer")


def _output_paths(output, stem: str) -> tuple[Path, Path]:
    out = Path(output)
    if out.suffix == ".json":
        return out, out.with_suffix(".png")
    return out / f"{stem}.json", out / f"{stem}.png"


def _write(result: dict, output, stem: str, bars: dict, limit: float | None, title: str) -> None:
    from mdtrain.plots import DPI, benchmark_bars

    json_path, png_path = _output_paths(output, stem)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    # The order given (baselines first); a log axis when a cached epoch dwarfs the rest.
    benchmark_bars(bars, limit=limit, title=title, order="given").savefig(png_path, dpi=DPI)
