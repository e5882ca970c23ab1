"""Unit tests for mdtrain.monitor: fake samplers and clocks, no GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from mdtrain.monitor import DeviceSample, Sample, Sampler, verdict
from mdtrain.monitor.sampler import NvmlReader
from mdtrain.monitor.stamps import Stamp, StampMatcher, call_wait
from mdtrain.monitor.summary import Chart, Rates, resolve_display, summarize
from mdtrain.monitor.throughput import ThroughputMeter

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeGpuReader:
    """Two GPUs at fixed figures: what NVML would return on a 2-GPU box."""

    error = None
    names = ["GPU 0 (Fake)", "GPU 1 (Fake)"]

    def __init__(self, utils=(90.0, 80.0)) -> None:
        self.utils = utils
        self.closed = False

    def read(self):
        return tuple(
            DeviceSample(n, "gpu", u, 4 * 2**30, 16 * 2**30, 70.0, 60.0)
            for n, u in zip(self.names, self.utils, strict=True)
        )

    def close(self) -> None:
        self.closed = True


class NoGpuReader:
    error = "NVML unavailable (test)"
    names: list[str] = []

    def read(self):
        return ()

    def close(self) -> None:
        pass


class FakeCpuReader:
    def read(self):
        return DeviceSample("CPU", "cpu", 50.0, 2**30, 8 * 2**30)


class FakeSampler:
    """What the callback needs from a sampler, with no thread at all."""

    interval_s = 0.0  # the callback records an images/sec point every step

    def __init__(self, gpu_util: float | None = 90.0) -> None:
        devices = [DeviceSample("CPU", "cpu", 40.0, 2**30, 8 * 2**30)]
        if gpu_util is not None:
            devices.insert(0, DeviceSample("GPU 0 (Fake)", "gpu", gpu_util, 2**30, 2**34))
        self.sample = Sample(time=time.monotonic(), devices=tuple(devices))
        self.gpu_error = "" if gpu_util is not None else "no GPU (fake)"
        self.started = self.stopped = 0

    def start(self):
        self.started += 1
        return self

    def stop(self):
        self.stopped += 1

    def latest(self):
        return self.sample

    def sample_now(self):
        return self.sample

    def history(self, since=None):
        return [self.sample]


# --- verdict -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wait, util, first_word",
    [
        (0.38, None, "input-bound (highly):"),
        (0.20, 95.0, "input-bound (highly):"),  # TensorFlow profiler's thresholds: 20%,
        (0.19, 95.0, "input-bound (moderately):"),
        (0.05, None, "input-bound (moderately):"),  # and 5%
        (0.049, 95.0, "compute-bound:"),
        (None, 95.0, "compute-bound:"),
        (None, 20.0, "input-bound (likely):"),  # utilisation is the only evidence
        (0.03, 20.0, "under-used:"),
        (None, 55.0, "under-used:"),
        (0.03, None, "compute-bound:"),
        (None, None, "unknown:"),
    ],
)
def test_verdict_on_numbers(wait, util, first_word):
    assert verdict(wait, util).startswith(first_word)


def test_verdict_does_not_advise_what_the_run_already_does():
    assert "move augmentation onto the device" in verdict(0.38, 41.0)
    on_device = verdict(0.38, 41.0, augments_on_device=True)
    assert on_device.startswith("input-bound (highly)") and "augmentation" not in on_device


def test_verdict_never_advises_mixed_precision_to_a_mixed_precision_run():
    assert "use mixed precision" in verdict(None, 55.0)
    assert "mixed precision" not in verdict(None, 55.0, mixed_precision=True)


def test_verdict_names_the_wait_share_and_the_fix():
    text = verdict(0.38, 41.0)
    assert "38%" in text and "cache the dataset" in text


@pytest.mark.parametrize(
    "in_place, advice",
    [
        ({}, "cache the dataset, prefetch, or move augmentation onto the device"),
        ({"prefetched": True}, "cache the dataset or move augmentation onto the device"),
        ({"cached": True, "augments_on_device": True},
         "prefetch or give the input pipeline more CPU cores"),
        ({"cached": True, "prefetched": True, "augments_on_device": True},
         "give the input pipeline more CPU cores"),
        ({"in_memory": True}, "prefetch or give the input pipeline more CPU cores"),
        ({"in_memory": True, "prefetched": True}, "give the input pipeline more CPU cores"),
    ],
)  # fmt: skip
def test_verdict_never_advises_what_the_input_pipeline_does_already(in_place, advice):
    assert verdict(0.38, None, **in_place).endswith(" — " + advice)


# --- throughput ----------------------------------------------------------------------


def _run_steps(meter, clock, n, seconds, **figures):
    for step in range(n):
        clock.advance(seconds)
        meter.batch_end(step, **figures)


def test_meter_counts_every_step_and_leaves_out_the_compiling():
    clock = FakeClock()
    meter = ThroughputMeter(256, clock=clock)
    meter.epoch_begin()
    clock.advance(3.0)  # tracing and compiling
    _run_steps(meter, clock, 11, 0.1)
    meter.epoch_end()
    rates = meter.train_rates()
    assert rates.steps == 11 and rates.images == 11 * 256  # every step counts
    assert rates.left_out_steps == 1 and rates.left_out_s == pytest.approx(3.0)  # its excess
    assert rates.seconds == pytest.approx(1.1)
    assert rates.images_per_sec == pytest.approx(2560.0)
    assert rates.step_time_s == pytest.approx(0.1)
    assert rates.input_wait_share is None  # not measured: unknown, not zero


def test_meter_times_epoch_boundaries_but_not_validation_or_the_gap_between_epochs():
    clock = FakeClock()
    meter = ThroughputMeter(10, clock=clock)
    for epoch in range(3):
        meter.epoch_begin()
        clock.advance(2.0 if epoch == 0 else 0.0)  # compiling
        clock.advance(0.2)  # the epoch's iterator is made: the user waits for it
        _run_steps(meter, clock, 4, 0.1)
        clock.advance(0.1)  # the end of the epoch's data
        meter.validation_begin()
        clock.advance(5.0)
        meter.validation_end()
        meter.epoch_end()
        if epoch == 1:
            assert meter.epoch_rates().images_per_sec == pytest.approx(40 / 0.7)
        clock.advance(30.0)  # checkpoints between epochs
    rates = meter.train_rates()
    # The first call counts as long as the other epochs' first calls (0.3 s: the iterator and
    # the step); the 2 s beyond it are compiling. Validation on its own.
    assert rates.seconds == pytest.approx(3 * 0.7) and rates.left_out_s == pytest.approx(2.0)
    assert rates.images_per_sec == pytest.approx(120 / 2.1)
    assert rates.validation_s == pytest.approx(15.0)


def test_meter_leaves_out_the_first_call_of_each_batch_size():
    clock = FakeClock()
    meter = ThroughputMeter(100, clock=clock)
    meter.epoch_begin()
    _run_steps(meter, clock, 3, 0.5, images=100, input_wait_s=0.2)
    clock.advance(2.0)  # the partial last batch: a new shape, traced again
    meter.batch_end(3, images=30, input_wait_s=0.0)
    _run_steps(meter, clock, 2, 0.5, images=100, input_wait_s=0.2)  # batches 0, 1 again
    rates = meter.epoch_rates()
    assert rates.steps == 6 and rates.images == 530
    assert rates.left_out_steps == 2 and rates.left_out_s == pytest.approx(1.5)  # the retrace
    assert rates.images_per_sec == pytest.approx(530 / 3.0)
    assert rates.input_wait_share == pytest.approx(0.4)


def test_meter_step_time_includes_fetching_between_steps():
    # The loop fetches between one batch_end and the next step: still step time.
    clock = FakeClock()
    meter = ThroughputMeter(10, clock=clock)
    meter.epoch_begin()
    for step in range(5):
        clock.advance(0.3)  # blocked on next(iterator)
        clock.advance(0.1)  # the step itself
        meter.batch_end(step, input_wait_s=0.3)
    rates = meter.epoch_rates()
    assert rates.step_time_s == pytest.approx(0.4)
    assert rates.input_wait_share == pytest.approx(0.75)


def test_meter_counts_every_step_of_multi_step_calls():
    """3 epochs of 6 steps, one call each (steps_per_execution): 18 steps, not 12."""
    clock = FakeClock()
    meter = ThroughputMeter(16, clock=clock)
    for epoch in range(3):
        meter.epoch_begin()
        clock.advance(0.6)
        meter.batch_end(5, images=96)
        clock.advance(0.05)  # the epoch's end, after its last call
        meter.epoch_end()
        if epoch == 0:  # its one call compiled, and nothing yet says what a call takes:
            assert meter.epoch_rates().images_per_sec is None  # not 96 images in 0.05 s
            assert meter.epoch_rates().step_time_s is None
    rates = meter.train_rates()
    assert rates.steps == 18 and rates.images == 288
    assert rates.left_out_steps == 6 and rates.images_per_sec == pytest.approx(288 / 1.95)
    assert meter.current_rates().step_time_s == pytest.approx(0.1)  # the live view too


def test_meter_reads_the_steps_sizes_and_waits_only_with_its_rates():
    """mdtrain's step hands over scalar tensors: read on the host later, not after each call."""

    class Lazy:  # a scalar tensor's part the meter may use
        reads = 0

        def __init__(self, value):
            self.value = value

        def __float__(self):
            Lazy.reads += 1
            return self.value

    clock = FakeClock()
    meter = ThroughputMeter(100, clock=clock)
    meter.epoch_begin()
    for batch in (3, 7, 11):  # 4 steps per call
        clock.advance(0.4)
        meter.batch_end(batch, Lazy(400.0), Lazy(0.1))
    assert Lazy.reads == 0
    rates = meter.epoch_rates()
    assert rates.steps == 12 and rates.images == 1200 and rates.left_out_steps == 4
    assert rates.input_wait_share == pytest.approx(0.25)


def test_meter_rejects_bad_batch_size():
    with pytest.raises(ValueError, match="global_batch_size"):
        ThroughputMeter(0)


# --- stamps (a watched tf.data dataset) ----------------------------------------------


def test_a_step_that_began_before_its_batch_came_waited_until_then():
    assert call_wait(10.0, 10.05, [10.03]) == pytest.approx(0.03)
    assert call_wait(10.0, 10.05, [9.0]) == 0.0  # fetched ahead: no wait
    # 3 steps of 10 ms each, the last batch 25 ms late: 25 ms of the call's 55 were waiting.
    assert call_wait(0.0, 0.055, [0.0, 0.0, 0.045]) == pytest.approx(0.025)
    assert call_wait(0.0, 0.03, [-1.0, -1.0, -1.0]) == pytest.approx(0.0)


def _stamps(index0, got_times, images=8):
    return [Stamp(index0 + i, got, images) for i, got in enumerate(got_times)]


def test_the_stamps_of_an_iterator_keras_peeked_at_are_dropped():
    """fit builds the model from an iterator it then drops, with the batches it prefetched."""
    queue = [
        *_stamps(0, [1.0, 1.1, 1.2, 1.3]),  # the peek's iterator: never trained on
        *_stamps(0, [5.0, 5.2, 5.4], images=16),  # the epoch's
        *_stamps(3, [5.6], images=4),
    ]
    matcher = StampMatcher(lambda: [queue.pop(0) for _ in range(len(queue))])
    calls = [matcher.call(4.9, 5.1, 1), matcher.call(5.1, 5.25, 1), matcher.call(5.25, 5.7, 2)]
    assert [call.images() for call in calls] == [16, 16, 20]
    assert calls[0].wait_s() == pytest.approx(0.1)
    assert calls[1].wait_s() == pytest.approx(0.1)
    later = matcher.call(5.7, 5.8, 1)  # no stamp for it: unknown, not zero
    assert later.images() is None and later.wait_s() is None


def test_each_epochs_iterator_feeds_its_own_steps():
    queue = [*_stamps(0, [1.0, 1.1]), *_stamps(0, [3.0, 3.1])]
    matcher = StampMatcher(lambda: [queue.pop(0) for _ in range(len(queue))])
    epoch_1 = [matcher.call(0.9, 1.05, 1), matcher.call(1.05, 1.2, 1)]
    epoch_2 = [matcher.call(2.9, 3.05, 1), matcher.call(3.05, 3.2, 1)]
    assert [call.wait_s() for call in epoch_2 + epoch_1] == pytest.approx([0.1, 0.05, 0.1, 0.05])


# --- sampler -------------------------------------------------------------------------


def test_sampler_samples_in_background_and_stops():
    gpu = FakeGpuReader()
    sampler = Sampler(0.01, max_samples=5, gpu_reader=gpu, cpu_reader=FakeCpuReader())
    with sampler:
        assert sampler.running
        deadline = time.monotonic() + 5
        while len(sampler.history()) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not sampler.running
    history = sampler.history()
    assert len(history) == 5  # bounded
    assert [d.name for d in history[-1].devices] == ["GPU 0 (Fake)", "GPU 1 (Fake)", "CPU"]
    assert sampler.has_gpu
    sampler.stop()  # idempotent
    sampler.close()
    assert gpu.closed


def test_sampler_without_gpu_says_why_in_the_summary_not_on_stderr(capsys):
    s = Sampler(0.05, gpu_reader=NoGpuReader(), cpu_reader=FakeCpuReader())
    assert capsys.readouterr().err == ""  # nothing on standard error, however many monitors
    assert not s.has_gpu and s.gpu_error == "NVML unavailable (test)"
    assert [d.kind for d in s.sample_now().devices] == ["cpu"]
    rates = ThroughputMeter(8).train_rates()
    text = str(summarize(rates, s.history(), no_gpu=s.gpu_error))
    assert text.count("GPU: none sampled (NVML unavailable (test))") == 1


def test_sampler_history_since():
    clock = FakeClock()
    s = Sampler(1.0, gpu_reader=FakeGpuReader(), cpu_reader=FakeCpuReader(), clock=clock)
    s.sample_now()
    clock.advance(10)
    s.sample_now()
    assert len(s.history(since=105)) == 1 and s.latest().time == 110


def test_real_cpu_reader_and_default_sampler():
    with Sampler(0.05) as s:
        time.sleep(0.12)
    cpu = s.latest().devices[-1]
    assert cpu.kind == "cpu" and cpu.memory_used > 0 and 0 <= cpu.utilization <= 100


def _nvml_error() -> str | None:
    reader = NvmlReader()
    try:
        return reader.error
    finally:
        reader.close()


class FakeNvml(types.SimpleNamespace):
    """pynvml on one GPU whose driver sampled 90% busy, though its last period read 0%."""

    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, sample_times_us):
        super().__init__(samples=[(t, 90) for t in sample_times_us], asked_since=[])

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return "handle"

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-1"

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=0)  # a 0.3 s epoch between two driver periods

    def nvmlDeviceGetSamples(self, handle, kind, since_us):
        self.asked_since.append(since_us)
        fresh = [
            types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=value))
            for t, value in self.samples
            if t > since_us
        ]
        if not fresh:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return 1, fresh

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        return types.SimpleNamespace(used=2**30, total=2**34)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 300_000

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 60


def test_a_short_epoch_gets_the_drivers_own_utilisation_samples(monkeypatch):
    """NVML keeps samples every 1/6 s: an epoch of 0.3 s reads 90%, not its last period's 0%."""
    now_us = int(time.time() * 1e6)
    nvml = FakeNvml([now_us - 300_000, now_us - 130_000])  # during the epoch
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    epoch_start = time.monotonic() - 0.35
    sampler = Sampler(0.5, gpu_reader=NvmlReader(), cpu_reader=FakeCpuReader())
    first = sampler.sample_now()
    (gpu,) = first.gpus
    assert gpu.utilization == 90.0 and len(gpu.busy) == 2
    assert all(epoch_start < when <= time.monotonic() for when, _ in gpu.busy)
    (again,) = sampler.sample_now().gpus  # nothing new: the rate NVML reports now, counted once
    assert again.busy == () and nvml.asked_since[-1] == now_us - 130_000
    summary = summarize(Rates(1, 8, 0.3, 26.7, 0.3, None), sampler.history(), since=epoch_start)
    assert summary.devices[0].mean_utilization == 90.0  # the driver's samples, not the 0%


@pytest.mark.gpu
def test_nvml_reads_a_real_gpu():
    error = _nvml_error()
    if error:
        pytest.skip(f"no NVIDIA GPU to read on this machine: {error}")
    reader = NvmlReader()
    try:
        gpus = reader.read()
    finally:
        reader.close()
    assert gpus and all(g.kind == "gpu" and g.name.startswith("GPU ") for g in gpus)
    for g in gpus:
        assert 0 <= g.utilization <= 100
        assert 0 < g.memory_used <= g.memory_total
    with Sampler(0.05) as s:
        time.sleep(0.2)
    assert s.has_gpu and s.latest().gpus


def test_import_is_tensorflow_free():
    code = (
        "import sys, mdtrain.monitor as m\n"
        "s = m.Sampler(0.05); s.start(); s.stop(); s.close()\n"
        "m.verdict(0.1, 50.0)\n"
        "from mdtrain.monitor.summary import resolve_display; resolve_display('auto')\n"
        "from mdtrain.monitor.throughput import ThroughputMeter; ThroughputMeter(8).batch_end(0)\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('tensorflow', 'keras'))\n"
        "print(bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- summary and display choice ------------------------------------------------------


def test_summary_means_peaks_and_json():
    gpu = FakeGpuReader(utils=(90.0, 70.0))
    clock = FakeClock()
    s = Sampler(1.0, gpu_reader=gpu, cpu_reader=FakeCpuReader(), clock=clock)
    s.sample_now()
    gpu.utils = (100.0, 50.0)
    s.sample_now()
    rates = Rates(10, 1000, 2.0, 500.0, 0.2, 0.02)
    summary = summarize(rates, s.history())
    by_name = {d.name: d for d in summary.devices}
    assert by_name["GPU 0 (Fake)"].mean_utilization == 95.0
    assert by_name["GPU 1 (Fake)"].peak_utilization == 70.0
    assert summary.gpu_utilization == pytest.approx(77.5)
    assert summary.verdict.startswith("compute-bound")
    assert json.loads(json.dumps(summary.to_dict()))["images_per_sec"] == 500.0
    text = str(summary)
    assert "500.0 images/sec" in text and "verdict: compute-bound" in text


def test_the_text_forms_read_exactly_so():
    from mdtrain.monitor.summary import device_text, epoch_line

    gpu = DeviceSample("GPU 0 (Fake)", "gpu", 87.0, 2**30, 2**34, 70.4, 61.0)
    sample = Sample(time=0.0, devices=(gpu, DeviceSample("CPU", "cpu", 40.0, 2**30, 8 * 2**30)))
    summary = summarize(Rates(50, 12800, 10.37, 1234.5, 0.0259, 0.12, 1, 2.04, 3.5), [sample])
    assert epoch_line(1, 5, summary) == (
        "epoch 2/5: 50 steps, 1234.5 images/sec, step 25.9 ms, input wait 12%, "
        "util GPU 0 87%, CPU 40%"
    )
    empty = summarize(Rates(0, 0, 0.0, None, None, None), [])
    assert epoch_line(0, None, empty) == (
        "epoch 1: 0 steps, n/a images/sec, step n/a, input wait unknown, util n/a"
    )
    assert str(summary) == (
        "mdtrain monitor: 50 steps, 1234.5 images/sec, step 25.9 ms, input wait 12%\n"
        "  timing: 10.4 s of training, epoch boundaries included; left out: 2.0 s of tracing "
        "and compiling (in the first call of each batch size, 1 steps); validation 3.5 s, on its "
        "own\n"
        "  GPU 0 (Fake): mean 87%, peak 87%, peak memory 1.0/16.0 GiB\n"
        "  CPU: mean 40%, peak 40%, peak memory 1.0/8.0 GiB\n"
        "  verdict: input-bound (moderately): the devices waited 12% of each step — "
        "cache the dataset, prefetch, or move augmentation onto the device"
    )
    assert device_text(gpu) == "87% · 1.0/16.0 GiB · 70 W · 61°C"
    assert device_text(DeviceSample("GPU 1", "gpu")) == "n/a"


def test_resolve_display(monkeypatch):
    monkeypatch.delenv("MDTRAIN_SMOKE", raising=False)
    assert resolve_display("auto") == "text"  # pytest is not a notebook kernel
    assert resolve_display("widget") == "widget"
    assert resolve_display("none") == "none"
    with pytest.raises(ValueError, match="display must be one of"):
        resolve_display("fancy")


class NotebookShell:
    """What the monitor asks of IPython in a notebook kernel: a kernel, and events to hook."""

    kernel = object()

    def __init__(self) -> None:
        self.hooks = []
        self.events = types.SimpleNamespace(
            register=lambda name, fn: self.hooks.append(fn),
            unregister=lambda name, fn: self.hooks.remove(fn),
        )


def test_resolve_display_smoke_means_text(monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", NotebookShell)
    monkeypatch.delenv("MDTRAIN_SMOKE", raising=False)
    assert resolve_display("auto") == "widget"
    monkeypatch.setenv("MDTRAIN_SMOKE", "1")
    assert resolve_display("auto") == "text"


# --- dashboard and chart -------------------------------------------------------------


def test_chart_draws_the_whole_run_thinned():
    """An hour of points: both panels span it, each line drawn with at most 150 points."""
    devices = (DeviceSample("GPU 0 (Fake)", "gpu", 80.0), DeviceSample("CPU", "cpu", 30.0))
    samples = [Sample(time=100.0 + t, devices=devices) for t in range(0, 3601, 2)]
    rates = [(100.0 + t, 500.0 + t) for t in range(1, 3601)]  # from the first step on
    chart = Chart()
    png = chart.render(rates, samples, 100.0)
    assert png[:4] == b"\x89PNG"
    assert chart.rate_ax.get_xlim() == chart.util_ax.get_xlim() == (0.0, 3600.0)
    seconds, per_sec = chart.rate_line.get_data()
    assert len(seconds) == 150 and (seconds[0], seconds[-1], per_sec[-1]) == (1.0, 3600.0, 4100.0)
    assert chart.rate_ax.get_ylim()[1] == pytest.approx(1.1 * 4100.0)
    assert [line.get_label() for line in chart.util_lines.values()] == ["GPU 0", "CPU"]
    assert list(chart.util_lines["CPU"].get_ydata()) == [30.0] * 150


def _watched_monitor():
    """What the dashboard reads from a `MonitorCallback`, without Keras: epoch 2/3, step 5/10."""
    clock = FakeClock()
    meter = ThroughputMeter(1000, clock=clock)
    meter.epoch_begin()
    _run_steps(meter, clock, 5, 0.8)
    sampler = FakeSampler()
    t0 = sampler.sample.time - 4.0
    return types.SimpleNamespace(
        meter=meter,
        sampler=sampler,
        epoch=1,
        epochs=3,
        steps_per_epoch=10,
        summary=lambda: summarize(meter.train_rates(), sampler.history()),
        chart_png=lambda: Chart().render([(t0 + 2, 1250.0)], sampler.history(), t0),
    )


def test_dashboard_shows_rates_devices_and_chart():
    """Utilisation per device, images/sec, step time, input wait, the chart, then the verdict."""
    from mdtrain.monitor import Dashboard

    dash = Dashboard(_watched_monitor(), chart_every_s=0.0)
    dash.update()
    assert "mdtrain-images-per-sec" in dash.images_per_sec._dom_classes
    assert "1250.0" in dash.images_per_sec.value
    assert "epoch 2/3 · step 5/10 · ETA 0:12" in dash.header.value  # 15 steps of 0.8 s left
    assert dash.stats.value == "step 800.0 ms · input wait unknown"
    rows = {row.children[0].value: row.children for row in dash.devices.children}
    assert list(rows) == ["<b>GPU 0 (Fake)</b>", "<b>CPU</b>"]
    gpu_label, gpu_util, gpu_mem, gpu_text = rows["<b>GPU 0 (Fake)</b>"]
    assert (gpu_util.value, gpu_mem.value, gpu_text.value) == (90.0, 6.25, "90% · 1.0/16.0 GiB")
    assert rows["<b>CPU</b>"][1].value == 40.0
    # ipywidgets 7 (Colab) holds an image's value as bytes, 8 (Kaggle) as a memoryview.
    assert bytes(dash.chart.value[:4]) == b"\x89PNG" and dash.chart.layout.display != "none"
    dash.update(final=True)
    assert "verdict:</b> compute-bound" in dash.verdict.value and "done" in dash.header.value
    dash.stop()  # the monitor leaves the final chart below the widget: not twice
    assert dash.chart.layout.display == "none" and "verdict:</b>" in dash.verdict.value


def test_dashboard_thread_refreshes_and_stops():
    from mdtrain.monitor import Dashboard

    monitor = _watched_monitor()
    calls = []
    live_rates = monitor.meter.current_rates
    monitor.meter.current_rates = lambda: calls.append(1) or live_rates()
    dash = Dashboard(monitor, refresh_s=0.01, chart_every_s=10.0)
    dash.start()
    deadline = time.monotonic() + 5
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    dash.stop()
    assert len(calls) >= 3
    assert "1250.0" in dash.images_per_sec.value and bytes(dash.chart.value[:4]) == b"\x89PNG"
    assert "compute-bound" in dash.verdict.value


# --- the Keras callback --------------------------------------------------------------


@pytest.fixture(scope="module")
def keras():
    return pytest.importorskip("keras")


def test_callback_reads_the_trainers_step_figures(keras, capsys, monkeypatch):
    """Driven as mdtrain's loops drive it: the model records each step's real size and wait."""
    import functools

    from mdtrain.loop import StepStats
    from mdtrain.monitor import MonitorCallback, callback

    clock = FakeClock()  # steps of 50 ms exactly, whatever the machine's load
    monkeypatch.setattr(
        callback, "ThroughputMeter", functools.partial(ThroughputMeter, clock=clock)
    )
    sampler = FakeSampler(gpu_util=35.0)
    monitor = MonitorCallback(64, display="text")
    monitor.sampler = sampler
    trainer = types.SimpleNamespace(last_step=None)
    callbacks = keras.callbacks.CallbackList([monitor], epochs=2, steps=4)
    monitor.set_model(trainer)
    callbacks.on_train_begin()
    for epoch in range(2):
        callbacks.on_epoch_begin(epoch)
        for step in range(4):
            callbacks.on_train_batch_begin(step)
            clock.advance(0.05)
            size = 64 if step < 3 else 10  # a partial last batch
            trainer.last_step = StepStats(size, 0.03)
            callbacks.on_train_batch_end(step, {"loss": 1.0})
        callbacks.on_test_begin()
        callbacks.on_test_end()
        callbacks.on_epoch_end(epoch, {"loss": 1.0})
    callbacks.on_train_end()

    summary = monitor.summary()
    assert summary.steps == 8 and summary.left_out_steps == 2  # tracing: 64, then 10 a step
    assert summary.images == 2 * (3 * 64 + 10)
    assert summary.input_wait_share == pytest.approx(0.6)  # 30 ms of each 50 ms step
    assert summary.images_per_sec == pytest.approx(summary.images / (8 * 0.05))
    assert summary.verdict.startswith("input-bound (highly)")
    assert sampler.started == 1 and sampler.stopped == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("epoch 1/2: 4 steps,") and lines[1].startswith("epoch 2/2: 4 steps,")
    assert "images/sec" in lines[0] and "GPU 0 35%" in lines[0] and "input wait" in lines[0]
    assert lines[2] == str(summary).splitlines()[0]
    assert lines[2].startswith("mdtrain monitor: 8 steps")
    assert lines[-1] == f"  verdict: {summary.verdict}"


def test_callback_under_fit_and_display_none(keras, capsys):
    import numpy as np

    from mdtrain.monitor import make_monitor

    x = np.zeros((40, 4), "float32")
    y = np.zeros((40, 1), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    quiet = make_monitor(8, display="none")
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[quiet], verbose=0)
    assert capsys.readouterr().out == ""
    summary = quiet.summary()
    assert summary.steps == 10 and summary.images == 80 and summary.left_out_steps == 1
    assert summary.input_wait_share is None  # fit fetches inside its step
    assert quiet.epochs == 2 and quiet.steps_per_epoch == 5  # from fit's params

    text = make_monitor(8, display="text")
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[text], verbose=0)
    out = capsys.readouterr().out
    assert "epoch 1/1: 5 steps" in out and "input wait unknown" in out
    assert "verdict:" in out


def test_a_mixed_precision_run_is_not_told_to_use_mixed_precision(keras):
    monitor = MonitorCallbackWith(FakeSampler(gpu_util=55.0))
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        _fit_tiny(keras, monitor, epochs=1)
    finally:
        keras.config.set_dtype_policy(before)
    text = monitor.summary().verdict
    assert text.startswith("under-used") and "mixed precision" not in text
    plain = MonitorCallbackWith(FakeSampler(gpu_util=55.0))
    _fit_tiny(keras, plain, epochs=1)
    assert "use mixed precision" in plain.summary().verdict


def test_the_summary_shows_tensorflows_peak_memory_beside_nvmls():
    gpu = DeviceSample("GPU 0 (NVIDIA H200)", "gpu", 80.0, 118 * 2**30, 140 * 2**30)
    summary = summarize(
        Rates(10, 640, 1.0, 640.0, 0.1, None),
        [Sample(0.0, (gpu,))],
        allocator_peaks=(("GPU:0", 3 * 2**30), ("GPU:1", 2**31)),
    )
    assert "GPU 0 (NVIDIA H200): mean 80%, peak 80%, peak memory 118.0/140.0 GiB" in str(summary)
    assert (
        "  TensorFlow's peak memory: GPU:0 3.0 GiB, GPU:1 2.0 GiB (NVML's figure is what its "
        "allocator reserved)"
    ) in str(summary)


def test_one_run_across_several_fit_calls(keras):
    """Phases and resume segments call fit several times: `run()` keeps one set of figures."""
    import numpy as np

    from mdtrain.monitor import MonitorCallback

    x, y = np.zeros((40, 4), "float32"), np.zeros((40, 1), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    sampler = FakeSampler(gpu_util=None)
    monitor = MonitorCallback(8, display="none")
    monitor.sampler = sampler
    with monitor.run():
        model.fit(x, y, batch_size=8, epochs=2, callbacks=[monitor], verbose=0)
        model.fit(x, y, batch_size=8, initial_epoch=2, epochs=3, callbacks=[monitor], verbose=0)
    summary = monitor.summary()
    assert summary.steps == 15 and summary.images == 15 * 8 and summary.left_out_steps == 1
    assert sampler.started == 1 and sampler.stopped == 1


def MonitorCallbackWith(sampler):  # noqa: N802 - reads as the class it makes
    from mdtrain.monitor import MonitorCallback

    monitor = MonitorCallback(8, display="none")
    monitor.sampler = sampler
    return monitor


def _fit_tiny(keras, monitor, epochs=2):
    import numpy as np

    x, y = np.zeros((40, 4), "float32"), np.zeros((40, 1), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, y, batch_size=8, epochs=epochs, callbacks=[monitor], verbose=0)


@pytest.mark.parametrize("display", ["widget", "text"])
def test_in_a_notebook_the_run_leaves_its_chart_and_summary(keras, monkeypatch, capsys, display):
    """The picture a saved notebook keeps: the chart as a PNG, then the summary's text.

    Live runs show the widget first (which regenerate.py drops); smoke runs
    (MDTRAIN_SMOKE=1, "auto" means text) print epoch lines first.
    """
    import IPython
    import IPython.display

    from mdtrain.monitor import make_monitor

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", NotebookShell)
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monitor = make_monitor(8, display=display)
    monitor.sampler = FakeSampler(gpu_util=None)
    _fit_tiny(keras, monitor)
    *live, picture = shown
    assert len(live) == (display == "widget")  # the dashboard's widget, kept live
    assert picture.format == "png" and picture.data[:4] == b"\x89PNG"
    assert picture.data == monitor.chart_png(dpi=100)  # the dashboard's chart, same figures
    out = capsys.readouterr().out
    assert out.endswith(str(monitor.summary()) + "\n")
    assert str(monitor.summary()).startswith("mdtrain monitor: 10 steps")
    assert ("epoch 1/2:" in out) == (display == "text")


def test_outside_a_notebook_or_with_display_none_no_picture(keras, monkeypatch, capsys):
    import IPython.display

    from mdtrain.monitor import make_monitor

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    _fit_tiny(keras, make_monitor(8, display="text"), epochs=1)  # a terminal: text only
    assert shown == [] and "mdtrain monitor:" in capsys.readouterr().out
    monkeypatch.setattr(IPython, "get_ipython", NotebookShell)
    _fit_tiny(keras, make_monitor(8, display="none"), epochs=1)
    assert shown == [] and capsys.readouterr().out == ""


# The cells of a notebook that trains as a reader's notebook does: one default, no display code.
KERNEL_CELLS = [
    "import os\nimport numpy as np\nimport keras\nimport mdtrain\n"
    "x = np.random.default_rng(0).random((320, 16, 16, 3), dtype='float32')\n"
    "y = np.arange(320) % 4\n"
    "model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),\n"
    "    keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])\n"
    "model.compile('adam', keras.losses.SparseCategoricalCrossentropy(from_logits=True))",
    "os.environ.pop('MDTRAIN_SMOKE', None)  # a real run: the live dashboard\n"
    "model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[mdtrain.make_monitor(32)])",
    "os.environ['MDTRAIN_SMOKE'] = '1'  # CI's nbval run: text\n"
    "model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[mdtrain.make_monitor(32)])",
]


@pytest.mark.slow
def test_a_saved_notebook_keeps_the_monitors_picture(monkeypatch):
    """In a real kernel, live and in smoke mode, the cell keeps a PNG and the summary.

    What a reader on GitHub, nbviewer or Kaggle's viewer sees: the notebook as
    notebooks/regenerate.py saves it, widget views dropped.
    """
    import base64
    import importlib.util

    import nbformat
    from nbclient import NotebookClient

    spec = importlib.util.spec_from_file_location("regenerate", REPO / "notebooks/regenerate.py")
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in KERNEL_CELLS])
    NotebookClient(nb, kernel_name="python3", timeout=300).execute()
    live_widget = [o for o in nb.cells[1].outputs if regenerate._WIDGET in o.get("data", {})]
    saved = regenerate.scrub_notebook(nb)
    for cell in saved.cells[1:]:
        pictures = [i for i, o in enumerate(cell.outputs) if "image/png" in o.get("data", {})]
        assert len(pictures) == 1, [o.output_type for o in cell.outputs]
        picture, below = cell.outputs[pictures[0]], cell.outputs[pictures[0] + 1]
        assert base64.b64decode(picture.data["image/png"])[:4] == b"\x89PNG"
        assert below.name == "stdout" and below.text.startswith("mdtrain monitor: "), below
        assert "\n  verdict: " in below.text
    smoke_text = "".join(o.get("text", "") for o in saved.cells[2].outputs)
    assert live_widget and "epoch 1/2:" in smoke_text
