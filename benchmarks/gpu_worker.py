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
`numerics` (2 devices against 1 with TF32 off: the largest relative weight
difference per case), `overflow` (float16 with loss scaling forced, an overflow
on replica 1 only), `mdtrain` (`mdtrain train` with the given arguments, parsed
by the CLI's own parser, through `mdtrain.training.train`), `recipe` (article
003's recipe, `recipe.recipe_fit`: `image_dataset_from_directory` + cache, Keras
augmentation layers in the model, the same small CNN, MirroredStrategy, `fit`).
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
sys.path.insert(1, str(Path(__file__).resolve().parent))  # recipe.py, _common.py

PREFIX = "GPUCHECK "


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
def mdtrain_run(run: dict, work: str, record: dict) -> None:
    """`mdtrain train ARGS` as the CLI parses it, through `train()`; its figures into `record`."""
    from mdtrain.cli import config_from_args
    from mdtrain.training import train

    argv = list(run["argv"])
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
    record["classes"] = len(result.class_names)


def _printed(lines: list[str]) -> dict:
    """The lines of a run's output that matter here: precision, strategy, the last few."""

    def first(start: str) -> str | None:
        return next((ln for ln in lines if ln.lower().startswith(start)), None)

    return {"precision_line": first("mixed precision"), "strategy_line": first("strategy "),
            "tail": lines[-8:]}  # fmt: skip


def recipe_run(run: dict, work: str, record: dict) -> None:
    """Article 003's recipe on the same images (`recipe.recipe_fit`): the small CNN, `fit`."""
    from recipe import recipe_fit, val_accuracy_on_every_image

    timer, tee = _epoch_timer(), _Tee()
    try:
        with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
            model, strategy, train_ds, history = recipe_fit(
                run["data"], run["image_size"], run["global_batch"], run["epochs"],
                run.get("devices"), callbacks=[timer],
            )  # fmt: skip
    finally:
        record["printed"] = {"tail": tee.lines()[-6:]}
    num_train = len(train_ds.file_paths)
    record.update(
        replicas=strategy.num_replicas_in_sync, global_batch_size=run["global_batch"],
        num_train=num_train, image_size=run["image_size"], epochs=run["epochs"],
        classes=len(train_ds.class_names),
        val_accuracy=val_accuracy_on_every_image(
            model, run["data"], run["image_size"], run["global_batch"]
        ),
        val_accuracy_in_fit=history.history.get("val_accuracy", [None])[-1],
        loss=history.history.get("loss", [None])[-1],
        weights_finite=_finite(model), **_rates(timer, num_train),
    )  # fmt: skip


# ------------------------------------------------------------------ correctness (n, s)
def _two_strategies():
    """One device, and the first two under MirroredStrategy (through one device where they
    share a card: NCCL refuses two ranks on one); the GPUs, else the CPUs of a dry run."""
    import tensorflow as tf

    from mdtrain.compat import fresh_collective_keys

    devices = _names(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices())
    devices = devices[:2]
    shared = len(tf.config.list_physical_devices("GPU")) < 2
    fresh_collective_keys()
    reduce = tf.distribute.ReductionToOneDevice() if shared else None
    two = tf.distribute.MirroredStrategy(devices, cross_device_ops=reduce)
    return tf.distribute.OneDeviceStrategy(devices[0]), two


def _trained_weights(strategy, dataset, batch_norm: str, classes: int, size: int) -> list:
    """The small CNN (dropout 0) after one epoch of `ExactTrainer.fit` with SGD."""
    import keras

    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    keras.utils.set_random_seed(0)  # the same initial weights under both strategies
    with strategy.scope():
        net = build_model("small-cnn", classes, size, dropout=0.0, batch_norm=batch_norm)
        trainer = ExactTrainer(net)
        trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    trainer.fit(dataset, epochs=1, shuffle=False, verbose=0)
    return net.get_weights()


#: N ≡ 1 cases: (examples, global batch, --batch-norm, whether 2 devices must equal 1).
NUMERICS_CASES = {
    "empty slice (17 examples, batches of 16: last 1 + 0), exact": (17, 16, "exact", True),
    "--batch-norm exact (31 examples: last 8 + 7)": (31, 16, "exact", True),
    "--batch-norm synchronized (31 examples: last 8 + 7)": (31, 16, "synchronized", True),
    "--batch-norm local (31 examples: last 8 + 7)": (31, 16, "local", False),
}
#: tests/test_numerics.py's bound on the largest relative weight difference, and its image
#: size (16 px: 1x1 after the small CNN's 4 poolings). At 32 px float32 runs part by up to
#: 1.4e-3 after one step through a max-pool tie that float32 breaks the other way in one of
#: them (float64: 1e-14): docs/numerics.md, "Float32: discrete decisions, not the rule".
EXACT, NUMERICS_PX = 1e-4, 16


def numerics_run(run: dict, work: str, record: dict) -> None:
    """2 devices against 1 with TF32 off: the largest relative weight difference per case."""
    import tensorflow as tf

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from numerics_harness import fixed_dataset, max_relative_difference

    one, two = _two_strategies()
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    cases = {}
    try:
        for case in run["cases"]:
            examples, batch, norm, must_equal = NUMERICS_CASES[case]
            dataset = fixed_dataset(examples, batch, image_size=NUMERICS_PX)
            reference = _trained_weights(one, dataset, norm, 3, NUMERICS_PX)
            got = _trained_weights(two, dataset, norm, 3, NUMERICS_PX)
            difference = max_relative_difference(got, reference)
            cases[case] = {"max_relative_difference": difference, "must_equal": must_equal,
                           "equal": difference < EXACT}  # fmt: skip
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    record.update(
        cases=cases,
        devices=list(two.extended.worker_devices),
        bound=EXACT,
        tf32="off",
        passed=all(c["equal"] for c in cases.values() if c["must_equal"]),
    )


def _overflow_layer(replica: int):
    """Multiplies replica `replica`'s logits by 30,000 (past float16's 65504): a non-finite
    gradient on that replica only."""
    import keras
    import tensorflow as tf

    class OverflowOn(keras.layers.Layer):
        def call(self, logits):
            context = tf.distribute.get_replica_context()  # None while Keras builds the model
            if context is None:
                return logits
            here = tf.equal(context.replica_id_in_sync_group, replica)
            return logits * tf.cast(tf.where(here, 3e4, 1.0), logits.dtype)

    return OverflowOn()


def overflow_run(run: dict, work: str, record: dict) -> None:
    """float16 with loss scaling forced (an override: compute capability 8+ picks bfloat16),
    one step with an overflow on replica 1 only: weights finite and unchanged, scale halved."""
    import keras
    import numpy as np
    import tensorflow as tf

    from mdtrain.loop import ExactTrainer

    _, two = _two_strategies()
    dataset = tf.data.Dataset.from_tensor_slices((np.ones((4, 4), "float32"), [0, 1, 2, 0]))
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        with two.scope():
            inputs = keras.Input((4,))
            logits = keras.layers.Dense(3, kernel_initializer="ones")(inputs)
            outputs = keras.layers.Activation("softmax", dtype="float32")(
                _overflow_layer(1)(logits)
            )
            net = keras.Model(inputs, outputs)
            trainer = ExactTrainer(net)
            trainer.compile(keras.optimizers.SGD(0.1))
        before, scale = net.get_weights(), float(trainer.optimizer.initial_scale)
        trainer.fit(dataset.batch(4), epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    after, scale_after = net.get_weights(), float(trainer.optimizer.dynamic_scale.numpy())
    record.update(
        policy="mixed_float16 (forced)", compute_dtype=net.layers[1].compute_dtype,
        devices=list(two.extended.worker_devices), overflow_on_replica=1,
        weights_finite=all(bool(np.isfinite(w).all()) for w in after),
        step_skipped=all(np.array_equal(a, b) for a, b in zip(after, before, strict=True)),
        loss_scale_before=scale, loss_scale_after=scale_after,
    )  # fmt: skip
    record["passed"] = bool(record["weights_finite"] and record["step_skipped"]
                            and scale_after == scale / 2)  # fmt: skip


RUNNERS = {
    "mdtrain": mdtrain_run,
    "recipe": recipe_run,
    "numerics": numerics_run,
    "overflow": overflow_run,
}


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
