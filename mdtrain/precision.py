"""The mixed-precision choice: which Keras dtype policy a run uses.

`auto` picks by the devices that compute: `mixed_float16` on GPUs (their
tensor cores run float16; float16's narrow range needs loss scaling, which
Keras' `compile` adds itself: a `LossScaleOptimizer`), and
`mixed_bfloat16` everywhere else (TPUs and recent CPUs compute bfloat16
natively; its float32-sized exponent needs no loss scaling). Variables stay
float32 under both. A pure function of the device kinds, so the choice is
tested without a GPU; `local_device_kinds` reads them from TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable

from mdtrain.errors import UsageError

MODES = ("auto", "float32")


def choose_policy(mode: str, device_kinds: Iterable[str]) -> str:
    """The Keras dtype policy name for `mode` on devices of `device_kinds`.

    `mode` is `"auto"` (mixed precision: float16 on GPUs, bfloat16 elsewhere)
    or `"float32"` (none). `device_kinds` are the types of the devices the
    strategy computes on, as TensorFlow names them (`"GPU"`, `"CPU"`, `"TPU"`;
    any case): a GPU among them means the GPUs compute. The name is one of
    `"mixed_float16"`, `"mixed_bfloat16"`, `"float32"`.

    Raises:
        UsageError: If `mode` is not one of `MODES`.

    Example:
        >>> choose_policy("auto", ["CPU", "GPU", "GPU"])
        'mixed_float16'
        >>> choose_policy("auto", ["CPU"])
        'mixed_bfloat16'
    """
    if mode not in MODES:
        raise UsageError(f"mixed precision {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "float32":
        return "float32"
    on_gpu = any(kind.upper() == "GPU" for kind in device_kinds)
    return "mixed_float16" if on_gpu else "mixed_bfloat16"


def local_device_kinds() -> list[str]:
    """The kinds of this process's logical devices, e.g. `["CPU", "GPU", "GPU"]`.

    Imports TensorFlow and initialises its devices: call it after
    `mdtrain.distribute.configure_devices`, never before.
    """
    import tensorflow as tf

    return [device.device_type for device in tf.config.list_logical_devices()]
