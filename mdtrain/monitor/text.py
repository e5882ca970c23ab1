"""The text fallback: one line per epoch, for terminals, CI and smoke runs."""

from __future__ import annotations

from mdtrain.monitor.summary import format_rates, format_utilization
from mdtrain.monitor.throughput import Rates


def epoch_line(
    epoch: int,
    epochs: int | None,
    rates: Rates,
    utilization: dict[str, float],
) -> str:
    """Formats one epoch's figures on one line.

    Args:
        epoch: Zero-based epoch index (printed one-based, like Keras).
        epochs: Total epochs, or ``None`` when unknown.
        rates: The epoch's `Rates`.
        utilization: Mean utilisation per device name over the epoch.

    Returns:
        E.g. ``"epoch 2/5: 50 steps, 1234.5 images/sec, step 25.9 ms,
        input wait 12%, util GPU 0 87%, CPU 45%"``.

    Example:

    ```python
    print(epoch_line(0, 3, meter.epoch_rates(), {"CPU": 45.0}))
    ```
    """
    of = f"/{epochs}" if epochs else ""
    return (
        f"epoch {epoch + 1}{of}: {rates.steps} steps, {format_rates(rates)}, "
        f"util {format_utilization(utilization)}"
    )
