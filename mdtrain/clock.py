"""A wall clock inside TensorFlow graphs, also under op determinism.

`tf.timestamp` is the clock of a graph, but op determinism
(`tf.config.experimental.enable_op_determinism`, mdtrain's `--deterministic`)
refuses it: "Timestamp cannot be called when determinism is enabled" (TF 2.21).
Python's `time.time` through `tf.numpy_function` is allowed there, and reads
the same wall clock, for the cost of taking the GIL once a call: about 0.1 ms
of CPU on an idle core, up to 2 ms on a 2-core machine loaded 8 times over.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from mdtrain.compat import op_determinism_enabled


def _python_time() -> tf.Tensor:
    seconds = tf.numpy_function(lambda: np.float64(time.time()), [], tf.float64, stateful=True)
    return tf.ensure_shape(seconds, [])


def graph_clock():
    """The clock for a graph traced now: `tf.timestamp`, or Python's under op determinism.

    Returns:
        A function of no arguments that returns the wall time in seconds as a
        scalar float64 tensor.
    """
    return _python_time if op_determinism_enabled() else tf.timestamp
