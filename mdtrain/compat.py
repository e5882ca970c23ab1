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
from collections.abc import Iterator

import keras
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.framework import config as tf_config

from mdtrain.versions import TESTED

_NEEDED = (
    (keras.Model, "_maybe_symbolic_build"),
    (keras.Model, "_symbolic_build"),
    (keras.Model, "make_train_function"),
    (tf.distribute.MirroredStrategy, "_collective_key_base"),
    (multi_device_iterator_ops, "_create_device_dataset"),
    (tf_config, "is_op_determinism_enabled"),
    (tf_config, "disable_op_determinism"),
)


def check() -> None:
    """Raises `ImportError` if a private name mdtrain relies on is gone."""
    missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in _NEEDED
               if not hasattr(owner, name)]  # fmt: skip
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

    # Keras' train function runs each step in a `tf.while_loop` over `get_next_as_optional`,
    # which rounds some sums differently; through the trainer's own step `fit` ends with the
    # weights of `custom_fit` (which multi-worker runs must use, keras-team/keras#20585) bit
    # for bit. `make_train_function` is public but no documented hook: checked at import.
    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function

        def train_function(iterator):
            self.train_one_step(iterator)  # StopIteration at the end ends the epoch
            return self.get_metrics_result()

        self.train_function = train_function
        return train_function


def fresh_collective_keys() -> None:
    """Gives the next `MirroredStrategy` its own range of collective keys (no public API).

    Strategies over overlapping devices reuse group keys and fail (tensorflow/tensorflow#61314);
    TensorFlow's own tests move this base the same way.
    """
    tf.distribute.MirroredStrategy._collective_key_base += 100_000


def without_autotuning(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with tf.data's autotuning model off, so deleting its iterator never stalls.

    TensorFlow runs cancellation callbacks before marking the manager cancelled, so a woken
    model thread can sleep out its period (up to 60 s) while the deleting thread waits (no
    upstream issue yet; `benchmarks/teardown_stall.py` reproduces it).
    """
    # Without the model, AUTOTUNE parallelism is the core count; prefetch keeps its own tuning.
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


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
