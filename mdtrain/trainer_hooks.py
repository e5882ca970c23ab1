"""`ExactTrainer`'s departures from Keras' own training machinery.

`ExactFitHooks` (Keras' `fit` on the trainer's own compiled steps, making no distributed
iterator it throws away) and `skip_together` (an overflow on any replica skips the step on
all): docs/numerics.md. The private Keras names the hooks override are listed and checked
at import in `mdtrain.compat`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mdtrain import compat  # its check at import: the private names used here still exist


class ExactFitHooks:
    """Mixin for `mdtrain.loop.ExactTrainer`: where Keras' `fit` and `evaluate` are changed."""

    # Keras 3's fit/evaluate build the model from a first-batch sample reduced across replicas
    # with AddN, which fails when that batch splits unevenly (keras-team/keras#19246) and under
    # MultiWorkerMirroredStrategy (keras-team/keras#20585). A net that knows its input shape
    # needs no sample; `_symbolic_build` with no data then creates only the optimizer's and
    # metrics' variables.
    # Keras hands this method the epoch iterator `fit` and `evaluate` read: its spares are made
    # undistributed here (`compat`), under single-worker strategies (multi-worker ones shard).
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None and self.distribute_strategy.cluster_resolver is None:
            compat.spares_undistributed(iterator)
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
        if steps_per_epoch and self.steps_per_execution > 1 and _known_length(x) >= 0:
            x = x.filter(_keep)  # its cardinality unknown: a length to hide
        return super().fit(x, *args, steps_per_epoch=steps_per_epoch, **kwargs)


def _known_length(data) -> int:
    """A `tf.data.Dataset`'s batches, if it knows them; below 0 otherwise (or not a dataset)."""
    return int(data.cardinality()) if isinstance(data, tf.data.Dataset) else -1


def _keep(*element) -> bool:
    """Keeps every element: a dataset filtered by it has the same ones, its length unknown."""
    return True


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
