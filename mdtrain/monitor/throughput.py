"""Step time, images/sec and input-wait share, counted from batch hooks (no Keras here)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mdtrain.monitor.summary import Rates


@dataclass
class _Totals:
    """Figures summed over some steps, for `Rates`."""

    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    wait_seconds: float = 0.0  # step time of the steps that reported a wait
    # (images, wait_s, seconds) unread: tensors are read with the rates, not after each step.
    lazy: list = field(default_factory=list)

    def add(self, steps: int, images, seconds: float, wait_s) -> None:
        self.steps += steps
        self.seconds += seconds
        self.lazy.append((images, wait_s, seconds))
        if len(self.lazy) > 1000:
            self.rates()

    def rates(self) -> Rates:
        for images, wait_s, seconds in self.lazy:
            self.images += round(float(images))
            if wait_s is not None:
                self.wait_s += min(float(wait_s), seconds)
                self.wait_seconds += seconds
        self.lazy.clear()
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
    """Step time, images/sec and input-wait share from batch hooks; a live view may read it."""

    # A step runs from the previous step's end (so it holds the input wait); the first
    # ``warmup_steps`` calls (tracing, compiling) count in no rate, whatever steps they hold.

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
        # The last 20 `batch_end` calls: the "current" rate a live view shows.
        self._recent: collections.deque[tuple] = collections.deque(maxlen=20)
        self._train = _Totals()
        self._seen = 0  # batch_end calls since training began, warm-up included
        self.epoch_begin()

    def epoch_begin(self) -> None:
        """Starts a new epoch's counts; gaps between epochs are not step time."""
        with self._lock:
            self._epoch = _Totals()
            self._last_end = self._clock()
            self._last_batch = -1
            self.epoch_step = 0  # steps finished in the current epoch

    def batch_end(self, batch: int, batch_size=None, input_wait_s=None) -> None:
        """Records the steps up to Keras's ``batch``; ``batch_size`` and ``input_wait_s``: lazy."""
        now = self._clock()
        with self._lock:
            steps = max(1, batch - self._last_batch)
            self._last_batch = batch
            seconds, self._last_end = max(0.0, now - self._last_end), now
            images = batch_size if batch_size is not None else self.global_batch_size * steps
            self._seen += 1
            self.epoch_step += steps
            if self._seen <= self.warmup_steps:
                return
            self._train.add(steps, images, seconds, input_wait_s)
            self._epoch.add(steps, images, seconds, input_wait_s)
            self._recent.append((steps, images, seconds, input_wait_s))

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
