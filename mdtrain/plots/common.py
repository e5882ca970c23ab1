"""What every figure shares: a figure pyplot forgets, image cells, grids, colours."""

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
    for spine in ax.spines.values():
        spine.set_visible(color is not None)
        if color is not None:
            spine.set_edgecolor(color)
            spine.set_linewidth(3)


def axes_grid(n: int, ncols: int, cell: float = 1.3, title: str | None = None):
    ncols = max(1, min(ncols, n))
    nrows = max(1, -(-n // ncols))
    fig = new_figure((cell * ncols, cell * nrows + (0.4 if title else 0)))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[n:]:
        ax.remove()
    if title:
        fig.suptitle(title, fontsize=11)
    return fig, list(axes.flat[:n])


def tab10_colors(n: int) -> list:
    """n colours from matplotlib's tab10 cycle: one per replica, or per class."""
    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]
