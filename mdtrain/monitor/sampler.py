"""A background thread that samples GPUs and CPU into a bounded history."""

from __future__ import annotations

import collections
import functools
import sys
import threading
import time
from collections.abc import Callable

from mdtrain.monitor.cpu import CpuReader
from mdtrain.monitor.nvml import NvmlReader
from mdtrain.monitor.samples import Sample


@functools.cache  # remembers every message said: a repeat returns at once
def say_once(message: str) -> None:
    """Prints ``message`` to standard error the first time this process sees it.

    A notebook that trains five times should hear "no GPU" once, not five times.

    Args:
        message: The line to print.
    """
    print(message, file=sys.stderr, flush=True)


class Sampler:
    """Samples every GPU (NVML) and the CPU (psutil) on a background thread.

    Samples go into a ``collections.deque`` of at most ``max_samples`` entries,
    so a week-long run keeps constant memory. Without NVML or a GPU it says so
    once on standard error and samples the CPU alone.

    Use it as a context manager, or call ``start()`` and ``stop()``.

    Args:
        interval_s: Seconds between samples. Defaults to ``0.5``.
        max_samples: History length. Defaults to ``7200`` (an hour at 0.5 s).
        gpu_reader: Object with ``read() -> tuple[DeviceSample, ...]``,
            ``names``, ``error`` and ``close()``; tests inject a fake.
            Defaults to a new `NvmlReader`.
        cpu_reader: Object with ``read() -> DeviceSample``. Defaults to a new
            `CpuReader`.
        clock: Time source for ``Sample.time``. Defaults to ``time.monotonic``.
        quiet: Say nothing when there is no GPU to sample (a monitor that
            shows nothing, ``display="none"``). Defaults to ``False``.

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
        quiet: bool = False,
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
        if self._gpu.error and not quiet:
            say_once(f"mdtrain.monitor: {self._gpu.error}; monitoring the CPU only.")

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
