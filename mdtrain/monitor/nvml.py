"""NVIDIA GPU readings through NVML (the ``nvidia-ml-py`` package, ``import pynvml``).

NVML needs only the driver, not CUDA or TensorFlow, so this works (and is
tested) on a machine without TensorFlow.
"""

from __future__ import annotations

import os

from mdtrain.monitor.samples import DeviceSample


def _visible_indices(count: int, uuids: list[str]) -> list[int]:
    """NVML sees every GPU; honour CUDA_VISIBLE_DEVICES so we show the ones TF uses."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    chosen: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.lstrip("-").isdigit():
            index = int(item)
            if index < 0:
                break  # CUDA stops at the first invalid entry
            if index < count:
                chosen.append(index)
        else:
            matches = [i for i, u in enumerate(uuids) if u.startswith(item)]
            if not matches:
                break
            chosen.append(matches[0])
    return chosen


class NvmlReader:
    """Reads utilisation, memory, power and temperature of each visible GPU.

    Construction never raises: when NVML is missing or finds no GPU, ``error``
    says why and ``read()`` returns an empty tuple.

    Example:

    ```python
    reader = NvmlReader()
    print(reader.error or [d.name for d in reader.read()])
    reader.close()
    ```
    """

    def __init__(self) -> None:
        self.error: str | None = None
        self._nvml = None
        self._handles: list[tuple[str, object]] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
            for index in _visible_indices(count, uuids):
                name = _text(pynvml.nvmlDeviceGetName(handles[index]))
                self._handles.append((f"GPU {index} ({name})", handles[index]))
            if not self._handles:
                self.error = "NVML found no visible NVIDIA GPU"
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.error = f"NVML unavailable ({type(exc).__name__}: {exc})".strip()
            self._handles = []

    @property
    def names(self) -> list[str]:
        """Display names of the GPUs this reader reports."""
        return [name for name, _ in self._handles]

    def read(self) -> tuple[DeviceSample, ...]:
        """Reads every visible GPU once.

        Returns:
            One `DeviceSample` per GPU; figures the board cannot report are ``None``.
        """
        return tuple(_read(self._nvml, name, handle) for name, handle in self._handles)

    def close(self) -> None:
        """Releases NVML; safe to call twice."""
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)
            self._nvml = None
            self._handles = []


def _read(nv, name: str, handle) -> DeviceSample:
    util = _try(nv.nvmlDeviceGetUtilizationRates, handle)
    memory = _memory(nv, handle)
    power_mw = _try(nv.nvmlDeviceGetPowerUsage, handle)
    temperature = _try(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
    return DeviceSample(
        name=name,
        kind="gpu",
        utilization=float(util.gpu) if util is not None else None,
        memory_used=int(memory.used) if memory is not None else None,
        memory_total=int(memory.total) if memory is not None else None,
        power_w=power_mw / 1000.0 if power_mw is not None else None,
        temperature_c=float(temperature) if temperature is not None else None,
    )


def _memory(nv, handle):
    """Memory in use as `nvidia-smi` reports it: without the driver's reserve.

    NVML's first memory query counts the driver's reserved memory as used
    (480 MiB more than `nvidia-smi` on an idle H100, see
    `benchmarks/nvml.json`); the version-2 query reports it apart. Drivers
    older than R510 have only the first.
    """
    version = getattr(nv, "nvmlMemory_v2", None)
    info = _try(nv.nvmlDeviceGetMemoryInfo, handle, version=version) if version else None
    return info or _try(nv.nvmlDeviceGetMemoryInfo, handle)


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes.
    return value.decode() if isinstance(value, bytes) else value


def _try(fn, *args, **kwargs):
    # One unsupported query (power on a MIG slice) must not hide the others.
    try:
        return fn(*args, **kwargs)
    except Exception:
        return None
