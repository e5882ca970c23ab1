"""Training results: loss and accuracy per epoch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from mdtrain.history import history_rows
from mdtrain.plots.common import new_figure


def history_curves(
    history: Sequence[Mapping[str, float]],
    title: str | None = None,
    num_classes: int | None = None,
) -> Figure:
    """Loss and accuracy per epoch, training against validation.

    The accuracy axis runs from 0 to 1, with a dotted line at chance
    (1 / classes) when `num_classes` is given.

    Args:
        history: one dict per epoch with `loss`, `accuracy` and optionally
            `val_loss`, `val_accuracy` (`TrainResult.history`). A Keras
            `History` or its `.history` dict of lists is accepted too.
        title: figure title. Defaults to None.
        num_classes: classes of the task, for the chance line. Defaults to None.

    Returns:
        The figure: two axes (loss, accuracy), one line per available series.
    """
    history = history_rows(history)
    fig = new_figure((8.5, 3.0), title)
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
        curves = {}
        for prefix, label in (("", "train"), ("val_", "validation")):
            values = [epoch.get(prefix + metric) for epoch in history]
            if any(v is not None for v in values):
                curves[label] = [np.nan if v is None else float(v) for v in values]
        _epoch_curves(ax, curves, ("-o", "--s"))
        ax.set_title(metric, fontsize=10)
    _accuracy_axis(axes[1], 1 / num_classes if num_classes else None)
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _epoch_curves(ax, curves: Mapping[str, Sequence[float]], styles: Sequence[str]) -> int:
    """One line per curve over epochs 1, 2, ...; returns the longest curve's epoch count."""
    longest = 1
    for (label, values), style in zip(curves.items(), styles, strict=False):
        ax.plot(np.arange(1, len(values) + 1), values, style, label=label, markersize=4)
        longest = max(longest, len(values))
    ax.set_xlabel("epoch")
    ax.grid(alpha=0.3)
    if longest <= 20:
        ax.set_xticks(np.arange(1, longest + 1))
    return longest


def _accuracy_axis(ax, chance: float | None) -> None:
    """An accuracy axis from 0 to 1, with a dotted line at chance level when known."""
    if chance is not None:
        label = f"chance ({chance:.2f})"
        ax.axhline(chance, color="gray", linestyle=":", linewidth=1.2, label=label)
    ax.set_ylim(0, 1.02)


def accuracy_comparison(
    runs: Mapping[str, Sequence[Mapping[str, float]]],
    chance: float | None = None,
    boundary: int | None = None,
    title: str | None = None,
) -> Figure:
    """One validation accuracy curve per run on one axis from 0 to 1, with the chance level.

    Args:
        runs: run label → its history (one dict per epoch, `TrainResult.history`).
        chance: accuracy of guessing (1 / number of classes), drawn as a dotted
            line. Defaults to None (no line).
        boundary: draw a dashed line after this many epochs (e.g. where
            fine-tuning starts). Defaults to None.
        title: axis title. Defaults to None.

    Returns:
        The figure; one `Line2D` per run on `fig.axes[0]`, then the chance line.

    Example:

    >>> runs = {"ImageNet": transfer.history, "scratch": scratch.history}
    >>> accuracy_comparison(runs, chance=0.2)  # doctest: +SKIP
    """
    fig = new_figure((6.0, 3.2))
    ax = fig.subplots()
    curves = {
        label: [float(epoch.get("val_accuracy", np.nan)) for epoch in history]
        for label, history in runs.items()
    }
    longest = _epoch_curves(ax, curves, [f"-{marker}" for marker in "osD^v"])
    _accuracy_axis(ax, chance)
    if boundary is not None:
        ax.axvline(boundary + 0.5, color="gray", linestyle="--", linewidth=1)
    ax.set_xlim(0.5, longest + 0.5)
    ax.set_ylabel("val accuracy")
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
