"""The mixed-precision choice: which Keras dtype policy a run uses.

Mixed precision is `mixed_float16` on GPUs (tensor cores; Keras' `compile` adds
the loss scaling float16 needs) and `mixed_bfloat16` elsewhere (native on TPUs and
recent CPUs, no loss scaling); variables stay float32. Tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable


def choose_policy(mixed_precision: bool, device_kinds: Iterable[str]) -> str:
    """The Keras dtype policy of a run whose devices are of `device_kinds` (any case)."""
    if not mixed_precision:
        return "float32"
    on_gpu = any(kind.upper() == "GPU" for kind in device_kinds)
    return "mixed_float16" if on_gpu else "mixed_bfloat16"


def local_device_kinds() -> list[str]:
    """This process's logical device kinds; initialises them: call after configure_devices."""
    import tensorflow as tf

    return [device.device_type for device in tf.config.list_logical_devices()]
