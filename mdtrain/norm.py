"""Batch normalization whose statistics are those of the whole global batch.

Each channel's count, sum and sum of squares of ``x - K`` (K the moving mean)
travel in one all-reduce, and examples of weight 0 (an empty slice's dummy)
do not count, so N replicas train like one device. Why the shift, and how the
three `--batch-norm` choices compare: docs/numerics.md, "Batch normalization".
"""

from __future__ import annotations

import contextlib
import threading

import keras
import tensorflow as tf
from keras import ops

_local = threading.local()  # MirroredStrategy traces each replica in its own thread


@contextlib.contextmanager
def example_weights(weights: tf.Tensor):
    """Within this block, `ExactBatchNormalization` counts example i with `weights[i]` (0 or 1)."""
    previous = getattr(_local, "weights", None)
    _local.weights = weights
    try:
        yield
    finally:
        _local.weights = previous


def all_reduce_sum(values):
    """`values` summed over the replicas in sync; as they are outside a strategy or on one."""
    replica_context = tf.distribute.get_replica_context()
    if replica_context is None or replica_context.num_replicas_in_sync == 1:
        return values
    return replica_context.all_reduce(tf.distribute.ReduceOp.SUM, values)


def global_moments(x: tf.Tensor, weights: tf.Tensor | None = None, shift=None):
    """Per-channel `(mean, biased variance)` of `x` over every replica's examples of weight 1."""
    # One all-reduce; `shift` (per channel, the same on every replica, default 0) is subtracted
    # before summing, keeping the variance's digits where it is near the mean.
    axes = list(range(len(x.shape) - 1))  # all but the channels
    channels = int(x.shape[-1])
    weights = tf.ones(tf.shape(x)[:1], x.dtype) if weights is None else tf.cast(weights, x.dtype)
    per_example = tf.cast(tf.reduce_prod(tf.shape(x)[1:-1]), x.dtype)
    shift = tf.zeros([channels], x.dtype) if shift is None else tf.cast(shift, x.dtype)
    centred = x - tf.stop_gradient(shift)  # the moments do not depend on it
    weighted = centred * tf.reshape(weights, [-1] + [1] * (len(x.shape) - 1))
    local = [
        [tf.reduce_sum(weights) * per_example],
        tf.reduce_sum(weighted, axes),
        tf.reduce_sum(weighted * centred, axes),
    ]
    count, sums, squares = tf.split(all_reduce_sum(tf.concat(local, 0)), [1, channels, channels])
    count = tf.maximum(count, 1.0)
    centred_mean = sums / count
    variance = tf.maximum(squares / count - tf.square(centred_mean), 0.0)
    return shift + centred_mean, variance


@keras.saving.register_keras_serializable(package="mdtrain")
class ExactBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with global-batch statistics under any strategy.

    A drop-in replacement (same arguments and weights, saved and loaded as
    itself) that trains on the statistics of every replica's examples (module
    doc). Renormalisation and masks are not supported.

    Example:

    >>> x = keras.layers.Conv2D(8, 3)(keras.Input((32, 32, 3)))  # doctest: +SKIP
    >>> x = ExactBatchNormalization()(x)
    """

    def __init__(self, **kwargs):
        kwargs.pop("synchronized", None)  # always synchronised, exactly
        if kwargs.get("renorm"):
            raise ValueError("ExactBatchNormalization does not support renorm")
        super().__init__(**kwargs)

    def call(self, inputs, training=None, mask=None):
        if mask is not None:
            raise ValueError("ExactBatchNormalization does not support masks")
        if not (training and self.trainable) or self.axis not in (-1, len(inputs.shape) - 1):
            return super().call(inputs, training=training)
        # Statistics in float32 at least (float16 would lose them), float64 in float64.
        dtype = "float64" if self.compute_dtype == "float64" else "float32"
        values = ops.cast(inputs, dtype)
        weights = getattr(_local, "weights", None)
        mean, variance = global_moments(values, weights, self.moving_mean)
        for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
            moving.assign(moving * self.momentum + batch * (1.0 - self.momentum))
        offset = ops.cast(self.beta, dtype) if self.center else None
        scale = ops.cast(self.gamma, dtype) if self.scale else None
        outputs = ops.batch_normalization(values, mean, variance, -1, offset, scale, self.epsilon)
        return ops.cast(outputs, self.compute_dtype)


def swap_batch_norm(model: keras.Model, layer_class: type, **config) -> keras.Model:
    """A copy of functional or sequential `model`, same weights, batch norm `layer_class`."""

    def clone(layer):
        if isinstance(layer, keras.Model):
            return swap_batch_norm(layer, layer_class, **config)
        if isinstance(layer, keras.layers.BatchNormalization):
            return layer_class.from_config(layer.get_config() | config)  # e.g. synchronized
        return layer.__class__.from_config(layer.get_config())

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy
