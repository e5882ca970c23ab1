"""`monitor.watch(dataset)`: the input wait of plain Keras `fit` and of a custom loop, measured.

`StampQueue.stamp_dataset` stamps each element as the dataset hands it over
(for `fit`); `WatchedDistributedDataset` times a custom loop's ``next()``.
Why these two, what they cost, and the one log line TensorFlow 2.21 prints
under op determinism (with its minimal reproduction): docs/figures.md, "Input wait".
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import tensorflow as tf

from mdtrain.clock import graph_clock
from mdtrain.monitor.stamps import Stamp


def _rows(component) -> tf.Tensor:
    """The batch size of one component of an element: its first dimension (1 for a scalar)."""
    if isinstance(component, tf.RaggedTensor):
        return tf.cast(component.nrows(), tf.int32)
    if isinstance(component, tf.SparseTensor):
        return tf.cast(component.dense_shape[0], tf.int32)
    return tf.reduce_prod(tf.shape(component)[:1])


class StampQueue:
    """A host queue of `Stamp` figures that watched datasets fill and the monitor drains."""

    def __init__(self) -> None:
        # Unbounded (capacity -1): a dataset watched by no monitor must never block on it.
        with tf.init_scope(), tf.device("/cpu:0"):
            self._queue = tf.queue.FIFOQueue(
                -1, [tf.int64, tf.float64, tf.int32], shapes=[[], [], []]
            )

    def stamp_dataset(
        self, dataset: tf.data.Dataset, elements_per_step: int = 1
    ) -> tf.data.Dataset:
        """``dataset``'s elements, unchanged, stamped into this queue as they are handed out:
        of each step's ``elements_per_step`` (a worker's for its replicas), the last only."""
        clock = graph_clock()

        def stamp(index, rows):
            return self._queue.enqueue((index // elements_per_step, clock(), rows))

        def record(index, element):
            rows = _rows(tf.nest.flatten(element)[0])
            if elements_per_step == 1:
                stamped = stamp(index, rows)
            else:
                last = index % elements_per_step == elements_per_step - 1
                stamped = tf.cond(last, lambda: stamp(index, rows), tf.no_op)
            with tf.control_dependencies([stamped]):  # the element waits for its stamp
                return tf.nest.map_structure(tf.identity, element)

        # `enumerate` numbers the elements afresh for each iterator; the map is sequential, so
        # it runs the moment `dataset` hands an element over, on the consumer's thread.
        return dataset.enumerate().map(record)

    def drain(self) -> list[Stamp]:
        """The stamps recorded since the last drain, in order."""
        count = int(self._queue.size())
        if count == 0:
            return []
        columns = [column.numpy().tolist() for column in self._queue.dequeue_many(count)]
        return [Stamp(*row) for row in zip(*columns, strict=True)]


class HostWait:
    """Seconds a loop's thread spent in ``next()`` on a watched distributed iterator."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def take(self) -> float | None:
        """The seconds since the last `take`, or ``None`` if no ``next()`` ran since."""
        if not self.calls:
            return None
        seconds, self.seconds, self.calls = self.seconds, 0.0, 0
        return seconds

    def clear(self) -> None:
        """Forgets what was timed (validation between epochs is not a training step's wait)."""
        self.seconds, self.calls = 0.0, 0


class WatchedIterator:
    """An iterator of a distributed dataset whose ``next()`` adds its blocking time to a wait."""

    def __init__(self, iterator, wait: HostWait) -> None:
        self._iterator = iterator
        self._wait = wait

    def __iter__(self) -> WatchedIterator:
        return self

    def __next__(self):
        return self._timed(next, self._iterator)

    def get_next(self):
        """`tf.distribute.DistributedIterator.get_next`, timed."""
        return self._timed(self._iterator.get_next)

    def get_next_as_optional(self):
        """`tf.distribute.DistributedIterator.get_next_as_optional`, timed."""
        return self._timed(self._iterator.get_next_as_optional)

    def __getattr__(self, name: str):
        return getattr(self._iterator, name)  # element_spec and the rest, unchanged

    def _timed(self, fetch, *args):
        started = time.perf_counter()
        try:
            return fetch(*args)
        finally:
            self._wait.seconds += time.perf_counter() - started
            self._wait.calls += 1


class WatchedDistributedDataset:
    """A distributed dataset whose iterators time their ``next()``: iterate it in Python."""

    def __init__(self, dataset, wait: HostWait) -> None:
        self._dataset = dataset
        self._wait = wait

    def __iter__(self) -> Iterator:
        return WatchedIterator(iter(self._dataset), self._wait)

    def __getattr__(self, name: str):
        return getattr(self._dataset, name)  # element_spec, reduce, ... unchanged


def watched(dataset, stamps: StampQueue, wait: HostWait, elements_per_step: int = 1):
    """``dataset`` (tf.data or distributed) watched as `MonitorCallback.watch` says."""
    if isinstance(dataset, tf.data.Dataset):
        return stamps.stamp_dataset(dataset, elements_per_step)
    if isinstance(dataset, tf.distribute.DistributedDataset):
        return WatchedDistributedDataset(dataset, wait)
    raise TypeError(
        "monitor.watch takes a tf.data.Dataset (for model.fit) or a distributed dataset "
        f"(strategy.experimental_distribute_dataset, for a custom loop); got {type(dataset)}"
    )
