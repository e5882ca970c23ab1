"""What one sampling tick records: a reading per device (GPUs, then the CPU)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSample:
    """One device's reading at one instant.

    Every figure is ``None`` when the driver cannot report it (power on some
    boards, utilisation on MIG slices), so views show "n/a" instead of a lie.

    Args:
        name: Display name, e.g. ``"GPU 0 (NVIDIA H100)"`` or ``"CPU"``.
        kind: ``"gpu"`` or ``"cpu"``.
        utilization: Busy share in percent (0-100). Defaults to ``None``.
        memory_used: Bytes in use (for the CPU: this process's RSS).
            Defaults to ``None``.
        memory_total: Bytes available (for the CPU: the host's RAM).
            Defaults to ``None``.
        power_w: Power draw in watts. Defaults to ``None``.
        temperature_c: Temperature in degrees Celsius. Defaults to ``None``.
    """

    name: str
    kind: str
    utilization: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None


@dataclass(frozen=True)
class Sample:
    """All devices at one instant.

    Args:
        time: ``time.monotonic()`` when the sample was taken.
        devices: GPUs first (NVML order), then one ``"cpu"`` entry.
    """

    time: float
    devices: tuple[DeviceSample, ...]

    @property
    def gpus(self) -> tuple[DeviceSample, ...]:
        """The GPU readings only."""
        return tuple(d for d in self.devices if d.kind == "gpu")
