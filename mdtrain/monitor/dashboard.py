"""The live notebook dashboard: core ipywidgets plus a matplotlib chart.

No JupyterLab extension beyond ipywidgets' own, so it renders on Colab and
Kaggle. Widgets are updated from a background thread at a few hertz: the
training thread only records numbers, which keeps the monitor's cost per step
in microseconds (see benchmarks/monitor_overhead.py).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as widgets

from mdtrain.monitor.chart import Chart
from mdtrain.monitor.samples import DeviceSample, Sample
from mdtrain.monitor.throughput import Rates

IMAGES_PER_SEC_CLASS = "mdtrain-images-per-sec"


@dataclass(frozen=True)
class DashboardState:
    """Everything one dashboard refresh shows.

    Args:
        epoch: Zero-based current epoch.
        epochs: Total epochs, or ``None``.
        step: Steps finished in this epoch.
        steps: Steps per epoch, or ``None``.
        eta_s: Seconds left, or ``None`` when unknown.
        rates: Current (recent-window) `Rates`.
        sample: Latest device `Sample`, or ``None``.
        verdict: Final verdict sentence, or ``None`` while training.
    """

    epoch: int
    epochs: int | None
    step: int
    steps: int | None
    eta_s: float | None
    rates: Rates
    sample: Sample | None
    verdict: str | None = None


class Dashboard:
    """Bars per device, a throughput/utilisation chart, progress and ETA.

    Call ``start(poll)`` with a function returning a `DashboardState`; a
    daemon thread calls it every ``refresh_s`` and updates the widgets, and
    redraws the chart at most every ``chart_every_s``. ``stop(final)`` shows
    the final state.

    Args:
        refresh_s: Seconds between widget refreshes. Defaults to ``0.25``.
        chart_every_s: Least seconds between chart redraws (a redraw costs
            tens of milliseconds). Defaults to ``2.0``.
        max_points: Points kept for the chart. Defaults to ``600``.

    Example:

    ```python
    dash = Dashboard()
    display(dash.widget)
    dash.start(lambda: callback.dashboard_state())
    ```
    """

    def __init__(
        self,
        *,
        refresh_s: float = 0.25,
        chart_every_s: float = 2.0,
        max_points: int = 600,
    ) -> None:
        self.refresh_s = refresh_s
        self.chart_every_s = chart_every_s
        self._points: collections.deque[tuple[float, float | None, dict[str, float]]] = (
            collections.deque(maxlen=max_points)
        )
        self._t0 = time.monotonic()
        self._last_chart = 0.0
        self._chart_dirty = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one refresh at a time: thread and stop()
        self._rows: dict[str, tuple[widgets.FloatProgress, ...]] = {}

        self.header = widgets.HTML("<b>mdtrain monitor</b> — waiting for the first step")
        self.epoch_bar = widgets.IntProgress(value=0, min=0, max=1, description="epoch")
        self.step_bar = widgets.IntProgress(value=0, min=0, max=1, description="step")
        self.images_per_sec = widgets.HTML("– images/sec")
        self.images_per_sec.add_class(IMAGES_PER_SEC_CLASS)
        self.stats = widgets.HTML("")
        self.devices = widgets.VBox([])
        self.chart = widgets.Image(format="png")
        self._chart = Chart()
        self.verdict = widgets.HTML("")
        self.widget = widgets.VBox(
            [
                self.header,
                widgets.HBox([self.epoch_bar, self.step_bar]),
                self.images_per_sec,
                self.stats,
                self.devices,
                self.chart,
                self.verdict,
            ]
        )
        self.widget.add_class("mdtrain-monitor")

    def start(self, poll: Callable[[], DashboardState]) -> None:
        """Refreshes from ``poll()`` on a daemon thread until `stop`.

        Args:
            poll: Returns the state to show; must be safe to call from another thread.
        """
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.refresh_s):
                try:
                    self.update(poll())
                except Exception:  # a display glitch must never stop training
                    pass

        self._thread = threading.Thread(target=run, name="mdtrain-dashboard", daemon=True)
        self._thread.start()

    def stop(self, final: DashboardState | None = None) -> None:
        """Stops the refresh thread and shows ``final`` (chart included).

        The final chart is also displayed as a plain image below the widget:
        a saved notebook keeps it, and a repository page or a viewer without
        the widget state shows it, where the live widget cannot render.

        Args:
            final: Last state to show. Defaults to ``None`` (leave as is).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if final is not None:
            self.update(final, force_chart=True)
            if self.chart.value:
                from IPython.display import Image, display

                display(Image(data=self.chart.value, format="png"))

    def update(self, state: DashboardState, *, force_chart: bool = False) -> None:
        """Shows ``state`` now; redraws the chart if it is due.

        Args:
            state: What to show.
            force_chart: Redraw the chart even if one was drawn recently.
                Defaults to ``False``.
        """
        with self._lock:
            self._show_progress(state)
            self._show_rates(state.rates, state.sample)
            if state.sample is not None:
                self._show_devices(state.sample.devices)
            self._record(state)
            now = time.monotonic()
            if self._chart_dirty and (force_chart or now - self._last_chart >= self.chart_every_s):
                self.chart.value = self._chart.render(list(self._points))
                self._last_chart = time.monotonic()
                self._chart_dirty = False
            if state.verdict:
                self.verdict.value = f"<b>verdict:</b> {_escape(state.verdict)}"

    def _show_progress(self, s: DashboardState) -> None:
        epochs = f"{s.epoch + 1}/{s.epochs}" if s.epochs else f"{s.epoch + 1}"
        steps = f"{s.step}/{s.steps}" if s.steps else f"{s.step}"
        eta = _clock(s.eta_s) if s.eta_s is not None else "–"
        state = "done" if s.verdict else f"ETA {eta}"
        self.header.value = f"<b>mdtrain monitor</b> — epoch {epochs} · step {steps} · {state}"
        if s.epochs:
            self.epoch_bar.max = s.epochs
            self.epoch_bar.value = min(s.epochs, s.epoch + (1 if s.verdict else 0))
        if s.steps:
            self.step_bar.max = s.steps
            self.step_bar.value = min(s.steps, s.step)

    def _show_rates(self, r: Rates, sample: Sample | None) -> None:
        if r.images_per_sec is not None:
            self.images_per_sec.value = (
                f"<span style='font-size:1.5em;font-weight:bold'>{r.images_per_sec:.1f}</span>"
                " images/sec"
            )
        parts = []
        if r.step_time_s is not None:
            parts.append(f"step {r.step_time_s * 1000:.1f} ms")
        if r.input_wait_share is not None:
            parts.append(f"input wait {r.input_wait_share:.0%}")
        else:
            parts.append("input wait unknown (model.fit)")
        self.stats.value = " · ".join(parts)

    def _show_devices(self, devices: tuple[DeviceSample, ...]) -> None:
        if set(self._rows) != {d.name for d in devices}:
            self._rows = {}
            rows = []
            for d in devices:
                util = widgets.FloatProgress(min=0, max=100, description="util")
                mem = widgets.FloatProgress(min=0, max=100, description="mem")
                text = widgets.HTML("")
                text.layout.min_width = "300px"
                label = widgets.HTML(f"<b>{_escape(d.name)}</b>")
                label.layout.width = "220px"
                self._rows[d.name] = (util, mem, text)
                rows.append(widgets.HBox([label, util, mem, text]))
            self.devices.children = rows
        for d in devices:
            util, mem, text = self._rows[d.name]
            util.value = d.utilization or 0.0
            if d.memory_used is not None and d.memory_total:
                mem.value = 100.0 * d.memory_used / d.memory_total
            text.value = _device_text(d)

    def _record(self, s: DashboardState) -> None:
        if s.sample is None and s.rates.images_per_sec is None:
            return
        util = {}
        if s.sample is not None:
            util = {d.name: d.utilization for d in s.sample.devices if d.utilization is not None}
        self._points.append((time.monotonic() - self._t0, s.rates.images_per_sec, util))
        self._chart_dirty = True


def _device_text(d: DeviceSample) -> str:
    parts = [f"{d.utilization:.0f}%" if d.utilization is not None else "n/a"]
    if d.memory_used is not None and d.memory_total:
        parts.append(f"{d.memory_used / 2**30:.1f}/{d.memory_total / 2**30:.1f} GiB")
    if d.power_w is not None:
        parts.append(f"{d.power_w:.0f} W")
    if d.temperature_c is not None:
        parts.append(f"{d.temperature_c:.0f}°C")
    return " · ".join(parts)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
