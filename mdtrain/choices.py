"""The names a user may choose: models and strategies.

Kept free of TensorFlow so that `mdtrain train` rejects a misspelt option in
a fraction of a second, before TensorFlow starts.
"""

from __future__ import annotations

import re

from mdtrain.errors import UsageError

EFFICIENTNETS = {
    "efficientnetv2-b0": "EfficientNetV2B0",
    "efficientnetv2-b1": "EfficientNetV2B1",
    "efficientnetv2-b2": "EfficientNetV2B2",
    "efficientnetv2-b3": "EfficientNetV2B3",
    "efficientnetv2-s": "EfficientNetV2S",
}
LITE0 = "efficientnet-lite0"  # ImageNet weights from an installed package, no network
MODELS = ("small-cnn", *EFFICIENTNETS, LITE0)
STRATEGIES = ("auto", "mirrored", "multiworker", "tpu", "one", "cpu:N")
CPU_STRATEGY = re.compile(r"^cpu:(\d+)$")


def check_strategy_name(name: str) -> str:
    """Returns `name` if it is a known strategy, else raises `UsageError`."""
    m = CPU_STRATEGY.match(name)
    if name in STRATEGIES[:-1] or (m and int(m.group(1)) >= 1):
        return name
    raise UsageError(f"--strategy {name}: unknown; choose one of {', '.join(STRATEGIES)} (N >= 1)")


def check_model_name(name: str) -> str:
    """Returns `name` if it is a known model, else raises `UsageError`."""
    if name in MODELS:
        return name
    raise UsageError(f"--model {name}: unknown; choose one of {', '.join(MODELS)}")
