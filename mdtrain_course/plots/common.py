"""What every figure shares: a figure pyplot forgets, image cells, grids, grouped bars, colours."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

RIGHT_COLOR, WRONG_COLOR = "#2e7d32", "#c62828"
DPI = 80  # keeps committed notebook images small


def new_figure(
    figsize: tuple[float, float], title: str | None = None, layout: str | None = None
) -> Figure:
    """A new figure with suptitle `title` that pyplot does not keep: shown where it is returned."""
    fig = plt.figure(figsize=figsize, dpi=DPI, layout=layout)
    plt.close(fig)  # otherwise Jupyter's inline backend shows it a second time
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def show_image(ax, image, title: str | None = None, color: str | None = None) -> None:
    """Draws uint8 or float (0-1 or 0-255) `image` without ticks, framed in `color` if given."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = array.astype(np.float32)
        if array.size and array.max() <= 1.0:
            array = array * 255.0
        array = np.clip(np.round(array), 0, 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    ax.imshow(array, cmap="gray" if array.ndim == 2 else None, vmin=0, vmax=255)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9, color=color or "black")
    ax.spines[:].set_visible(color is not None)
    if color is not None:
        ax.spines[:].set(edgecolor=color, linewidth=3)


def axes_grid(n: int, ncols: int, cell=1.3, title=None, rows=None, left=0.0):
    """A figure of `n` image cells of side `cell` inches, `ncols` per row; `(figure, axes)`.

    `rows`: the cells of each row, when not all are full; `left`: inches for row labels.
    """
    ncols = max(1, min(ncols, n) if rows is None else ncols)
    rows = rows if rows is not None else [min(ncols, n - i) for i in range(0, n, ncols)] or [0]
    # Constrained layout keeps each cell's title clear of the row above (tight_layout
    # does not once a suptitle is set); 0.25 in per row is the title's line.
    size = (cell * ncols + left, (cell + 0.25) * len(rows) + (0.35 if title else 0))
    fig = new_figure(size, title, "constrained")
    grid = fig.subplots(len(rows), ncols, squeeze=False)
    axes = []
    for row, used in zip(grid, rows, strict=True):
        axes += list(row[:used])
        for ax in row[used:]:
            ax.remove()
    return fig, axes


def tab10_colors(n: int) -> list:
    """n colours from matplotlib's tab10 cycle: one per replica, or per class."""
    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def grouped_bars(ax, groups, fmt: str = "%g", fontsize: float = 8, errors=None) -> None:
    """Bars side by side at each x position, one colour per group, each labelled with its value.

    `groups` and `errors`: legend label (empty: none) -> heights, and -> `Axes.bar`'s `yerr`.
    """
    width = 0.8 / max(1, len(groups))
    colors = tab10_colors(len(groups))
    for i, (label, heights) in enumerate(groups.items()):
        x = np.arange(len(heights)) + (i - (len(groups) - 1) / 2) * width
        whiskers = (errors or {}).get(label)
        bars = ax.bar(
            x,
            heights,
            width,
            label=label or None,
            color=colors[i],
            yerr=whiskers,
            error_kw=dict(elinewidth=0.8, capsize=2),
        )
        ax.bar_label(bars, fmt=fmt, fontsize=fontsize, padding=1)
