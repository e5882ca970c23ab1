"""A run's numerics settings that depend on its devices: mixed precision, determinism.

Mixed precision computes in a 16-bit type and keeps the variables in float32.
It follows the strategy's own devices (`strategy.extended.worker_devices`):
bfloat16 where every one has it (GPUs of compute capability 8.0 and up, CPUs,
TPUs), float16 with loss scaling (Keras' `compile` adds it) on older GPUs (T4
7.5, V100 7.0), where bfloat16 has no tensor cores; a strategy mixing both kinds
takes its weakest device's, and never float16 on a CPU (emulated, slow).
TensorFlow-free at import; tested with fake devices.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from mdtrain.errors import UsageError


@dataclass(frozen=True)
class Device:
    """A replica's device: its kind (`"GPU"`, `"CPU"`, `"TPU"`), a GPU's name and capability."""

    kind: str
    name: str = ""
    compute_capability: tuple[int, int] | None = None

    @property
    def has_bfloat16(self) -> bool:
        return self.kind != "GPU" or (self.compute_capability or (0, 0)) >= (8, 0)

    def __str__(self) -> str:
        if self.kind != "GPU":
            return self.kind
        major, minor = self.compute_capability or ("?", "?")
        return f"{self.name or 'GPU'}, compute capability {major}.{minor}"


def choose_policy(mixed_precision: bool, devices: Iterable[Device]) -> str:
    """The Keras dtype policy of a run on `devices` (module doc): a policy name.

    Args:
        mixed_precision: whether the run asked for mixed precision.
        devices: the strategy's devices (`strategy_devices`).

    Returns:
        `"float32"`, `"mixed_bfloat16"` or `"mixed_float16"`; float32 also when
        CPUs and older GPUs share a strategy, which no 16-bit type serves.

    Example:

    >>> choose_policy(True, [Device("GPU", "Tesla T4", (7, 5))] * 2)
    'mixed_float16'
    """
    devices = list(devices)
    if not mixed_precision:
        return "float32"
    if all(device.has_bfloat16 for device in devices):
        return "mixed_bfloat16"
    return "float32" if any(device.kind == "CPU" for device in devices) else "mixed_float16"


def describe_policy(policy: str, devices: Iterable[Device]) -> str:
    """The line a run prints, e.g. `mixed precision: bfloat16 (CPU)`."""
    kinds = "; ".join(dict.fromkeys(map(str, devices)))
    words = {"mixed_float16": "float16 with loss scaling", "mixed_bfloat16": "bfloat16"}
    return f"mixed precision: {words.get(policy, 'off, float32')} ({kinds})"


def strategy_devices(strategy) -> list[Device]:
    """The devices of `strategy`'s replicas on this worker, GPUs with their name and capability."""
    import tensorflow as tf

    gpus = []  # visible physical GPU per logical GPU (virtual GPUs share a card)
    for gpu in tf.config.get_visible_devices("GPU"):
        gpus += [gpu] * len(tf.config.get_logical_device_configuration(gpu) or [None])
    devices = []
    for name in strategy.extended.worker_devices:
        spec = tf.DeviceSpec.from_string(name)
        if spec.device_type != "GPU":
            devices.append(Device(spec.device_type))
            continue
        details = tf.config.experimental.get_device_details(gpus[spec.device_index or 0])
        capability = details.get("compute_capability")
        devices.append(Device("GPU", details.get("device_name", ""), capability))
    return devices


def check_deterministic(strategy, net, image_size: int, variables) -> None:
    """Raises `UsageError` if TensorFlow cannot train `net` deterministically under `strategy`.

    Under op determinism some ops (on GPUs: depthwise-convolution filter
    gradients without cuDNN, for one) raise when they first run, which would
    be mid-run: the gradient of `variables` (those the run trains) on a
    one-image batch per replica finds them now. Call it under determinism, in
    the strategy's scope; `net`'s variables are left as they were.
    """
    import tensorflow as tf

    def gradient():
        watched = [v.value for v in variables if "float" in v.dtype]
        images = tf.zeros((1, image_size, image_size, 3), "uint8")
        with tf.GradientTape() as tape:
            tape.watch(watched)
            loss = tf.reduce_sum(net(images, training=True))
        tape.gradient(loss, watched)

    state = [v.numpy() for v in net.non_trainable_variables]  # BatchNorm statistics, RNG
    try:
        strategy.run(gradient)
    except tf.errors.OpError as e:
        if not isinstance(e, tf.errors.UnimplementedError) and "determinism" not in e.message:
            raise
        op = re.search(r"\[Op:(\w+)\]|\{\{node (\S+)\}\}", e.message)
        op = next(filter(None, op.groups())) if op else "an op"
        device = strategy.extended.worker_devices[0]
        raise UsageError(
            f"--deterministic: TensorFlow cannot run {op} deterministically on {device} "
            f"({e.message.strip().splitlines()[0]}); drop --deterministic or use another model"
        ) from None
    finally:
        for variable, value in zip(net.non_trainable_variables, state, strict=True):
            variable.assign(value)
