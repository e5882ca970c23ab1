"""A wall clock inside TensorFlow graphs, also under op determinism.

Op determinism (`--deterministic`) refuses `tf.timestamp`; Python's `time.time` through
`tf.numpy_function` reads the same clock there, at a cost: docs/figures.md, "Input wait".
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
