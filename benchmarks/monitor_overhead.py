"""How much does mdtrain.monitor cost per training step?

Measures, on this machine:

1. the callback's own cost per step (``on_train_batch_begin`` +
   ``on_train_batch_end``) with the live dashboard refreshing and the sampler
   running on their threads, as in a notebook;
2. the background cost: one chart redraw, and its share of wall time at the
   dashboard's redraw rate;
3. a typical training step (a small CNN, 64x64 images, global batch 64, on
   this machine's devices) to put (1) in proportion.

Writes benchmarks/monitor_overhead.json and prints it. Run from the repo root:

    python benchmarks/monitor_overhead.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OUT = Path(__file__).with_name("monitor_overhead.json")
CALLBACK_STEPS = 20_000
TRAIN_STEPS = 60
REFERENCE_STEP_S = 0.010  # a fast GPU step; below this, per-step overhead matters more


def callback_cost_s() -> float:
    """Mean seconds per step spent in the monitor's batch hooks, dashboard live."""
    import keras

    from mdtrain.monitor import MonitorCallback

    monitor = MonitorCallback(64, epochs=1, steps_per_epoch=CALLBACK_STEPS, display="widget")
    callbacks = keras.callbacks.CallbackList([monitor], epochs=1, steps=CALLBACK_STEPS)
    with contextlib.redirect_stdout(io.StringIO()):  # display() outside a kernel prints a repr
        callbacks.on_train_begin()
        callbacks.on_epoch_begin(0)
        logs = {"loss": 0.5, "batch_size": 64, "input_wait_s": 0.001}
        start = time.perf_counter()
        for step in range(CALLBACK_STEPS):
            callbacks.on_train_batch_begin(step)
            callbacks.on_train_batch_end(step, logs)
        elapsed = time.perf_counter() - start
        callbacks.on_epoch_end(0)
        callbacks.on_train_end()
    # CallbackList's own dispatch is paid with or without the monitor: subtract it.
    empty = keras.callbacks.CallbackList([keras.callbacks.Callback()], epochs=1, steps=1)
    start = time.perf_counter()
    for step in range(CALLBACK_STEPS):
        empty.on_train_batch_begin(step)
        empty.on_train_batch_end(step, logs)
    baseline = time.perf_counter() - start
    return max(0.0, elapsed - baseline) / CALLBACK_STEPS


def chart_render_s() -> float:
    """Seconds for one live chart redraw with an hour of history (the sampler's whole)."""
    from mdtrain.monitor import DeviceSample, Sample
    from mdtrain.monitor.summary import Chart

    devices = tuple(DeviceSample(n, "gpu", 90.0) for n in ("GPU 0", "GPU 1"))
    samples = [Sample(i * 0.5, (*devices, DeviceSample("CPU", "cpu", 40.0))) for i in range(7200)]
    rates = [(i * 0.5, 1000.0 + i) for i in range(7200)]
    chart = Chart()
    chart.render(rates, samples, 0.0)  # warm matplotlib's font cache
    start = time.perf_counter()
    for _ in range(10):
        chart.render(rates, samples, 0.0)
    return (time.perf_counter() - start) / 10


def training_step_s() -> tuple[float, str]:
    """Mean step time of a small CNN under model.fit, and the device it ran on."""
    import keras
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).random((64 * TRAIN_STEPS, 64, 64, 3), dtype="float32")
    y = np.arange(len(x)) % 10
    model = keras.Sequential(
        [
            keras.Input((64, 64, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)  # trace and compile
    start = time.perf_counter()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    return (time.perf_counter() - start) / TRAIN_STEPS, device


def main() -> dict:
    per_step = callback_cost_s()
    render = chart_render_s()
    step, device = training_step_s()
    from mdtrain.monitor import Dashboard

    chart_every_s = Dashboard(monitor=None).chart_every_s
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "callback_cost_per_step_us": round(per_step * 1e6, 2),
        "training_step_ms": round(step * 1e3, 2),
        "training_step_device": device,
        "overhead_share_of_step": round(per_step / step, 6),
        "overhead_share_of_10ms_step": round(per_step / REFERENCE_STEP_S, 6),
        "chart_render_ms": round(render * 1e3, 1),
        "chart_redraw_every_s": chart_every_s,
        "chart_thread_share_of_wall_time": round(render / chart_every_s, 4),
        "note": (
            "callback cost = batch hooks with dashboard and sampler threads live, minus "
            "CallbackList dispatch; the chart is drawn on the dashboard thread, off the "
            "training thread, at most once per chart_redraw_every_s"
        ),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
