"""What the benchmark scripts share: their dataset, the machine, result files and chart.

Imported by the scripts beside it (`python benchmarks/pipeline.py` puts this
folder on `sys.path`); mdtrain itself must be importable (installed, or the
repository root on `PYTHONPATH`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from matplotlib.figure import Figure

from mdtrain.errors import UsageError
from mdtrain.plots.common import DPI, WRONG_COLOR, new_figure

#: Where `data=None` keeps the benchmark dataset (1500 training JPEGs of about 256 px).
BENCH_DATA = Path(os.environ.get("MDTRAIN_DATA_DIR", "data")) / "bench"
REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at commit `ref`, removed on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "before"
        git = ["git", "-C", str(REPO), "worktree"]
        subprocess.run([*git, "add", "--detach", str(path), ref], check=True, capture_output=True)
        try:
            yield path
        finally:
            subprocess.run([*git, "remove", "--force", str(path)], check=False)


def package_env(source: Path) -> dict[str, str]:
    """The environment of a process that imports mdtrain from `source`, on the CPU, quietly."""
    return {**os.environ, "PYTHONPATH": str(source), "TF_CPP_MIN_LOG_LEVEL": "2",
            "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip


def last_json(command: list[str], source: Path) -> tuple[dict, float]:
    """Runs `command` with `source`'s mdtrain; its last stdout line as JSON, and its seconds.

    The seconds run from the start to the exit of the process, on `time.perf_counter`.
    """
    start = time.perf_counter()
    done = subprocess.run(command, env=package_env(source), cwd=REPO, capture_output=True,
                          text=True)  # fmt: skip
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed ({done.returncode}) with {source}:\n"
                         f"{done.stderr[-2000:]}")  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1]), seconds


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
    json_path, png_path = _output_paths(output, stem)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    # The order given (baselines first); a log axis when a cached epoch dwarfs the rest.
    benchmark_bars(bars, limit=limit, title=title, order="given").savefig(png_path, dpi=DPI)


# ------------------------------------------------------------------ chart
#: `log=None` switches to a log axis when the largest bar is this many times the smallest.
LOG_SPAN = 30.0


def benchmark_bars(
    results: Mapping[str, float],
    limit: float | None = None,
    title: str = "Input pipeline",
    order: str = "value",
    log: bool | None = None,
) -> Figure:
    """Horizontal bars of images/second per configuration.

    Args:
        results: `{configuration: images per second}`.
        limit: optional ceiling to draw as a vertical line (e.g. raw decode
            speed on all cores). Defaults to None.
        title: figure title. Defaults to "Input pipeline".
        order: `"value"` (fastest on top) or `"given"` (the mapping's order,
            first on top: steps read in the order they were taken). Defaults
            to `"value"`.
        log: log-scaled axis; None chooses it when one bar is more than
            `LOG_SPAN` times another, so the small ones stay readable.
            Defaults to None.

    Returns:
        The figure: one bar per configuration, labelled with its value.

    Raises:
        ValueError: for an `order` other than `"value"` or `"given"`.

    Example:

    >>> fig = benchmark_bars({"a": 100.0, "b": 5000.0}, order="given")  # doctest: +SKIP
    """
    if order not in ("value", "given"):
        raise ValueError(f"order {order!r}: expected 'value' or 'given'")
    items = list(results.items())
    items = sorted(items, key=lambda kv: kv[1]) if order == "value" else items[::-1]
    names = [k for k, _ in items]
    values = [float(v) for _, v in items]
    fig = new_figure((7.0, 0.45 * len(items) + 1.3))
    ax = fig.subplots()
    bars = ax.barh(names, values, color="#4c72b0")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=2)
    if limit is not None:
        ax.axvline(
            limit, color=WRONG_COLOR, linestyle="--", linewidth=1.2, label="raw decode limit"
        )
        ax.legend(fontsize=8, loc="lower right")
    positive = [v for v in [*values, limit or 0.0] if v > 0]
    if log is None:
        log = bool(positive) and max(positive) > LOG_SPAN * min(positive)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 4)
        ax.set_xlabel("images / second (log scale)")
    else:
        top = max([*values, limit or 0.0])
        ax.set_xlim(0, top * 1.18 if top > 0 else 1)
        ax.set_xlabel("images / second")
    # Over the figure, not the axes: long bar labels narrow the axes, and a title
    # centred over them would run off the figure's right edge.
    fig.suptitle(title, fontsize=11)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def run_main(main: Callable[[], object]) -> None:
    """Runs a script's `main`; a `UsageError` ends it with one line and exit code 2."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ chatter, as the CLI
    try:
        main()
    except UsageError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        sys.exit(2)
