"""What a user may choose, and the checks of those choices: models, strategies, values.

Free of TensorFlow, so `mdtrain train` rejects a misspelt option at once; the API
and the command line call the same checks, so they agree.
"""

from __future__ import annotations

import json
import os
import re

from mdtrain.errors import UsageError, bad_value

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
#: Parameter-server training: only in the chief of a cluster with `ps` tasks (`launch --ps`).
PS_STRATEGY = "ps"
CPU_STRATEGY = re.compile(r"^cpu:(\d+)$")


STRATEGY_NOTEBOOK = "notebooks/09_choosing_a_strategy.ipynb"
# Strategies `mdtrain train` does not offer, and why (measured in notebook 09's matrix).
_NOT_OFFERED = {
    "ps": "parameter-server training runs in the chief of a cluster of ps and worker tasks "
    "(TF_CONFIG): start one with `mdtrain launch --workers N --ps M -- <train arguments>`",
    "central": "CentralStorageStrategy is experimental and, on one machine, gives what "
    "mirrored gives (synchronous updates), with the variables on one device; use mirrored",
}
_ALIASES = {
    "parameterserver": "ps",
    "parameterserverstrategy": "ps",
    "centralstorage": "central",
    "centralstoragestrategy": "central",
}


def check_strategy_name(name: str) -> None:
    """Raises `UsageError` unless offered; the articles' other strategies get a one-line reason."""
    cpu_replicas = CPU_STRATEGY.match(name)
    offered = name in STRATEGIES[:-1] or (cpu_replicas and int(cpu_replicas.group(1)) >= 1)
    if offered or (name == PS_STRATEGY and _is_ps_chief()):
        return
    key = re.sub(r"[-_ ]", "", name.lower())
    key = _ALIASES.get(key, key)
    if key in _NOT_OFFERED:
        raise bad_value("strategy", name, f"{_NOT_OFFERED[key]} (see {STRATEGY_NOTEBOOK})")
    raise bad_value(
        "strategy",
        name,
        f"unknown; choose one of {', '.join(STRATEGIES)} (N >= 1); "
        f"{STRATEGY_NOTEBOOK} compares them",
    )


def _is_ps_chief() -> bool:
    """Whether `TF_CONFIG` makes this process the chief of a cluster with parameter servers."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        return bool(config["cluster"].get("ps")) and config["task"]["type"] == "chief"
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


CACHE_MODES = ("auto", "memory", "disk", "none")
LOOPS = ("fit", "custom")
#: Where `mdtrain train --augment-in` applies the augmentation; auto: in the model.
AUGMENT_IN = ("auto", "pipeline", "model")
CLASS_WEIGHTS = ("auto", "none")
MONITOR_DISPLAYS = ("auto", "widget", "text", "none")
#: `--batch-norm`: mdtrain's exact layer, Keras' synchronized one, or per replica (`mdtrain.norm`).
BATCH_NORMS = ("exact", "synchronized", "local")


def check_model_name(name: str) -> None:
    """Raises `UsageError` unless `name` is a known model."""
    check(name in MODELS, "model", name, f"unknown; choose one of {', '.join(MODELS)}")


def check(condition: bool, argument: str, value, problem: str) -> None:
    """Raises `bad_value(argument, value, problem)` unless `condition` holds."""
    if not condition:
        raise bad_value(argument, value, problem)


def check_one_of(argument: str, value, allowed) -> None:
    """Raises `bad_value(argument, value, ...)` unless `value` is one of `allowed`."""
    check(value in allowed, argument, value, f"choose one of {', '.join(allowed)}")


def check_seed(seed: int) -> None:
    """Raises `UsageError` unless NumPy and Keras can seed with `seed`."""
    check(0 <= seed < 2**32, "seed", seed, "must be in [0, 2**32)")


def check_dropout(dropout: float) -> None:
    """Raises `UsageError` unless `dropout` is a rate in [0, 1)."""
    check(0 <= dropout < 1, "dropout", dropout, "must be in [0, 1)")


def smallest_image_size(model: str) -> int:
    """The smallest image side `model` takes (small-cnn: four 2x2 poolings)."""
    return 16 if model == "small-cnn" else 32


def check_image_size(model: str, image_size: int) -> None:
    """Raises `UsageError` unless `model` can take images of side `image_size`."""
    smallest = smallest_image_size(model)
    problem = f"{model} needs at least {smallest} pixels"
    check(image_size >= smallest, "image_size", image_size, problem)


def check_batch_sizes(per_replica: int | None, global_batch: int | None) -> None:
    """Raises `UsageError` unless at most one batch size is given, and it is positive."""
    if per_replica is not None and global_batch is not None:
        raise UsageError("give a per-replica or a global batch size, not both")
    for argument, value in (
        ("batch_size_per_replica", per_replica),
        ("global_batch_size", global_batch),
    ):
        check(value is None or value >= 1, argument, value, "must be at least 1")
