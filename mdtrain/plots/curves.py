"""Training curves: loss and accuracy per epoch, scaling, per-step curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from mdtrain.history import history_rows
from mdtrain.plots.common import (
    new_figure,
    tab10_colors,
)


def history_curves(
    history,
    title: str | None = None,
    num_classes: int | None = None,
    boundary: int | None = None,
) -> Figure:
    """Loss and accuracy per epoch, training against validation, of one run or several.

    The accuracy axis runs from 0 to 1, with a dotted line at chance
    (1 / classes), when `num_classes` is given; otherwise it fits the curves.

    Args:
        history: one dict per epoch with `loss`, `accuracy` and optionally
            `val_loss`, `val_accuracy` (`TrainResult.history`). A Keras
            `History` or its `.history` dict of lists is accepted too, and
            `{run label: history}` draws several runs, a colour each.
        title: figure title. Defaults to None.
        num_classes: classes of the task, for the chance line. Defaults to None.
        boundary: epochs before a dashed line (where fine-tuning starts). Defaults to None.

    Returns:
        The figure: two axes (loss, accuracy), one line per run and available series.
    """
    several = isinstance(history, Mapping) and "loss" not in history  # not Keras' `.history`
    runs = {k: history_rows(v) for k, v in (history if several else {"": history}).items()}
    fig = new_figure((8.5, 3.0), title)
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
        curves = {
            f"{run} {label}".strip(): [epoch.get(prefix + metric, np.nan) for epoch in rows]
            for run, rows in runs.items()
            for prefix, label in (("", "train"), ("val_", "validation"))
            if any(prefix + metric in epoch for epoch in rows)
        }
        _epoch_curves(ax, curves, ("-o", "--s") * len(runs), boundary)
        ax.set_title(metric, fontsize=10)
    if num_classes:
        _accuracy_axis(axes[1], 1 / num_classes)
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _epoch_curves(ax, curves: Mapping[str, Sequence[float]], styles, boundary=None) -> int:
    """One line per curve over epochs 1, 2, ... (dashed: `boundary`); returns the most epochs."""
    longest = 1
    for (label, values), style in zip(curves.items(), styles, strict=False):
        ax.plot(np.arange(1, len(values) + 1), values, style, label=label, markersize=4)
        longest = max(longest, len(values))
    ax.set_xlabel("epoch")
    ax.grid(alpha=0.3)
    if longest <= 20:
        ax.set_xticks(np.arange(1, longest + 1))
    if boundary is not None:
        ax.axvline(boundary + 0.5, color="gray", linestyle="--", linewidth=1)
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

    >>> runs = {"ImageNet": transfer.history, "scratch": scratch.history}  # doctest: +SKIP
    >>> accuracy_comparison(runs, chance=0.2)  # doctest: +SKIP
    """
    fig = new_figure((6.0, 3.2))
    ax = fig.subplots()
    curves = {
        label: [float(epoch.get("val_accuracy", np.nan)) for epoch in history]
        for label, history in runs.items()
    }
    longest = _epoch_curves(ax, curves, [f"-{marker}" for marker in "osD^v"], boundary)
    _accuracy_axis(ax, chance)
    ax.set_xlim(0.5, longest + 0.5)
    ax.set_ylabel("val accuracy")
    return _finish_lines(fig, ax, title)


def scaling_chart(
    replicas: Sequence[int], images_per_sec: Mapping[str, Sequence[float]], title: str | None = None
) -> Figure:
    """Images/s against replicas, one line per way of scaling, each with its ideal, dashed.

    Args:
        replicas: the replica counts measured, ascending.
        images_per_sec: label (e.g. "strong: global batch 64") -> one figure per count.
        title: axis title. Defaults to None.

    Returns:
        The figure; per label a measured and an ideal `Line2D` on `fig.axes[0]`.
    """
    fig, ax = _line_axes((5.6, 3.2), "replicas", "images/s")
    colors = tab10_colors(len(images_per_sec))
    for color, (label, rates) in zip(colors, images_per_sec.items(), strict=True):
        ax.plot(replicas, rates, "-o", color=color, label=label, markersize=4)
        ideal, kind = [rates[0] * n / replicas[0] for n in replicas], label.split(":")[0]
        ax.plot(replicas, ideal, "--", color=color, alpha=0.5, label=f"ideal ({kind})")
    ax.set(xticks=list(replicas), ylim=(0, None))
    return _finish_lines(fig, ax, title)


def step_curves(
    curves: Mapping[str, Sequence[float]],
    ylabel: str,
    steps: Sequence[int] | None = None,
    marks: Mapping[int, str] | None = None,
    title: str | None = None,
) -> Figure:
    """One line per curve against the training step, with labelled vertical marks.

    Args:
        curves: label -> one value per step, drawn thick to thin: equal curves stay visible.
        ylabel: what the values are.
        steps: the step of each value. Defaults to None (0, 1, 2, ...).
        marks: step -> label, drawn as dotted vertical lines (a warm-up's end, a killed
            worker). Defaults to None.
        title: axis title. Defaults to None.

    Returns:
        The figure; one `Line2D` per curve on `fig.axes[0]`, then the marks.
    """
    fig, ax = _line_axes((6.0, 3.0), "step", ylabel)
    colors = tab10_colors(len(curves))
    for i, (color, (label, values)) in enumerate(zip(colors, curves.items(), strict=True)):
        x = np.arange(len(values)) if steps is None else steps
        ax.plot(x, values, color=color, label=label, linewidth=3.0 / (i + 1))
    for step, label in (marks or {}).items():
        ax.axvline(step, color="gray", linestyle=":", linewidth=1.2)
        ax.annotate(
            label,
            (step, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            xytext=(3, -10),
            textcoords="offset points",
        )
    return _finish_lines(fig, ax, title)


def _line_axes(size: tuple[float, float], xlabel: str, ylabel: str):
    """A figure with one gridded axis, labelled; `(figure, axis)`."""
    fig = new_figure(size)
    ax = fig.subplots()
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _finish_lines(fig: Figure, ax, title: str | None) -> Figure:
    """The legend and the title, laid out."""
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
