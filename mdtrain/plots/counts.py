"""Count figures: images per class, per replica, recall per class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from mdtrain.plots.common import (
    grouped_bars,
    new_figure,
    tab10_colors,
)


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
    steps, replicas, classes = counts.shape
    fig = new_figure((2.9 * replicas + 1.4, 2.5), title)
    axes = np.atleast_1d(fig.subplots(1, replicas, sharey=True))
    colors = tab10_colors(classes)
    for replica, ax in enumerate(axes):
        bottom = np.zeros(steps)
        for label in range(classes):
            ax.bar(
                np.arange(1, steps + 1),
                counts[:, replica, label],
                bottom=bottom,
                width=0.85,
                color=colors[label],
                label=class_names[label],
            )
            bottom += counts[:, replica, label]
        ax.set_title(f"replica {replica}", fontsize=10)
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
