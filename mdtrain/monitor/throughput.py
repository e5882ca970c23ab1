"""Images/sec, step time and input-wait share of a run, on the clock the user waits on.

Epochs are timed from start to end, boundaries included, less validation and compiling;
lazy figures are read with the rates (docs/figures.md, "images/s"). No Keras or TensorFlow.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mdtrain.monitor.summary import Rates


def _read(value):
    """A figure as a float: a callable is called, a tensor converted; ``None`` stays."""
    if callable(value):
        value = value()
    return None if value is None else float(value)


@dataclass
class _Call:
    """One `batch_end`: the steps since the previous one, their images, seconds and wait."""

    steps: int
    images: object  # number, tensor or callable; None: steps x the global batch size
    seconds: float  # from the previous call's end (or the epoch's start) to this one's
    wait_s: object  # likewise; None: not measured
    first_of_epoch: bool  # its seconds hold the epoch's start: making the iterator


@dataclass
class _Totals:
    """Figures summed over some calls: a whole run, one epoch, or the last few calls."""

    steps: int = 0
    images: int = 0
    call_seconds: float = 0.0  # the calls' own seconds, the left-out ones' excepted
    wait_s: float = 0.0
    waited_seconds: float = 0.0  # the seconds of the calls that reported a wait
    left_out_steps: int = 0
    left_out_calls: list = field(default_factory=list)  # (seconds, steps, first_of_epoch)
    first_call_seconds: list = field(default_factory=list)  # each epoch's first call, timed
    later_seconds: float = 0.0  # the other calls, timed
    later_steps: int = 0
    validation_s: float = 0.0
    closed_epochs_s: float = 0.0  # the wall time of the epochs that ended
    open_epoch_t0: float | None = None  # the running epoch's start

    def add(self, call: _Call, images: int, wait_s: float | None, left_out: bool) -> None:
        self.steps += call.steps
        self.images += images
        if left_out:
            self.left_out_steps += call.steps
            self.left_out_calls.append((call.seconds, call.steps, call.first_of_epoch))
            return
        self.call_seconds += call.seconds
        if call.first_of_epoch:
            self.first_call_seconds.append(call.seconds)
        else:
            self.later_seconds += call.seconds
            self.later_steps += call.steps
        if wait_s is not None:
            self.wait_s += min(wait_s, call.seconds)
            self.waited_seconds += call.seconds

    def typical_seconds(self, steps: int, first_of_epoch: bool) -> float | None:
        """What a call like this takes when it compiles nothing: the timed calls' median or mean."""
        if first_of_epoch and self.first_call_seconds:
            return statistics.median(self.first_call_seconds)
        return steps * self.later_seconds / self.later_steps if self.later_steps else None

    def compiling_s(self, reference: _Totals) -> tuple[float, bool]:
        """The left-out calls' seconds beyond a like call's of ``reference``: the compiling;
        and whether some left-out call had no like call to be judged by."""
        excess, unjudged = 0.0, False
        for seconds, steps, first_of_epoch in self.left_out_calls:
            typical = reference.typical_seconds(steps, first_of_epoch)
            unjudged = unjudged or typical is None
            excess += seconds if typical is None else max(0.0, seconds - typical)
        return excess, unjudged

    def rates(self, now: float, reference: _Totals | None = None) -> Rates:
        """Rates on the epochs' clock, the compiling judged against ``reference``'s calls;
        none while a left-out call has no like call (docs/figures.md, "images/s")."""
        compiling, unjudged = self.compiling_s(reference or self)
        running = now - self.open_epoch_t0 if self.open_epoch_t0 is not None else 0.0
        seconds = max(0.0, self.closed_epochs_s + running - self.validation_s - compiling)
        if self.open_epoch_t0 is None and not self.closed_epochs_s:
            seconds = self.call_seconds  # calls counted outside epochs: the recent ones
        measured = seconds > 0 and not unjudged
        return Rates(
            steps=self.steps,
            images=self.images,
            seconds=seconds,
            images_per_sec=self.images / seconds if measured else None,
            step_time_s=seconds / self.steps if measured and self.steps else None,
            input_wait_share=(
                self.wait_s / self.waited_seconds if self.waited_seconds > 0 else None
            ),
            left_out_steps=self.left_out_steps,
            left_out_s=compiling,
            validation_s=self.validation_s,
        )


class ThroughputMeter:
    """Images/sec, step time and input-wait share from a loop's hooks; a live view may read it.

    Driven by `epoch_begin`, `batch_end` (once per call of the step function),
    `validation_begin`/`validation_end` and `epoch_end`; what it counts:
    docs/figures.md, "images/s".

    Args:
        global_batch_size: Examples per step over all replicas, for calls
            that report no image count.
        clock: Time source. Defaults to ``time.perf_counter``.

    Raises:
        ValueError: If ``global_batch_size`` is below 1.
    """

    def __init__(
        self, global_batch_size: int, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        self.global_batch_size = int(global_batch_size)
        self._clock = clock
        self._lock = threading.Lock()
        self._run = _Totals()
        self._epoch = _Totals()
        self._recent: collections.deque[_Call] = collections.deque(maxlen=20)  # the live rate
        self._unread: list[tuple[_Call, tuple[_Totals, ...]]] = []
        self._sizes_seen: set[float] = set()  # per-step batch sizes already compiled for
        self._calls = 0
        self._validation_t0: float | None = None
        self.epoch_step = 0  # steps finished in the current epoch
        self.epoch_begin()

    def epoch_begin(self) -> None:
        """Starts an epoch: its wall time counts from now."""
        with self._lock:
            now = self._clock()
            self._close_epoch(now)
            self._epoch = _Totals(open_epoch_t0=now)
            self._run.open_epoch_t0 = now
            self._last_end = now
            self._last_batch = -1
            self.epoch_step = 0

    def epoch_end(self) -> None:
        """Ends the epoch: the time until the next `epoch_begin` is not training."""
        with self._lock:
            self._close_epoch(self._clock())

    def validation_begin(self) -> None:
        """Validation starts: its time is reported on its own, not as training."""
        self._validation_t0 = self._clock()

    def validation_end(self) -> None:
        """Validation ends."""
        if self._validation_t0 is None:
            return
        now = self._clock()
        seconds, self._validation_t0 = now - self._validation_t0, None
        with self._lock:
            self._run.validation_s += seconds
            self._epoch.validation_s += seconds
            self._last_end = now

    def steps_until(self, batch: int) -> int:
        """The steps a `batch_end` for ``batch`` would record: those since the last call."""
        return max(1, batch - self._last_batch)

    def batch_end(self, batch: int, images=None, input_wait_s=None) -> None:
        """Records the steps up to the loop's ``batch`` (zero-based, in the epoch).

        Args:
            batch: The index of the call's last step in the epoch.
            images: The call's global examples: a number, a tensor or a
                callable, read later. Defaults to ``None`` (steps x
                ``global_batch_size``).
            input_wait_s: Seconds the call waited for input, likewise.
                Defaults to ``None`` (not measured).
        """
        now = self._clock()
        with self._lock:
            steps = self.steps_until(batch)
            seconds = max(0.0, now - self._last_end)
            call = _Call(steps, images, seconds, input_wait_s, self._last_batch < 0)
            self._last_end = now
            self.epoch_step += steps
            self._last_batch = batch
            self._unread.append((call, (self._run, self._epoch)))
            self._recent.append(call)
            if len(self._unread) > 1000:  # read now and then: constant memory
                self._read_calls()

    def train_rates(self) -> Rates:
        """Rates over the run so far."""
        with self._lock:
            self._read_calls()
            return self._run.rates(self._clock())

    def epoch_rates(self) -> Rates:
        """Rates over the current (or just finished) epoch."""
        with self._lock:
            self._read_calls()
            return self._epoch.rates(self._clock(), reference=self._run)

    def current_rates(self) -> Rates:
        """Rates over the last 20 calls, their own seconds only: what a live view shows."""
        with self._lock:
            self._read_calls()
            recent = list(self._recent)
        totals = _Totals()
        for call in recent:
            totals.add(call, *self._figures(call), left_out=False)
        return totals.rates(self._clock())

    def _close_epoch(self, now: float) -> None:
        for totals in (self._run, self._epoch):
            if totals.open_epoch_t0 is not None:
                totals.closed_epochs_s += now - totals.open_epoch_t0
                totals.open_epoch_t0 = None

    def _figures(self, call: _Call) -> tuple[int, float | None]:
        images = _read(call.images)
        images = self.global_batch_size * call.steps if images is None else round(images)
        return images, _read(call.wait_s)

    def _read_calls(self) -> None:
        """Adds the unread calls to their totals, in order (a call's figures may be tensors)."""
        for call, totals in self._unread:
            images, wait_s = self._figures(call)
            left_out = self._compiles(call, images)
            for each in totals:
                each.add(call, images, wait_s, left_out)
        self._unread.clear()

    def _compiles(self, call: _Call, images: int) -> bool:
        """Whether the call likely traced and compiled: the run's first, or a new batch size."""
        self._calls += 1
        size = images / call.steps if call.images is not None else None
        new_size = size is not None and size not in self._sizes_seen
        if size is not None:
            self._sizes_seen.add(size)
        return self._calls == 1 or new_size
