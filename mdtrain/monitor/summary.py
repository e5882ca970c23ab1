"""The after-training report: per-device utilisation, throughput, verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from mdtrain.monitor.samples import Sample
from mdtrain.monitor.throughput import Rates
from mdtrain.monitor.verdict import verdict


@dataclass(frozen=True)
class DeviceSummary:
    """Utilisation and memory of one device over a run.

    Args:
        name: Display name, e.g. ``"GPU 0 (NVIDIA T4)"`` or ``"CPU"``.
        kind: ``"gpu"`` or ``"cpu"``.
        mean_utilization: Mean utilisation in percent, or ``None``.
        peak_utilization: Highest utilisation in percent, or ``None``.
        peak_memory_used: Highest bytes in use, or ``None``.
        memory_total: Bytes available, or ``None``.
    """

    name: str
    kind: str
    mean_utilization: float | None
    peak_utilization: float | None
    peak_memory_used: int | None
    memory_total: int | None


@dataclass(frozen=True)
class Summary:
    """What a training run used and how fast it went.

    Args:
        devices: One `DeviceSummary` per GPU, then the CPU.
        steps: Steps measured (warm-up excluded).
        images: Global examples in those steps.
        images_per_sec: Mean throughput, or ``None``.
        step_time_s: Mean step time in seconds, or ``None``.
        input_wait_share: Share (0-1) of step time spent waiting for input,
            or ``None`` when unknown (``model.fit``).
        verdict: One sentence from `verdict`.
    """

    devices: tuple[DeviceSummary, ...] = field(default_factory=tuple)
    steps: int = 0
    images: int = 0
    images_per_sec: float | None = None
    step_time_s: float | None = None
    input_wait_share: float | None = None
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
        return format_summary(self)


def summarize(
    rates: Rates, samples: Sequence[Sample], *, augments_on_device: bool = False
) -> Summary:
    """Builds a `Summary` from measured rates and device samples.

    Args:
        rates: Throughput over the run, from `ThroughputMeter.train_rates`.
        samples: Device samples taken during the run.
        augments_on_device: Whether the training step augments (see
            `verdict`). Defaults to ``False``.

    Returns:
        The `Summary`, verdict included.

    Example:

    ```python
    summary = summarize(meter.train_rates(), sampler.history(since=t0))
    print(summary.verdict)
    ```
    """
    devices = tuple(_device_summary(name, samples) for name in _device_names(samples))
    partial = Summary(
        devices=devices,
        steps=rates.steps,
        images=rates.images,
        images_per_sec=rates.images_per_sec,
        step_time_s=rates.step_time_s,
        input_wait_share=rates.input_wait_share,
    )
    said = verdict(
        rates.input_wait_share, partial.gpu_utilization, augments_on_device=augments_on_device
    )
    return replace(partial, verdict=said)


def mean_utilization(samples: Sequence[Sample]) -> dict[str, float]:
    """Mean utilisation per device name over ``samples`` (devices with no figure left out)."""
    out = {}
    for name in _device_names(samples):
        d = _device_summary(name, samples)
        if d.mean_utilization is not None:
            out[name] = d.mean_utilization
    return out


def format_rates(rates: Rates) -> str:
    """``"1234.5 images/sec, step 25.9 ms, input wait 12%"`` (``n/a`` where unknown)."""
    ips = f"{rates.images_per_sec:.1f}" if rates.images_per_sec is not None else "n/a"
    step = f"{rates.step_time_s * 1000:.1f} ms" if rates.step_time_s is not None else "n/a"
    wait = (
        f"{rates.input_wait_share:.0%}"
        if rates.input_wait_share is not None
        else "unknown (model.fit)"
    )
    return f"{ips} images/sec, step {step}, input wait {wait}"


def format_utilization(util: dict[str, float]) -> str:
    """``"GPU 0 87%, CPU 45%"``: short names, one figure each."""
    return ", ".join(f"{_short(name)} {value:.0f}%" for name, value in util.items()) or "n/a"


def format_summary(summary: Summary) -> str:
    """The multi-line text form printed at the end of training."""
    rates = Rates(
        summary.steps,
        summary.images,
        0.0,
        summary.images_per_sec,
        summary.step_time_s,
        summary.input_wait_share,
    )
    lines = [f"mdtrain monitor: {summary.steps} steps, {format_rates(rates)}"]
    for d in summary.devices:
        mean = f"{d.mean_utilization:.0f}%" if d.mean_utilization is not None else "n/a"
        peak = f"{d.peak_utilization:.0f}%" if d.peak_utilization is not None else "n/a"
        mem = ""
        if d.peak_memory_used is not None and d.memory_total:
            mem = f", peak memory {_gib(d.peak_memory_used)}/{_gib(d.memory_total)} GiB"
        lines.append(f"  {d.name}: mean {mean}, peak {peak}{mem}")
    lines.append(f"  verdict: {summary.verdict}")
    return "\n".join(lines)


def _device_names(samples: Sequence[Sample]) -> list[str]:
    names: dict[str, None] = {}
    for s in samples:
        for d in s.devices:
            names.setdefault(d.name, None)
    return list(names)


def _device_summary(name: str, samples: Sequence[Sample]) -> DeviceSummary:
    readings = [d for s in samples for d in s.devices if d.name == name]
    utils = [d.utilization for d in readings if d.utilization is not None]
    mems = [d.memory_used for d in readings if d.memory_used is not None]
    totals = [d.memory_total for d in readings if d.memory_total is not None]
    return DeviceSummary(
        name=name,
        kind=readings[0].kind if readings else "gpu",
        mean_utilization=sum(utils) / len(utils) if utils else None,
        peak_utilization=max(utils) if utils else None,
        peak_memory_used=max(mems) if mems else None,
        memory_total=totals[-1] if totals else None,
    )


def _short(name: str) -> str:
    return name.split(" (")[0]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"
