"""Where a run's wall time goes: the seconds of each of its phases, measured.

How they are timed, what each holds, where they are reported: docs/figures.md, "The run's phases".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class PhaseClock:
    """Adds up the seconds of a run's named phases, in the order they first ran.

    Args:
        now: the clock, in seconds. Defaults to `time.perf_counter`.

    Example:

    >>> clock = PhaseClock()
    >>> with clock.phase("import"):
    ...     import json
    >>> list(clock.seconds())
    ['import']
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self._seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        """Counts `seconds` more for the phase `name`."""
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Counts the time spent in the block for the phase `name`."""
        start = self.now()
        try:
            yield
        finally:
            self.add(name, self.now() - start)

    def seconds(self) -> dict[str, float]:
        """A copy of the seconds so far, by phase."""
        return dict(self._seconds)

    def segment_timer(self):
        """A Keras callback that splits one loop call into `first_step`, `training`, `validation`.

        Made just before the loop is called, which starts its clock; it
        counts the seconds when the loop's training ends (`on_train_end`).
        """
        import keras

        start, marks = self.now(), {"validation": 0.0}

        def batch_end(batch, logs=None):  # the first one ends the first call of the steps
            marks.setdefault("first_step", self.now())

        def test_begin(logs=None):
            marks["test_begin"] = self.now()

        def test_end(logs=None):
            marks["validation"] += self.now() - marks["test_begin"]

        def train_end(logs=None):
            end = self.now()
            first_end = marks.get("first_step", end)
            self.add("first_step", first_end - start)
            self.add("training", end - first_end - marks["validation"])
            self.add("validation", marks["validation"])

        return keras.callbacks.LambdaCallback(
            on_train_batch_end=batch_end,
            on_train_end=train_end,
            on_test_begin=test_begin,
            on_test_end=test_end,
        )
