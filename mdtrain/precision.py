"""A run's numerics settings that depend on its devices: mixed precision, determinism.

The rules: docs/numerics.md, "Precision, TF32 and determinism on GPUs".
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
    compute_capability: tuple[int, int] = (0, 0)  # unknown: the oldest

    def __str__(self) -> str:
        capability = ".".join(map(str, self.compute_capability))
        return f"{self.name}, compute capability {capability}" if self.kind == "GPU" else self.kind


def choose_policy(mixed_precision: bool, devices: Iterable[Device]) -> str:
    """The Keras dtype policy name of a run on `devices` (module doc), float32 if none fits.

    >>> choose_policy(True, [Device("GPU", "Tesla T4", (7, 5))] * 2)
    'mixed_float16'
    """
    # The kinds of device without bfloat16 tensor cores, and CPUs and TPUs (which have bfloat16).
    kinds = {
        device.kind
        for device in devices
        if device.kind != "GPU" or device.compute_capability < (8, 0)
    }
    if not mixed_precision or kinds <= {"CPU", "TPU"}:  # all have bfloat16
        return "mixed_bfloat16" if mixed_precision else "float32"
    return "float32" if "CPU" in kinds else "mixed_float16"  # never float16 on a CPU


def describe_policy(policy: str, devices: Iterable[Device]) -> str:
    """The line a run prints, e.g. `mixed precision: bfloat16 (CPU)`."""
    kinds = "; ".join(dict.fromkeys(map(str, devices)))
    words = {"mixed_float16": "float16 with loss scaling", "mixed_bfloat16": "bfloat16"}
    return f"mixed precision: {words.get(policy, 'off, float32')} ({kinds})"


def strategy_devices(strategy) -> list[Device]:
    """The devices of `strategy`'s replicas on this worker, GPUs with their name and capability."""
    import tensorflow as tf

    devices = []
    for spec in map(tf.DeviceSpec.from_string, strategy.extended.worker_devices):
        if spec.device_type != "GPU":
            devices.append(Device(spec.device_type))
            continue
        card = _card_of_each_logical_gpu()[spec.device_index]
        details = tf.config.experimental.get_device_details(card)
        name = details.get("device_name", "GPU")
        devices.append(Device("GPU", name, details.get("compute_capability", (0, 0))))
    return devices


def _card_of_each_logical_gpu() -> list:
    """The physical GPU behind each logical GPU, in the logical GPUs' order."""
    import tensorflow as tf

    # A card split into logical GPUs (`configure_devices`) has one configuration per part;
    # an unsplit card has none and is one logical GPU.
    cards = []
    for card in tf.config.get_visible_devices("GPU"):
        parts = tf.config.get_logical_device_configuration(card)
        cards += [card] * max(1, len(parts or []))
    return cards


def check_deterministic(strategy, net, image_size: int, variables) -> None:
    """Raises `UsageError` if TensorFlow cannot train `net` deterministically under `strategy`."""
    # Some ops (GPU depthwise filter gradients without cuDNN) raise when first run: one gradient
    # of the trained `variables`, one image per replica, in the scope, finds them; state kept.
    import tensorflow as tf

    def gradient():
        watched = [variable.value for variable in variables if "float" in variable.dtype]
        images = tf.zeros((1, image_size, image_size, 3), "uint8")
        with tf.GradientTape() as tape:
            tape.watch(watched)
            loss = tf.reduce_sum(net(images, training=True))
        tape.gradient(loss, watched)

    state = [variable.numpy() for variable in net.non_trainable_variables]  # BatchNorm, RNG
    logger = tf.get_logger()
    level = logger.level
    # Eagerly (a graph's error names the op less plainly): silence MirroredStrategy's warning
    # on stderr that running eagerly costs more, true of training and not of this one probe.
    logger.setLevel("ERROR")
    try:
        strategy.run(gradient)
    except tf.errors.OpError as error:
        refused = isinstance(error, tf.errors.UnimplementedError) or "determinism" in error.message
        if not refused:
            raise
        raise UsageError(
            f"--deterministic: TensorFlow cannot run {_failing_op(error.message)} "
            f"deterministically on {strategy.extended.worker_devices[0]} "
            f"({error.message.strip().splitlines()[0]}); drop --deterministic or use another model"
        ) from None
    finally:
        logger.setLevel(level)
        for variable, value in zip(net.non_trainable_variables, state, strict=True):
            variable.assign(value)


def _failing_op(message: str) -> str:
    """The op an error message names (`[Op:Name]` eagerly, `{{node name}}` in a graph)."""
    found = re.search(r"\[Op:(\w+)\]|\{\{node (\S+)\}\}", message)
    if found is None:
        return "an op"
    return found.group(1) or found.group(2)
