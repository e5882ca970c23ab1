"""Timing iterators one at a time, repeats interleaved: images per second, median and spread."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator


def take_batches(iterator: Iterator, steps: int) -> int:
    """Pulls `steps` batches from an iterator and counts their images.

    Args:
        iterator: an iterator over batches of a dataset or a generator:
            `(images, labels)` tuples or bare image batches.
        steps: how many batches to pull.

    Returns:
        The number of images in those batches.

    Example:
        >>> take_batches(iter([(np.zeros((4, 8, 8, 3)), np.zeros(4))] * 3), 2)  # doctest: +SKIP
        8
    """
    n = 0
    for _ in range(steps):
        batch = next(iterator)
        n += len(batch[0] if isinstance(batch, tuple) else batch)
    return n


class Variant:
    """One configuration to time, in isolation, for `measure`.

    `prime()` runs once, untimed, before the first timing (XLA compilation,
    filling a cache, warming the page cache). Every timing then calls
    `start()` for a fresh iterator, pulls `warmup` batches untimed and times
    `batches` more; with `warmup=0` and `batches` = one epoch, a timing is a
    whole epoch, shuffle-buffer fill included. The iterator is dropped
    afterwards, so no pipeline keeps working in the background while another
    one is timed.

    Args:
        start: makes a fresh iterator of batches.
        batches: batches each timing pulls after the warm-up.
        warmup: batches pulled untimed first. Defaults to 0.
        prime: runs once before the first timing. Defaults to None.

    Example:
        >>> v = Variant(lambda: iter(ds), batches=10, warmup=1)  # doctest: +SKIP
        >>> measure({"mine": v}, repeats=3)["mine"]["median"]  # doctest: +SKIP
    """

    def __init__(
        self,
        start: Callable[[], Iterator],
        batches: int,
        warmup: int = 0,
        prime: Callable[[], object] | None = None,
    ):
        self.start, self.batches, self.warmup, self.prime = start, batches, warmup, prime
        self.rates: list[float] = []

    def time_one(self) -> None:
        if not self.rates and self.prime is not None:
            self.prime()
        iterator = self.start()
        take_batches(iterator, self.warmup)
        begin = time.perf_counter()
        n = take_batches(iterator, self.batches)
        self.rates.append(n / (time.perf_counter() - begin))
        del iterator
        gc.collect()


def whole_epochs(make: Callable[[], Iterator], steps: int) -> Variant:
    """A variant timed over whole epochs, each from a fresh `make()`, after one untimed epoch."""
    return Variant(make, steps, prime=lambda: take_batches(make(), steps))


def measure(variants: dict[str, Variant], repeats: int) -> dict[str, dict]:
    """Times `repeats` rounds, variants interleaved, so load changes hit all alike.

    Returns:
        `{name: {"median", "min", "max", "runs"}}`, images per second; `runs`
        lists every repeat in order, so ratios can be taken repeat by repeat.
    """
    for _ in range(repeats):
        for v in variants.values():
            v.time_one()
    return {
        name: {
            "median": statistics.median(v.rates),
            "min": min(v.rates),
            "max": max(v.rates),
            "runs": [round(r, 1) for r in v.rates],
        }
        for name, v in variants.items()
    }
