"""Timing iterators one at a time, repeats interleaved: images per second, median kept."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator


def _take(iterator, steps: int) -> int:
    """Pulls `steps` batches from an iterator (of a dataset or a generator); returns images."""
    n = 0
    for _ in range(steps):
        batch = next(iterator)
        n += len(batch[0] if isinstance(batch, tuple) else batch)
    return n


class _Variant:
    """One configuration to time, in isolation.

    `start()` returns a fresh iterator; `warmup` batches are pulled untimed
    (start-up, XLA compilation, filling a cache), then `batches` are timed,
    and the iterator is dropped, so no pipeline keeps working in the
    background while another one is timed.
    """

    def __init__(
        self, start: Callable[[], Iterator], batches: int, warmup: int = 3, first_warmup=None
    ):
        self.start, self.batches, self.warmup = start, batches, warmup
        self.first_warmup = warmup if first_warmup is None else first_warmup
        self.rates: list[float] = []

    def time_one(self) -> None:
        iterator = self.start()
        _take(iterator, self.warmup if self.rates else self.first_warmup)
        begin = time.perf_counter()
        n = _take(iterator, self.batches)
        self.rates.append(n / (time.perf_counter() - begin))
        del iterator
        gc.collect()


def measure(variants: dict[str, _Variant], repeats: int) -> dict[str, dict]:
    """Times `repeats` rounds, variants interleaved, so load changes hit all alike."""
    for _ in range(repeats):
        for v in variants.values():
            v.time_one()
    return {
        name: {"median": statistics.median(v.rates), "runs": [round(r, 1) for r in v.rates]}
        for name, v in variants.items()
    }
