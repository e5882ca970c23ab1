"""The live notebook dashboard: core ipywidgets plus the monitor's chart.

Why these widgets, refreshed once a second: docs/figures.md, "Where the monitor shows".
"""

from __future__ import annotations

import contextlib
import html
import threading
import time

import ipywidgets as widgets

from mdtrain.monitor.sampler import DeviceSample
from mdtrain.monitor.summary import Rates, count, device_text, rate_figures


class Dashboard:
    """Bars per device, a throughput/utilisation chart, progress and ETA of one monitor.

    Args:
        monitor: The `MonitorCallback` to show: its ``meter``, ``sampler``,
            ``epoch``, ``epochs``, ``steps_per_epoch``, ``summary()`` and ``chart_png()``.
        refresh_s: Seconds between widget refreshes. Defaults to ``1.0``.
        chart_every_s: Least seconds between chart redraws (tens of ms each). Defaults to ``2.0``.

    Example:

    ```python
    dash = Dashboard(monitor)
    display(dash.widget)
    dash.start()
    ```
    """

    def __init__(self, monitor, *, refresh_s: float = 1.0, chart_every_s: float = 2.0) -> None:
        self.monitor = monitor
        self.refresh_s = refresh_s
        self.chart_every_s = chart_every_s
        self._last_chart = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one refresh at a time: thread and stop()
        self._rows: dict[str, tuple[widgets.FloatProgress, ...]] = {}

        self.header = widgets.HTML("<b>mdtrain monitor</b> — waiting for the first step")
        self.epoch_bar = widgets.IntProgress(value=0, min=0, max=1, description="epoch")
        self.step_bar = widgets.IntProgress(value=0, min=0, max=1, description="step")
        self.images_per_sec = widgets.HTML("– images/sec")
        self.images_per_sec.add_class("mdtrain-images-per-sec")
        self.stats = widgets.HTML("")
        self.devices = widgets.VBox([])
        self.chart = widgets.Image(format="png")
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

    def start(self) -> None:
        """Refreshes from the monitor on a daemon thread until `stop`."""
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.refresh_s):
                with contextlib.suppress(Exception):  # a display glitch must never stop training
                    self.update()

        self._thread = threading.Thread(target=run, name="mdtrain-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the refresh thread, shows the final figures and verdict, hides the live chart."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self.update(final=True)
        self.chart.layout.display = "none"

    def update(self, *, final: bool = False) -> None:
        """Shows the monitor's figures now; redraws the chart if it is due.

        Args:
            final: Show the whole run (``monitor.summary()``: rates matching
                the printed summary, and the verdict). Defaults to ``False``
                (live: the rates of the last steps).
        """
        rates = self.monitor.summary() if final else self.monitor.meter.current_rates()
        sample = self.monitor.sampler.latest()
        with self._lock:
            self._show_progress(rates, final)
            self._show_rates(rates)
            if sample is not None:
                self._show_devices(sample.devices)
            if not final and time.monotonic() - self._last_chart >= self.chart_every_s:
                self.chart.value = self.monitor.chart_png()
                self._last_chart = time.monotonic()
            if final:
                self.verdict.value = f"<b>verdict:</b> {html.escape(rates.verdict, quote=False)}"

    def _show_progress(self, rates: Rates, done: bool) -> None:
        monitor = self.monitor
        epochs, steps, step = monitor.epochs, monitor.steps_per_epoch, monitor.meter.epoch_step
        eta = "–"
        if epochs and steps and rates.step_time_s is not None:
            left = (epochs - monitor.epoch - 1) * steps + max(0, steps - step)
            eta = _clock(left * rates.step_time_s)
        state = "done" if done else f"ETA {eta}"
        self.header.value = (
            f"<b>mdtrain monitor</b> — epoch {count(monitor.epoch + 1, epochs)} · "
            f"step {count(step, steps)} · {state}"
        )
        if epochs:
            self.epoch_bar.max = epochs
            self.epoch_bar.value = min(epochs, monitor.epoch + (1 if done else 0))
        if steps:
            self.step_bar.max = steps
            self.step_bar.value = min(steps, step)

    def _show_rates(self, rates: Rates) -> None:
        if rates.images_per_sec is not None:
            self.images_per_sec.value = (
                f"<span style='font-size:1.5em;font-weight:bold'>{rates.images_per_sec:.1f}</span>"
                " images/sec"
            )
        self.stats.value = " · ".join(rate_figures(rates)[1:])  # images/sec shows above

    def _show_devices(self, devices: tuple[DeviceSample, ...]) -> None:
        if set(self._rows) != {d.name for d in devices}:
            self._rows = {}
            rows = []
            for device in devices:
                util = widgets.FloatProgress(min=0, max=100, description="util")
                mem = widgets.FloatProgress(min=0, max=100, description="mem")
                text = widgets.HTML("")
                text.layout.min_width = "300px"
                label = widgets.HTML(f"<b>{html.escape(device.name, quote=False)}</b>")
                label.layout.width = "220px"
                self._rows[device.name] = (util, mem, text)
                rows.append(widgets.HBox([label, util, mem, text]))
            self.devices.children = rows
        for device in devices:
            util, mem, text = self._rows[device.name]
            util.value = device.utilization or 0.0
            if device.memory_used is not None and device.memory_total:
                mem.value = 100.0 * device.memory_used / device.memory_total
            text.value = device_text(device)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
