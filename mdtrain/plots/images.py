"""Images in grids: samples titled by class, an image and its augmentations."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from mdtrain.plots.common import RIGHT_COLOR, WRONG_COLOR, axes_grid, new_figure, show_image


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
    fig, axes = axes_grid(len(images), ncols, title=title)
    for i, (ax, image, label) in enumerate(zip(axes, images, labels, strict=True)):
        color = None if marks is None else (RIGHT_COLOR if marks[i] else WRONG_COLOR)
        show_image(ax, image, class_names[label], color)
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
    fig, axes = axes_grid(len(images), ncols, title=title)
    for i, (ax, image) in enumerate(zip(axes, images, strict=True)):
        show_image(ax, image, "original" if i == 0 else None, "black" if i == 0 else None)
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
    fig = new_figure((7.2, 0.9 * rows + 1.2))
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
    show_image(ax, original, "original", "black")
    ax.set_anchor("C")
    for column, (images, title) in enumerate(zip((ours, idg), titles, strict=True)):
        inner = outer[1, column].subgridspec(rows, 4, wspace=0.05, hspace=0.05)
        for i, image in enumerate(images):
            sub = fig.add_subplot(inner[i // 4, i % 4])
            show_image(sub, image)
            if i == 1:
                sub.set_title(title, fontsize=10, loc="center", x=1.0)
    return fig
