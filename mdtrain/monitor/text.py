"""The monitor's words: one line per epoch, the report after training, device figures.

The text fallback (terminals, CI, smoke runs), the summary and the dashboard
all format their figures here, so a figure reads the same in each.
"""

from __future__ import annotations

from mdtrain.monitor.samples import DeviceSample
from mdtrain.monitor.summary import Summary
from mdtrain.monitor.throughput import Rates


def epoch_line(epoch: int, epochs: int | None, summary: Summary) -> str:
    """Formats one epoch's figures on one line.

    Args:
        epoch: Zero-based epoch index (printed one-based, like Keras).
        epochs: Total epochs, or ``None`` when unknown.
        summary: The epoch's `Summary`: its rates and mean utilisation per device.

    Returns:
        E.g. ``"epoch 2/5: 50 steps, 1234.5 images/sec, step 25.9 ms,
        input wait 12%, util GPU 0 87%, CPU 45%"``.

    Example:

    ```python
    print(epoch_line(0, 3, summarize(meter.epoch_rates(), sampler.history(since=t0))))
    ```
    """
    util = ", ".join(
        f"{short_name(d.name)} {percent(d.mean_utilization)}"
        for d in summary.devices
        if d.mean_utilization is not None
    )
    return (
        f"epoch {count(epoch + 1, epochs)}: {summary.steps} steps, "
        f"{rates_text(summary)}, util {util or 'n/a'}"
    )


def format_summary(summary: Summary) -> str:
    """The multi-line text form printed at the end of training (also ``str(summary)``)."""
    lines = [f"mdtrain monitor: {summary.steps} steps, {rates_text(summary)}"]
    for d in summary.devices:
        memory = memory_text(d.peak_memory_used, d.memory_total)
        lines.append(
            f"  {d.name}: mean {percent(d.mean_utilization)}, peak {percent(d.peak_utilization)}"
            + (f", peak memory {memory}" if memory else "")
        )
    lines.append(f"  verdict: {summary.verdict}")
    return "\n".join(lines)


def rates_text(rates: Rates) -> str:
    """``"1234.5 images/sec, step 25.9 ms, input wait 12%"`` (``n/a`` where unknown)."""
    ips = f"{rates.images_per_sec:.1f}" if rates.images_per_sec is not None else "n/a"
    return f"{ips} images/sec, " + ", ".join(step_and_wait(rates))


def step_and_wait(rates: Rates) -> list[str]:
    """``["step 25.9 ms", "input wait 12%"]``; the wait is ``unknown (model.fit)`` without one."""
    step = f"{rates.step_time_s * 1000:.1f} ms" if rates.step_time_s is not None else "n/a"
    share = rates.input_wait_share
    wait = f"{share:.0%}" if share is not None else "unknown (model.fit)"
    return [f"step {step}", f"input wait {wait}"]


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


def count(n: int, total: int | None) -> str:
    """``"2/5"``, or ``"2"`` when the total is unknown."""
    return f"{n}/{total}" if total else f"{n}"


def short_name(name: str) -> str:
    """``"GPU 0"`` for ``"GPU 0 (NVIDIA T4)"``."""
    return name.split(" (")[0]
