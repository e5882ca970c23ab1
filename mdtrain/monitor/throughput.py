"""Step timing and images/sec, counted on the global batch. No Keras here."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW = 20  # `batch_end` calls in the "current" rate a live view shows


@dataclass(frozen=True)
class Rates:
    """Throughput over some set of steps.

    Args:
        steps: Steps counted.
        images: Global examples in those steps.
        seconds: Wall time of those steps (input wait included).
        images_per_sec: ``images / seconds``, or ``None`` with no time measured.
        step_time_s: Mean wall time per step, or ``None``.
        input_wait_share: Share (0-1) of step time spent blocked on input, or
            ``None`` when the loop did not report it (``model.fit``).
    """

    steps: int
    images: int
    seconds: float
    images_per_sec: float | None
    step_time_s: float | None
    input_wait_share: float | None


@dataclass
class _Totals:
    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    wait_seconds: float = 0.0  # step time of the steps that reported a wait

    def add(self, steps: int, images: int, seconds: float, wait_s: float | None) -> None:
        self.steps += steps
        self.images += images
        self.seconds += seconds
        if wait_s is not None:
            self.wait_s += min(wait_s, seconds)
            self.wait_seconds += seconds

    def rates(self) -> Rates:
        s = self.seconds
        return Rates(
            steps=self.steps,
            images=self.images,
            seconds=s,
            images_per_sec=self.images / s if s > 0 else None,
            step_time_s=s / self.steps if self.steps else None,
            input_wait_share=self.wait_s / self.wait_seconds if self.wait_seconds > 0 else None,
        )


class ThroughputMeter:
    """Measures step time, images/sec and input-wait share from batch hooks.

    A step's time runs from the previous step's end to this step's end, so it
    includes the wait for input whichever order a loop fetches and calls hooks
    in; an epoch's first step runs from ``epoch_begin`` (so creating the
    iterator counts as input time), or from the meter's creation without one.
    The first ``warmup_steps`` of training (graph tracing, XLA compile) are
    left out of every rate. Thread-safe: a dashboard thread may read while
    training writes.

    Args:
        global_batch_size: Examples per step over ALL replicas.
        warmup_steps: Steps at the start of training left out of the rates.
            Defaults to ``1``.
        clock: Time source. Defaults to ``time.perf_counter``.

    Example:

    ```python
    meter = ThroughputMeter(global_batch_size=256)
    meter.epoch_begin()
    for step in range(10):
        ...  # train one step
        meter.batch_end(step)
    print(meter.epoch_rates().images_per_sec)
    ```
    """

    def __init__(
        self,
        global_batch_size: int,
        *,
        warmup_steps: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        self.global_batch_size = int(global_batch_size)
        self.warmup_steps = int(warmup_steps)
        self._clock = clock
        self._lock = threading.Lock()
        self._recent: collections.deque[tuple[int, int, float, float | None]] = collections.deque(
            maxlen=WINDOW
        )
        self._train = _Totals()
        self._seen = 0  # steps since training began, warm-up included
        self.epoch_begin()

    def epoch_begin(self) -> None:
        """Starts a new epoch's counts; gaps between epochs are not step time."""
        with self._lock:
            self._epoch = _Totals()
            self._last_end = self._clock()
            self._last_batch = -1
            self.epoch_step = 0  # steps finished in the current epoch

    def batch_end(
        self,
        batch: int | None = None,
        batch_size: int | None = None,
        input_wait_s: float | None = None,
    ) -> None:
        """Records a finished step.

        Args:
            batch: Keras's batch index within the epoch. When it jumps by more
                than one (``steps_per_execution > 1``), the call covers that many
                steps. Defaults to ``None`` (one step).
            batch_size: Global examples in this call; pass the true size of a
                partial last batch. Defaults to ``None`` (``global_batch_size``
                per step).
            input_wait_s: Seconds the loop blocked on input before this step.
                Defaults to ``None`` (unknown, as under ``model.fit``).
        """
        now = self._clock()
        with self._lock:
            steps = 1
            if batch is not None:
                steps = max(1, batch - self._last_batch)
                self._last_batch = batch
            seconds, self._last_end = max(0.0, now - self._last_end), now
            images = int(batch_size) if batch_size is not None else self.global_batch_size * steps
            wait = float(input_wait_s) if input_wait_s is not None else None
            self._seen += steps
            self.epoch_step += steps
            if self._seen <= self.warmup_steps:
                return
            self._train.add(steps, images, seconds, wait)
            self._epoch.add(steps, images, seconds, wait)
            self._recent.append((steps, images, seconds, wait))

    def train_rates(self) -> Rates:
        """Rates over all of training (warm-up excluded)."""
        with self._lock:
            return self._train.rates()

    def epoch_rates(self) -> Rates:
        """Rates over the current (or just finished) epoch."""
        with self._lock:
            return self._epoch.rates()

    def current_rates(self) -> Rates:
        """Rates over the last 20 `batch_end` calls: what a live view shows."""
        with self._lock:
            recent = list(self._recent)
        totals = _Totals()
        for row in recent:
            totals.add(*row)
        return totals.rates()
