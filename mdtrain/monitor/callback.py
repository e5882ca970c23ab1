"""The Keras callback, its step meter and where it shows: throughput, samples, live view, summary.

This is the only monitor module that imports Keras; ``mdtrain.monitor``
exposes it lazily so the samplers stay importable without TensorFlow.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import keras

from mdtrain.choices import MONITOR_DISPLAYS
from mdtrain.monitor.sampler import Sampler
from mdtrain.monitor.summary import Rates, Summary, epoch_line, summarize


@dataclass
class _Totals:
    """Figures summed over some steps, for `Rates`."""

    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    wait_seconds: float = 0.0  # step time of the steps that reported a wait

    def add(self, steps: int, images: int, seconds: float, wait_s: float | None) -> None:
        self.steps += steps
        self.images += images
        self.seconds += seconds
        if wait_s is not None:
            self.wait_s += min(wait_s, seconds)
            self.wait_seconds += seconds

    def rates(self) -> Rates:
        s = self.seconds
        return Rates(
            steps=self.steps,
            images=self.images,
            seconds=s,
            images_per_sec=self.images / s if s > 0 else None,
            step_time_s=s / self.steps if self.steps else None,
            input_wait_share=self.wait_s / self.wait_seconds if self.wait_seconds > 0 else None,
        )


class ThroughputMeter:
    """Step time, images/sec and input-wait share from batch hooks; a live view may read it.

    A step runs from the previous step's end, so it holds the input wait whatever order a loop
    fetches and calls hooks in; the first ``warmup_steps`` (tracing, compiling) count in no rate.
    """

    def __init__(
        self,
        global_batch_size: int,
        *,
        warmup_steps: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        self.global_batch_size = int(global_batch_size)
        self.warmup_steps = int(warmup_steps)
        self._clock = clock
        self._lock = threading.Lock()
        # The last 20 `batch_end` calls: the "current" rate a live view shows.
        self._recent: collections.deque[tuple] = collections.deque(maxlen=20)
        self._train = _Totals()
        self._seen = 0  # steps since training began, warm-up included
        self.epoch_begin()

    def epoch_begin(self) -> None:
        """Starts a new epoch's counts; gaps between epochs are not step time."""
        with self._lock:
            self._epoch = _Totals()
            self._last_end = self._clock()
            self._last_batch = -1
            self.epoch_step = 0  # steps finished in the current epoch

    def batch_end(
        self, batch: int, batch_size: int | None = None, input_wait_s: float | None = None
    ) -> None:
        """Records the steps up to Keras's ``batch`` index: several with ``steps_per_execution``."""
        now = self._clock()
        with self._lock:
            steps = max(1, batch - self._last_batch)
            self._last_batch = batch
            seconds, self._last_end = max(0.0, now - self._last_end), now
            images = int(batch_size) if batch_size is not None else self.global_batch_size * steps
            wait = float(input_wait_s) if input_wait_s is not None else None
            self._seen += steps
            self.epoch_step += steps
            if self._seen <= self.warmup_steps:
                return
            self._train.add(steps, images, seconds, wait)
            self._epoch.add(steps, images, seconds, wait)
            self._recent.append((steps, images, seconds, wait))

    def train_rates(self) -> Rates:
        """Rates over all of training (warm-up excluded)."""
        with self._lock:
            return self._train.rates()

    def epoch_rates(self) -> Rates:
        """Rates over the current (or just finished) epoch."""
        with self._lock:
            return self._epoch.rates()

    def current_rates(self) -> Rates:
        """Rates over the last 20 `batch_end` calls: what a live view shows."""
        with self._lock:
            recent = list(self._recent)
        totals = _Totals()
        for row in recent:
            totals.add(*row)
        return totals.rates()


def in_notebook_kernel() -> bool:
    """Whether this code runs inside an IPython kernel (Jupyter, Colab, Kaggle), not a terminal."""
    if "IPython" not in sys.modules:  # never import IPython just to ask
        return False
    try:
        shell = sys.modules["IPython"].get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def resolve_display(display: str = "auto") -> str:
    """Turns ``display`` into ``"widget"``, ``"text"`` or ``"none"``.

    ``"auto"`` picks the widget inside a notebook kernel that has ipywidgets,
    unless ``MDTRAIN_SMOKE=1`` (CI logs want text); text otherwise.
    """
    if display not in MONITOR_DISPLAYS:
        raise ValueError(f"display must be one of {', '.join(MONITOR_DISPLAYS)}; got {display!r}")
    if display != "auto":
        return display
    smoke = os.environ.get("MDTRAIN_SMOKE", "") not in ("", "0")
    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    return "widget" if in_notebook_kernel() and has_widgets and not smoke else "text"


class MonitorCallback(keras.callbacks.Callback):
    """The training monitor: a dashboard in notebooks, text elsewhere, a summary at the end.

    Measures images/sec, step time and input wait, and samples GPUs and CPU.
    ``display="auto"`` shows the ipywidgets dashboard inside a notebook kernel
    (unless ``MDTRAIN_SMOKE=1``) and one text line per epoch otherwise;
    ``"none"`` measures without printing. ``monitor.summary()`` gives the
    figures and verdict after training. ``mdtrain.make_monitor`` is this class.

    Images are counted on the GLOBAL batch (all replicas). A model that
    records its last step as ``model.last_step`` (mdtrain's `ExactTrainer`
    does, under ``fit`` and its custom loop: ``batch_size``, the global
    examples of the step, right for a partial batch, and ``input_wait_s``,
    seconds blocked on the input before it) gets exact counts and an input-wait
    share. For any other model every step counts ``global_batch_size`` and the
    wait share is ``None``; the verdict then rests on GPU utilisation. The
    first step of training (tracing, compilation) is left out of the rates.

    Args:
        global_batch_size: Examples per step over all replicas.
        epochs: Total epochs, for progress and ETA. Defaults to ``None``
            (taken from ``fit``'s parameters when available).
        steps_per_epoch: Steps per epoch. Defaults to ``None`` (likewise).
        display: ``"widget"``, ``"text"``, ``"none"`` or ``"auto"`` (see
            above). Defaults to ``"auto"``.
        interval_s: Seconds between device samples. Defaults to ``0.5``.
        augments_on_device: Whether the training step augments
            (``mdtrain train``'s default, ``--augment-in model``), for the verdict's advice.
            Defaults to ``False``.

    Example:

    ```python
    monitor = make_monitor(global_batch_size=256, epochs=5)
    model.fit(train_ds, epochs=5, callbacks=[monitor])
    print(monitor.summary())
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
        augments_on_device: bool = False,
    ) -> None:
        super().__init__()
        self.global_batch_size = int(global_batch_size)
        self.display = resolve_display(display)
        self.augments_on_device = augments_on_device
        self.meter = ThroughputMeter(self.global_batch_size)
        self.sampler = Sampler(interval_s, quiet=self.display == "none")
        self.dashboard = None  # the live view of the latest run, with display="widget"
        self.epoch = 0  # the current epoch, zero-based
        self._epochs = epochs
        self._steps = steps_per_epoch
        self._train_t0 = self._epoch_t0 = time.monotonic()
        self._training = False
        self._in_run = False
        self._shell = None

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
        self.meter = ThroughputMeter(self.global_batch_size)
        self.epoch = 0
        self.dashboard = None
        self.sampler.start()
        self._train_t0 = self._epoch_t0 = time.monotonic()
        self._training = True
        # Keras skips on_train_end when training raises (or is interrupted), which
        # would leave the sampler and dashboard threads running in the kernel: stop
        # them when the notebook cell finishes instead.
        if in_notebook_kernel():
            self._shell = sys.modules["IPython"].get_ipython()
            self._shell.events.register("post_run_cell", self._finish)
        if self.display == "widget":
            from IPython.display import display

            from mdtrain.monitor.dashboard import Dashboard

            self.dashboard = Dashboard(self)  # a fresh one per run: charts do not continue
            display(self.dashboard.widget)
            self.dashboard.start()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = int(epoch)
        self._epoch_t0 = time.monotonic()
        self.meter.epoch_begin()

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
            rates, samples = self.meter.epoch_rates(), self.sampler.history(since=self._epoch_t0)
            print(epoch_line(epoch, self.epochs, summarize(rates, samples)), flush=True)

    def on_train_end(self, logs=None):
        if self._in_run:
            return
        self._finish()
        if self.display != "none":
            print(self.summary(), flush=True)

    def summary(self) -> Summary:
        """The run's `Summary`: final after training, a live snapshot during it.

        Returns:
            Mean and peak utilisation per device, images/sec, input-wait share
            and the verdict.
        """
        samples = self.sampler.history(since=self._train_t0)
        return summarize(
            self.meter.train_rates(), samples, augments_on_device=self.augments_on_device
        )

    def _finish(self, cell_result=None) -> None:
        """Stops sampling and the live view; runs once per run (also IPython's post_run_cell)."""
        if not self._training:
            return
        self._training = False
        shell, self._shell = self._shell, None
        if shell is not None:
            with contextlib.suppress(ValueError):
                shell.events.unregister("post_run_cell", self._finish)
        self.sampler.stop()  # takes a last sample: the figures are final from here
        if self.dashboard is not None:
            self.dashboard.stop()


# The front door's name (`mdtrain.make_monitor`): the monitor is built by calling its class.
make_monitor = MonitorCallback
