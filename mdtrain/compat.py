"""Every private Keras and TensorFlow name mdtrain relies on, in one place.

Each use says why no public API does the job and cites the upstream issue.
`check()` runs at import and raises `ImportError` naming what moved, so a
Keras or TensorFlow release that renames one of these fails loudly at the
first `import mdtrain.loop`, instead of training quietly with other numerics.
The numerics built on them live beside the loop they serve
(`mdtrain.trainer_hooks`); here are only the touches themselves.

Importing this module changes nothing; `run_settings` changes TensorFlow
inside `train` only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import keras
import tensorflow as tf
from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter
from keras.src.trainers.epoch_iterator import EpochIterator
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute.coordinator import values as coordinator_values
from tensorflow.python.framework import config as tf_config

from mdtrain.versions import TESTED

# Each private name, and where it is used.
_NEEDED = (
    # overridden by `mdtrain.trainer_hooks.ExactFitHooks` (keras-team/keras#19246, #20585)
    (keras.Model, "_maybe_symbolic_build"),
    (keras.Model, "_symbolic_build"),
    (keras.Model, "make_train_function"),
    # `spares_undistributed`, and the attributes its condition reads (`_SPARE_CONDITION`)
    (EpochIterator, "_get_iterator"),
    (EpochIterator, "_enumerate_iterator"),
    # the functions below
    (tf.distribute.MirroredStrategy, "_collective_key_base"),
    (multi_device_iterator_ops, "_create_device_dataset"),
    (coordinator_values.RemoteValueImpl, "_copy_to_local"),
    (tf_config, "is_op_determinism_enabled"),
    (tf_config, "disable_op_determinism"),
    (tf.data.Dataset, "_as_serialized_graph"),
    (tf.data.Dataset, "_inputs"),
)


#: What `EpochIterator._enumerate_iterator` reads to decide on a spare iterator, as
#: `spares_undistributed` reads it: instance attributes, found in the method's code.
_SPARE_CONDITION = ("steps_per_epoch", "_num_batches", "_steps_seen", "_get_iterator")


def check() -> None:
    """Raises `ImportError` if a private name mdtrain relies on is gone."""
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in _NEEDED
        if not hasattr(owner, name)
    ]
    read = getattr(getattr(EpochIterator, "_enumerate_iterator", None), "__code__", None)
    missing += [
        f"EpochIterator.{name}"
        for name in _SPARE_CONDITION
        if read is None or name not in read.co_names
    ]
    if missing:
        oldest, newest = (".".join(map(str, v)) for v in TESTED["keras"])
        raise ImportError(
            f"mdtrain relies on {', '.join(missing)}, which Keras {keras.__version__} / "
            f"TensorFlow {tf.__version__} no longer has; mdtrain is tested with Keras "
            f"{oldest} to {newest}"
        )


def op_determinism_enabled() -> bool:
    """Whether op determinism is on (TensorFlow exports only the switch): no clocks then."""
    return tf_config.is_op_determinism_enabled()


def fresh_collective_keys() -> None:
    """Gives the next `MirroredStrategy` its own range of collective keys (no public API)."""
    # Strategies over overlapping devices reuse group keys and fail (tensorflow/tensorflow#61314);
    # TensorFlow's own tests move this base the same way.
    tf.distribute.MirroredStrategy._collective_key_base += 100_000


def without_autotuning(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with tf.data's autotuning model off, so deleting its iterator never stalls."""
    # TensorFlow runs cancellation callbacks before marking the manager cancelled, so a woken
    # model thread can sleep out its period (up to 60 s) while the deleting thread waits (no
    # upstream issue yet; `benchmarks/teardown_stall.py` reproduces it).
    # Without the model, AUTOTUNE parallelism is the core count; prefetch keeps its own tuning.
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def spares_undistributed(epoch_iterator) -> None:
    """Has Keras' `epoch_iterator` make the iterators it throws away from the plain dataset."""
    # Keras 3.13-3.15's `EpochIterator`, knowing a dataset's length and no `steps_per_epoch`,
    # makes a spare at each pass's end that the next pass replaces unused. Making it moves a
    # reshuffling dataset's seed on, so it must be made; undistributed it draws the same seeds
    # in 0.3 ms, not 80-100 ms (benchmarks/README.md, `tests/test_loop.py`). No upstream issue.
    adapter = getattr(epoch_iterator, "data_adapter", None)
    if not isinstance(adapter, TFDatasetAdapter) or hasattr(epoch_iterator, "_mdtrain_spares"):
        return  # another input (arrays make a new dataset a call), or done before
    plain, distributed = adapter.get_tf_dataset(), epoch_iterator._get_iterator

    def next_iterable():
        thrown_away = (
            epoch_iterator.steps_per_epoch is None
            and epoch_iterator._num_batches
            and epoch_iterator._steps_seen >= epoch_iterator._num_batches
        )
        return plain if thrown_away else distributed()

    epoch_iterator._get_iterator = epoch_iterator._mdtrain_spares = next_iterable


def dataset_stages(ds: tf.data.Dataset) -> list[str]:
    """The op names of `ds`'s stages, source first: `["TensorSliceDataset", "MapDataset", ...]`."""
    # tf.data has no public view of a pipeline's stages; its maintainers point to the dataset's
    # serialized GraphDef for that (tensorflow/tensorflow#37517). The notebooks' exercise checks
    # read it, before tf.data's optimizations, to say which stage a learner's pipeline lacks.
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    return [
        node.op for node in graph.node if node.op.endswith(("Dataset", "DatasetV2", "DatasetV3"))
    ]


def dataset_kinds(dataset) -> set[str]:
    """The class names of a dataset's stages, all the way up (`{"CacheDataset", ...}`); of a
    distributed dataset, those of its source; of anything else, none."""
    # Each dataset lists what it reads in `_inputs()`: free, where the serialized graph
    # (`dataset_stages`) copies the data a pipeline holds. `_original_dataset` is the source of
    # an `experimental_distribute_dataset`; should it move, the monitor's advice is only vaguer.
    ds = getattr(dataset, "_original_dataset", dataset)
    if not isinstance(ds, tf.data.Dataset):
        return set()
    kinds, upstream = set(), [ds]
    while upstream:
        dataset = upstream.pop()
        kinds.add(type(dataset).__name__)
        upstream.extend(dataset._inputs())
    return kinds


#: Stages that only slice, reorder, group or repeat tensors held in memory, as `dataset_kinds`
#: names them: a pipeline of these alone decodes and augments nothing.
IN_MEMORY_KINDS = frozenset(
    {"_TensorSliceDataset", "_TensorDataset", "_ShuffleDataset", "_BatchDataset", "_RepeatDataset"}
    | {"_PrefetchDataset", "_OptionsDataset", "_TakeDataset", "_SkipDataset", "CacheDataset"}
)


@contextlib.contextmanager
def one_result_copy_at_a_time() -> Iterator[None]:
    """A `ClusterCoordinator`'s step results copied to the chief one at a time, in the block."""
    # Each worker's thread copies its step's result to the chief as the step ends: the chief
    # crashed (SIGSEGV) with two threads in this copy, about 1 run in 250 of tests/test_ps.py's
    # cluster (no upstream issue yet: docs/multi-worker.md). Three scalars: waiting costs little.
    copy, lock = coordinator_values.RemoteValueImpl._copy_to_local, threading.Lock()

    def serial_copy(remote_value):
        with lock:
            return copy(remote_value)

    coordinator_values.RemoteValueImpl._copy_to_local = serial_copy
    try:
        yield
    finally:
        coordinator_values.RemoteValueImpl._copy_to_local = copy


@contextlib.contextmanager
def run_settings(deterministic: bool = False) -> Iterator[None]:
    """Per-device datasets without autotuning, and op determinism if asked, for one run."""
    # `MultiDeviceIterator` builds one small dataset per device (a generator and a
    # one-element prefetch, nothing to tune) whose options do not come from the user's
    # dataset, so an input pipeline's own options cannot reach them: replaced for the
    # block only, so the user's own pipelines outside `train` keep TensorFlow's behaviour.
    make = multi_device_iterator_ops._create_device_dataset
    multi_device_iterator_ops._create_device_dataset = lambda *args, **kwargs: without_autotuning(
        make(*args, **kwargs)
    )
    # TensorFlow exports only `enable_op_determinism`; its `config` module has the
    # reading and the undoing.
    determinism_before = tf_config.is_op_determinism_enabled()
    try:
        if deterministic:
            tf_config.enable_op_determinism()
        yield
    finally:
        multi_device_iterator_ops._create_device_dataset = make
        if deterministic and not determinism_before:
            tf_config.disable_op_determinism()


check()
