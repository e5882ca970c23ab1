"""Matplotlib figures for the notebooks: images, class counts, training curves, throughput.

Every function returns a `matplotlib.figure.Figure` and never calls
`plt.show()`: a notebook displays the returned figure, a script saves it,
a test inspects it. Figures are sized to read well at dpi ~80 and stay small
when committed inside a notebook.

Images may be uint8 (0-255) or float in [0, 255] or [0, 1]; tensors are
converted with `numpy.asarray`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from mdtrain.history import history_rows
from mdtrain.plots.common import (
    DPI,
    RIGHT_COLOR,
    WRONG_COLOR,
    axes_grid,
    grouped_bars,
    new_figure,
    show_image,
    tab10_colors,
)

__all__ = [
    "DPI",
    "RIGHT_COLOR",
    "WRONG_COLOR",
    "accuracy_comparison",
    "augmentation_grid",
    "class_counts_bar",
    "history_curves",
    "image_grid",
    "overlap_timeline",
    "recall_bars",
    "replica_class_counts_plot",
    "scaling_chart",
    "side_by_side_augmentations",
    "step_curves",
    "throughput_bars",
]


def image_grid(
    images,
    labels: Sequence[int],
    class_names: Sequence[str],
    ncols: int = 6,
    title: str | None = None,
    predicted: Sequence[int] | None = None,
    per_class: int | None = None,
) -> Figure:
    """A grid of images, each titled with its class name, or with the class predicted for it.

    With `predicted`, each image is titled with the class the model gave it
    and framed green where that is its true class, red where not. With
    `per_class`, the grid has one row per true class, named at its left,
    holding up to `per_class` of that class's images (its mistakes first
    when `predicted` is given): every class shows, however few images it
    has and however the images are ordered.

    Args:
        images: sequence or array of images, (N, H, W, C) or (N, H, W).
        labels: true class index of each image.
        class_names: name of each class index.
        ncols: images per row (without `per_class`). Defaults to 6.
        title: figure title. Defaults to None.
        predicted: optional predicted class index of each image. Defaults to None.
        per_class: images per true class, one row each. Defaults to None
            (the images in their order, `ncols` per row).

    Returns:
        The figure, one axes per image shown.

    Raises:
        ValueError: if `labels` or `predicted` do not match the images.

    Example:

    >>> fig = image_grid(batch_images, batch_labels, class_names, ncols=4)  # doctest: +SKIP
    >>> fig = image_grid(val_images, val_labels, class_names, predicted=predicted,
    ...                  per_class=4)  # doctest: +SKIP
    """
    images = list(images)
    labels = _indices(labels, len(images), "labels")
    marks = None  # right or wrong, per image
    if predicted is not None:
        predicted = _indices(predicted, len(images), "predicted")
        marks = [p == label for p, label in zip(predicted, labels, strict=True)]
    names = labels if predicted is None else predicted
    if per_class is None:
        order, rows = list(range(len(images))), None
    else:
        order, rows = _class_rows(labels, marks, per_class)
        ncols = per_class
    left = 0.0 if rows is None else 0.12 * max(len(class_names[i]) for i in set(labels))
    # A row per class holds more images than a batch grid: smaller cells keep the figure small.
    cell = 1.3 if rows is None else 0.95
    fig, axes = axes_grid(len(order), ncols, cell=cell, title=title, rows=rows, left=left)
    for ax, i in zip(axes, order, strict=True):
        color = None if marks is None else (RIGHT_COLOR if marks[i] else WRONG_COLOR)
        text = class_names[names[i]] if (rows is None or predicted is not None) else None
        show_image(ax, images[i], text, color)
        if rows is not None and ax.get_subplotspec().is_first_col():
            ax.set_ylabel(class_names[labels[i]], rotation=0, ha="right", va="center", fontsize=9)
    return fig


def _indices(values, n: int, what: str) -> list[int]:
    values = [int(v) for v in np.asarray(values).reshape(-1)]
    if len(values) != n:
        raise ValueError(f"{n} images but {len(values)} {what}")
    return values


def _class_rows(labels: list[int], marks, per_class: int) -> tuple[list[int], list[int]]:
    """Indices of up to `per_class` images per class (wrong ones first), and each row's length."""
    if per_class < 1:
        raise ValueError(f"per_class={per_class}: must be at least 1")
    order, rows = [], []
    for label in sorted(set(labels)):
        members = [i for i, x in enumerate(labels) if x == label]
        if marks is not None:  # mistakes first, each group in its original order
            members.sort(key=lambda i: bool(marks[i]))
        order += members[:per_class]
        rows.append(len(members[:per_class]))
    return order, rows


def augmentation_grid(original, augmented_list, title: str | None = None, ncols: int = 4) -> Figure:
    """The original image, then its augmented versions, in one grid.

    Args:
        original: the source image.
        augmented_list: augmented versions of it (sequence or batch array).
        title: figure title. Defaults to None.
        ncols: images per row. Defaults to 4.

    Returns:
        The figure: 1 + len(augmented_list) axes, the first titled "original".
    """
    images = [original, *list(augmented_list)]
    fig, axes = axes_grid(len(images), ncols, title=title)
    for i, (ax, image) in enumerate(zip(axes, images, strict=True)):
        show_image(ax, image, "original" if i == 0 else None, "black" if i == 0 else None)
    return fig


def side_by_side_augmentations(original, ours, idg) -> Figure:
    """Two grids of augmentations of one image, side by side, to compare two pipelines.

    Args:
        original: the source image (shown small above the grids).
        ours: 12 augmented versions from `mdtrain.augment_batch` (drawn 3 x 4).
        idg: 12 augmented versions from ImageDataGenerator (drawn 3 x 4).

    Returns:
        The figure: 1 + len(ours) + len(idg) image axes.
    """
    ours, idg = list(ours), list(idg)
    rows = max(1, -(-max(len(ours), len(idg)) // 4))
    fig = new_figure((7.2, 0.9 * rows + 1.2))
    fig.subplots_adjust(left=0.01, right=0.99, top=0.94, bottom=0.01)
    outer = fig.add_gridspec(2, 2, height_ratios=[0.9, 0.9 * rows], wspace=0.06, hspace=0.18)
    ax = fig.add_subplot(outer[0, :])
    show_image(ax, original, "original", "black")
    ax.set_anchor("C")
    titles = ("mdtrain.augment_batch", "ImageDataGenerator")
    for column, (images, title) in enumerate(zip((ours, idg), titles, strict=True)):
        inner = outer[1, column].subgridspec(rows, 4, wspace=0.05, hspace=0.05)
        for i, image in enumerate(images):
            sub = fig.add_subplot(inner[i // 4, i % 4])
            show_image(sub, image)
            if i == 1:
                sub.set_title(title, fontsize=10, loc="center", x=1.0)
    return fig


def class_counts_bar(counts: Mapping) -> Figure:
    """Bar chart of examples per class, one group of bars per split if given.

    Args:
        counts: `{class: n}`, or `{split: {class: n}}` (e.g. `CheckReport.counts`).

    Returns:
        The figure: one bar per (split, class), each labelled with its count.
    """
    if counts and all(isinstance(v, Mapping) for v in counts.values()):
        splits = {str(k): dict(v) for k, v in counts.items()}
    else:
        splits = {"": dict(counts)}
    class_names = list(dict.fromkeys(c for per_class in splits.values() for c in per_class))
    fig = new_figure((max(4.0, 0.9 * len(class_names) + 1.5), 3.0))
    ax = fig.subplots()
    grouped_bars(
        ax, {s: [per_class.get(c, 0) for c in class_names] for s, per_class in splits.items()}
    )
    ax.set_xticks(range(len(class_names)), class_names, rotation=30 if len(class_names) > 6 else 0)
    ax.set_ylabel("images")
    ax.set_title("Images per class", fontsize=11)
    ax.margins(y=0.15)
    if len(splits) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def replica_class_counts_plot(
    counts, class_names: Sequence[str], title: str | None = None
) -> Figure:
    """Stacked bars: the classes in each replica's slice of each global batch.

    One panel per replica, one bar per step, coloured by class: a class
    missing from a bar never reached that replica's gradient on that step.

    Args:
        counts: array `(steps, replicas, classes)`: examples of each class
            on each replica at each step (notebook 08 reads them back with
            `strategy.experimental_local_results`).
        class_names: name of each class index.
        title: figure title. Defaults to None.

    Returns:
        The figure.
    """
    counts = np.asarray(counts)
    steps, replicas, k = counts.shape
    fig = new_figure((2.9 * replicas + 1.4, 2.5), title)
    axes = np.atleast_1d(fig.subplots(1, replicas, sharey=True))
    colors = tab10_colors(k)
    for r, ax in enumerate(axes):
        bottom = np.zeros(steps)
        for c in range(k):
            ax.bar(
                np.arange(1, steps + 1),
                counts[:, r, c],
                bottom=bottom,
                width=0.85,
                color=colors[c],
                label=class_names[c],
            )
            bottom += counts[:, r, c]
        ax.set_title(f"replica {r}", fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("examples")
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def recall_bars(
    recalls: Mapping[str, Sequence[float]],
    class_names: Sequence[str],
    title: str = "Per-class recall",
) -> Figure:
    """Grouped bars of recall per class, one bar per variant (baseline, remedies, ...).

    Given several runs per variant, each bar is their mean and a whisker
    spans the lowest to the highest run.

    Args:
        recalls: `{variant: recall of each class}`, or `{variant: array of
            shape (runs, classes)}`.
        class_names: name of each class index.
        title: axes title. Defaults to "Per-class recall".

    Returns:
        The figure.
    """
    fig = new_figure((max(6.0, 1.3 * len(class_names) + 1.5), 3.2))
    ax = fig.subplots()
    means, spreads = {}, {}
    for name, values in recalls.items():
        runs = np.atleast_2d(np.asarray(values, dtype=float))
        means[name] = mean = runs.mean(axis=0)
        if len(runs) > 1:  # whiskers from the lowest run to the highest
            spreads[name] = [mean - runs.min(axis=0), runs.max(axis=0) - mean]
    grouped_bars(ax, means, fmt="%.2f", fontsize=7, errors=spreads)
    ax.set_xticks(range(len(class_names)), class_names)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("recall")
    ax.set_title(title, fontsize=11)
    ax.legend(
        fontsize=8, ncol=len(means), loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


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


def throughput_bars(timings: Mapping[str, Mapping[str, float]], title: str | None = None) -> Figure:
    """Images per second of input pipelines, a bar each on a log scale, the first on top.

    Args:
        timings: `{name: {"median", "min", "max"}}` in images per second, as
            `mdtrain.time_epochs` returns; a whisker spans min to max.
        title: figure title. Defaults to None.

    Returns:
        The figure: one bar per pipeline, labelled with its median.
    """
    median, low, high = ([t[k] for t in timings.values()] for k in ("median", "min", "max"))
    fig = new_figure((7.0, 0.3 * len(timings) + 1.2), title)
    ax = fig.subplots()
    bars = ax.barh(
        list(timings),
        median,
        xerr=np.abs(np.subtract([low, high], median)),
        color=tab10_colors(1)[0],
        error_kw=dict(elinewidth=0.8, capsize=2),
    )
    ax.bar_label(bars, [f"{m:,.0f}" for m in median], fontsize=8, padding=6)
    ax.set_xscale("log")
    ax.set_xlim(right=max(median) * 6)  # room for the labels
    ax.invert_yaxis()
    ax.set_xlabel("images/s (log scale)")
    fig.tight_layout()
    return fig


def overlap_timeline(runs: Mapping[str, Sequence[Mapping]], title: str | None = None) -> Figure:
    """When the input pipeline made each batch and when the step used it: a panel per run.

    Args:
        runs: `{name: batches}`, each batch `{"input": (start, end), "step": (start, end)}`
            in seconds from the run's start (shades alternate batch by batch).
        title: figure title. Defaults to None.

    Returns:
        The figure: one axes per run, lanes "input" and "step", a shared time axis in ms.
    """
    fig = new_figure((7.5, 1.0 * len(runs) + 0.9), title)
    axes = np.atleast_1d(fig.subplots(len(runs), 1, sharex=True))
    for ax, (name, batches) in zip(axes, runs.items(), strict=True):
        for (k, batch), (lane, key) in product(enumerate(batches), enumerate(("step", "input"))):
            start, end = (1000 * t for t in batch[key])
            ax.broken_barh(
                [(start, end - start)],
                (lane - 0.35, 0.7),
                alpha=1 - 0.45 * (k % 2),
                color=tab10_colors(2)[lane],
            )
        end = 1000 * max(batch["step"][1] for batch in batches)
        ax.set_yticks([0, 1], ["step", "input"])
        ax.set_title(f"{name}: {len(batches)} batches in {end:.0f} ms", fontsize=10, loc="left")
    axes[-1].set_xlabel("ms")
    fig.tight_layout()
    return fig
