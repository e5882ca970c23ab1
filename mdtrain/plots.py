"""Matplotlib figures for the notebooks: images, class counts, batches, training curves.

Every function returns a `matplotlib.figure.Figure` and never calls
`plt.show()`: a notebook displays the returned figure, a script saves it,
a test inspects it. Figures are sized to read well at dpi ~80 and stay small
when committed inside a notebook.

Images may be uint8 (0-255) or float in [0, 255] or [0, 1]; tensors are
converted with `numpy.asarray`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = [
    "augmentation_grid",
    "batch_split_diagram",
    "benchmark_bars",
    "class_counts_bar",
    "confusion_matrix_plot",
    "history_curves",
    "image_grid",
    "side_by_side_augmentations",
]

_RIGHT, _WRONG = "#2e7d32", "#c62828"
DPI = 80  # keeps committed notebook images small


def _figure(figsize: tuple[float, float]) -> Figure:
    """A new figure that pyplot does not keep: shown only where it is returned or displayed."""
    fig = plt.figure(figsize=figsize, dpi=DPI)
    plt.close(fig)  # otherwise Jupyter's inline backend shows it a second time
    return fig


def _as_image(image) -> np.ndarray:
    """uint8 HWC array for imshow, from uint8 or float (0-1 or 0-255) input."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = array.astype(np.float32)
        if array.size and array.max() <= 1.0:
            array = array * 255.0
        array = np.clip(np.round(array), 0, 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return array


def _show(ax, image, title: str | None = None, color: str | None = None) -> None:
    array = _as_image(image)
    ax.imshow(array, cmap="gray" if array.ndim == 2 else None, vmin=0, vmax=255)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9, color=color or "black")
    for spine in ax.spines.values():
        spine.set_visible(color is not None)
        if color is not None:
            spine.set_edgecolor(color)
            spine.set_linewidth(3)


def _grid(n: int, ncols: int, cell: float = 1.3, title: str | None = None):
    ncols = max(1, min(ncols, n))
    nrows = max(1, -(-n // ncols))
    fig = _figure((cell * ncols, cell * nrows + (0.4 if title else 0)))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[n:]:
        ax.remove()
    if title:
        fig.suptitle(title, fontsize=11)
    return fig, list(axes.flat[:n])


def image_grid(
    images,
    labels: Sequence[int],
    class_names: Sequence[str],
    ncols: int = 6,
    title: str | None = None,
    marks: Sequence[bool] | None = None,
) -> Figure:
    """A grid of images, each titled with its class name.

    Args:
        images: sequence or array of images, (N, H, W, C) or (N, H, W).
        labels: class index of each image.
        class_names: name of each class index.
        ncols: images per row. Defaults to 6.
        title: figure title. Defaults to None.
        marks: optional True/False per image (e.g. prediction right or
            wrong): frames and titles the image green or red. Defaults to None.

    Returns:
        The figure, one axes per image.

    Example:

    >>> fig = image_grid(batch_images, batch_labels, class_names, ncols=4)  # doctest: +SKIP
    """
    images = list(images)
    labels = [int(label) for label in np.asarray(labels).reshape(-1)]
    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if marks is not None and len(marks) != len(images):
        raise ValueError(f"{len(images)} images but {len(marks)} marks")
    fig, axes = _grid(len(images), ncols, title=title)
    for i, (ax, image, label) in enumerate(zip(axes, images, labels, strict=True)):
        color = None if marks is None else (_RIGHT if marks[i] else _WRONG)
        _show(ax, image, class_names[label], color)
    fig.tight_layout()
    return fig


def class_counts_bar(counts: Mapping, title: str = "Images per class") -> Figure:
    """Bar chart of examples per class, one group of bars per split if given.

    Args:
        counts: `{class: n}`, or `{split: {class: n}}` (e.g. `CheckReport.counts`).
        title: axes title. Defaults to "Images per class".

    Returns:
        The figure: one bar per (split, class), each labelled with its count.
    """
    if counts and all(isinstance(v, Mapping) for v in counts.values()):
        splits = {str(k): dict(v) for k, v in counts.items()}
    else:
        splits = {"": dict(counts)}
    class_names: list[str] = []
    for per_class in splits.values():
        class_names += [c for c in per_class if c not in class_names]
    x = np.arange(len(class_names))
    width = 0.8 / max(1, len(splits))
    fig = _figure((max(4.0, 0.9 * len(class_names) + 1.5), 3.0))
    ax = fig.subplots()
    for i, (split, per_class) in enumerate(splits.items()):
        values = [per_class.get(c, 0) for c in class_names]
        offset = (i - (len(splits) - 1) / 2) * width
        bars = ax.bar(x + offset, values, width, label=split or None)
        ax.bar_label(bars, fontsize=8, padding=1)
    ax.set_xticks(x, class_names, rotation=30 if len(class_names) > 6 else 0)
    ax.set_ylabel("images")
    ax.set_title(title, fontsize=11)
    ax.margins(y=0.15)
    if len(splits) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    fig, axes = _grid(len(images), ncols, title=title)
    for i, (ax, image) in enumerate(zip(axes, images, strict=True)):
        _show(ax, image, "original" if i == 0 else None, "black" if i == 0 else None)
    fig.tight_layout()
    return fig


def side_by_side_augmentations(
    original,
    ours,
    idg,
    titles: tuple[str, str] = ("tf.data (mdtrain.augment)", "ImageDataGenerator"),
) -> Figure:
    """Two grids of augmentations of one image, side by side, to compare two pipelines.

    Args:
        original: the source image (shown small above the grids).
        ours: 12 augmented versions from one pipeline (drawn 3 x 4).
        idg: 12 augmented versions from the other (drawn 3 x 4).
        titles: the two grids' titles. Defaults to mdtrain's and IDG's.

    Returns:
        The figure: 1 + len(ours) + len(idg) image axes.
    """
    ours, idg = list(ours), list(idg)
    rows = max(1, -(-max(len(ours), len(idg)) // 4))
    fig = _figure((7.2, 0.9 * rows + 1.2))
    outer = fig.add_gridspec(
        2,
        2,
        height_ratios=[0.9, 0.9 * rows],
        wspace=0.06,
        hspace=0.18,
        left=0.01,
        right=0.99,
        top=0.94,
        bottom=0.01,
    )
    ax = fig.add_subplot(outer[0, :])
    _show(ax, original, "original", "black")
    ax.set_anchor("C")
    for column, (images, title) in enumerate(zip((ours, idg), titles, strict=True)):
        inner = outer[1, column].subgridspec(rows, 4, wspace=0.05, hspace=0.05)
        for i, image in enumerate(images):
            sub = fig.add_subplot(inner[i // 4, i % 4])
            _show(sub, image)
            if i == 1:
                sub.set_title(title, fontsize=10, loc="center", x=1.0)
    return fig


def _replica_colors(n: int):
    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def batch_split_diagram(geometry, steps: int = 4) -> Figure:
    """Draws how each global batch of an epoch splits across the replicas.

    One row per step; each row is the global batch laid out left to right,
    coloured by the replica that gets each slice. The last, partial batch is
    shorter; its slices can be uneven and some replicas can get nothing
    ("empty"). Long epochs show their first steps, an ellipsis, and the last.

    Args:
        geometry: a `mdtrain.distribute.BatchGeometry`.
        steps: most rows to draw. Defaults to 4.

    Returns:
        The figure: one rectangle per non-empty (step, replica) slice.

    Example:

    >>> batch_split_diagram(BatchGeometry(31, 16, 4))  # doctest: +SKIP
    """
    total = geometry.steps
    shown = list(range(total)) if total <= steps else [*range(max(1, steps - 1)), total - 1]
    rows = shown if len(shown) == total else [*shown[:-1], None, shown[-1]]
    colors = _replica_colors(geometry.num_replicas)
    gb = geometry.global_batch_size
    fig = _figure((8.0, 0.5 * len(rows) + 1.2))
    ax = fig.subplots()
    for y, step in enumerate(rows):
        if step is None:
            ax.text(
                gb / 2,
                y,
                f"... {total - len(shown)} more full steps ...",
                ha="center",
                va="center",
                fontsize=9,
                color="dimgray",
            )
            continue
        size = gb if step < total - 1 else geometry.last_batch_size
        start = 0
        for replica, n in enumerate(geometry.split(size)):
            if n:
                ax.add_patch(
                    Rectangle(
                        (start, y - 0.35),
                        n,
                        0.7,
                        facecolor=colors[replica],
                        edgecolor="white",
                        linewidth=1.5,
                    )
                )
                ax.text(
                    start + n / 2,
                    y,
                    str(n),
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="white",
                    fontweight="bold",
                )
            start += n
        empty = [r for r, n in enumerate(geometry.split(size)) if n == 0]
        if empty:
            names = ", ".join(str(r) for r in empty)
            ax.text(
                start + 0.3, y, f"replica {names}: empty", va="center", fontsize=8, color=_WRONG
            )
    ax.set_xlim(0, gb * 1.02)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(
        range(len(rows)), ["" if s is None else f"step {s + 1}" for s in rows], fontsize=9
    )
    ax.set_xlabel("position in the global batch (examples)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors]
    ax.legend(
        handles,
        [f"replica {r}" for r in range(len(colors))],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    ax.set_title(
        f"{geometry.num_examples} examples, global batch {gb} on {geometry.num_replicas} "
        f"replica(s): {total} step(s), last batch {geometry.last_batch_size}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def history_curves(history: Sequence[Mapping[str, float]], title: str | None = None) -> Figure:
    """Loss and accuracy per epoch, training against validation.

    Args:
        history: one dict per epoch with `loss`, `accuracy` and optionally
            `val_loss`, `val_accuracy` (`TrainResult.history`). A Keras
            `History.history` dict of lists is accepted too.
        title: figure title. Defaults to None.

    Returns:
        The figure: two axes (loss, accuracy), one line per available series.
    """
    if isinstance(history, Mapping):  # Keras' {metric: [per epoch]}
        keys = list(history)
        history = [{k: history[k][i] for k in keys} for i in range(len(history[keys[0]]))]
    epochs = np.arange(1, len(history) + 1)
    fig = _figure((8.5, 3.0))
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
        ax.legend(fontsize=8)
        if len(epochs) <= 20:
            ax.set_xticks(epochs)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def benchmark_bars(
    results: Mapping[str, float], limit: float | None = None, title: str = "Input pipeline"
) -> Figure:
    """Horizontal bars of images/second per configuration, fastest on top.

    Args:
        results: `{configuration: images per second}`.
        limit: optional ceiling to draw as a vertical line (e.g. raw decode
            speed on all cores). Defaults to None.
        title: axes title. Defaults to "Input pipeline".

    Returns:
        The figure: one bar per configuration, labelled with its value.
    """
    items = sorted(results.items(), key=lambda kv: kv[1])
    names = [k for k, _ in items]
    values = [float(v) for _, v in items]
    fig = _figure((7.0, 0.45 * len(items) + 1.3))
    ax = fig.subplots()
    bars = ax.barh(names, values, color="#4c72b0")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=2)
    if limit is not None:
        ax.axvline(limit, color=_WRONG, linestyle="--", linewidth=1.2, label="raw decode limit")
        ax.legend(fontsize=8, loc="lower right")
    top = max([*values, limit or 0.0])
    ax.set_xlim(0, top * 1.18 if top > 0 else 1)
    ax.set_xlabel("images / second")
    ax.set_title(title, fontsize=11)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


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
    fig = _figure((size + 0.8, size))
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


def replica_class_counts_plot(
    counts, class_names: Sequence[str], title: str | None = None
) -> Figure:
    """Stacked bars: the classes in each replica's slice of each global batch.

    One panel per replica, one bar per step, coloured by class: a class
    missing from a bar never reached that replica's gradient on that step.

    Args:
        counts: array `(steps, replicas, classes)`, e.g. from
            `mdtrain.imbalance.replica_class_counts`.
        class_names: name of each class index.
        title: figure title. Defaults to None.

    Returns:
        The figure.
    """
    counts = np.asarray(counts)
    steps, replicas, k = counts.shape
    fig = _figure((2.9 * replicas + 1.4, 2.5))
    axes = np.atleast_1d(fig.subplots(1, replicas, sharey=True))
    colors = [matplotlib.colormaps["tab10"](c % 10) for c in range(k)]
    for r, ax in enumerate(axes):
        bottom = np.zeros(steps)
        for c in range(k):
            ax.bar(np.arange(1, steps + 1), counts[:, r, c], bottom=bottom, width=0.85,
                   color=colors[c], label=class_names[c])  # fmt: skip
            bottom += counts[:, r, c]
        ax.set_title(f"replica {r}", fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_ylabel("examples")
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def recall_bars(
    recalls: Mapping[str, Sequence[float]],
    class_names: Sequence[str],
    title: str = "Per-class recall",
) -> Figure:
    """Grouped bars of recall per class, one bar per variant (baseline, remedies, ...).

    Args:
        recalls: `{variant: recall of each class}`.
        class_names: name of each class index.
        title: axes title. Defaults to "Per-class recall".

    Returns:
        The figure.
    """
    k, n = len(class_names), len(recalls)
    width = 0.8 / max(n, 1)
    fig = _figure((max(6.0, 1.3 * k + 1.5), 3.2))
    ax = fig.subplots()
    for i, (name, values) in enumerate(recalls.items()):
        x = np.arange(k) + (i - (n - 1) / 2) * width
        bars = ax.bar(x, np.asarray(values, dtype=float), width, label=name,
                      color=_replica_colors(n)[i])  # fmt: skip
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(np.arange(k), class_names)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("recall")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, ncol=n, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
