"""The half of `gpu.py` that runs TensorFlow: one fresh process per group of runs.

`gpu.py` starts `python benchmarks/gpu_worker.py CONFIG` and reads what it
prints: one line `GPUCHECK {json}` per event (the device layout, each run's
start and its record), so a process that crashes or hangs loses only the
run it was in. TensorFlow's device layout is fixed when it starts, which is
why the layout is the first thing a worker sets: every GPU with memory growth,
or, on a machine with one GPU, that GPU split into two logical GPUs (so a
MirroredStrategy has two replicas to split a batch over); CPU replicas in a
dry run. Every run catches its own error and says what it was.

Run kinds: `probe` (build, devices, TF32, cuBLAS, cuDNN and XLA checks),
`mdtrain` (`mdtrain train` with the given arguments, parsed by the CLI's own
parser, through `mdtrain.training.train`), `recipe` (article 003's recipe:
`image_dataset_from_directory`, Keras augmentation layers in the model,
`keras.applications.EfficientNetV2B0`, MirroredStrategy and `fit`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # mdtrain from the checkout

PREFIX = "GPUCHECK "
#: Where a run's argument list names the random EfficientNetV2-B0 weights file the worker makes.
RANDOM_B0 = "{random_b0_notop}"


def emit(event: dict) -> None:
    """One event line on the real standard output (fd 1), past any redirection."""
    os.write(1, (PREFIX + json.dumps(event, default=str) + "\n").encode())


def error_text(error: BaseException) -> tuple[str, str]:
    """`Type: message` of an error, and its full text (2,000 characters at most).

    TensorFlow's graph errors open with "Graph execution error:" and a traceback of
    where the node was defined; the message is the first line after them, and the
    node that failed (`[[{{node ...}}]]`) is appended when there is one.
    """
    text = str(error).strip()
    skip_prefixes = ("Graph execution error", "Detected at node", "File ", "[[")
    lines, after_file = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if after_file and raw.startswith("    "):  # a traceback's code line
            continue
        after_file = line.startswith("File ")
        if line and not line.startswith(skip_prefixes):
            lines.append(line)
    node = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("[[")), "")
    message = f"{type(error).__name__}: {lines[0] if lines else text[:200]}"
    return (f"{message} {node}" if node else message)[:500], text[:2000]


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": [round(v, 1) for v in values]}  # fmt: skip


class _Tee(io.TextIOBase):
    """Keeps what Python prints for the run's record, and passes it on to fd 2 (the log)."""

    def __init__(self) -> None:
        self.buffer_ = io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_.write(text)
        os.write(2, text.encode(errors="replace"))
        return len(text)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.buffer_.getvalue().splitlines() if line.strip()]


def _epoch_timer():
    """A Keras callback timing the training part of each epoch (validation not counted)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.wall, self._start = [], None

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_test_begin(self, logs=None):
            if self._start is not None:
                self.wall.append(time.perf_counter() - self._start)
                self._start = None

        def on_epoch_end(self, epoch, logs=None):
            if self._start is not None:  # no validation this epoch
                self.wall.append(time.perf_counter() - self._start)
                self._start = None

    return EpochTimer()


def _rates(timer, num_train: int) -> dict:
    """Images per second of every epoch after the first (which decodes and traces)."""
    timed = timer.wall[1:] or timer.wall
    rates = [num_train / w for w in timed if w > 0]
    spread = _spread(rates)
    return {"images_per_sec": spread and round(spread["median"], 1),
            "images_per_sec_spread": spread, "timed_epochs": len(timed),
            "epoch_seconds": [round(w, 3) for w in timer.wall]}  # fmt: skip


def _finite(model) -> bool:
    import numpy as np

    return all(bool(np.isfinite(w).all()) for w in model.get_weights())


# ------------------------------------------------------------------ layout
def set_layout(config: dict) -> dict:
    """Fixes this process's devices before TensorFlow starts them; returns what it found."""
    if config["dry_run"]:
        from mdtrain.distribute import configure_devices

        configure_devices("cpu:2")
        import tensorflow as tf

        return {"kind": "cpu", "replicas": 2, "devices": _names(tf.config.list_logical_devices())}
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    layout: dict = {"kind": "gpu", "physical_gpus": len(gpus)}
    if len(gpus) == 1 and config.get("split", True):
        limit = int(config.get("memory_limit_mb", 8192))
        try:
            tf.config.set_logical_device_configuration(
                gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * 2
            )
            layout["split"] = f"GPU 0 as 2 logical GPUs of {limit} MiB each"
        except Exception as e:  # noqa: BLE001 - then one replica: the runs say so
            layout["split_error"] = error_text(e)[0]
    if "split" not in layout:
        for gpu in gpus:
            with contextlib.suppress(RuntimeError, ValueError):
                tf.config.experimental.set_memory_growth(gpu, True)
    logical = tf.config.list_logical_devices("GPU")
    layout["devices"] = _names(logical)
    layout["replicas"] = len(logical)
    return layout


def _names(devices) -> list[str]:
    return [d.name for d in devices]


# ------------------------------------------------------------------ probe (sections a and b)
def probe(config: dict) -> dict:
    """Build, devices and what each library does on the first GPU, every check on its own."""
    import keras
    import numpy as np
    import tensorflow as tf

    out: dict = {
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                     "numpy": np.__version__, "python": sys.version.split()[0]},
        "built_with_cuda": _check(tf.test.is_built_with_cuda),
        "build_info": _check(lambda: dict(tf.sysconfig.get_build_info())),
    }  # fmt: skip
    gpus = tf.config.list_physical_devices("GPU")
    out["physical_gpus"] = [{"name": g.name, **_details(tf, g)} for g in gpus]
    for gpu in gpus:
        with contextlib.suppress(RuntimeError, ValueError):
            tf.config.experimental.set_memory_growth(gpu, True)
    out["logical_gpus"] = _check(lambda: _names(tf.config.list_logical_devices("GPU")))
    device = "/CPU:0" if config["dry_run"] else "/GPU:0"
    out["device"] = device
    if not gpus and not config["dry_run"]:
        out["checks"] = "skipped: TensorFlow lists no GPU"
        return out
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled
    out["tf32_enabled_by_default"] = _check(tf32).get("value")
    out["checks"] = {
        "matmul_tf32": _check(lambda: _tf32(tf, np, device)),
        "conv_cudnn": _check(lambda: _conv(tf, np, device)),
        "xla": _check(lambda: _xla(tf, np, device)),
        "xla_zero_size": _check(lambda: _xla_zero_size(tf, device)),
    }
    out["memory"] = _check(lambda: tf.config.experimental.get_memory_info(device.strip("/")))
    return out


def _details(tf, gpu) -> dict:
    try:
        details = tf.config.experimental.get_device_details(gpu)
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        return {"details_error": error_text(e)[0]}
    cc = details.get("compute_capability")
    return {"device_name": details.get("device_name"),
            "compute_capability": ".".join(map(str, cc)) if cc else None}  # fmt: skip


def _check(fn) -> dict:
    start = time.perf_counter()
    try:
        value = fn()
        result = value if isinstance(value, dict) else {"value": value}
        result = {"ok": True, **result}
    except Exception as e:  # noqa: BLE001 - a check records what failed
        message, detail = error_text(e)
        result = {"ok": False, "error": message, "error_detail": detail}
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def _relative_error(got, want) -> float:
    import numpy as np

    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def _tf32(tf, np, device: str) -> dict:
    """A float32 matmul against float64: TF32 rounds to ~1e-3, float32 to ~1e-6."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
    want = a.astype(np.float64) @ b.astype(np.float64)
    errors = {}
    default = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        for enabled in (True, False):
            tf.config.experimental.enable_tensor_float_32_execution(enabled)
            with tf.device(device):
                got = tf.matmul(tf.constant(a), tf.constant(b))
            errors["tf32_on" if enabled else "tf32_off"] = _relative_error(got.numpy(), want)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(default)
    return {"placed_on": got.device, "relative_error": errors,
            "tf32_used": errors["tf32_on"] > 10 * errors["tf32_off"]}  # fmt: skip


def _conv(tf, np, device: str) -> dict:
    """A convolution's output and both gradients on the device, against the CPU's."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 32, 32, 16)).astype(np.float32)
    w = rng.standard_normal((3, 3, 16, 32)).astype(np.float32)

    def run(where):
        with tf.device(where):
            xs, ws = tf.constant(x), tf.Variable(w)
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(xs)
                y = tf.nn.conv2d(xs, ws, 1, "SAME")
                loss = tf.reduce_sum(y * y)
            return [t.numpy() for t in (y, tape.gradient(loss, xs), tape.gradient(loss, ws))], y

    (got, y), (want, _) = run(device), run("/CPU:0")
    default = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        exact, _ = run(device)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(default)

    def errors(results):  # output, input gradient, filter gradient
        return [_relative_error(g, c) for g, c in zip(results, want, strict=True)]

    return {
        "placed_on": y.device,
        "relative_error_vs_cpu": errors(got),
        "relative_error_vs_cpu_tf32_off": errors(exact),
    }


def _xla(tf, np, device: str) -> dict:
    """A `jit_compile=True` function on the device: where it ran, its compile and call times."""

    def body(x):
        return tf.reduce_sum(tf.nn.relu(tf.matmul(x, x)) * 2.0, axis=1)

    compiled = tf.function(body, jit_compile=True)
    x = tf.constant(np.random.default_rng(2).standard_normal((256, 256)).astype(np.float32))
    with tf.device(device):
        start = time.perf_counter()
        got = compiled(x)
        _ = got.numpy()
        first = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(10):
            again = compiled(x)
        _ = again.numpy()
        call = (time.perf_counter() - start) / 10
        want = body(x)
    return {"placed_on": got.device, "first_call_s": round(first, 3), "call_s": call,
            "relative_error_vs_eager": _relative_error(got.numpy(), want.numpy())}  # fmt: skip


def _xla_zero_size(tf, device: str) -> dict:
    """An XLA program on an empty batch: what an empty replica slice becomes."""
    compiled = tf.function(lambda x: tf.image.flip_left_right(x) * 2.0, jit_compile=True)
    with tf.device(device):
        got = compiled(tf.zeros((0, 8, 8, 3)))
    return {"placed_on": got.device, "shape": list(got.shape)}


# ------------------------------------------------------------------ training runs
def _random_b0_notop(size: int, folder: str) -> str:
    """A random EfficientNetV2-B0 base saved as a weights file: `--weights` without network."""
    import keras

    path = Path(folder) / f"efficientnetv2-b0_random_{size}_notop.weights.h5"
    if not path.exists():
        keras.utils.set_random_seed(0)
        keras.applications.EfficientNetV2B0(
            include_top=False, weights=None, input_shape=(size, size, 3), pooling="avg"
        ).save_weights(str(path))
    return str(path)


def mdtrain_run(run: dict, work: str, record: dict) -> None:
    """`mdtrain train ARGS` as the CLI parses it, through `train()`; its figures into `record`."""
    from mdtrain.cli import config_from_args
    from mdtrain.training import train

    argv = list(run["argv"])
    if RANDOM_B0 in argv:
        size = int(argv[argv.index("--image-size") + 1])
        argv[argv.index(RANDOM_B0)] = _random_b0_notop(size, work)
    timer, tee = _epoch_timer(), _Tee()
    record["argv"] = argv
    try:
        with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
            result = train(config_from_args(argv), callbacks=[timer])
    finally:
        record["printed"] = _printed(tee.lines())
    summary = result.summary()
    last = result.history[-1] if result.history else {}
    batch, replicas = result.global_batch_size, result.replicas
    record.update(
        replicas=replicas, global_batch_size=batch, num_train=result.num_train,
        num_val=result.num_val, epochs=len(result.history),
        last_batch=result.num_train % batch or batch,
        val_accuracy=last.get("val_accuracy"), loss=last.get("loss"),
        mdtrain_images_per_sec=summary.get("images_per_sec"), augment_in=result.augment_in,
        precision=summary.get("precision"),
        model_dtype_policy=getattr(getattr(result.model, "dtype_policy", None), "name", None),
        weights_finite=_finite(result.model), **_rates(timer, result.num_train),
    )  # fmt: skip
    record["empty_replica"] = 0 < record["last_batch"] < replicas


def _printed(lines: list[str]) -> dict:
    """The lines of a run's output that matter here: precision, strategy, the last few."""

    def first(start: str) -> str | None:
        return next((ln for ln in lines if ln.lower().startswith(start)), None)

    return {"precision_line": first("mixed precision"), "strategy_line": first("strategy "),
            "tail": lines[-8:]}  # fmt: skip


def recipe_run(run: dict, work: str, record: dict) -> None:
    """Article 003's recipe on the same images: Keras' own loader, layers, model and `fit`."""
    tee = _Tee()
    try:
        with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
            model, strategy, train_ds, history, timer = _recipe_fit(run)
    finally:
        record["printed"] = {"tail": tee.lines()[-6:]}
    num_train = len(train_ds.file_paths)
    record.update(
        replicas=strategy.num_replicas_in_sync, global_batch_size=run["global_batch"],
        num_train=num_train, image_size=run["image_size"], epochs=run["epochs"],
        val_accuracy=history.history.get("val_accuracy", [None])[-1],
        loss=history.history.get("loss", [None])[-1],
        weights_finite=_finite(model), **_rates(timer, num_train),
    )  # fmt: skip


def _recipe_fit(run: dict):
    """The recipe itself: a frozen EfficientNetV2-B0 (random: no network) under augmentation."""
    import keras
    import tensorflow as tf

    from mdtrain.compat import fresh_collective_keys

    data, size, batch = run["data"], run["image_size"], run["global_batch"]
    layers = keras.layers
    keras.utils.set_random_seed(0)

    def load(split):
        return keras.utils.image_dataset_from_directory(
            f"{data}/{split}", shuffle=True, seed=0, batch_size=batch, image_size=(size, size)
        )

    train_ds, val_ds = load("train"), load("val")
    fresh_collective_keys()  # another MirroredStrategy over these devices may come before
    # NCCL, the default over GPUs, refuses two ranks on one card ("invalid usage").
    shared = len(tf.config.list_logical_devices("GPU")) > len(
        tf.config.list_physical_devices("GPU")
    )
    reduce = tf.distribute.ReductionToOneDevice() if shared else None
    strategy = tf.distribute.MirroredStrategy(run.get("devices"), cross_device_ops=reduce)
    with strategy.scope():
        augmentation = keras.Sequential(
            [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1), layers.RandomZoom(0.1)],
            name="augmentation",
        )
        base = keras.applications.EfficientNetV2B0(
            include_top=False, weights=None, input_shape=(size, size, 3)
        )
        base.trainable = False
        inputs = keras.Input((size, size, 3))
        x = augmentation(inputs)
        x = keras.applications.efficientnet_v2.preprocess_input(x)
        x = base(x, training=False)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.Dropout(0.2)(x)
        outputs = layers.Dense(len(train_ds.class_names), activation="softmax")(x)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(), metrics=["accuracy"],
                      loss="sparse_categorical_crossentropy")  # fmt: skip
    timer = _epoch_timer()
    history = model.fit(train_ds, epochs=run["epochs"], validation_data=val_ds, verbose=2,
                        callbacks=[timer])  # fmt: skip
    return model, strategy, train_ds, history, timer


RUNNERS = {"mdtrain": mdtrain_run, "recipe": recipe_run}


def _watchdog(run_id: str, limit_s: float) -> threading.Timer:
    """Ends the process when a run passes `limit_s`: a hung TensorFlow call cannot be stopped."""

    def fire() -> None:
        emit({"event": "result", "id": run_id, "status": "timeout",
              "error": f"still running after {limit_s:.0f} s: stopped"})  # fmt: skip
        os._exit(3)

    timer = threading.Timer(limit_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def run_one(run: dict, work: str) -> dict:
    """One run in its own try: its record, `status` ok or failed with the error's first line."""
    start, record = time.perf_counter(), {"status": "ok"}
    try:
        RUNNERS[run["kind"]](run, work, record)
    except BaseException as e:  # noqa: BLE001 - SystemExit from argparse included
        message, detail = error_text(e)
        record.update(status="failed", error=message, error_detail=detail)
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def main(config: dict) -> None:
    """Sets the layout, then runs the probe or each run that still fits before its deadline."""
    try:
        layout = set_layout(config)
    except Exception as e:  # noqa: BLE001 - every run then says why it did not run
        layout = {"error": error_text(e)[0]}
    emit({"event": "layout", **layout})
    if config.get("probe"):
        emit({"event": "probe", **_check(lambda: probe(config))})
    no_device = "error" in layout or (layout["kind"] == "gpu" and not layout["replicas"])
    for run in config.get("runs", []):
        if no_device:
            reason = layout.get("error") or "TensorFlow lists no GPU"
            emit({"event": "result", "id": run["id"], "status": "skipped", "error": reason})
            continue
        left = run["deadline"] - time.time()
        if left < run["estimate_s"]:
            why = f"time budget: {max(left, 0):.0f} s left, needs ~{run['estimate_s']} s"
            emit({"event": "result", "id": run["id"], "status": "skipped", "error": why})
            continue
        emit({"event": "start", "id": run["id"]})
        limit = min(run["limit_s"], config["hard_end"] - time.time())
        watchdog = _watchdog(run["id"], max(limit, 1.0))
        record = run_one(run, config["work"])
        watchdog.cancel()
        emit({"event": "result", "id": run["id"], **record})
        import keras

        with contextlib.suppress(Exception):  # the next run starts from a clean graph
            keras.backend.clear_session()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # warnings and errors: dlopen failures
    main(json.loads(sys.argv[1]))
