"""Speed figures: throughput bars and the timeline of overlapping work."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product

import numpy as np
from matplotlib.figure import Figure

from mdtrain_course.plots.common import (
    new_figure,
    tab10_colors,
)


def throughput_bars(timings: Mapping[str, Mapping[str, float]], title: str | None = None) -> Figure:
    """Images per second of input pipelines, a bar each on a log scale, the first on top.

    Args:
        timings: `{name: {"median", "min", "max"}}` in images per second, as
            `mdtrain_course.timing.time_epochs` returns; a whisker spans min to max.
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
