"""What every figure shares: a figure pyplot forgets, image cells, grids, grouped bars, colours."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

RIGHT_COLOR, WRONG_COLOR = "#2e7d32", "#c62828"
DPI = 80  # keeps committed notebook images small


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A new figure that pyplot does not keep: shown only where it is returned or displayed."""
    fig = plt.figure(figsize=figsize, dpi=DPI)
    plt.close(fig)  # otherwise Jupyter's inline backend shows it a second time
    return fig


def as_image(image) -> np.ndarray:
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


def show_image(ax, image, title: str | None = None, color: str | None = None) -> None:
    array = as_image(image)
    ax.imshow(array, cmap="gray" if array.ndim == 2 else None, vmin=0, vmax=255)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9, color=color or "black")
    ax.spines[:].set_visible(color is not None)
    if color is not None:
        ax.spines[:].set(edgecolor=color, linewidth=3)


def axes_grid(
    n: int,
    ncols: int,
    cell: float = 1.3,
    title: str | None = None,
    rows: list[int] | None = None,
    left: float = 0.0,
):
    """A figure of `n` image cells, `ncols` per row, with room for each cell's title.

    Args:
        n: number of cells.
        ncols: cells per row.
        cell: side of a cell in inches. Defaults to 1.3.
        title: figure title. Defaults to None.
        rows: cells in each row, when rows are not all full (`sum(rows) == n`);
            the other cells of a row are removed. Defaults to None: full rows.
        left: inches added at the left, for row labels. Defaults to 0.

    Returns:
        `(figure, axes)`: the axes in reading order, `n` of them.
    """
    ncols = max(1, min(ncols, n) if rows is None else ncols)
    rows = rows if rows is not None else [min(ncols, n - i) for i in range(0, n, ncols)] or [0]
    # Constrained layout keeps each cell's title clear of the row above (tight_layout
    # does not once a suptitle is set); 0.25 in per row is the title's line.
    fig = new_figure((cell * ncols + left, (cell + 0.25) * len(rows) + (0.35 if title else 0)))
    fig.set_layout_engine("constrained")
    grid = fig.subplots(len(rows), ncols, squeeze=False)
    axes = []
    for row, used in zip(grid, rows, strict=True):
        axes += list(row[:used])
        for ax in row[used:]:
            ax.remove()
    if title:
        fig.suptitle(title, fontsize=11)
    return fig, axes


def tab10_colors(n: int) -> list:
    """n colours from matplotlib's tab10 cycle: one per replica, or per class."""
    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def grouped_bars(ax, groups, fmt: str = "%g", fontsize: float = 8, errors=None) -> None:
    """Bars side by side at each x position, one colour per group, each labelled with its value.

    Args:
        ax: the axes to draw on.
        groups: group label -> one height per x position (0, 1, ...). An
            empty label leaves the group out of the legend.
        fmt: the bar labels' format. Defaults to `"%g"`.
        fontsize: the bar labels' size. Defaults to 8.
        errors: group label -> its whiskers, as `Axes.bar`'s `yerr` takes
            them. Defaults to None (no whiskers).
    """
    width = 0.8 / max(1, len(groups))
    colors = tab10_colors(len(groups))
    for i, (label, heights) in enumerate(groups.items()):
        x = np.arange(len(heights)) + (i - (len(groups) - 1) / 2) * width
        whiskers = (errors or {}).get(label)
        bars = ax.bar(x, heights, width, label=label or None, color=colors[i], yerr=whiskers,
                      error_kw=dict(elinewidth=0.8, capsize=2))  # fmt: skip
        ax.bar_label(bars, fmt=fmt, fontsize=fontsize, padding=1)
