"""A watched dataset's timestamps matched to the steps that consumed them: each call's wait.

Free of TensorFlow: a step that began before its element was handed over
waited until then (docs/figures.md, "Input wait").
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stamp:
    """One element a watched dataset handed out.

    Args:
        index: Its place in its iterator: 0 starts a new iterator.
        got: Wall time (``time.time()``'s clock) the dataset handed it over.
        images: Its batch size (rows of its first component).
    """

    index: int
    got: float
    images: int


def call_wait(begin: float, end: float, handed_over: Sequence[float]) -> float:
    """Seconds a call of ``len(handed_over)`` steps waited for its elements.

    Exact for one step; with several, each is taken to compute for the same
    time (docs/figures.md, "Input wait").

    Args:
        begin: Wall time the call began (the previous call's end).
        end: Wall time it ended.
        handed_over: Wall time each of its elements was handed over, in order.

    Returns:
        The wait, between 0 and ``end - begin``.

    Example:

    >>> call_wait(10.0, 10.05, [10.03])  # the element came 30 ms into a 50 ms step
    0.03
    """
    span = max(0.0, end - begin)
    if len(handed_over) == 1:
        return round(min(max(0.0, handed_over[0] - begin), span), 9)

    def finish(compute: float) -> float:  # when the call ends if each step computes this long
        clock = begin
        for got in handed_over:
            clock = max(clock, got) + compute
        return clock

    low, high = 0.0, span / len(handed_over)
    if finish(low) >= end:  # the last element came at the very end: the call only waited
        return span
    for _ in range(40):  # bisection: `finish` grows with the compute time
        middle = (low + high) / 2
        low, high = (middle, high) if finish(middle) < end else (low, middle)
    return max(0.0, span - len(handed_over) * low)


class _Iterator:
    """The stamps of one iterator of the watched dataset, not yet matched to a step."""

    def __init__(self, first: Stamp) -> None:
        self.started = first.got
        self.stamps: collections.deque[Stamp] = collections.deque([first])


class StampedCall:
    """One call of the step function whose images and wait come from the stamps, when read."""

    def __init__(self, matcher: StampMatcher, begin: float, end: float, steps: int) -> None:
        self.begin, self.end, self.steps = begin, end, steps
        self._matcher = matcher
        self.matched = False
        self._images: int | None = None
        self._wait_s: float | None = None

    def images(self) -> int | None:
        """Global examples of the call's steps, or ``None`` when its stamps are missing."""
        self._matcher.match_until(self)
        return self._images

    def wait_s(self) -> float | None:
        """Seconds the call waited for input, or ``None`` when its stamps are missing."""
        self._matcher.match_until(self)
        return self._wait_s

    def settle(self, stamps: list[Stamp] | None) -> None:
        """Takes the call's own stamps (``None``: none were found)."""
        self.matched = True
        if stamps:
            self._images = sum(stamp.images for stamp in stamps)
            self._wait_s = call_wait(self.begin, self.end, [stamp.got for stamp in stamps])


class StampMatcher:
    """Matches the stamps, in order, to the calls that consumed their elements.

    Each call takes its elements from the newest iterator begun before the call
    ended (why: docs/figures.md, "Input wait").

    Args:
        drain: Returns the stamps recorded since its last call, in order.
    """

    def __init__(self, drain: Callable[[], Iterable[Stamp]]) -> None:
        self._drain = drain
        self._iterators: collections.deque[_Iterator] = collections.deque()
        self._calls: collections.deque[StampedCall] = collections.deque()

    def call(self, begin: float, end: float, steps: int) -> StampedCall:
        """Records a call (wall times of its start and end), to be matched when read."""
        call = StampedCall(self, begin, end, steps)
        self._calls.append(call)
        return call

    def match_until(self, target: StampedCall) -> None:
        """Matches the calls recorded up to ``target``, in order."""
        if target.matched:
            return
        self._take_stamps()
        while self._calls:
            call = self._calls.popleft()
            call.settle(self._stamps_of(call))
            if call is target:
                return

    def _take_stamps(self) -> None:
        for stamp in self._drain():
            if stamp.index == 0 or not self._iterators:
                self._iterators.append(_Iterator(stamp))
            else:
                self._iterators[-1].stamps.append(stamp)

    def _stamps_of(self, call: StampedCall) -> list[Stamp] | None:
        while len(self._iterators) > 1 and self._iterators[1].started <= call.end:
            self._iterators.popleft()  # a newer iterator fed this call: the older one is done
        if not self._iterators or len(self._iterators[0].stamps) < call.steps:
            return None
        stamps = self._iterators[0].stamps
        return [stamps.popleft() for _ in range(call.steps)]
