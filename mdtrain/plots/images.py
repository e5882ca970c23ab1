"""Image figures: a grid of labelled images, augmentations beside their original."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from mdtrain.plots.common import (
    RIGHT_COLOR,
    WRONG_COLOR,
    axes_grid,
    new_figure,
    show_image,
)


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
