"""What TensorFlow's allocator held on each GPU: the memory a model used, not what was reserved.

NVML sees the allocator's reservation instead (docs/figures.md, "Utilisation and memory").
"""

from __future__ import annotations

import contextlib
import sys


def _tensorflow_gpus():
    """TensorFlow and its GPUs' names (``"GPU:0"``, logical ones included); none if not loaded."""
    tf = sys.modules.get("tensorflow")  # never loaded here just to ask
    if tf is None:
        return None, []
    return tf, [
        device.name.split("device:")[-1] for device in tf.config.list_logical_devices("GPU")
    ]


def reset_allocator_peaks() -> None:
    """Starts each GPU's peak-memory figure afresh, for a run of its own."""
    tf, gpus = _tensorflow_gpus()
    for device in gpus:
        # A device whose allocator keeps no statistics: no figure, never an error.
        with contextlib.suppress(ValueError, RuntimeError):
            tf.config.experimental.reset_memory_stats(device)


def allocator_peaks() -> tuple[tuple[str, int], ...]:
    """``(device, bytes)``: the most TensorFlow's allocator held on each GPU since the reset."""
    tf, gpus = _tensorflow_gpus()
    peaks = []
    for device in gpus:
        with contextlib.suppress(ValueError, RuntimeError):
            peaks.append((device, int(tf.config.experimental.get_memory_info(device)["peak"])))
    return tuple(peaks)
