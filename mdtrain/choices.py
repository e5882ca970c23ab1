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


STRATEGY_NOTEBOOK = "notebooks/07_choosing_a_strategy.ipynb"
# Strategies `mdtrain train` does not offer, and why (measured in notebook 07's matrix).
_NOT_OFFERED = {
    "ps": "parameter-server training needs a cluster of ps and worker tasks and its own "
    "asynchronous loop: run `mdtrain launch --workers N --ps M -- <train arguments>`",
    "central": "CentralStorageStrategy is experimental and, on one machine, gives what "
    "mirrored gives (synchronous updates), with the variables on one device; use mirrored",
}
_ALIASES = {
    "parameterserver": "ps", "parameterserverstrategy": "ps",
    "centralstorage": "central", "centralstoragestrategy": "central",
}  # fmt: skip


def check_strategy_name(name: str) -> str:
    """Returns `name` if `mdtrain train` offers that strategy, else raises `UsageError`.

    Strategies named by the articles that `mdtrain train` does not offer
    (parameter servers, central storage) get a one-line reason and a pointer
    to the notebook that measures them.

    Raises:
        UsageError: for an unknown or not offered name.
    """
    m = CPU_STRATEGY.match(name)
    if name in STRATEGIES[:-1] or (m and int(m.group(1)) >= 1):
        return name
    key = re.sub(r"[-_ ]", "", name.lower())
    key = _ALIASES.get(key, key)
    if key in _NOT_OFFERED:
        raise UsageError(f"--strategy {name}: {_NOT_OFFERED[key]} (see {STRATEGY_NOTEBOOK})")
    raise UsageError(
        f"--strategy {name}: unknown; choose one of {', '.join(STRATEGIES)} (N >= 1); "
        f"{STRATEGY_NOTEBOOK} compares them"
    )


def check_model_name(name: str) -> str:
    """Returns `name` if it is a known model, else raises `UsageError`."""
    if name in MODELS:
        return name
    raise UsageError(f"--model {name}: unknown; choose one of {', '.join(MODELS)}")
