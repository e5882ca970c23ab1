"""Training results: loss and accuracy per epoch, and the confusion matrix."""

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
    epochs = np.arange(1, len(history) + 1)
    fig = new_figure((8.5, 3.0))
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
        for prefix, label, style in (("", "train", "-o"), ("val_", "validation", "--s")):
            values = [epoch.get(prefix + metric) for epoch in history]
            if any(v is not None for v in values):
                values = [np.nan if v is None else float(v) for v in values]
                ax.plot(epochs, values, style, label=label, markersize=4)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if len(epochs) <= 20:
            ax.set_xticks(epochs)
    _accuracy_axis(axes[1], 1 / num_classes if num_classes else None)
    for ax in axes:
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _accuracy_axis(ax, chance: float | None) -> None:
    """An accuracy axis from 0 to 1, with a dotted line at chance level when known."""
    if chance is not None:
        label = f"chance ({chance:.2f})"
        ax.axhline(chance, color="gray", linestyle=":", linewidth=1.2, label=label)
    ax.set_ylim(0, 1.02)


def confusion_matrix_plot(
    y_true, y_pred, class_names: Sequence[str], normalize: bool = False
) -> Figure:
    """Confusion matrix: rows the true class, columns the predicted one.

    Args:
        y_true: true class indices.
        y_pred: predicted class indices.
        class_names: name of each class index.
        normalize: show each row as fractions of its true class. Defaults to False.

    Returns:
        The figure; the matrix is on `fig.axes[0].images[0].get_array()`.
    """
    k = len(class_names)
    y_true = np.asarray(y_true, dtype=int).reshape(-1)
    y_pred = np.asarray(y_pred, dtype=int).reshape(-1)
    matrix = np.zeros((k, k), dtype=float)
    np.add.at(matrix, (y_true, y_pred), 1)
    if normalize:
        matrix = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    size = max(3.2, 0.55 * k + 1.8)
    fig = new_figure((size + 0.8, size))
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="Blues", vmin=0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    threshold = matrix.max() / 2 if matrix.size else 0
    for i in range(k):
        for j in range(k):
            text = f"{matrix[i, j]:.2f}" if normalize else f"{int(matrix[i, j])}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if matrix[i, j] > threshold else "black",
            )
    ax.set_xticks(range(k), class_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(k), class_names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    accuracy = float(np.mean(y_true == y_pred)) if y_true.size else float("nan")
    ax.set_title(f"Confusion matrix (accuracy {accuracy:.1%})", fontsize=10)
    fig.tight_layout()
    return fig


def accuracy_comparison(
    runs: Mapping[str, Sequence[Mapping[str, float]]],
    chance: float | None = None,
    metric: str = "val_accuracy",
    boundary: int | None = None,
    title: str | None = None,
) -> Figure:
    """One accuracy curve per run on one axis from 0 to 1, with the chance level.

    Args:
        runs: run label → its history (one dict per epoch, `TrainResult.history`).
        chance: accuracy of guessing (1 / number of classes), drawn as a dotted
            line. Defaults to None (no line).
        metric: the history key to draw. Defaults to `"val_accuracy"`.
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
    longest = 1
    for (label, history), marker in zip(runs.items(), "osD^v", strict=False):
        values = [float(epoch.get(metric, np.nan)) for epoch in history]
        longest = max(longest, len(values))
        ax.plot(np.arange(1, len(values) + 1), values, "-" + marker, label=label, markersize=4)
    _accuracy_axis(ax, chance)
    if boundary is not None:
        ax.axvline(boundary + 0.5, color="gray", linestyle="--", linewidth=1)
    ax.set_xlim(0.5, longest + 0.5)
    if longest <= 20:
        ax.set_xticks(np.arange(1, longest + 1))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
