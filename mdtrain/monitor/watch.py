"""`monitor.watch(dataset)`: the input wait of plain Keras `fit` and of a custom loop, measured.

Two ways, one per place the wait happens:

- A custom loop calls ``next()`` on a distributed iterator in Python, and
  that call blocks for exactly the step's wait: `WatchedDistributedDataset`
  times it on the loop's own thread. Cost: two clock reads per step.
- Plain `fit` fetches inside Keras' compiled train function, out of a
  callback's sight. `stamp_dataset` appends one sequential map to the
  dataset, which runs the moment the dataset hands an element over and puts
  the element's number (from `enumerate`: 0 for each new iterator), the wall
  time (`tf.timestamp`) and its batch size in a host queue.
  `mdtrain.monitor.stamps` sets the hand-over time against the step's start
  (the previous step's end), which the callback sees. Under a strategy the
  element's consumer is the distributed iterator's prefetch thread, one
  element per replica ahead of the step, so how long that thread blocks would
  overstate the step's wait (a `Zip` of timestamps around the dataset measures
  that, at twice the cost), and is not used. Not measured: the copy from the
  host to the device after the hand-over (microseconds on CPU replicas; on a
  GPU, the batch's transfer). Chosen over changing Keras' train function (a
  private API that each Keras release may move): public tf.data only.
  Cost: one map call per batch on the input thread, about 100 µs of CPU time
  on a loaded 2-core machine (`benchmarks/watch_overhead.py`).

Under op determinism (`tf.config.experimental.enable_op_determinism`)
TensorFlow refuses `tf.timestamp` ("Timestamp cannot be called when
determinism is enabled"), so the stamp's clock is then Python's
(`mdtrain.clock.graph_clock`). TensorFlow 2.21 then logs one line on stderr,
"NodeDef mentions attribute use_unbounded_threadpool which is not in the op
definition", wherever the stamps follow a parallel map: the message of a
tf.data graph rewrite, with no effect seen on the elements or their speed.
Minimal reproduction, no upstream issue found: under
`enable_op_determinism()`, iterate
``Dataset.range(40).map(f, num_parallel_calls=2).map(g)`` where ``g`` calls a
stateful `tf.numpy_function`.
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
        """``dataset``'s elements, unchanged, stamped into this queue as they are handed out.

        With ``elements_per_step`` k > 1 (a worker's pipeline feeding k
        replicas, one element each), only the last element of each step's k
        is stamped: the step can start once it is there.
        """
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
