"""The dashboard's chart: images/sec and utilisation over time, as PNG bytes."""

from __future__ import annotations

import io

import numpy as np

from mdtrain.monitor.text import short_name

Point = tuple[float, "float | None", "dict[str, float]"]
MAX_DRAWN = 150  # points drawn per line: more than the figure has pixels buys nothing


class Chart:
    """Keeps one matplotlib figure and redraws it from new points.

    Reusing the figure and its lines (``set_data``) instead of building a new
    figure each time makes a redraw several times cheaper, and the bare
    ``Figure`` (no pyplot) is safe off the main thread without touching the
    notebook's own matplotlib backend. Longer histories than 150 points are
    thinned evenly.

    Example:

    ```python
    chart = Chart()
    png = chart.render([(0.0, 950.0, {"GPU 0": 91.0}), (0.5, 990.0, {"GPU 0": 93.0})])
    ```
    """

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self.figure = Figure(figsize=(8, 2.4), dpi=72)
        self.canvas = FigureCanvasAgg(self.figure)
        self.rate_ax, self.util_ax = self.figure.subplots(1, 2)
        self.figure.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.88, wspace=0.2)
        (self.rate_line,) = self.rate_ax.plot([], [], color="tab:blue")
        self.rate_ax.set_title("images/sec", fontsize=10)
        self.util_ax.set_title("utilisation %", fontsize=10)
        self.util_ax.set_ylim(0, 105)
        for ax in (self.rate_ax, self.util_ax):
            ax.set_xlabel("seconds", fontsize=8)
            ax.tick_params(labelsize=7)
            # Tick labels are most of a redraw's cost: keep few.
            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.yaxis.set_major_locator(MaxNLocator(4))
        self.util_lines: dict[str, object] = {}

    def render(self, points: list[Point]) -> bytes:
        """Redraws from ``points`` and returns a PNG.

        Args:
            points: ``(seconds, images_per_sec or None, {device: utilisation})``
                in time order.

        Returns:
            PNG bytes for an ``ipywidgets.Image``.
        """
        points = _thin(points, MAX_DRAWN)
        rated = [(t, r) for t, r, _ in points if r is not None]
        self.rate_line.set_data([t for t, _ in rated], [r for _, r in rated])
        if rated:
            t0, t1 = rated[0][0], rated[-1][0]
            self.rate_ax.set_xlim(t0, max(t1, t0 + 1.0))
            self.rate_ax.set_ylim(0, 1.1 * max(r for _, r in rated) or 1.0)
        names: dict[str, None] = {}
        for _, _, util in points:
            names.update(dict.fromkeys(util))
        for name in names:
            if name not in self.util_lines:
                (self.util_lines[name],) = self.util_ax.plot([], [], label=short_name(name))
                self.util_ax.legend(fontsize=7, loc="lower right")
            series = [(t, u[name]) for t, _, u in points if name in u]
            self.util_lines[name].set_data([t for t, _ in series], [u for _, u in series])
        if points:
            t0, t1 = points[0][0], points[-1][0]
            self.util_ax.set_xlim(t0, max(t1, t0 + 1.0))
        buf = io.BytesIO()
        self.canvas.print_png(buf)
        return buf.getvalue()


def _thin(points: list[Point], n: int) -> list[Point]:
    if len(points) <= n:
        return points
    return [points[i] for i in np.linspace(0, len(points) - 1, n).round().astype(int)]
