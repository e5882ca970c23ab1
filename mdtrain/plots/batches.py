"""How each global batch of an epoch splits across the replicas, drawn."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from mdtrain.plots.common import WRONG_COLOR, new_figure, tab10_colors


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
    colors = tab10_colors(geometry.num_replicas)
    gb = geometry.global_batch_size
    fig = new_figure((8.0, 0.5 * len(rows) + 1.2))
    ax = fig.subplots()
    for y, step in enumerate(rows):
        if step is None:
            ax.text(gb / 2, y, f"... {total - len(shown)} more full steps ...",
                    ha="center", va="center", fontsize=9, color="dimgray")  # fmt: skip
        else:
            size = gb if step < total - 1 else geometry.last_batch_size
            _draw_step(ax, y, geometry.split(size), colors)
    _label_axes(ax, geometry, rows, colors)
    fig.tight_layout()
    return fig


def _draw_step(ax, y: int, slices: list[int], colors) -> None:
    """One global batch as a row of slices, one per replica; replicas without any are named."""
    start = 0
    for replica, n in enumerate(slices):
        if n:
            ax.add_patch(Rectangle((start, y - 0.35), n, 0.7, facecolor=colors[replica],
                                   edgecolor="white", linewidth=1.5))  # fmt: skip
            ax.text(start + n / 2, y, str(n), ha="center", va="center", fontsize=9,
                    color="white", fontweight="bold")  # fmt: skip
        start += n
    empty = [r for r, n in enumerate(slices) if n == 0]
    if empty:
        names = ", ".join(str(r) for r in empty)
        ax.text(start + 0.3, y, f"replica {names}: empty", va="center", fontsize=8,
                color=WRONG_COLOR)  # fmt: skip


def _label_axes(ax, geometry, rows: list[int | None], colors) -> None:
    gb = geometry.global_batch_size
    ax.set_xlim(0, gb * 1.02)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(
        range(len(rows)), ["" if s is None else f"step {s + 1}" for s in rows], fontsize=9
    )
    ax.set_xlabel("position in the global batch (examples)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors]
    ax.legend(handles, [f"replica {r}" for r in range(len(colors))], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # fmt: skip
    ax.set_title(
        f"{geometry.num_examples} examples, global batch {gb} on {geometry.num_replicas} "
        f"replica(s): {geometry.steps} step(s), last batch {geometry.last_batch_size}",
        fontsize=10,
    )
