"""Figures of notebook 07: parameter-server training's loss and throughput."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

from mdtrain.plots.common import new_figure


def ps_training_curves(
    runs: Mapping[str, Mapping], kill_step: int | None = None, title: str | None = None
) -> Figure:
    """Loss and steps per second of parameter-server runs, against steps done.

    Args:
        runs: `{label: summary}`, summaries from `mdtrain.ps.train` or
            `mdtrain.ps.run_local` (`steps`, `loss`, `steps_per_sec`).
        kill_step: where a worker was killed, marked by a dashed line.
            Defaults to None.
        title: the figure's title. Defaults to None.

    Returns:
        A figure with two panels: training loss, and throughput per block of steps.

    Example:

    >>> ps_training_curves({"2 workers": summary})  # doctest: +SKIP
    """
    fig = new_figure((9, 3.2))
    loss_ax, speed_ax = fig.subplots(1, 2)
    for label, run in runs.items():
        steps = run["steps"]
        loss_ax.plot(steps, run["loss"], marker="o", markersize=3, label=label)
        # The first block holds tracing and start-up: its rate says nothing about training.
        speed_ax.plot(steps[1:], run["steps_per_sec"][1:], marker="o", markersize=3, label=label)
    loss_ax.set(xlabel="steps done (all workers)", ylabel="training loss (mean of block)")
    speed_ax.set(xlabel="steps done (all workers)", ylabel="steps / second", ylim=(0, None))
    for ax in (loss_ax, speed_ax):
        if kill_step is not None:
            ax.axvline(kill_step, color="#c62828", linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
    if kill_step is not None:
        speed_ax.annotate("worker killed", (kill_step, 0), xytext=(4, 6),
                          textcoords="offset points", color="#c62828", fontsize=8)  # fmt: skip
    loss_ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
