"""Timing input pipelines the way training meets them: whole epochs, repeats interleaved."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterable, Mapping


def _count_images(batch) -> int:
    """Images in a batch: `(images, labels)` tuples or bare image batches."""
    return len(batch[0] if isinstance(batch, (tuple, list)) else batch)


def _time_epoch(pipeline: Iterable, batches: int | None, step: Callable | None) -> float:
    """Images per second of one pass over `pipeline` from a fresh iterator."""
    iterator = iter(pipeline)
    begin, images = time.perf_counter(), 0
    for i, batch in enumerate(iterator):
        images += _count_images(batch)
        if step is not None:
            step(batch)
        if batches is not None and i + 1 >= batches:
            break
    seconds = time.perf_counter() - begin
    # Dropped before the next pipeline is timed, so none keeps working in the background.
    del iterator
    gc.collect()
    if images == 0:
        raise ValueError("a pipeline gave no batches")
    return images / seconds


def time_epochs(
    pipelines: Mapping[str, Iterable],
    repeats: int = 3,
    batches: int | None = None,
    warmup: bool = True,
    step: Callable[[object], object] | None = None,
) -> dict[str, dict]:
    """Images per second of input pipelines over whole epochs, repeats interleaved.

    Every timing starts a fresh iterator (`iter(pipeline)`) and pulls an
    epoch, so a shuffle buffer or a cache that must fill before the first
    batch counts, as it does in training. One untimed epoch per pipeline
    comes first (tracing, compiling, filling a cache, warming the page
    cache). The repeats are interleaved (every pipeline once, then again), so
    a change in the machine's load hits every pipeline alike, and ratios are
    best taken repeat by repeat from `runs`.

    Args:
        pipelines: `{name: iterable of batches}`: a `tf.data.Dataset`, a Keras
            `DirectoryIterator`, or anything `iter()` restarts. A batch is an
            `(images, labels)` tuple or an image batch.
        repeats: timed epochs per pipeline. Defaults to 3.
        batches: at most this many batches per epoch; needed for endless
            iterators such as `ImageDataGenerator().flow_from_directory(...)`
            (pass `len(iterator)`). Defaults to None (until the pipeline ends).
        warmup: run a first, untimed epoch of every pipeline. Defaults to True.
        step: called on every batch, timed with it, as a training step would
            be: with one, the rate shows how much of the input work hides
            behind the step (what `prefetch` is for). Defaults to None (the
            batches are only pulled).

    Returns:
        `{name: {"median", "min", "max", "runs"}}` in images per second, in
        the order of `pipelines`; `runs` lists every repeat in order.

    Raises:
        ValueError: if `repeats` or `batches` is not positive, or a pipeline
            gives no batches.

    Example:

    >>> ds = tf.data.Dataset.range(64).batch(8)  # doctest: +SKIP
    >>> time_epochs({"range": ds}, repeats=3)["range"]["median"]  # doctest: +SKIP
    """
    if repeats < 1 or (batches is not None and batches < 1):
        raise ValueError(f"repeats={repeats}, batches={batches}: must be positive")
    if warmup:
        for pipeline in pipelines.values():
            _time_epoch(pipeline, batches, step)
    rates: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(repeats):
        for name, pipeline in pipelines.items():
            rates[name].append(_time_epoch(pipeline, batches, step))
    return {
        name: {
            "median": statistics.median(runs),
            "min": min(runs),
            "max": max(runs),
            "runs": [round(r, 1) for r in runs],
        }
        for name, runs in rates.items()
    }
