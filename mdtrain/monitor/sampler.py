"""Device sampling: GPUs through NVML, the CPU through psutil, on a background thread.

NVML (the ``nvidia-ml-py`` package, ``import pynvml``) needs only the driver,
not CUDA or TensorFlow, so this works (and is tested) on a machine without
TensorFlow.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from mdtrain.gpus import visible_gpus


@dataclass(frozen=True)
class DeviceSample:
    """One device's reading at one instant; a figure the driver cannot report is ``None``.

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
        busy: The driver's own utilisation samples since the previous reading,
            as ``(time.monotonic() time, percent)`` pairs (docs/figures.md,
            "Utilisation and memory"). Defaults to ``()``.
    """

    name: str
    kind: str
    utilization: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    busy: tuple[tuple[float, float], ...] = ()


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


class CpuReader:
    """Reads the host's CPU utilisation and this process's resident memory (RSS)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._total = int(psutil.virtual_memory().total)
        psutil.cpu_percent(interval=None)  # primes the counter; the first call returns 0.0

    def read(self) -> DeviceSample:
        """Reads the CPU once: utilisation over all cores, this process's RSS, the host's RAM."""
        try:
            rss = int(self._process.memory_info().rss)
        except psutil.Error:
            rss = None
        return DeviceSample(
            name="CPU",
            kind="cpu",
            utilization=float(psutil.cpu_percent(interval=None)),  # since the last: no sleep
            memory_used=rss,
            memory_total=self._total,
        )


def _visible_indices(nv, uuids: list[str]) -> list[int]:
    """NVML sees every GPU; honour CUDA_VISIBLE_DEVICES so we show the ones TF uses."""
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        return list(range(len(uuids)))
    chosen = []
    for item in visible_gpus():  # indices, UUIDs or MIG devices, as the launcher reads them
        index = _gpu_index(nv, item, uuids)
        if index is None:
            break  # CUDA stops at the first invalid entry
        if index not in chosen:  # two MIG devices of one GPU: one row
            chosen.append(index)
    return chosen


def _gpu_index(nv, item: str, uuids: list[str]) -> int | None:
    """NVML's index of the GPU `item` names, or holds the MIG device `item` names."""
    if item.isdigit():
        return int(item) if int(item) < len(uuids) else None
    if item.startswith("MIG-GPU-"):  # drivers before R470: MIG-GPU-<GPU uuid>/<gi>/<ci>
        item = item[4:].split("/")[0]
    elif item.startswith("MIG-"):  # MIG-<uuid>: NVML knows its GPU
        try:
            mig = nv.nvmlDeviceGetHandleByUUID(item.encode())
            item = _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)))
        except Exception:  # NVMLError: no such device, or an NVML without MIG
            return None
    return next((i for i, u in enumerate(uuids) if u.startswith(item)), None)


class NvmlReader:
    """Reads the visible GPUs' utilisation, memory, power, temperature; never raises: ``error``."""

    def __init__(self) -> None:
        self.error: str | None = None
        self._nvml = None
        self._handles: list[tuple[str, object]] = []
        self._last_seen_us: dict[str, int] = {}  # NVML's newest utilisation sample read, per GPU
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
            for index in _visible_indices(pynvml, uuids):
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
        """Reads every visible GPU once; figures the board cannot report are ``None``."""
        return tuple(self._read(name, handle) for name, handle in self._handles)

    def _read(self, name: str, handle) -> DeviceSample:
        nv = self._nvml
        busy, self._last_seen_us[name] = _busy_samples(nv, handle, self._last_seen_us.get(name, 0))
        if busy:
            utilization = sum(percent for _, percent in busy) / len(busy)
        else:  # no sample since the last reading, or a board without the buffer (MIG)
            rates = _try(nv.nvmlDeviceGetUtilizationRates, handle)
            utilization = float(rates.gpu) if rates is not None else None
        memory = _memory(nv, handle)
        power_mw = _try(nv.nvmlDeviceGetPowerUsage, handle)
        temperature = _try(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        return DeviceSample(
            name=name,
            kind="gpu",
            utilization=utilization,
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            busy=busy,
        )

    def close(self) -> None:
        """Releases NVML; safe to call twice."""
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)
            self._nvml = None
            self._handles = []


def _busy_samples(nv, handle, last_seen_us: int) -> tuple[tuple, int]:
    """NVML's utilisation samples newer than ``last_seen_us`` (each read once), and the newest
    one's timestamp (microseconds since the epoch); ``((), last_seen_us)`` when none."""
    try:
        _, samples = nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, last_seen_us)
    except Exception:  # NVML_ERROR_NOT_FOUND: none since; NOT_SUPPORTED: MIG slices
        return (), last_seen_us
    fresh = [(s.timeStamp, s.sampleValue.uiVal) for s in samples if s.timeStamp > last_seen_us]
    if not fresh:
        return (), last_seen_us
    # To the monotonic clock of `Sample.time`: the samples are seconds old, not days.
    offset = time.monotonic() - time.time()
    busy = tuple((stamp / 1e6 + offset, float(value)) for stamp, value in sorted(fresh))
    return busy, max(stamp for stamp, _ in fresh)


def _memory(nv, handle):
    """Memory in use as `nvidia-smi` reports it: without the driver's reserve."""
    # NVML's first query counts the reserve as used (480 MiB on an idle H100, see
    # `benchmarks/nvml.json`); the version-2 query (drivers from R510) leaves it out.
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


@functools.cache  # remembers every message said: a repeat returns at once
def say_once(message: str) -> None:
    """Prints to standard error once per process: five runs in a notebook hear "no GPU" once."""
    print(message, file=sys.stderr, flush=True)


class Sampler:
    """Samples every GPU (NVML) and the CPU (psutil) on a background thread.

    Without NVML or a GPU it samples the CPU alone, and ``gpu_error`` says why.
    Use it as a context manager, or call ``start()`` and ``stop()``.

    Args:
        interval_s: Seconds between samples. Defaults to ``0.5``.
        max_samples: History length. Defaults to ``7200`` (an hour at 0.5 s).
        gpu_reader: Object with ``read() -> tuple[DeviceSample, ...]``,
            ``names``, ``error`` and ``close()``; tests inject a fake.
            Defaults to a new `mdtrain.monitor.sampler.NvmlReader`.
        cpu_reader: Object with ``read() -> DeviceSample``. Defaults to a new
            `mdtrain.monitor.sampler.CpuReader`.
        clock: Time source for ``Sample.time``. Defaults to ``time.monotonic``.

    Example:

    ```python
    with Sampler(interval_s=0.2) as sampler:
        time.sleep(1)
    print(sampler.latest())
    ```
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        *,
        max_samples: int = 7200,
        gpu_reader=None,
        cpu_reader=None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self._gpu = gpu_reader if gpu_reader is not None else NvmlReader()
        self._cpu = cpu_reader if cpu_reader is not None else CpuReader()
        self._clock = clock
        self._history: collections.deque[Sample] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def gpu_error(self) -> str:
        """Why no GPU is sampled (e.g. NVML missing), or ``""``."""
        return self._gpu.error or ("" if self._gpu.names else "no GPU found by NVML")

    @property
    def has_gpu(self) -> bool:
        """Whether at least one GPU is being sampled."""
        return not self._gpu.error and bool(self._gpu.names)

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def sample_now(self) -> Sample:
        """Takes one sample on the calling thread and adds it to the history.

        Returns:
            The new `Sample`.
        """
        sample = Sample(time=self._clock(), devices=(*self._gpu.read(), self._cpu.read()))
        with self._lock:
            self._history.append(sample)
        return sample

    def latest(self) -> Sample | None:
        """The most recent sample, or ``None`` before the first."""
        with self._lock:
            return self._history[-1] if self._history else None

    def history(self, since: float | None = None) -> list[Sample]:
        """Samples in time order.

        Args:
            since: Keep only samples with ``time >= since`` (same clock as
                ``Sample.time``). Defaults to ``None`` (all).

        Returns:
            A list copy, safe to use while sampling continues.
        """
        with self._lock:
            samples = list(self._history)
        if since is not None:
            samples = [s for s in samples if s.time >= since]
        return samples

    def start(self) -> Sampler:
        """Starts the sampling thread (idempotent).

        Returns:
            ``self``, so ``sampler = Sampler().start()`` reads naturally.
        """
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mdtrain-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the thread, waits for it, and takes one last sample (idempotent)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval_s))
        self._thread = None
        self.sample_now()

    def close(self) -> None:
        """Stops sampling and releases NVML."""
        self.stop()
        self._gpu.close()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        while True:
            try:
                self.sample_now()
            except Exception as exc:  # a sampler must never kill training
                say_once(f"mdtrain.monitor: sampling failed ({exc}); monitoring stopped.")
                return
            if self._stop.wait(self.interval_s):
                return
