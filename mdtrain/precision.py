"""The mixed-precision choice: which Keras dtype policy a run uses.

Mixed precision picks by the devices that compute: `mixed_float16` on GPUs (their
tensor cores run float16; float16's narrow range needs loss scaling, which
Keras' `compile` adds itself: a `LossScaleOptimizer`), and
`mixed_bfloat16` everywhere else (TPUs and recent CPUs compute bfloat16
natively; its float32-sized exponent needs no loss scaling). Variables stay
float32 under both. A pure function of the device kinds, so the choice is
tested without a GPU.
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
