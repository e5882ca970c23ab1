"""The after-training report: per-device utilisation, throughput, verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

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
class Summary(Rates):
    """What a training run used and how fast it went: its `Rates`, devices and verdict.

    Args:
        steps, images, seconds, images_per_sec, step_time_s, input_wait_share:
            The run's `Rates` (warm-up excluded); ``input_wait_share`` is
            ``None`` when unknown (``model.fit``).
        devices: One `DeviceSummary` per GPU, then the CPU. Defaults to ``()``.
        verdict: One sentence from `verdict`. Defaults to ``""``.
    """

    devices: tuple[DeviceSummary, ...] = ()
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
        from mdtrain.monitor.text import format_summary

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
    names = dict.fromkeys(d.name for s in samples for d in s.devices)
    devices = tuple(_device_summary(name, samples) for name in names)
    run = Summary(**asdict(rates), devices=devices)
    said = verdict(run.input_wait_share, run.gpu_utilization, augments_on_device=augments_on_device)
    return replace(run, verdict=said)


def _device_summary(name: str, samples: Sequence[Sample]) -> DeviceSummary:
    readings = [d for s in samples for d in s.devices if d.name == name]
    utils = [d.utilization for d in readings if d.utilization is not None]
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
