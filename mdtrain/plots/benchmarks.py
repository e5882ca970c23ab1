"""Benchmark results: images per second per configuration, as bars."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

from mdtrain.plots.common import WRONG_COLOR, new_figure

#: `log=None` switches to a log axis when the largest bar is this many times the smallest.
LOG_SPAN = 30.0


def benchmark_bars(
    results: Mapping[str, float],
    limit: float | None = None,
    title: str = "Input pipeline",
    order: str = "value",
    log: bool | None = None,
) -> Figure:
    """Horizontal bars of images/second per configuration.

    Args:
        results: `{configuration: images per second}`.
        limit: optional ceiling to draw as a vertical line (e.g. raw decode
            speed on all cores). Defaults to None.
        title: figure title. Defaults to "Input pipeline".
        order: `"value"` (fastest on top) or `"given"` (the mapping's order,
            first on top: steps read in the order they were taken). Defaults
            to `"value"`.
        log: log-scaled axis; None chooses it when one bar is more than
            `LOG_SPAN` times another, so the small ones stay readable.
            Defaults to None.

    Returns:
        The figure: one bar per configuration, labelled with its value.

    Raises:
        ValueError: for an `order` other than `"value"` or `"given"`.

    Example:

    >>> fig = benchmark_bars({"a": 100.0, "b": 5000.0}, order="given")  # doctest: +SKIP
    """
    if order not in ("value", "given"):
        raise ValueError(f"order {order!r}: expected 'value' or 'given'")
    items = list(results.items())
    items = sorted(items, key=lambda kv: kv[1]) if order == "value" else items[::-1]
    names = [k for k, _ in items]
    values = [float(v) for _, v in items]
    fig = new_figure((7.0, 0.45 * len(items) + 1.3))
    ax = fig.subplots()
    bars = ax.barh(names, values, color="#4c72b0")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=2)
    if limit is not None:
        ax.axvline(
            limit, color=WRONG_COLOR, linestyle="--", linewidth=1.2, label="raw decode limit"
        )
        ax.legend(fontsize=8, loc="lower right")
    positive = [v for v in [*values, limit or 0.0] if v > 0]
    if log is None:
        log = bool(positive) and max(positive) > LOG_SPAN * min(positive)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 4)
        ax.set_xlabel("images / second (log scale)")
    else:
        top = max([*values, limit or 0.0])
        ax.set_xlim(0, top * 1.18 if top > 0 else 1)
        ax.set_xlabel("images / second")
    # Over the figure, not the axes: long bar labels narrow the axes, and a title
    # centred over them would run off the figure's right edge.
    fig.suptitle(title, fontsize=11)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
