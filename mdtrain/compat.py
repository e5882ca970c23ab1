"""Every private Keras and TensorFlow name mdtrain relies on, in one place.

Each use says why no public API does the job and cites the upstream issue.
`check()` runs at import and raises `ImportError` naming what moved, so a
Keras or TensorFlow release that renames one of these fails loudly at the
first `import mdtrain.loop`, instead of training quietly with other numerics.

Importing this module changes nothing; `run_settings` changes TensorFlow
inside `train` only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import keras
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute.coordinator import values as coordinator_values
from tensorflow.python.framework import config as tf_config

from mdtrain.versions import TESTED

_NEEDED = (
    (keras.Model, "_maybe_symbolic_build"),
    (keras.Model, "_symbolic_build"),
    (keras.Model, "make_train_function"),
    (tf.distribute.MirroredStrategy, "_collective_key_base"),
    (multi_device_iterator_ops, "_create_device_dataset"),
    (coordinator_values.RemoteValueImpl, "_copy_to_local"),
    (tf_config, "is_op_determinism_enabled"),
    (tf_config, "disable_op_determinism"),
    (tf.data.Dataset, "_as_serialized_graph"),
)


def check() -> None:
    """Raises `ImportError` if a private name mdtrain relies on is gone."""
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in _NEEDED
        if not hasattr(owner, name)
    ]
    if missing:
        oldest, newest = (".".join(map(str, v)) for v in TESTED["keras"])
        raise ImportError(
            f"mdtrain relies on {', '.join(missing)}, which Keras {keras.__version__} / "
            f"TensorFlow {tf.__version__} no longer has; mdtrain is tested with Keras "
            f"{oldest} to {newest}"
        )


class ExactFitHooks:
    """Mixin for `mdtrain.loop.ExactTrainer`: the two places where Keras' `fit` is changed."""

    # Keras 3's fit/evaluate build the model from a first-batch sample reduced across replicas
    # with AddN, which fails when that batch splits unevenly (keras-team/keras#19246) and under
    # MultiWorkerMirroredStrategy (keras-team/keras#20585). A net that knows its input shape
    # needs no sample; `_symbolic_build` with no data then creates only the optimizer's and
    # metrics' variables.
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        with self.distribute_strategy.scope():
            if not self.built and getattr(self.net, "inputs", None):
                self.build(self.net.inputs[0].shape)  # a functional net knows its input
            if not self.built:
                return super()._maybe_symbolic_build(iterator, data_batch)
            self._symbolic_build()

    # Through the trainer's compiled steps `fit` ends with the weights of `custom_fit` (which
    # multi-worker runs must use, keras-team/keras#20585) bit for bit. `make_train_function`
    # is public but no documented hook: checked at import. Keras' last call of an epoch runs
    # `steps_per_execution` steps even past `steps_per_epoch`, into the next epoch's batches
    # (`InputData.train_epochs`): each call here stops at the epoch's end. Keras also counts
    # N steps per call towards a dataset's known length and starts it over once they reach
    # it, early: `fit` hides the length of epochs given back to back (`repeat()`: none known).
    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function

        def train_function(iterator):
            epoch_steps, done = getattr(self, "_epoch_position", (None, 0))
            steps = min(self.steps_per_execution, (epoch_steps or 1 << 62) - done)
            self._epoch_position = (epoch_steps, (done + steps) % epoch_steps if epoch_steps else 0)
            return self.train_steps(iterator, steps)  # StopIteration at the end ends the epoch

        self.train_function = train_function
        return train_function

    def fit(self, x=None, *args, steps_per_epoch=None, **kwargs):
        self._epoch_position = (steps_per_epoch, 0)  # steps per epoch, steps done in this one
        known = isinstance(x, tf.data.Dataset) and int(x.cardinality()) >= 0  # a length to hide
        if steps_per_epoch and self.steps_per_execution > 1 and known:
            x = x.filter(lambda *batch: True)  # its cardinality unknown
        return super().fit(x, *args, steps_per_epoch=steps_per_epoch, **kwargs)


def skip_together(optimizer, gradients: list) -> list:
    """`gradients`, made non-finite on every replica when any replica's are not finite."""
    # Keras 3.15's `LossScaleOptimizer._tf_apply` (MirroredStrategy's merge call) reads replica
    # 0's finite flag only ("`grads` is all-reduced", but the inner optimizer sums them later):
    # an overflow on another replica reaches the weights as NaN; across workers each worker
    # reads its own, and one that skips leaves the others' all-reduce waiting forever. No
    # upstream issue yet: docs/numerics.md has the reproduction. An all-reduced flag, and a
    # NaN added to one gradient where it is set, make Keras' own skip-and-halve run on every
    # replica. Identity without loss scaling.
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return gradients
    context = tf.distribute.get_replica_context()
    unfinished = 1.0 - tf.cast(optimizer.check_finite(gradients), tf.float32)
    if context is not None and context.num_replicas_in_sync > 1:
        unfinished = context.all_reduce(tf.distribute.ReduceOp.SUM, unfinished)
    first = next(i for i, g in enumerate(gradients) if g is not None)
    poison = tf.where(unfinished > 0, float("nan"), 0.0)
    return [g + tf.cast(poison, g.dtype) if i == first else g for i, g in enumerate(gradients)]


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


def dataset_stages(ds: tf.data.Dataset) -> list[str]:
    """The op names of `ds`'s stages, source first: `["TensorSliceDataset", "MapDataset", ...]`."""
    # tf.data has no public view of a pipeline's stages; its maintainers point to the dataset's
    # serialized GraphDef for that (tensorflow/tensorflow#37517). The notebooks' exercise checks
    # read it, before tf.data's optimizations, to say which stage a learner's pipeline lacks.
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    return [
        node.op for node in graph.node if node.op.endswith(("Dataset", "DatasetV2", "DatasetV3"))
    ]


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
