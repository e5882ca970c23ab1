"""The Keras callback: throughput, device samples, live view, summary.

This is the only monitor module that imports Keras; ``mdtrain.monitor``
exposes it lazily so the samplers stay importable without TensorFlow.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TextIO

import keras

from mdtrain.monitor.display import in_notebook_kernel, resolve_display
from mdtrain.monitor.summary import Summary, format_summary, mean_utilization, summarize
from mdtrain.monitor.text import epoch_line
from mdtrain.monitor.throughput import ThroughputMeter


class MonitorCallback(keras.callbacks.Callback):
    """Measures images/sec, step time and input wait; samples GPUs and CPU.

    Images are counted on the GLOBAL batch (all replicas). A model that
    records its last step as ``model.last_step`` (mdtrain's `ExactTrainer`
    does, under ``fit`` and its custom loop: ``batch_size``, the global
    examples of the step, right for a partial batch, and ``input_wait_s``,
    seconds blocked on the input before it) gets exact counts and an input-wait
    share. For any other model every step counts ``global_batch_size`` and the
    wait share is ``None``; the verdict then rests on GPU utilisation.

    Args:
        global_batch_size: Examples per step over all replicas.
        epochs: Total epochs, for progress and ETA. Defaults to ``None``
            (taken from ``fit``'s parameters when available).
        steps_per_epoch: Steps per epoch. Defaults to ``None`` (likewise).
        display: ``"widget"``, ``"text"``, ``"none"`` or ``"auto"`` (see
            `resolve_display`). Defaults to ``"auto"``.
        interval_s: Seconds between device samples. Defaults to ``0.5``.
        sampler: A `Sampler` or any object with ``latest()``, ``history(since)``
            and optionally ``start()``/``stop()``. Defaults to ``None`` (a new
            `Sampler`, started and stopped with training).
        dashboard: A `Dashboard` to drive when ``display="widget"``.
            Defaults to ``None`` (a new one).
        stream: Where text lines go. Defaults to ``sys.stdout``.
        warmup_steps: Steps at the start of training left out of rates
            (tracing, compilation). Defaults to ``1``.
        augments_on_device: Whether the training step augments
            (``mdtrain train``'s default, ``--augment-in model``), for the verdict's advice.
            Defaults to ``False``.

    Example:

    ```python
    monitor = MonitorCallback(global_batch_size=256, display="text")
    model.fit(train_ds, epochs=3, callbacks=[monitor])
    print(monitor.summary().verdict)
    ```
    """

    def __init__(
        self,
        global_batch_size: int,
        *,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        display: str = "auto",
        interval_s: float = 0.5,
        sampler=None,
        dashboard=None,
        stream: TextIO | None = None,
        warmup_steps: int = 1,
        augments_on_device: bool = False,
    ) -> None:
        super().__init__()
        self.augments_on_device = augments_on_device
        self.global_batch_size = int(global_batch_size)
        self.display = resolve_display(display)
        self.interval_s = interval_s
        self.meter = ThroughputMeter(self.global_batch_size, warmup_steps=warmup_steps)
        self.sampler = sampler
        self.dashboard = dashboard
        self._epochs = epochs
        self._steps = steps_per_epoch
        self._stream = stream
        self._warmup_steps = warmup_steps
        self._owns_sampler = False
        self._epoch = 0
        self._train_t0 = 0.0
        self._epoch_t0 = 0.0
        self._summary: Summary | None = None
        self._training = False
        self._shell = None
        self._owns_dashboard = False
        self._in_run = False

    # Progress figures: the constructor wins, else what fit()/CallbackList passed.
    @property
    def epochs(self) -> int | None:
        """Total epochs, if known."""
        return self._epochs or (self.params or {}).get("epochs")

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps per epoch, if known."""
        return self._steps or (self.params or {}).get("steps")

    @contextlib.contextmanager
    def run(self):
        """Makes every `fit` call inside the block one run: figures add up, one summary at the end.

        A run with phases (training, fine-tuning) or resume segments calls
        `fit` several times; without this block each call would start the
        figures afresh.

        Example:

        >>> with monitor.run():  # doctest: +SKIP
        ...     model.fit(train_ds, epochs=3, callbacks=[monitor])
        ...     model.fit(train_ds, initial_epoch=3, epochs=5, callbacks=[monitor])
        """
        self._in_run = False
        self.on_train_begin()
        self._in_run = True
        try:
            yield self
        finally:
            self._in_run = False
            self.on_train_end()

    def on_train_begin(self, logs=None):
        if self._in_run:
            return  # one more fit call of a run already going
        self._finish()  # a previous run that raised before on_train_end
        self.meter = ThroughputMeter(self.global_batch_size, warmup_steps=self._warmup_steps)
        self._summary = None
        self._epoch = 0
        if self.sampler is None:
            from mdtrain.monitor.sampler import Sampler

            self.sampler = Sampler(self.interval_s, quiet=self.display == "none")
        if hasattr(self.sampler, "start") and not getattr(self.sampler, "running", False):
            self.sampler.start()
            self._owns_sampler = True
        self._train_t0 = self._epoch_t0 = time.monotonic()
        self._training = True
        self._watch_cell()
        if self.display == "widget":
            self._start_dashboard()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = int(epoch)
        self._epoch_t0 = time.monotonic()
        self.meter.epoch_begin()

    def on_train_batch_begin(self, batch, logs=None):
        self.meter.batch_begin(batch)

    def on_train_batch_end(self, batch, logs=None):
        # mdtrain's ExactTrainer (under fit and the custom loop alike) records the
        # step's real global batch size and its input wait; other models leave
        # both unknown.
        step = getattr(self.model, "last_step", None)
        if self.steps_per_epoch:  # with steps_per_execution, Keras ends an epoch at `steps`
            batch = min(batch, self.steps_per_epoch - 1)
        self.meter.batch_end(
            batch,
            step.batch_size if step is not None else None,
            step.input_wait_s if step is not None else None,
        )

    def on_epoch_end(self, epoch, logs=None):
        if self.display == "text":
            util = mean_utilization(self._samples(since=self._epoch_t0))
            self._print(epoch_line(epoch, self.epochs, self.meter.epoch_rates(), util))

    def on_train_end(self, logs=None):
        if self._in_run:
            return
        self._finish()
        if self.display != "none":
            self._print(format_summary(self.summary()))

    def summary(self) -> Summary:
        """The run's `Summary`: final after training, a live snapshot during it.

        Returns:
            Mean and peak utilisation per device, images/sec, input-wait share
            and the verdict.
        """
        if self._summary is not None and not self._training:
            return self._summary
        return self._summarize()

    def _summarize(self) -> Summary:
        samples = self._samples(since=self._train_t0)
        return summarize(
            self.meter.train_rates(), samples, augments_on_device=self.augments_on_device
        )

    def dashboard_state(self, verdict: str | None = None):
        """What the dashboard shows now; safe to call from the dashboard thread."""
        from mdtrain.monitor.dashboard import DashboardState

        # Live: the recent window; final: the whole run, matching summary().
        rates = self.meter.train_rates() if verdict else self.meter.current_rates()
        epochs, steps, step = self.epochs, self.steps_per_epoch, self.meter.epoch_step
        eta = None
        if epochs and steps and rates.step_time_s is not None:
            left = (epochs - self._epoch - 1) * steps + max(0, steps - step)
            eta = left * rates.step_time_s
        latest = self.sampler.latest() if self.sampler is not None else None
        return DashboardState(self._epoch, epochs, step, steps, eta, rates, latest, verdict)

    def _finish(self) -> None:
        """Stops sampling and the live view; runs once per training run."""
        if not self._training:
            return
        self._training = False
        self._unwatch_cell()
        if self._owns_sampler:
            self.sampler.stop()
            self._owns_sampler = False
        self._summary = self._summarize()
        if self.display == "widget" and self.dashboard is not None:
            self.dashboard.stop(self.dashboard_state(verdict=self._summary.verdict))

    # Keras skips on_train_end when training raises (or is interrupted), which
    # would leave the sampler and dashboard threads running in the kernel: stop
    # them when the notebook cell finishes instead.
    def _watch_cell(self) -> None:
        if not in_notebook_kernel():
            return
        import IPython

        self._shell = IPython.get_ipython()
        self._shell.events.register("post_run_cell", self._on_cell_done)

    def _unwatch_cell(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            try:
                shell.events.unregister("post_run_cell", self._on_cell_done)
            except ValueError:
                pass

    def _on_cell_done(self, result=None) -> None:
        self._finish()

    def _start_dashboard(self) -> None:
        from IPython.display import display

        from mdtrain.monitor.dashboard import Dashboard

        if self.dashboard is None or self._owns_dashboard:
            self.dashboard = Dashboard()  # a fresh one per run: charts do not continue
            self._owns_dashboard = True
        display(self.dashboard.widget)
        self.dashboard.start(self.dashboard_state)

    def _samples(self, since: float):
        if self.sampler is None:
            return []
        return self.sampler.history(since=since)

    def _print(self, text: str) -> None:
        print(text, file=self._stream or sys.stdout, flush=True)


def make_monitor(
    global_batch_size: int,
    *,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    display: str = "auto",
    interval_s: float = 0.5,
    augments_on_device: bool = False,
) -> keras.callbacks.Callback:
    """Builds the training monitor: a dashboard in notebooks, text elsewhere.

    ``display="auto"`` shows the ipywidgets dashboard inside a notebook kernel
    (unless ``MDTRAIN_SMOKE=1``) and one text line per epoch otherwise;
    ``"none"`` measures without printing. ``monitor.summary()`` gives the
    figures and verdict after training.

    Args:
        global_batch_size: Examples per step over all replicas.
        epochs: Total epochs, for progress and ETA. Defaults to ``None``.
        steps_per_epoch: Steps per epoch. Defaults to ``None``.
        display: ``"auto"``, ``"widget"``, ``"text"`` or ``"none"``.
            Defaults to ``"auto"``.
        interval_s: Seconds between GPU/CPU samples. Defaults to ``0.5``.
        augments_on_device: Whether the training step augments, for the
            verdict's advice. Defaults to ``False``.

    Returns:
        A `MonitorCallback`.

    Example:

    ```python
    monitor = make_monitor(global_batch_size=256, epochs=5)
    model.fit(train_ds, epochs=5, callbacks=[monitor])
    print(monitor.summary())
    ```
    """
    return MonitorCallback(
        global_batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        display=display,
        interval_s=interval_s,
        augments_on_device=augments_on_device,
    )
