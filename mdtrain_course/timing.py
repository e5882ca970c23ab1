"""Timing input pipelines the way training meets them: whole epochs, repeats interleaved."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterable, Mapping

#: What `time_epochs` times: an iterable that `iter()` restarts, or a function making one.
Pipeline = Iterable | Callable[[], Iterable]


def _time_epoch(pipeline: Pipeline, batches: int | None, step: Callable | None) -> float:
    """Images per second of one pass over a fresh iterator (making it is not timed)."""
    iterator = iter(pipeline if isinstance(pipeline, Iterable) else pipeline())
    begin, images = time.perf_counter(), 0
    for count, batch in enumerate(iterator, start=1):
        images += len(batch[0] if isinstance(batch, (tuple, list)) else batch)
        if step is not None:
            step(batch)
        if batches is not None and count >= batches:
            break
    seconds = time.perf_counter() - begin
    # Dropped before the next pipeline is timed, so none keeps working in the background.
    del iterator
    gc.collect()
    if images == 0:
        raise ValueError("a pipeline gave no batches")
    return images / seconds


def _warm_up(pipeline: Pipeline, own, batches: int | None, step: Callable | None) -> None:
    """An untimed epoch of `pipeline` (`own` True), of `own` (an iterable), or `own()`."""
    if own is True or isinstance(own, Iterable):
        _time_epoch(pipeline if own is True else own, batches, step)
    elif callable(own):
        own()


def time_epochs(
    pipelines: Mapping[str, Pipeline],
    repeats: int = 3,
    batches: int | None = None,
    warmup: bool | Mapping[str, Iterable | Callable[[], object] | None] = True,
    step: Callable[[object], object] | None = None,
) -> dict[str, dict]:
    """Images per second of input pipelines over whole epochs, repeats interleaved.

    Every timing starts a fresh iterator and pulls an epoch, so a shuffle
    buffer or a cache that fills before the first batch counts, as in
    training. A pipeline given as a function is called (untimed, like
    `iter()`) before every timing, which then times a new pipeline's first
    epoch. Each pipeline warms up, untimed, right before its first timing
    (tracing, compiling, filling caches). The repeats are interleaved (every
    pipeline once, then again), so a change in the machine's load hits every
    pipeline alike; take ratios repeat by repeat from `runs`.

    Args:
        pipelines: `{name: pipeline}`: an iterable of batches that `iter()`
            restarts (a `tf.data.Dataset`, a Keras `DirectoryIterator`, a
            list), or a function of no arguments that makes one. A batch is
            an `(images, labels, ...)` tuple or an image batch.
        repeats: timed epochs per pipeline. Defaults to 3.
        batches: at most this many batches per epoch, warm-ups included;
            needed for endless iterators such as `flow_from_directory`'s
            (pass `len(iterator)`). Defaults to None (until the pipeline ends).
        warmup: True: one epoch of each pipeline; False: none. A mapping
            gives some pipelines their own warm-up: an iterable to pull one
            epoch of (say, epoch 0 of an `InputData` whose memory cache the
            timed epoch 1 reads), a function to call, or None for none;
            the pipelines it does not name warm up on an epoch of their own.
            Defaults to True.
        step: called on every batch, timed with it, as a training step would
            be (warm-ups included), to show how much input work hides behind
            the step. Defaults to None (the batches are only pulled).

    Returns:
        `{name: {"median", "min", "max", "runs"}}` in images per second, in
        the order of `pipelines`; `runs` lists every repeat in order.

    Raises:
        ValueError: if `repeats` or `batches` is not positive, `warmup` names
            a pipeline not in `pipelines`, or a pipeline gives no batches.

    Example:

    >>> data = mdtrain.InputData(splits, 160, 32, cache="memory")  # doctest: +SKIP
    >>> rates = time_epochs(
    ...     {"fresh": lambda: data.train_epochs(1, 2)},  # a new pipeline per timing
    ...     warmup={"fresh": data.train_epochs(0, 1)},  # epoch 0 fills the cache
    ... )  # doctest: +SKIP
    >>> rates["fresh"]["median"], rates["fresh"]["runs"]  # doctest: +SKIP
    """
    if repeats < 1 or (batches is not None and batches < 1):
        raise ValueError(f"repeats={repeats}, batches={batches}: must be positive")
    warmups = dict.fromkeys(pipelines, warmup if isinstance(warmup, bool) else True)
    if not isinstance(warmup, bool):
        warmups.update(warmup)
    if unknown := sorted(set(warmups) - set(pipelines)):
        raise ValueError(f"warmup names no pipeline: {', '.join(unknown)}")
    rates: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(repeats):
        for name, pipeline in pipelines.items():
            if not rates[name]:  # right before its first timing
                _warm_up(pipeline, warmups[name], batches, step)
            rates[name].append(_time_epoch(pipeline, batches, step))
    return {
        name: {
            "median": statistics.median(runs),
            "min": min(runs),
            "max": max(runs),
            "runs": [round(rate, 1) for rate in runs],
        }
        for name, runs in rates.items()
    }
