"""`TrainConfig`: every choice of a training run, and the checks made before TensorFlow starts.

Free of TensorFlow at import, so that `mdtrain train` rejects a bad option in a
fraction of a second; `mdtrain.training.train(config)` runs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from mdtrain import choices

OUTPUT_FILES = ("model.keras", "history.json", "report.json", "monitor.png")
#: The options that take one of a few names, and the names.
_CHOICES = {
    "loop": choices.LOOPS,
    "augment_in": choices.AUGMENT_IN,
    "class_weight": choices.CLASS_WEIGHTS,
    "cache": choices.CACHE_MODES,
    "monitor": choices.MONITOR_DISPLAYS,
    "batch_norm": choices.BATCH_NORMS,
}


class _Rule(NamedTuple):
    """One check of `TrainConfig.validate`: the argument, whether it holds, what is wrong if not."""

    argument: str
    holds: bool
    problem: str


def _folder_problem(folder: Path) -> str | None:
    """Why mdtrain could not create or write `folder`, or None: checked before training."""
    if folder.exists():
        return None if folder.is_dir() else "is a file; pass a folder"
    parent = next(path for path in folder.absolute().parents if path.exists())
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable"
    return None


@dataclass
class TrainConfig:
    """Every choice of a training run; field names match `mdtrain train` options.

    `mdtrain train --help` describes each option; the fields hold their
    defaults. The ones whose meaning is not in their name:

    Args:
        data: the image folder (one subfolder per class); None trains on the
            demo dataset, created on first use.
        batch_size_per_replica: images per replica per step; or set
            `global_batch_size` instead (neither: 32 per replica).
        image_size: side of the square images; None picks 32 for
            `small-cnn` and 224 for the EfficientNets.
        augment_in: `"auto"`, `"pipeline"` or `"model"`; see `augment_place`.
        backup_dir: a folder for backups that let an interrupted run resume.
        cache: `"auto"`, `"memory"`, `"disk"` or `"none"` (data/README.md, "Caching").
        monitor: `"auto"`, `"widget"`, `"text"` or `"none"`: how progress shows.
        verbose: 0 silent, 1 a progress bar, 2 a line per epoch.
        log_every: under parameter-server training (`strategy="ps"`), steps
            per point of the fine-grained loss curve (`TrainResult.ps_log`).

    Example:

    >>> TrainConfig(model="efficientnetv2-b0", weights="imagenet").resolved_image_size
    224
    """

    data: str | None = None
    val_data: str | None = None
    validation_split: float = 0.0
    model: str = "small-cnn"
    weights: str = "none"
    image_size: int | None = None
    batch_size_per_replica: int | None = None
    global_batch_size: int | None = None
    epochs: int = 15
    fine_tune_epochs: int = 0
    learning_rate: float = 2e-3
    warmup_epochs: int = 0
    strategy: str = "auto"
    loop: str = "fit"
    mixed_precision: bool = False
    augment: bool = True
    augment_in: str = "auto"
    dropout: float = 0.2
    batch_norm: str = "exact"
    class_weight: str = "none"
    seed: int = 0
    deterministic: bool = False
    backup_dir: str | None = None
    backup_every_steps: int | None = None
    output: str | None = None
    cache: str = "auto"
    cache_dir: str | None = None
    monitor: str = "auto"
    verbose: int = 2
    log_every: int = 10
    steps_per_execution: int | None = None

    def validate(self) -> None:
        """Raises `UsageError` for any value that cannot work, before TensorFlow starts."""
        choices.check_strategy_name(self.strategy)
        choices.check_model_name(self.model)
        choices.check_batch_sizes(self.batch_size_per_replica, self.global_batch_size)
        for argument, allowed in _CHOICES.items():
            choices.check_one_of(argument, getattr(self, argument), allowed)
        rules = [*self._range_rules(), *self._parameter_server_rules(), *self._combination_rules()]
        for rule in rules:  # grouped by what they are about
            choices.check(rule.holds, rule.argument, getattr(self, rule.argument), rule.problem)
        for argument in ("output", "backup_dir", "cache_dir"):
            folder = getattr(self, argument)
            problem = _folder_problem(Path(folder)) if folder else None
            choices.check(problem is None, argument, folder, problem)
        taken = [
            name for name in OUTPUT_FILES if self.output and (Path(self.output) / name).exists()
        ]
        choices.check(
            not taken,
            "output",
            self.output,
            f"already holds {', '.join(taken)}; choose a new folder (nothing was overwritten)",
        )

    def _range_rules(self) -> list[_Rule]:
        """Numbers that must lie in a range."""
        smallest = choices.smallest_image_size(self.model)
        image_size_fits = self.image_size is None or self.image_size >= smallest
        steps_per_execution = self.steps_per_execution
        backup_every_steps = self.backup_every_steps
        return [
            _Rule("image_size", image_size_fits, f"{self.model} needs at least {smallest} pixels"),
            _Rule("dropout", 0 <= self.dropout < 1, "must be in [0, 1)"),
            _Rule("epochs", self.epochs >= 1, "must be at least 1"),
            _Rule("fine_tune_epochs", self.fine_tune_epochs >= 0, "must be at least 0"),
            _Rule("learning_rate", self.learning_rate > 0, "must be positive"),
            _Rule(
                "warmup_epochs",
                0 <= self.warmup_epochs < self.epochs,
                f"must be in [0, {self.epochs}): the warm-up is part of the training epochs",
            ),
            _Rule(
                "validation_split",
                0 <= self.validation_split < 1,
                "must be in [0, 1) (0 means no validation)",
            ),
            _Rule("seed", 0 <= self.seed < 2**32, "must be in [0, 2**32)"),
            _Rule("log_every", self.log_every >= 1, "must be at least 1"),
            _Rule(
                "steps_per_execution",
                steps_per_execution is None or steps_per_execution >= 1,
                "must be at least 1",
            ),
            _Rule(
                "backup_every_steps",
                backup_every_steps is None or backup_every_steps >= 1,
                "must be at least 1",
            ),
        ]

    def _parameter_server_rules(self) -> list[_Rule]:
        """What parameter-server training lacks."""
        # Its updates are asynchronous, its workers share no disk cache, and its loop has no
        # backups or second phase.
        under_ps = self.strategy == choices.PS_STRATEGY
        see = f"(see {choices.STRATEGY_NOTEBOOK})"
        not_under_ps = f"not under parameter-server training {see}"
        return [
            _Rule("backup_dir", not under_ps or self.backup_dir is None, not_under_ps),
            _Rule("fine_tune_epochs", not under_ps or self.fine_tune_epochs == 0, not_under_ps),
            _Rule("mixed_precision", not under_ps or not self.mixed_precision, not_under_ps),
            _Rule(
                "deterministic",
                not under_ps or not self.deterministic,
                f"parameter-server training's asynchronous updates cannot be reproduced {see}",
            ),
            _Rule(
                "cache",
                not under_ps or self.cache != "disk",
                "parameter-server training's workers would all write the same cache files; "
                f"use memory or none {see}",
            ),
        ]

    def _combination_rules(self) -> list[_Rule]:
        """Options that need, or exclude, another."""
        fine_tuning = self.fine_tune_epochs > 0
        needs_pretrained = "needs a pretrained base: "
        return [
            _Rule(
                "backup_every_steps",
                self.backup_every_steps is None or bool(self.backup_dir),
                "needs a backup folder (--backup-dir)",
            ),
            _Rule(
                "augment_in",
                self.augment or self.augment_in == "auto",
                "has nothing to place: --no-augment turns augmentation off",
            ),
            _Rule(
                "fine_tune_epochs",
                not fine_tuning or self.model != "small-cnn",
                needs_pretrained + "use an EfficientNet model",
            ),
            _Rule(
                "fine_tune_epochs",
                not fine_tuning or self.weights != "none",
                needs_pretrained + "pass --weights imagenet or a weights file",
            ),
            _Rule(
                "weights",
                self.weights in ("imagenet", "none") or os.path.isfile(self.weights),
                "no such file; pass imagenet, none, or a weights file",
            ),
            # EfficientNetV2 trains its head on a frozen base: a random base cannot learn.
            _Rule(
                "model",
                self.weights != "none" or self.model not in choices.EFFICIENTNETS,
                "trains only its head on a frozen base, so it needs --weights imagenet or a "
                "…_notop.h5 file; to train an EfficientNet from scratch use efficientnet-lite0",
            ),
        ]

    @property
    def resolved_image_size(self) -> int:
        """`image_size`, or the model's own size when it is None."""
        return self.image_size or (32 if self.model == "small-cnn" else 224)

    @property
    def resolved_steps_per_execution(self) -> int:
        """`steps_per_execution`, or 16, or the largest divisor of `backup_every_steps` up to 16."""
        every = self.backup_every_steps or 16
        return self.steps_per_execution or max(n for n in range(1, 17) if every % n == 0)

    @property
    def augment_place(self) -> str | None:
        """Where the run augments: `"pipeline"`, `"model"`, or None when it does not.

        `auto` is the model, on every kind of replica: the same pixels, and the CPU threads
        left to decode (benchmarks/README.md, "Augmenting in the pipeline or in the model").
        """
        if not self.augment:
            return None
        return "model" if self.augment_in == "auto" else self.augment_in
