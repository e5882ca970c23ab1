"""The monitor's report: the verdict, the summary, its words and chart, and where they show.

The text fallback (terminals, CI, smoke runs), the summary and the dashboard
all format their figures here, so a figure reads the same in each.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from mdtrain.choices import MONITOR_DISPLAYS
from mdtrain.monitor.sampler import DeviceSample, Sample


def verdict(
    input_wait_share: float | None,
    gpu_utilization: float | None,
    *,
    augments_on_device: bool = False,
    mixed_precision: bool = False,
    cached: bool = False,
    prefetched: bool = False,
    in_memory: bool = False,
) -> str:
    """Says in words what limits training speed, and what to try.

    The first word is one of ``input-bound``, ``compute-bound``,
    ``under-used`` or ``unknown``, so code can branch on it; the evidence and
    thresholds: docs/figures.md, "The verdict".

    Args:
        input_wait_share: Share (0-1) of each step spent waiting for input, or
            ``None`` when unknown.
        gpu_utilization: Mean utilisation (0-100) over the GPUs, or ``None``
            without a GPU.
        augments_on_device: Whether the training step augments already
            (``mdtrain train``'s default, ``--augment-in model``), so the advice leaves
            moving it there out. Defaults to ``False``.
        mixed_precision: Whether the run computes in mixed precision already,
            so the advice leaves it out. Defaults to ``False``.
        cached: Whether the training dataset is cached already
            (``Dataset.cache`` upstream), so the advice leaves it out. Defaults to ``False``.
        prefetched: Whether it is prefetched already, likewise. Defaults to ``False``.
        in_memory: Whether it only slices, shuffles and batches tensors held in memory,
            so there is nothing to cache or to move onto the device. Defaults to ``False``.

    Returns:
        One sentence.

    Example:

    >>> verdict(0.38, 41.0).split(" — ")[0]
    'input-bound (highly): the devices waited 38% of each step'
    """
    fixes = _input_fixes(augments_on_device, cached, prefetched, in_memory)
    wait = input_wait_share
    # The thresholds of TensorFlow's profiler (its input-pipeline analyzer): 20% and 5%.
    if wait is not None and wait >= 0.05:
        degree = "highly" if wait >= 0.20 else "moderately"
        return f"input-bound ({degree}): the devices waited {wait:.0%} of each step — {fixes}"
    if gpu_utilization is not None:
        util = f"the GPUs averaged {gpu_utilization:.0f}% utilisation"
        if wait is not None:
            util += f" and waited {wait:.0%} of each step on input"
        if gpu_utilization >= 70.0:
            return f"compute-bound: {util} — the input pipeline keeps up"
        if gpu_utilization < 40.0 and wait is None:
            return (
                f"input-bound (likely): {util} with no input-wait figure — "
                f"{fixes}, or train on monitor.watch(dataset) to measure the wait"
            )
        precision = "" if mixed_precision else "use mixed precision, "
        return (
            f"under-used: {util} — raise the batch size, {precision}"
            "or look for host-side work between steps"
        )
    if wait is not None:
        return (
            f"compute-bound: the loop waited {wait:.0%} of each step on input — "
            "the input pipeline keeps up (no GPU to sample)"
        )
    return (
        "unknown: no input-wait figure and no GPU to sample — train on "
        "monitor.watch(dataset) (fit or a custom loop) to measure the wait"
    )


def _input_fixes(augments_on_device: bool, cached: bool, prefetched: bool, in_memory: bool) -> str:
    """What to try for an input-bound run, leaving out what it does already or has no use for."""
    todo = [] if cached or in_memory else ["cache the dataset"]
    todo += [] if prefetched else ["prefetch"]
    last = (
        "give the input pipeline more CPU cores"
        if augments_on_device or in_memory
        else "move augmentation onto the device"
    )
    return ", ".join(todo) + ("," if len(todo) > 1 else "") + (" or " if todo else "") + last


@dataclass(frozen=True)
class Rates:
    """Throughput over some steps; a figure is ``None`` where nothing was measured.

    Args:
        steps: Every step trained, compiling calls included.
        images: Every global example trained on, likewise.
        seconds: The training time the rates divide by: the epochs' wall
            time less validation and the left-out calls.
        images_per_sec: ``images`` over ``seconds``.
        step_time_s: ``seconds`` per step.
        input_wait_share: The timed calls' share of time spent waiting for
            input, or ``None`` where the wait was not measured.
        left_out_steps: Steps of the calls that traced and compiled. Defaults to ``0``.
        left_out_s: Their seconds beyond what a like call takes: the compiling,
            left out of ``seconds``. Defaults to ``0.0``.
        validation_s: Seconds of validation, reported on their own. Defaults to ``0.0``.
    """

    steps: int
    images: int
    seconds: float
    images_per_sec: float | None
    step_time_s: float | None
    input_wait_share: float | None
    left_out_steps: int = 0
    left_out_s: float = 0.0
    validation_s: float = 0.0


@dataclass(frozen=True)
class DeviceSummary:
    """Utilisation and memory of one device over a run.

    Args:
        name: Display name, e.g. ``"GPU 0 (NVIDIA T4)"`` or ``"CPU"``.
        kind: ``"gpu"`` or ``"cpu"``.
        mean_utilization: Mean utilisation in percent, or ``None``.
        peak_utilization: Highest utilisation in percent, or ``None``.
        peak_memory_used: Highest bytes in use as the driver sees them (for a
            GPU: what TensorFlow's allocator reserved), or ``None``.
        memory_total: Bytes available, or ``None``.
    """

    name: str
    kind: str
    mean_utilization: float | None
    peak_utilization: float | None
    peak_memory_used: int | None
    memory_total: int | None


@dataclass(frozen=True)
class Summary(Rates):
    """What a training run used and how fast it went: throughput, devices and verdict.

    Args:
        steps, images, seconds, images_per_sec, step_time_s, input_wait_share,
            left_out_steps, left_out_s, validation_s: The run's throughput (`Rates`).
        devices: One `DeviceSummary` per GPU, then the CPU. Defaults to ``()``.
        allocator_peaks: ``(device, bytes)`` per TensorFlow GPU: the most its
            allocator held for tensors during the run
            (``tf.config.experimental.get_memory_info``), what the model
            really used. Defaults to ``()``.
        no_gpu: Why no GPU was sampled (NVML missing, no GPU), or ``""``.
            Defaults to ``""``.
        verdict: One sentence from `verdict`. Defaults to ``""``.
    """

    devices: tuple[DeviceSummary, ...] = ()
    allocator_peaks: tuple[tuple[str, int], ...] = ()
    no_gpu: str = ""
    verdict: str = ""

    @property
    def gpu_utilization(self) -> float | None:
        """Mean utilisation over all GPUs, or ``None`` without one."""
        values = [
            d.mean_utilization
            for d in self.devices
            if d.kind == "gpu" and d.mean_utilization is not None
        ]
        return sum(values) / len(values) if values else None

    def to_dict(self) -> dict:
        """Plain types only, ready for ``json.dumps``."""
        return asdict(self)

    def __str__(self) -> str:
        """The multi-line text form printed at the end of training."""
        lines = [f"mdtrain monitor: {self.steps} steps, {', '.join(rate_figures(self))}"]
        lines.append(f"  timing: {timing_text(self)}")
        for device in self.devices:
            memory = memory_text(device.peak_memory_used, device.memory_total)
            util = (
                f"mean {percent(device.mean_utilization)}, peak {percent(device.peak_utilization)}"
            )
            lines.append(f"  {device.name}: {util}" + (f", peak memory {memory}" if memory else ""))
        if self.no_gpu:
            lines.append(f"  GPU: none sampled ({self.no_gpu})")
        if self.allocator_peaks:
            peaks = ", ".join(f"{gpu} {used / 2**30:.1f} GiB" for gpu, used in self.allocator_peaks)
            reserved = "NVML's figure is what its allocator reserved"
            lines.append(f"  TensorFlow's peak memory: {peaks} ({reserved})")
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)


def summarize(
    rates: Rates,
    samples: Sequence[Sample],
    *,
    since: float | None = None,
    allocator_peaks: tuple[tuple[str, int], ...] = (),
    no_gpu: str = "",
    **known: bool,
) -> Summary:
    """The run's `Summary` from its rates and device samples, verdict included.

    ``known`` (what the run does already: ``augments_on_device``, ...) goes to `verdict`;
    ``since`` (``Sample.time``'s clock) keeps only the driver's own samples
    taken from then on; ``allocator_peaks`` and ``no_gpu`` go into the summary as they are.
    """
    names = dict.fromkeys(d.name for s in samples for d in s.devices)
    devices = tuple(_device_summary(name, samples, since) for name in names)
    run = Summary(
        **asdict(rates), devices=devices, allocator_peaks=tuple(allocator_peaks), no_gpu=no_gpu
    )
    said = verdict(run.input_wait_share, run.gpu_utilization, **known)
    return replace(run, verdict=said)


def _device_summary(name: str, samples: Sequence[Sample], since: float | None) -> DeviceSummary:
    readings = [d for s in samples for d in s.devices if d.name == name]
    # The driver's own samples where it keeps them (NVML: every 1/6 s or so), else our readings.
    busy = [value for d in readings for when, value in d.busy if since is None or when >= since]
    utils = busy or [d.utilization for d in readings if d.utilization is not None]
    mems = [d.memory_used for d in readings if d.memory_used is not None]
    totals = [d.memory_total for d in readings if d.memory_total is not None]
    return DeviceSummary(
        name=name,
        kind=readings[0].kind,
        mean_utilization=sum(utils) / len(utils) if utils else None,
        peak_utilization=max(utils) if utils else None,
        peak_memory_used=max(mems) if mems else None,
        memory_total=totals[-1] if totals else None,
    )


def epoch_line(epoch: int, epochs: int | None, summary: Summary) -> str:
    """``"epoch 2/5: 50 steps, 1234.5 images/sec, step 25.9 ms, ..."``; ``epoch`` counts from 0."""
    util = ", ".join(
        f"{short_name(d.name)} {percent(d.mean_utilization)}"
        for d in summary.devices
        if d.mean_utilization is not None
    )
    return (
        f"epoch {count(epoch + 1, epochs)}: {summary.steps} steps, "
        f"{', '.join(rate_figures(summary))}, util {util or 'n/a'}"
    )


def timing_text(rates: Rates) -> str:
    """What the rates' seconds hold and leave out, in words."""
    text = f"{rates.seconds:.1f} s of training, epoch boundaries included"
    if rates.left_out_steps:
        text += (
            f"; left out: {rates.left_out_s:.1f} s of tracing and compiling (in the first call "
            f"of each batch size, {rates.left_out_steps} steps)"
        )
    if rates.validation_s:
        text += f"; validation {rates.validation_s:.1f} s, on its own"
    return text


def rate_figures(rates: Rates) -> list[str]:
    """``["1234.5 images/sec", "step 25.9 ms", "input wait 12%"]``: ``n/a``, or ``unknown`` wait."""
    ips = f"{rates.images_per_sec:.1f}" if rates.images_per_sec is not None else "n/a"
    step = f"{rates.step_time_s * 1000:.1f} ms" if rates.step_time_s is not None else "n/a"
    share = rates.input_wait_share
    wait = f"{share:.0%}" if share is not None else "unknown"
    return [f"{ips} images/sec", f"step {step}", f"input wait {wait}"]


def device_text(d: DeviceSample) -> str:
    """``"87% · 4.0/16.0 GiB · 70 W · 60°C"``: what the device reports now."""
    parts = [
        percent(d.utilization),
        memory_text(d.memory_used, d.memory_total),
        f"{d.power_w:.0f} W" if d.power_w is not None else None,
        f"{d.temperature_c:.0f}°C" if d.temperature_c is not None else None,
    ]
    return " · ".join(p for p in parts if p)


def percent(value: float | None) -> str:
    """``"87%"``, or ``"n/a"`` for ``None``."""
    return f"{value:.0f}%" if value is not None else "n/a"


def memory_text(used: int | None, total: int | None) -> str | None:
    """``"4.0/16.0 GiB"``, or ``None`` when either figure is unknown."""
    if used is None or not total:
        return None
    return f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB"


def short_name(name: str) -> str:
    """``"GPU 0"`` for ``"GPU 0 (NVIDIA T4)"``."""
    return name.split(" (")[0]


def count(n: int, total: int | None) -> str:
    """``"2/5"``, or ``"2"`` when the total is unknown."""
    return f"{n}/{total}" if total else f"{n}"


def in_notebook_kernel() -> bool:
    """Whether this code runs inside an IPython kernel (Jupyter, Colab, Kaggle), not a terminal."""
    if "IPython" not in sys.modules:  # never import IPython just to ask
        return False
    try:
        shell = sys.modules["IPython"].get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def resolve_display(display: str = "auto") -> str:
    """``display`` as ``"widget"``, ``"text"`` or ``"none"``; ``"auto"``: widget in a kernel."""
    if display not in MONITOR_DISPLAYS:
        raise ValueError(f"display must be one of {', '.join(MONITOR_DISPLAYS)}; got {display!r}")
    if display != "auto":
        return display
    smoke = os.environ.get("MDTRAIN_SMOKE", "") not in ("", "0")  # CI logs want text
    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    return "widget" if in_notebook_kernel() and has_widgets and not smoke else "text"


class Chart:
    """The run's images/sec and each device's utilisation over time, as PNG bytes."""

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        # A bare Figure, no pyplot: safe off the main thread, the notebook's backend left be.
        self.figure = Figure(figsize=(8, 2.4))
        self.canvas = FigureCanvasAgg(self.figure)
        self.rate_ax, self.util_ax = self.figure.subplots(1, 2)
        self.figure.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.88, wspace=0.2)
        (self.rate_line,) = self.rate_ax.plot([], [], color="tab:blue")
        self.rate_ax.set_title("images/sec", fontsize=10)
        self.util_ax.set_title("utilisation %", fontsize=10)
        self.util_ax.set_ylim(0, 105)
        for ax in (self.rate_ax, self.util_ax):
            ax.set_xlabel("seconds", fontsize=8)
            ax.tick_params(labelsize=7)
            # Tick labels are most of a redraw's cost: keep few.
            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.yaxis.set_major_locator(MaxNLocator(4))
        self.util_lines: dict[str, object] = {}
        self._lock = threading.Lock()  # the dashboard's thread and the end of the run

    def render(
        self,
        rates: Sequence[tuple[float, float]],
        samples: Sequence[Sample],
        t0: float,
        dpi: int = 72,
    ) -> bytes:
        """PNG bytes of ``(time, images_per_sec)`` points and device samples, from ``t0`` on."""
        with self._lock:
            self.figure.dpi = dpi  # 72 live (cheaper redraws), more for the picture that stays
            rated = _thin([(t - t0, r) for t, r in rates])
            self.rate_line.set_data([t for t, _ in rated], [r for _, r in rated])
            self.rate_ax.set_ylim(0, 1.1 * max((r for _, r in rated), default=0.0) or 1.0)
            samples = _thin(list(samples))
            for name in dict.fromkeys(d.name for s in samples for d in s.devices):
                if name not in self.util_lines:
                    (self.util_lines[name],) = self.util_ax.plot([], [], label=short_name(name))
                    self.util_ax.legend(fontsize=7, loc="lower right")
                series = [
                    (s.time - t0, d.utilization)
                    for s in samples
                    for d in s.devices
                    if d.name == name and d.utilization is not None
                ]
                self.util_lines[name].set_data([t for t, _ in series], [u for _, u in series])
            end = max([1.0, *(t for t, _ in rated[-1:]), *(s.time - t0 for s in samples[-1:])])
            for ax in (self.rate_ax, self.util_ax):
                ax.set_xlim(0, end)
            buf = io.BytesIO()
            self.canvas.print_png(buf)
            return buf.getvalue()


def _thin(points: list, most: int = 150) -> list:
    """At most ``most`` of ``points``, evenly spaced: more than the figure's pixels buys nothing."""
    if len(points) <= most:
        return points
    return [points[round(i * (len(points) - 1) / (most - 1))] for i in range(most)]
