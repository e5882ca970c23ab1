"""The Keras callback: throughput, samples, live view and summary of a training run.

This is the only monitor module that imports Keras; ``mdtrain.monitor``
exposes it lazily so the samplers stay importable without TensorFlow.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time

import keras

from mdtrain.monitor.allocator import allocator_peaks, reset_allocator_peaks
from mdtrain.monitor.sampler import Sampler
from mdtrain.monitor.stamps import StampMatcher
from mdtrain.monitor.summary import (
    Chart,
    Summary,
    epoch_line,
    in_notebook_kernel,
    resolve_display,
    summarize,
)
from mdtrain.monitor.throughput import ThroughputMeter


class MonitorCallback(keras.callbacks.Callback):
    """The training monitor: a dashboard in notebooks, text elsewhere, a summary at the end.

    Measures images/sec, step time and input wait (train on ``monitor.watch(...)``
    or with mdtrain's `ExactTrainer`) and samples GPUs and CPU; what each figure
    counts and where it shows: docs/figures.md. ``mdtrain.make_monitor`` is this class.

    Args:
        global_batch_size: Examples per step over all replicas.
        epochs: Total epochs, for progress and ETA. Defaults to ``None``
            (taken from ``fit``'s parameters when available).
        steps_per_epoch: Steps per epoch. Defaults to ``None`` (likewise).
        display: ``"widget"``, ``"text"``, ``"none"`` or ``"auto"``. Defaults to ``"auto"``.
        interval_s: Seconds between device samples. Defaults to ``0.5``.
        augments_on_device: Whether the training step augments
            (``mdtrain train``'s default, ``--augment-in model``), for the verdict's advice.
            Defaults to ``False``.
        cached: Whether the training dataset is cached, for the advice; ``watch``
            reads it from the dataset it watches. Defaults to ``False``.
        prefetched: Whether it is prefetched, likewise. Defaults to ``False``.

    Raises:
        ValueError: If ``display`` is not one of the four, or
            ``global_batch_size`` is below 1.

    Example:

    ```python
    monitor = make_monitor(global_batch_size=256, epochs=5)
    model.fit(monitor.watch(train_ds), epochs=5, callbacks=[monitor])
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
        cached: bool = False,
        prefetched: bool = False,
    ) -> None:
        super().__init__()
        self.global_batch_size = int(global_batch_size)
        self.display = resolve_display(display)
        self.augments_on_device = augments_on_device
        self.cached, self.prefetched = cached, prefetched
        self.in_memory = False  # tensors in memory, nothing decoded or augmented: `watch` reads it
        self.meter = ThroughputMeter(self.global_batch_size)
        self.sampler = Sampler(interval_s)
        self.dashboard = None  # the live view of the latest run, with display="widget"
        # (time, images/sec) once per sampling interval: the chart's rate line, an hour of it.
        self._rates: collections.deque[tuple[float, float]] = collections.deque(maxlen=7200)
        self._chart: Chart | None = None  # made on first use: one figure per monitor
        self._next_rate = 0.0
        self.epoch = 0  # the current epoch, zero-based
        self._epochs = epochs
        self._steps = steps_per_epoch
        self._train_t0 = self._epoch_t0 = time.monotonic()
        self._training = False
        self._in_run = False
        self._shell = None
        self._stamps = None  # the host queue of watched tf.data datasets, made on first watch
        self._matcher: StampMatcher | None = None
        self._host_wait = None  # what a watched distributed dataset's next() blocked for
        self._last_wall = time.time()  # wall clock of the last call's end, for the stamps
        self._allocator_peaks: tuple[tuple[str, int], ...] = ()  # the run's, once it ended

    def watch(self, dataset, elements_per_step: int = 1):
        """The dataset to train on in its place, so that the monitor measures the input wait.

        Watch the training data only: a watched validation set would be taken for
        it. How the wait is measured, and what the dataset's stages tell the
        verdict: docs/figures.md, "Input wait" and "The verdict".

        Args:
            dataset: The training `tf.data.Dataset`, or a distributed one.
            elements_per_step: Elements of a `tf.data.Dataset` that make one
                step: 1 (a global batch, the default), or the worker's replicas
                in a dataset function of `distribute_datasets_from_function`,
                which hands each replica its own element.

        Returns:
            The same kind of dataset, to use in ``dataset``'s place.

        Raises:
            TypeError: For anything else.

        Example:

        ```python
        model.fit(monitor.watch(train_ds), epochs=5, callbacks=[monitor])

        for images, labels in monitor.watch(strategy.experimental_distribute_dataset(ds)):
            ...  # the step, then callbacks.on_train_batch_end(step)
        ```
        """
        from mdtrain.compat import IN_MEMORY_KINDS, dataset_kinds
        from mdtrain.monitor.watch import HostWait, StampQueue, watched

        stages = dataset_kinds(dataset)  # what the pipeline does already, for the advice
        if stages:
            self.cached, self.prefetched = "CacheDataset" in stages, "_PrefetchDataset" in stages
            self.in_memory = stages <= IN_MEMORY_KINDS
        if self._stamps is None:
            self._stamps, self._host_wait = StampQueue(), HostWait()
            self._matcher = StampMatcher(self._stamps.drain)
        return watched(dataset, self._stamps, self._host_wait, elements_per_step)

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
        self._rates.clear()
        self.sampler.start()
        reset_allocator_peaks()
        self._allocator_peaks = ()
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
        self._last_wall = time.time()
        if self._host_wait is not None:
            self._host_wait.clear()  # the next() of validation between epochs is not a step's

    def on_test_begin(self, logs=None):
        self.meter.validation_begin()

    def on_test_end(self, logs=None):
        self.meter.validation_end()
        self._last_wall = time.time()
        if self._host_wait is not None:
            self._host_wait.clear()

    def on_train_batch_end(self, batch, logs=None):
        if self.steps_per_epoch:  # with steps_per_execution, Keras ends an epoch at `steps`
            batch = min(batch, self.steps_per_epoch - 1)
        self.meter.batch_end(batch, *self._step_figures(batch))
        now = time.monotonic()
        if now >= self._next_rate:  # the chart's rate line: a point per sampling interval
            self._next_rate = now + self.sampler.interval_s
            rate = self.meter.current_rates().images_per_sec
            if rate is not None:
                self._rates.append((now, rate))

    def _step_figures(self, batch: int) -> tuple:
        """The call's global examples and input wait, as measured (lazy), or ``None``."""
        began, now = self._last_wall, time.time()
        self._last_wall = now
        step = getattr(self.model, "last_step", None)  # mdtrain's ExactTrainer, its own graph's
        examples = step.batch_size if step is not None else None
        if step is not None and step.input_wait_s is not None:
            return examples, step.input_wait_s
        # Else a watched dataset's figure (ExactTrainer keeps no clock under op determinism).
        waited = self._host_wait.take() if self._host_wait is not None else None
        if waited is not None:  # a custom loop's next() on a watched distributed dataset
            return examples, waited
        if self._matcher is not None:  # a watched tf.data dataset: its stamps, read later
            call = self._matcher.call(began, now, self.meter.steps_until(batch))
            return (examples if examples is not None else call.images), call.wait_s
        return examples, None

    def on_epoch_end(self, epoch, logs=None):
        self.meter.epoch_end()
        if self.display == "text":
            self.sampler.sample_now()  # the driver's samples up to now: a short epoch has some
            rates, samples = self.meter.epoch_rates(), self.sampler.history(since=self._epoch_t0)
            summary = summarize(rates, samples, since=self._epoch_t0)
            print(epoch_line(epoch, self.epochs, summary), flush=True)

    def on_train_end(self, logs=None):
        if self._in_run:
            return
        self._finish()
        if self.display == "none":
            return
        if in_notebook_kernel():  # the picture a saved notebook keeps, where widgets do not show
            from IPython.display import Image, display

            display(Image(self.chart_png(dpi=100), format="png"))
        print(self.summary(), flush=True)

    def summary(self) -> Summary:
        """The run's `Summary`: final after training, a live snapshot during it.

        Returns:
            Mean and peak utilisation per device, images/sec, input-wait share
            and the verdict.
        """
        samples = self.sampler.history(since=self._train_t0)
        return summarize(
            self.meter.train_rates(),
            samples,
            augments_on_device=self.augments_on_device,
            mixed_precision=self._mixed_precision(),
            cached=self.cached,
            prefetched=self.prefetched,
            in_memory=self.in_memory,
            since=self._train_t0,
            allocator_peaks=self._allocator_peaks or allocator_peaks(),
            no_gpu=self.sampler.gpu_error,
        )

    def _mixed_precision(self) -> bool:
        """Whether the run computes in mixed precision: the model's policy, or the global one."""
        policies = (getattr(self.model, "dtype_policy", None), keras.config.dtype_policy())
        return any(policy is not None and policy.name.startswith("mixed") for policy in policies)

    def chart_png(self, dpi: int = 72) -> bytes:
        """The run's chart as PNG bytes: images/sec and each device's utilisation over time.

        Args:
            dpi: Pixels per inch of the 8 x 2.4 inch figure. Defaults to ``72``
                (the live dashboard's; the picture left at the end has 100).

        Returns:
            A PNG of the dashboard's chart, drawn from the figures so far.
        """
        if self._chart is None:
            self._chart = Chart()
        samples = self.sampler.history(since=self._train_t0)
        return self._chart.render(list(self._rates), samples, self._train_t0, dpi)

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
        self._allocator_peaks = allocator_peaks()
        if self.dashboard is not None:
            self.dashboard.stop()


# The front door's name (`mdtrain.make_monitor`): the monitor is built by calling its class.
make_monitor = MonitorCallback
