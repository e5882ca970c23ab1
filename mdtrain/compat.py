"""Every private Keras and TensorFlow name mdtrain relies on, in one place.

Each use says why no public API does the job and cites the upstream issue.
`check()` runs at import and raises `ImportError` naming what moved, so a
Keras or TensorFlow release that renames one of these fails loudly at the
first `import mdtrain.loop`, instead of training quietly with other numerics.
`TESTED_KERAS` is the range mdtrain is tested with (pyproject states it too).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

TESTED_KERAS = ((3, 15), (3, 15))  # oldest and newest minor releases tested (pyproject's extras)

_NEEDED = (
    (keras.Model, "_maybe_symbolic_build"),
    (keras.Model, "_symbolic_build"),
    (tf.distribute.MirroredStrategy, "_collective_key_base"),
    (multi_device_iterator_ops, "_create_device_dataset"),
)


def check() -> None:
    """Raises `ImportError` if a private name mdtrain relies on is gone."""
    missing = [f"{owner.__name__}.{name}" for owner, name in _NEEDED if not hasattr(owner, name)]
    if missing:
        raise ImportError(
            f"mdtrain relies on {', '.join(missing)}, which Keras {keras.__version__} / "
            f"TensorFlow {tf.__version__} no longer has; mdtrain is tested with Keras "
            f"{'.'.join(map(str, TESTED_KERAS[0]))} to {'.'.join(map(str, TESTED_KERAS[1]))}"
        )


class BuildWithoutSampleBatch:
    """Mixin for a `keras.Model` wrapper: build before `fit`/`evaluate` without a data sample.

    Keras 3's `fit` and `evaluate` build the model from a sample of the first
    batch, reduced across replicas with AddN, which fails when that batch
    splits unevenly (keras-team/keras#19246) and under
    MultiWorkerMirroredStrategy (keras-team/keras#20585). A model whose
    wrapped network knows its input shape needs no sample: build it from that
    shape, then let Keras create only the optimizer's and metrics' variables
    (`_symbolic_build` with no data does just that).
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        with self.distribute_strategy.scope():
            if not self.built and getattr(self.net, "inputs", None):
                self.build(self.net.inputs[0].shape)  # a functional net knows its input
            if not self.built:
                return super()._maybe_symbolic_build(iterator, data_batch)
            self._symbolic_build()


def fresh_collective_keys() -> None:
    """Gives the next `MirroredStrategy` its own range of collective keys.

    Two MirroredStrategies over overlapping devices in one process reuse the
    same group keys and fail ("joining a group with size 4, but that group
    has size 2", tensorflow/tensorflow#61314); TensorFlow's own tests move
    this base the same way. There is no public API for it.
    """
    tf.distribute.MirroredStrategy._collective_key_base += 100_000


def without_autotuning(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with tf.data's autotuning model off, so deleting its iterator never stalls.

    An autotuning iterator runs a model thread that sleeps between
    optimisation rounds, for up to 60 s once a run is a minute old. Deleting
    the iterator wakes that thread through its cancellation callback, but
    TensorFlow runs cancellation callbacks before it marks the manager
    cancelled (tsl `CancellationManager::StartCancelWithStatus`), so the woken
    thread can find "not cancelled" and sleep out the rest of its period
    (`tensorflow::data::model::Model::OptimizeLoop`) while the deleting
    thread waits for it: `mdtrain train` sat idle 30-90 s after its last
    epoch in 2 runs of 3 (gdb: three `OptimizeLoop` threads in a timed wait,
    the main thread in `RootDataset::Iterator::~Iterator`). Not reported
    upstream yet (no issue found, November 2026); `benchmarks/teardown_stall.py`
    reproduces it with TensorFlow alone. Without the model,
    `AUTOTUNE` parallelism is the core count and prefetch buffers keep their
    own (legacy) autotuning, which is what a CPU or GPU input pipeline needs.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def _per_device_datasets_without_autotuning() -> None:
    """Applies `without_autotuning` to the datasets `MirroredStrategy` makes per device.

    `MultiDeviceIterator` builds one small dataset per device (a generator and
    a one-element prefetch, nothing to tune) whose options do not come from
    the user's dataset, so an input pipeline's own options cannot reach them.
    """
    make = multi_device_iterator_ops._create_device_dataset
    if getattr(make, "mdtrain_without_autotuning", False):
        return

    def create_device_dataset(*args, **kwargs):
        return without_autotuning(make(*args, **kwargs))

    create_device_dataset.mdtrain_without_autotuning = True
    multi_device_iterator_ops._create_device_dataset = create_device_dataset


check()
_per_device_datasets_without_autotuning()
