"""The GPU check in one command: correctness first, then what this machine's GPUs do.

Run from the repository root on a machine with NVIDIA GPUs (within 8 minutes on an H100):

    python benchmarks/gpu.py [--out DIR] [--budget-s 480] [--json]

It writes `gpu.json` (every figure, the card, the versions, the commit it ran
and whether the tree was dirty, each section's status, error and duration)
and `gpu.png` (images per second of every training run) to `--out` (default:
`benchmarks/`), and prints a verdict table. Sections, run in this order, which
is their order of value (one that no longer fits the budget is skipped and
recorded as skipped):

- a: the build's CUDA and cuDNN, the driver, the GPUs and their compute
  capability (NVML, nvidia-smi and TensorFlow), TF32, cuBLAS and cuDNN at work;
- b: an XLA (`jit_compile=True`) function on a GPU, and on an empty batch;
- n: N ≡ 1 on 2 devices with TF32 off: the largest relative weight difference
  of 2 devices against 1, per case (an empty replica slice; each `--batch-norm`);
- s: float16 with loss scaling forced (an override: compute capability 8.0 and
  up picks bfloat16), an overflow on replica 1 only: weights finite, step
  skipped, loss scale halved;
- c: `mdtrain train` default and `--mixed-precision`, with a last batch that
  leaves a replica empty: validation accuracy, the precision line, finite weights;
- e: EfficientNet-Lite0 from scratch with each `--batch-norm`, small images;
- d: `--augment-in pipeline` (c's default run is the `model` run);
- i: `--deterministic` with the small CNN and with Lite0: runs, or which op refuses;
- p: `pytest -m gpu` (tests/test_gpu.py), each test's outcome;
- g: article 003's recipe (`recipe.py`: `image_dataset_from_directory` + cache,
  Keras augmentation layers, the same small CNN, MirroredStrategy, `fit`)
  beside `mdtrain train` on the same images and devices: both sides' validation
  accuracy against chance, images/s on one clock (the same epoch timer);
- f: images/s on 1 device and on 2 (two logical GPUs of one card where there
  is one card: shared SMs, no NCCL);
- h: NVML utilisation (mdtrain's sampler) beside `nvidia-smi`, polled together
  while g and f train.

One GPU is split into two logical GPUs so that a MirroredStrategy has two
replicas; every figure of such a layout says so. TensorFlow runs only in
worker processes (`gpu_worker.py`), a few runs each, so that a crash or a
hang costs one run, never the report. Without an NVIDIA GPU it prints one
line and exits 0. `--dry-run-on-cpu` runs every section's code path on two
CPU replicas with tiny sizes (one run per section where a section has
several alike, the small CNN in place of Lite0), writing to a temporary
folder unless `--out` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # mdtrain from the checkout, as the worker finds it

from gpu_worker import PREFIX  # noqa: E402

#: Section id: what it checks. The order is the order of value (and of running).
SECTIONS = {
    "a": "build, driver, GPUs, TF32",
    "b": "XLA function on a GPU",
    "n": "N ≡ 1 on 2 devices, TF32 off, per case",
    "s": "float16 loss scaling forced, overflow on replica 1",
    "c": "mdtrain train default and --mixed-precision, a replica left empty",
    "e": "EfficientNet-Lite0 from scratch, each --batch-norm",
    "d": "--augment-in pipeline beside model",
    "i": "--deterministic on the GPU",
    "p": "pytest -m gpu",
    "g": "article 003's recipe beside mdtrain train, one clock",
    "f": "images/s on 1 and 2 devices",
    "h": "NVML utilisation beside nvidia-smi",
}
#: What a figure of two replicas on one split card is (every label of such a figure says so).
SPLIT_LABEL = "2 logical GPUs of one card: shared SMs, no NCCL"
DRY_LABEL = "2 virtual CPU devices (dry run)"
#: A side of a comparison learns when its validation accuracy is above this many times chance.
LEARNING = 1.5
BATCH_NORMS = ("exact", "synchronized", "local")
OUTPUT_RESERVE_S = 10.0  # writing the JSON and drawing the chart
SMI_QUERY = ["--query-gpu=timestamp,index,utilization.gpu", "--format=csv,noheader,nounits"]


@dataclass
class Sizes:
    """Dataset and run sizes, and how long things take (the budget's estimates), per mode."""

    small_target: int  # training images of the small-CNN set, about
    small_px: int
    small_batch: int  # per replica
    big: tuple[int, int, int]  # classes, per class, image size of the throughput set
    epochs: dict[str, int]
    big_px: int  # the throughput runs' image size
    lite0_px: int
    start_s: float  # a worker's TensorFlow start
    estimate_s: dict[str, float]  # a run's, by kind


GPU_SIZES = Sizes(
    small_target=2300, small_px=48, small_batch=64, big=(5, 400, 160),
    epochs={"c": 8, "d": 4, "e": 2, "i": 1, "g": 5, "f": 5},
    big_px=128, lite0_px=64, start_s=20,
    estimate_s={"probe": 30, "numerics": 45, "overflow": 10, "small": 20, "lite0": 30,
                "lite0_det": 30, "pytest": 120, "recipe": 30, "big": 25},
)  # fmt: skip
DRY_SIZES = Sizes(
    small_target=60, small_px=24, small_batch=8, big=(3, 10, 32),
    epochs={"c": 2, "d": 1, "e": 1, "i": 1, "g": 2, "f": 1},
    big_px=24, lite0_px=32, start_s=20,
    # two shared, busy cores
    estimate_s={"probe": 30, "numerics": 60, "overflow": 20, "small": 30, "lite0": 30,
                "lite0_det": 90, "pytest": 120, "recipe": 40, "big": 30},
)  # fmt: skip


@dataclass
class Run:
    """One training run in a worker: what it runs, its section, and the budget's view of it."""

    id: str
    section: str
    label: str
    kind: str  # "mdtrain" or "recipe"
    estimate_s: float
    argv: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    deadline: float = 0.0  # the latest time.time() it may start at and still fit

    def config(self) -> dict:
        limit = max(3 * self.estimate_s, self.estimate_s + 90)  # then it is taken as hung
        return {"id": self.id, "kind": self.kind, "argv": self.argv, "deadline": self.deadline,
                "estimate_s": self.estimate_s, "limit_s": limit, **self.extra}  # fmt: skip


@dataclass
class Group:
    """Runs that share one worker process (and its device layout)."""

    name: str
    runs: list[Run]
    probe: bool = False


# ------------------------------------------------------------------ is there a GPU?
def _try(fn, *args):
    try:
        value = fn(*args)
        return value.decode() if isinstance(value, bytes) else value
    except Exception as e:  # noqa: BLE001 - NVML raises its own error per unsupported query
        return f"error: {e}"


def nvml_info() -> dict:
    """The driver and every GPU as NVML reports them (no CUDA, no TensorFlow)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no library, no driver: recorded
        return {"count": 0, "error": str(e) or type(e).__name__}
    try:
        cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        info: dict = {
            "driver": _try(pynvml.nvmlSystemGetDriverVersion),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else cuda,
            "gpus": [],
        }
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            cc = _try(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            memory = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
            info["gpus"].append({
                "index": i, "name": _try(pynvml.nvmlDeviceGetName, h),
                "compute_capability": ".".join(map(str, cc)) if isinstance(cc, tuple) else cc,
                "memory_total_mib": getattr(memory, "total", 0) // 2**20 or None,
                "pci_bus_id": getattr(_try(pynvml.nvmlDeviceGetPciInfo, h), "busId", None),
                "mig_mode": _try(pynvml.nvmlDeviceGetMigMode, h),
                "power_limit_mw": _try(pynvml.nvmlDeviceGetPowerManagementLimit, h),
            })  # fmt: skip
        info["count"] = len(info["gpus"])
        return info
    except Exception as e:  # noqa: BLE001
        return {"count": 0, "error": str(e) or type(e).__name__}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def smi_info() -> dict:
    """What `nvidia-smi` says about the GPUs, the driver and its CUDA version."""
    query = "index,name,driver_version,compute_cap,memory.total,pci.bus_id"
    try:
        rows = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return {"error": "not found"}
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
    return {"rows": [r.strip() for r in rows.stdout.splitlines() if r.strip()],
            "error": rows.stderr.strip()[:300] or None,
            "cuda_version": cuda.group(1) if cuda else None}  # fmt: skip


def tensorflow_gpus() -> str:
    """How many GPUs TensorFlow lists, asked in a subprocess; or why it was not asked."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "none: no libcuda.so.1 (the driver's CUDA library, which TensorFlow needs)"
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    try:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=180, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "unknown: TensorFlow did not answer within 180 s"
    last = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-1:] or [""]
    return last[0] if last[0].isdigit() else f"unknown: {last[0][:200]}"


# ------------------------------------------------------------------ the plan
def _small_geometry(target: int, global_batch: int, replicas: int) -> tuple[int, int]:
    """Classes and images per class near `target` whose last batch leaves a replica empty."""
    for classes in (5, 3, 4, 2):
        start = max(5, target // classes)
        for per_class in range(start, start + global_batch + 1):
            if 0 < classes * per_class % global_batch < replicas:
                return classes, per_class
    return 5, max(5, target // 5)  # no such size (a replica count with the batch's factors)


def make_plan(sizes: Sizes, replicas: int, work: Path, dry_run: bool, two: str = "") -> tuple:
    """The datasets to make and the groups of runs, in order of running (of value).

    `two` labels a run on two devices (`SPLIT_LABEL` where one card is split). A dry
    run makes one run per section where a section has several alike.
    """
    from gpu_worker import NUMERICS_CASES

    small_batch = sizes.small_batch * replicas
    classes, per_class = _small_geometry(sizes.small_target, small_batch, replicas)
    data = {"small": (work / "small", classes, per_class, sizes.small_px),
            "big": (work / "big", *sizes.big)}  # fmt: skip
    small, big = str(data["small"][0]), str(data["big"][0])
    est, epochs = sizes.estimate_s, {k: str(v) for k, v in sizes.epochs.items()}
    common = ["--data", small, "--global-batch-size", str(small_batch)]
    # A dry run checks the check's code: the small CNN stands in for Lite0 (minutes on 2 cores).
    model = (
        ["--image-size", str(sizes.small_px)]
        if dry_run
        else [
            "--model",
            "efficientnet-lite0",
            "--weights",
            "none",
            "--image-size",
            str(sizes.lite0_px),
        ]
    )
    lite0 = [*common, *model, "--epochs", epochs["e"]]  # fmt: skip
    cases = list(NUMERICS_CASES)

    def mdtrain(rid, label, argv, kind="small"):
        return Run(rid, rid[0], label, "mdtrain", est[kind], argv)

    correctness = [
        Run("n.cases", "n", f"2 devices against 1 ({two})", "numerics", est["numerics"],
            extra={"cases": [cases[0], cases[-1]] if dry_run else cases}),
        Run("s.overflow", "s", f"float16 forced, overflow on replica 1 ({two})", "overflow",
            est["overflow"]),
        mdtrain("c.default", "mdtrain train", [*common, "--epochs", epochs["c"]]),
        mdtrain("c.mixed", "--mixed-precision",
                [*common, "--epochs", epochs["c"], "--mixed-precision"]),
        *(mdtrain(f"e.{norm}", f"{'small-cnn (dry run)' if dry_run else 'Lite0'} --batch-norm "
                  f"{norm}", [*lite0, "--batch-norm", norm], kind="lite0")
          for norm in (BATCH_NORMS[:1] if dry_run else BATCH_NORMS)),
        mdtrain("d.pipeline", "--augment-in pipeline",
                [*common, "--epochs", epochs["d"], "--augment-in", "pipeline"]),
        mdtrain("i.small-cnn", "small-cnn --deterministic",
                [*common, "--epochs", epochs["i"], "--deterministic"]),
        *([] if dry_run else [mdtrain("i.lite0", "Lite0 --deterministic",
                                      [*lite0, "--deterministic"], kind="lite0_det")]),
    ]  # fmt: skip
    big_args = ["--data", big, "--image-size", str(sizes.big_px), "--epochs"]
    recipe = {
        "data": big,
        "image_size": sizes.big_px,
        "global_batch": small_batch,
        "epochs": sizes.epochs["g"],
        "devices": ["/cpu:0", "/cpu:1"] if dry_run else None,
    }
    throughput = [
        Run("g.recipe", "g", f"article 003 recipe ({two})", "recipe", est["recipe"],
            extra=recipe),
        mdtrain("g.mdtrain", f"mdtrain train ({two})",
                [*big_args, epochs["g"], "--global-batch-size", str(small_batch)], kind="big"),
        *(mdtrain(f"f.{name}", label, [*big_args, epochs["f"], "--batch-size-per-replica",
                  str(sizes.small_batch), "--strategy", strategy], kind="big")
          for name, label, strategy in (("one", "1 device", "one"),
                                        ("all", f"every device ({two})", "auto"))),
    ]  # fmt: skip
    return data, [Group("probe", [], probe=True), Group("correctness", correctness),
                  Group("throughput", throughput)]  # fmt: skip


def set_deadlines(groups: list[Group], end: float, start_s: float) -> None:
    """Each run may start while the runs of more valuable sections after it still fit."""
    rank = {s: i for i, s in enumerate(SECTIONS)}
    for i, group in enumerate(groups):
        for run in group.runs:
            reserve = 0.0
            for later in groups[i + 1 :]:
                first = [r.estimate_s for r in later.runs if rank[r.section] < rank[run.section]]
                reserve += start_s + sum(first) if first else 0.0
            run.deadline = end - reserve


# ------------------------------------------------------------------ running workers
class Clock:
    """The run's budget: seconds since the start, and the wall-clock end."""

    def __init__(self, budget_s: float):
        self.start = time.time()
        self.end = self.start + budget_s - OUTPUT_RESERVE_S

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        return self.end - time.time()


def say(clock: Clock, text: str) -> None:
    print(f"gpu.py [{clock.elapsed():5.0f} s] {text}", file=sys.stderr, flush=True)


def _worker_env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    # A GPU whose architecture the build lacks runs kernels compiled from PTX by the driver:
    # a cache large enough for them all lets the next worker start without compiling again.
    cache = os.environ.get("CUDA_CACHE_MAXSIZE", str(4 * 2**30))
    # Lazy loading compiles a kernel when it is first used, not the whole library at start.
    loading = os.environ.get("CUDA_MODULE_LOADING", "LAZY")
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "1", "CUDA_CACHE_MAXSIZE": cache,
            "CUDA_MODULE_LOADING": loading}  # fmt: skip


#: Lines of a worker's log worth keeping: what failed to load, compile or run.
NOTABLE = re.compile(
    r"dlopen|Could not|Cannot |libcu|cudnn|cuDNN|ptxas|libdevice|nvJitLink|NCCL|XLA|"
    r"[Ee]rror|[Ff]ail|Check failed|Segmentation|Abort|Traceback|deterministic|Unimplemented"
)


#: A log line about a CUDA library that did not load (the stand-ins of another CUDA version).
LIBRARY_LINE = re.compile(r"dlopen|Could not load|Cannot |libcu|libnccl|cuDNN|cudnn|version")


def _log_summary(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.strip()]
    notable = list(dict.fromkeys(line[:300] for line in lines if NOTABLE.search(line)))
    return {"notable": notable[:40], "tail": [line[:300] for line in lines[-25:]]}


def _describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running: stopped"
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-rc).name}"
    return f"exit {rc}"


def launch(config: dict, kill_at: float, work: Path, on_event) -> dict:
    """Runs one worker until it exits or `kill_at`; passes each event on; returns its log."""
    name = f"{config['group']}-{int(time.time() * 1000) % 10**8}"
    out_path, err_path = work / f"{name}.out", work / f"{name}.err"
    started = time.time()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "gpu_worker.py"), json.dumps(config)], cwd=REPO,
            stdout=out, stderr=err, env=_worker_env(), start_new_session=True,
        )  # fmt: skip
        seen = 0
        while True:
            rc = proc.poll()
            lines = out_path.read_bytes().decode(errors="replace").splitlines()
            complete = lines if rc is not None else lines[:-1]  # the last may be half-written
            for line in complete[seen:]:
                if line.startswith(PREFIX):
                    with contextlib.suppress(json.JSONDecodeError):
                        on_event(json.loads(line[len(PREFIX) :]))
            seen = max(seen, len(complete))
            if rc is not None:
                break
            if time.time() > kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
                break
            time.sleep(0.25)
    log = _log_summary(err_path.read_bytes().decode(errors="replace"))
    return {"group": config["group"], "exit": _describe_exit(rc),
            "seconds": round(time.time() - started, 1), **log}  # fmt: skip


def _events(group: Group, clock: Clock, report: dict, started: list[str]):
    """What to do with each event a worker prints: keep it in the report, say a line."""

    def on_event(event: dict) -> None:
        kind = event.pop("event", None)
        if kind == "layout":
            report["layouts"].setdefault(group.name, event)
        elif kind == "probe":
            report["probe"] = event
            say(clock, f"probe: {_probe_line(event)}")
        elif kind == "start":
            started.append(event["id"])
        elif kind == "result":
            report["runs"][event["id"]] = event
            say(clock, f"{event['id']}: {_run_line(event)}")

    return on_event


def run_group(group: Group, base: dict, clock: Clock, work: Path, report: dict) -> None:
    """Runs a group's runs in workers; a crashed run is recorded and a fresh worker goes on."""
    records, pending, first_attempt = report["runs"], list(group.runs), True
    while first_attempt or pending:
        started: list[str] = []
        config = {**base, "group": group.name, "probe": group.probe and first_attempt,
                  "split": not group.probe, "runs": [r.config() for r in pending]}  # fmt: skip
        kill_at = clock.end if pending else min(clock.end, time.time() + 150)
        log = launch(config, kill_at, work, _events(group, clock, report, started))
        report["processes"].append(log)
        first_attempt = False
        last = (log["notable"] or log["tail"] or ["no log"])[-1]
        for run_id in [i for i in started if i not in records]:  # the worker died in this run
            stopped = log["exit"].startswith("still running")
            records[run_id] = {"status": "timeout" if stopped else "crashed",
                               "error": f"worker {log['exit']}: {last}"[:500]}  # fmt: skip
            say(clock, f"{run_id}: {records[run_id]['status']} ({log['exit']})")
        pending = [r for r in pending if r.id not in records]
        if pending and (not started or clock.left() < 30):  # no progress, or no time: stop
            spent = clock.left() < 30
            why = "time budget spent" if spent else f"worker {log['exit']} before this run"
            for run in pending:
                records[run.id] = {"status": "skipped" if spent else "failed",
                                   "error": f"{why}: {last}"[:500]}  # fmt: skip
            pending = []


# ------------------------------------------------------------------ data
def start_data(data: dict, clock: Clock, work: Path) -> dict:
    """Starts `mdtrain data synth` for each dataset, side by side; returns the processes."""
    procs = {}
    for name, (folder, classes, per_class, px) in data.items():
        if (folder / "mdtrain-dataset.json").exists():  # --work kept from an earlier check
            continue
        cmd = [sys.executable, "-m", "mdtrain", "data", "synth", str(folder), "--classes",
               str(classes), "--per-class", str(per_class), "--image-size", str(px)]  # fmt: skip
        log = open(work / f"synth-{name}.log", "wb")  # noqa: SIM115 - closed in wait_data
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=log, cwd=REPO,
                                        env=_worker_env()), log, cmd)  # fmt: skip
    return procs


def wait_data(procs: dict, clock: Clock) -> dict:
    """Waits for the datasets; returns each one's command, status and seconds."""
    out = {}
    for name, (proc, log, cmd) in procs.items():
        try:
            rc = proc.wait(timeout=max(clock.left(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        text = Path(log.name).read_text(errors="replace").strip().splitlines()
        out[name] = {"command": " ".join(["python", *cmd[1:]]), "exit": rc,
                     "error": None if rc == 0 else (text[-1:] or ["no output"])[0]}  # fmt: skip
    say(clock, "data: " + ", ".join(f"{k} {'ok' if v['exit'] == 0 else v['error']}"
                                    for k, v in out.items()))  # fmt: skip
    return out


# ------------------------------------------------------------------ h: NVML beside nvidia-smi
class UtilisationPair:
    """mdtrain's NVML sampler and `nvidia-smi -lms 250` reading the GPUs at the same time."""

    def __init__(self, work: Path) -> None:
        from mdtrain.monitor import Sampler

        self.sampler = Sampler(interval_s=0.25, clock=time.time, max_samples=20000)
        self.smi, self.smi_error, self.smi_text = None, None, ""
        self.log = work / "nvidia-smi.csv"  # a file: a pipe nobody reads would fill and block

    def __enter__(self):
        self.sampler.start()
        try:
            with open(self.log, "wb") as out:
                self.smi = subprocess.Popen(["nvidia-smi", *SMI_QUERY, "-lms", "250"],
                                            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        except FileNotFoundError:
            self.smi_error = "not found"
        except OSError as e:
            self.smi_error = f"{type(e).__name__}: {e}"
        return self

    def __exit__(self, *exc) -> None:
        self.sampler.stop()
        if self.smi is not None:
            self.smi.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.smi.wait(timeout=10)
            self.smi_text = self.log.read_text(errors="replace")
            if not _smi_rows(self.smi_text):
                self.smi_error = self.smi_text.strip()[:300] or f"exit {self.smi.returncode}"
        self.sampler.close()

    def result(self, dry_run: bool) -> dict:
        ours = [(s.time, _gpu_index(d.name), d.utilization) for s in self.sampler.history()
                for d in s.gpus if d.utilization is not None]  # fmt: skip
        theirs = _smi_rows(self.smi_text)
        pairs = []
        for t, index, util in theirs:
            near = [(abs(t - u), v) for u, i, v in ours if i == index and abs(t - u) <= 0.3]
            if near:
                pairs.append((min(near)[1], util))
        diffs = [abs(a - b) for a, b in pairs]
        out = {
            "samples": {"mdtrain_nvml": len(ours), "nvidia_smi": len(theirs),
                        "cpu_only": len(self.sampler.history())},
            "nvml_has_gpu": self.sampler.has_gpu,
            "nvidia_smi_error": self.smi_error,
            "mdtrain_utilization": _summary([u for _, _, u in ours]),
            "nvidia_smi_utilization": _summary([u for _, _, u in theirs]),
            "pairs": len(pairs), "abs_difference": _summary(diffs),
        }  # fmt: skip
        if len(pairs) >= 5 or (dry_run and self.sampler.history()):
            out["status"] = "ok"
        else:
            seen = f"NVML sees a GPU: {self.sampler.has_gpu}; nvidia-smi: {self.smi_error}"
            out.update(status="failed", error=f"fewer than 5 readings at the same time ({seen})")
        return out


def _gpu_index(name: str) -> int | None:
    m = re.match(r"GPU (\d+)", name)
    return int(m.group(1)) if m else None


def _smi_rows(text: str) -> list[tuple[float, int, float]]:
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        with contextlib.suppress(ValueError, IndexError):
            stamp = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((stamp, int(parts[1]), float(parts[2])))
    return rows


def _summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"n": len(values), "median": round(statistics.median(values), 2),
            "mean": round(statistics.fmean(values), 2), "max": round(max(values), 2)}  # fmt: skip


# ------------------------------------------------------------------ verdicts
def _fmt(value, spec: str = ",.0f") -> str:
    return "n/a" if value is None else format(value, spec)


def _run_line(r: dict) -> str:
    if r.get("status") != "ok":
        return f"{r.get('status')}: {r.get('error')}"
    parts = [f"{_fmt(r.get('images_per_sec'))} img/s"]
    if r.get("val_accuracy") is not None:
        parts.append(f"val acc {r['val_accuracy']:.3f}")
    if r.get("weights_finite") is False:
        parts.append("NON-FINITE weights")
    return ", ".join(parts) + f" ({r.get('seconds')} s)"


def _probe_line(p: dict) -> str:
    if not p.get("ok"):
        return f"failed: {p.get('error')}"
    gpus = p.get("physical_gpus") or []
    return f"TensorFlow {p['versions']['tensorflow']} lists {len(gpus)} GPU(s)"


def _section_status(records: list[dict]) -> str:
    states = {r.get("status") for r in records}
    if not records or states == {"skipped"}:
        return "skipped"
    if states - {"ok", "skipped"}:
        return "failed"
    return "ok" if states == {"ok"} else "partial"


def _first_error(records: list[dict]) -> str | None:
    return next((f"{r['id']}: {r['error']}" for r in records if r.get("error")), None)


def _key_a(report: dict) -> tuple[str, str, str | None]:
    probe, nvml = report.get("probe") or {}, report["nvml"]
    gpu = (nvml.get("gpus") or [{}])[0]
    build = probe.get("build_info") or {}
    checks = probe.get("checks") if isinstance(probe.get("checks"), dict) else {}
    tf32 = checks.get("matmul_tf32", {})
    archs, cc = build.get("cuda_compute_capabilities") or [], gpu.get("compute_capability")
    sass = f"sm_{str(cc).replace('.', '')}"
    jit = f" ({sass} missing: its kernels compile from PTX)" if archs and sass not in archs else ""
    key = (f"{gpu.get('name', 'no NVML GPU')} cc {cc}, "
           f"driver {nvml.get('driver')} (CUDA {nvml.get('cuda_driver')}); TF "
           f"{probe.get('versions', {}).get('tensorflow')} built for CUDA "
           f"{build.get('cuda_version')}/cuDNN {build.get('cudnn_version')} and {archs}{jit}, "
           f"lists {len(probe.get('physical_gpus') or [])} GPU(s); TF32 "
           f"{ {True: 'on', False: 'off'}.get(probe.get('tf32_enabled_by_default'), 'unknown')}"
           " by default"
           f"{', used by float32 matmuls' if tf32.get('tf32_used') else ''}")  # fmt: skip
    # what the probe's log says about the libraries, when it failed to use them
    log = next((p for p in report["processes"] if p["group"] == "probe"), {})
    libraries = [ln for ln in log.get("notable", []) if LIBRARY_LINE.search(ln)][:3]
    why = f" (log: {' | '.join(libraries)})" if libraries else ""
    if not probe:
        return "failed", key, f"the probe reported nothing, worker {log.get('exit')}{why}"
    if not probe.get("ok"):
        return "failed", key, f"{probe.get('error')}{why}"
    if not checks:
        return "failed", key, f"{probe.get('checks')}{why}"
    bad = [f"{name}: {c.get('error')}" for name, c in checks.items()
           if name in ("matmul_tf32", "conv_cudnn") and not c.get("ok")]  # fmt: skip
    return ("failed" if bad else "ok"), key, (bad[0] + why if bad else None)


def _key_b(report: dict) -> tuple[str, str, str | None]:
    checks = (report.get("probe") or {}).get("checks")
    if not isinstance(checks, dict):
        return "failed", "no XLA check ran", str(checks)
    xla, zero = checks.get("xla", {}), checks.get("xla_zero_size", {})
    if not xla.get("ok"):
        return "failed", "XLA failed", xla.get("error")
    key = (f"on {xla['placed_on'].split('/')[-1]}: first call {xla['first_call_s']} s, "
           f"{xla['call_s'] * 1e3:.2f} ms a call, error vs eager "
           f"{xla['relative_error_vs_eager']:.0e}; empty batch "
           f"{'ok' if zero.get('ok') else 'FAILED'}")  # fmt: skip
    return ("ok" if zero.get("ok") else "failed"), key, zero.get("error")


def _learns(run: dict) -> bool | None:
    """Whether a run's validation accuracy is above `LEARNING` times chance (None: unknown)."""
    accuracy, classes = run.get("val_accuracy"), run.get("classes")
    if accuracy is None or not classes:
        return None
    return accuracy > LEARNING / classes


def _accuracy(run: dict) -> str:
    chance = f" (chance {1 / run['classes']:.2f})" if run.get("classes") else ""
    return f"val {_fmt(run.get('val_accuracy'), '.2f')}{chance}"


def _key_n(by_id: dict) -> str:
    cases = by_id.get("cases", {}).get("cases") or {}
    return "; ".join(f"{case}: {value['max_relative_difference']:.1e}"
                     f"{'' if value['equal'] or not value['must_equal'] else ' (ABOVE 1e-4)'}"
                     for case, value in cases.items()) or by_id.get("cases", {}).get(
                         "status", "-")  # fmt: skip


def _key_s(by_id: dict) -> str:
    run = by_id.get("overflow", {})
    if run.get("status") != "ok":
        return run.get("status", "-")
    return (f"{run['compute_dtype']} on {len(run['devices'])} devices: weights "
            f"{'finite' if run['weights_finite'] else 'NON-FINITE'}, step "
            f"{'skipped' if run['step_skipped'] else 'APPLIED'}, loss scale "
            f"{run['loss_scale_before']:g} -> {run['loss_scale_after']:g}")  # fmt: skip


def _key_runs(section: str, runs: list[dict], report: dict) -> str:
    by_id = {r["id"].split(".", 1)[1]: r for r in runs}
    if section == "n":
        return _key_n(by_id)
    if section == "s":
        return _key_s(by_id)

    def rate(name: str) -> str:
        r = by_id.get(name, {})
        return _fmt(r.get("images_per_sec")) if r.get("status") == "ok" else r.get("status", "-")

    def ratio(a: str, b: str) -> str:
        x, y = (by_id.get(n, {}).get("images_per_sec") for n in (a, b))
        return f" ({y / x:.2f}×)" if x and y else ""

    def learned(name: str) -> str:
        r = by_id.get(name, {})
        return f"{rate(name)} img/s {_accuracy(r)}" if r.get("status") == "ok" else rate(name)

    if section == "c":
        parts = []
        for name, r in by_id.items():
            if r.get("status") == "ok":
                precision = r.get("precision") or r.get("model_dtype_policy")
                finite = "finite" if r.get("weights_finite") else "NON-FINITE"
                parts.append(f"{name} {_accuracy(r)} {finite} {precision}")
            else:
                parts.append(f"{name} {r.get('status')}")
        geo = next((r for r in runs if r.get("status") == "ok"), {})
        if "last_batch" in geo:
            empty = "" if geo.get("empty_replica") else " (NO empty replica)"
            parts.append(f"last batch {geo['last_batch']} on {geo.get('replicas')} replicas{empty}")
        return "; ".join(parts)
    if section == "g":
        return (f"recipe {learned('recipe')}, mdtrain {learned('mdtrain')}"
                f"{ratio('recipe', 'mdtrain')}; {report.get('two_devices')}")  # fmt: skip
    if section == "f":
        return f"1: {rate('one')}, 2: {rate('all')} img/s{ratio('one', 'all')}; " + str(
            report.get("two_devices")
        )
    if section in "ed":
        return "; ".join(f"{name} {learned(name)}" for name in by_id)
    if section == "i":
        return "; ".join(f"{name}: {'runs' if r.get('status') == 'ok' else r.get('error')}"
                         for name, r in by_id.items())  # fmt: skip
    return ""


def _key_h(h: dict) -> str:
    ours, theirs = h.get("mdtrain_utilization"), h.get("nvidia_smi_utilization")
    diff = h.get("abs_difference")
    if not ours or not theirs:
        return (f"readings {h.get('samples')}; NVML sees a GPU: {h.get('nvml_has_gpu')}; "
                f"nvidia-smi: {h.get('nvidia_smi_error')}")  # fmt: skip
    return (f"NVML median {ours['median']:.0f}% vs nvidia-smi {theirs['median']:.0f}%, "
            f"{h['pairs']} pairs, |difference| median {diff['median']:.1f}")  # fmt: skip


def _judge(section: str, runs: list[dict], report: dict) -> tuple[str, str | None]:
    """A section's status from its runs, and what the runs' own figures fail, if anything."""
    status, error = _section_status(runs), _first_error(runs)
    if status != "ok":
        return status, error
    failed = [r for r in runs if r.get("passed") is False]  # n and s judge their numbers
    if failed:
        return "failed", f"{failed[0]['id']}: the figures miss their bound"
    if section == "g" and not report["dry_run"]:  # a comparison holds where both sides learn
        flat = [r["id"] for r in runs if _learns(r) is False]
        if flat:
            return "failed", f"{', '.join(flat)}: at chance, the comparison says nothing"
    return status, error


def _pytest_entry(report: dict) -> dict:
    result = report.get("pytest") or {"status": "skipped", "error": "did not run"}
    counts = result.get("counts") or {}
    key = ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "no result"
    return {"status": result["status"], "key": key, "error": result.get("error"),
            "seconds": result.get("seconds")}  # fmt: skip


def sections(report: dict, chosen: str) -> dict:
    """Every section's status, key figure, error and seconds, from the runs and the probe."""
    out = {}
    for sid, title in SECTIONS.items():
        entry: dict = {"title": title}
        if sid not in chosen:
            entry.update(status="skipped", key="not chosen (--sections)")
        elif sid in "ab":
            status, key, error = (_key_a if sid == "a" else _key_b)(report)
            seconds = sum(p["seconds"] for p in report["processes"] if p["group"] == "probe")
            entry.update(status=status, key=key, error=error, seconds=seconds)
        elif sid == "h":
            h = report.get("h") or {"status": "skipped", "error": "no throughput run was made"}
            entry.update(status=h["status"], key=_key_h(h), error=h.get("error"))
        elif sid == "p":
            entry.update(_pytest_entry(report))
        else:
            runs = [{**v, "id": k} for k, v in report["runs"].items() if k.startswith(sid + ".")]
            status, error = _judge(sid, runs, report)
            entry.update(
                status=status,
                key=_key_runs(sid, runs, report),
                error=error,
                seconds=round(sum(r.get("seconds") or 0 for r in runs), 1),
            )
        out[sid] = entry
    return out


def _bars(report: dict) -> dict[str, float]:
    """Images/s of every timed run in order of value, labelled with section, variant, replicas."""
    rank = {s: i for i, s in enumerate(SECTIONS)}
    bars = {}
    for rid in sorted(report["labels"], key=lambda rid: rank[rid[0]]):  # stable: plan order
        r = report["runs"].get(rid, {})
        # i's single epochs include tracing: no rate to compare
        if r.get("status") != "ok" or not r.get("images_per_sec") or rid[0] in "ie":
            continue
        if r.get("same_run_as"):  # drawn once, under its own run
            continue
        n = r.get("replicas")
        label = f"{rid[0]}: {report['labels'].get(rid, rid)}"
        bars[f"{label} ({n} replica{'s' if n != 1 else ''})"] = r["images_per_sec"]
    return bars


def verdict_table(report: dict) -> str:
    width = max(len(t) for t in SECTIONS.values()) + 3
    lines = [report["headline"], f"{'section':<{width}} {'status':<8} {'seconds':>7}  key figure"]
    for sid, s in report["sections"].items():
        seconds = _fmt(s.get("seconds"), ".0f")
        lines.append(f"{sid} {s['title']:<{width - 2}} {s['status']:<8} {seconds:>7}  {s['key']}")
        if s.get("error") and s["status"] != "ok":
            lines.append(f"{'':<{width + 18}}{s['error'][:200]}")
    return "\n".join(lines)


def headline(report: dict) -> str:
    if report["dry_run"]:
        return ("GPU check DRY RUN on 2 CPU replicas (tiny sizes; no GPU figures); commit "
                f"{(report.get('source') or {}).get('commit', '?')[:12]}")  # fmt: skip
    nvml, probe = report["nvml"], report.get("probe") or {}
    names = [g.get("name") for g in nvml.get("gpus", [])]
    layouts = report["layouts"]
    layout = layouts.get("correctness") or layouts.get("throughput") or layouts.get("probe") or {}
    source = report.get("source") or {}
    dirty = " (dirty tree)" if source.get("dirty") else ""
    return (f"GPU check: {report['gpu']} x{len(names)}, driver {nvml.get('driver')}, TensorFlow "
            f"{probe.get('versions', {}).get('tensorflow')}, layout: "
            f"{layout.get('split') or layout.get('devices')}; commit "
            f"{source.get('commit', '?')[:12]}{dirty}")  # fmt: skip


# ------------------------------------------------------------------ main
def source_state() -> dict:
    """The commit this check runs, and whether tracked files differ from it (a dirty tree)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        commit, changed = git("rev-parse", "HEAD"), git("status", "--porcelain", "-uno")
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"commit": None, "error": f"{type(e).__name__}: {e}"}
    return {"commit": commit or None, "dirty": bool(changed),
            "changed": changed.splitlines()[:20]}  # fmt: skip


# ------------------------------------------------------------------ p: pytest -m gpu
def _junit_cases(path: Path) -> list[dict]:
    """Each test case of a JUnit XML report: its name, outcome, seconds and message."""
    import xml.etree.ElementTree as ElementTree

    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        found = [child for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            found[0].tag if found else "", "passed"
        )
        message = (found[0].get("message") or found[0].text or "")[:1000] if found else None
        cases.append({"test": case.get("name"), "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message})  # fmt: skip
    return cases


def run_pytest(clock: Clock, work: Path, estimate_s: float) -> dict:
    """`pytest -m gpu tests/test_gpu.py` in a subprocess: every test's outcome and message."""
    if clock.left() < estimate_s:
        return {"status": "skipped", "error": f"time budget: {clock.left():.0f} s left"}
    report = work / "pytest-gpu.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q",
               "-p", "no:cacheprovider", f"--junitxml={report}"]  # fmt: skip
    start = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                              env=_worker_env(), timeout=max(clock.left(), 1))  # fmt: skip
        exit_line = f"exit {done.returncode}"
    except subprocess.TimeoutExpired:
        exit_line = "timeout"
    result = {"command": " ".join(["python", *command[1:-1]]), "exit": exit_line,
              "seconds": round(time.time() - start, 1)}  # fmt: skip
    tests = _junit_cases(report) if report.exists() else []
    counts: dict[str, int] = {}
    for test in tests:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    bad = [t for t in tests if t["outcome"] in ("failed", "error")]
    result.update(tests=tests, counts=counts, status="failed" if bad or not tests else "ok",
                  error=f"{bad[0]['test']}: {bad[0]['message']}" if bad else
                  None if tests else f"no report ({exit_line})")  # fmt: skip
    say(clock, f"pytest -m gpu: {counts or exit_line}")
    return result


def machine() -> dict:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    return {"cpu_count": len(os.sched_getaffinity(0)), "cpu_model": model,
            "platform": platform.platform(terse=True),
            "python": platform.python_version()}  # fmt: skip


def write_outputs(report: dict, out: Path, final: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    if final:
        from _common import benchmark_bars

        from mdtrain_course.plots.common import DPI

        bars = _bars(report) or {"no training run finished": 0.0}
        title = f"GPU check, {report['gpu']}: images/s, median of the timed epochs"
        benchmark_bars(bars, title=title, order="given").savefig(out / "gpu.png", dpi=DPI)


def no_gpu_line(nvml: dict, smi: dict, tf_says: str) -> str:
    return (f"gpu.py: no NVIDIA GPU on this machine (NVML: {nvml.get('error') or 'no GPU'}; "
            f"nvidia-smi: {smi.get('error') or 'no GPU'}; TensorFlow: {tf_says}): "
            "nothing to check")  # fmt: skip


def _no_gpu(nvml: dict, smi: dict) -> bool:
    """True (after printing the one line) when neither NVML, nvidia-smi nor TensorFlow sees one."""
    if nvml.get("count") or smi.get("rows"):
        return False
    tf_says = tensorflow_gpus()
    if tf_says[:1].isdigit() and tf_says != "0":
        return False
    print(no_gpu_line(nvml, smi, tf_says), flush=True)
    return True


def _prepare(args, clock: Clock, nvml: dict, smi: dict) -> tuple[dict, list, dict, dict]:
    """The report's first fields, the groups of chosen runs, the datasets and the workers' base."""
    dry = args.dry_run_on_cpu
    sizes = DRY_SIZES if dry else GPU_SIZES
    physical = max(nvml.get("count") or 0, len(smi.get("rows") or []), 1)
    replicas = 2 if dry or physical == 1 else physical
    two = DRY_LABEL if dry else SPLIT_LABEL if physical == 1 else f"{physical} GPUs, NCCL"
    work = Path(args.work or tempfile.mkdtemp(prefix="mdtrain-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    data, groups = make_plan(sizes, replicas, work, dry, two)
    for group in groups:  # the chosen sections; d's model run is c's default run when c runs
        group.runs = [r for r in group.runs if r.section in args.sections
                      and not (r.id == "d.model" and "c" in args.sections)]  # fmt: skip
        group.probe = group.probe and bool(set("ab") & set(args.sections))
    groups = [g for g in groups if g.runs or g.probe]
    set_deadlines(groups, clock.end, sizes.start_s)
    memory = (nvml.get("gpus") or [{}])[0].get("memory_total_mib")
    base = {"dry_run": dry, "work": str(work), "hard_end": clock.end,
            "memory_limit_mb": int(memory * 0.42) if isinstance(memory, int) else 8192}  # fmt: skip
    gpu_name = "CPU (dry run)" if dry else str((nvml.get("gpus") or [{}])[0].get("name"))
    report: dict = {
        "gpu": gpu_name, "dry_run": dry, "command": " ".join(["python", *sys.argv]),
        "source": source_state(), "two_devices": two,
        "pytest_estimate_s": sizes.estimate_s["pytest"],
        "started": dt.datetime.now().isoformat(timespec="seconds"), "budget_s": args.budget_s,
        "machine": machine(), "nvml": nvml, "nvidia_smi": smi,
        "environment": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "XLA_FLAGS",
                        "LD_LIBRARY_PATH", "TF_GPU_ALLOCATOR", "CUDA_DEVICE_ORDER",
                        "CUDA_MODULE_LOADING", "CUDA_CACHE_MAXSIZE", "PATH")},
        "replicas": replicas, "datasets": {}, "layouts": {}, "probe": None, "runs": {},
        "labels": {r.id: r.label for g in groups for r in g.runs},
        "argv": {r.id: r.argv or r.extra for g in groups for r in g.runs},
        "processes": [],
    }  # fmt: skip
    say(clock, f"{gpu_name}: {0 if dry else physical} GPU(s), {replicas} replicas; "
        f"budget {args.budget_s:.0f} s; work folder {work}")  # fmt: skip
    return report, groups, data, base


def _execute(args, clock: Clock, report: dict, groups: list, data: dict, base: dict) -> None:
    """Makes the datasets (beside the probe), then runs each group in order: `pytest -m gpu`
    after the correctness runs, h beside the throughput runs."""
    work = Path(base["work"])
    synth = start_data(data, clock, work) if any(g.runs for g in groups) else {}
    bad: list[str] = []
    for group in groups:
        if group.name == "throughput" and "p" in args.sections:
            report["pytest"] = run_pytest(clock, work, report["pytest_estimate_s"])
        if group.runs and synth:
            report["datasets"] = wait_data(synth, clock)
            synth, bad = {}, [k for k, v in report["datasets"].items() if v["error"]]
        if group.runs and bad:
            for run in group.runs:
                report["runs"][run.id] = {"status": "failed", "error": f"data synth: {bad}"}
            continue
        pair = None
        if group.name == "throughput" and "h" in args.sections:
            try:
                pair = UtilisationPair(work)
            except Exception as e:  # noqa: BLE001 - h fails, the runs go on
                report["h"] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        with pair or contextlib.nullcontext():
            run_group(group, base, clock, work, report)
        if pair is not None:
            report["h"] = pair.result(base["dry_run"])
        write_outputs(report, args.out, final=False)
    if "p" in args.sections and "pytest" not in report:  # no throughput group was chosen
        report["pytest"] = run_pytest(clock, work, report["pytest_estimate_s"])


def _share_default_run(report: dict, chosen: str) -> None:
    """d's `--augment-in model` run is c's default run (auto augments in the model)."""
    if "c" not in chosen or "d" not in chosen:
        return
    default = report["runs"].get("c.default", {"status": "skipped", "error": "c did not run"})
    report["labels"]["d.model"] = "--augment-in model (c's default run)"
    if default.get("status") == "ok" and default.get("augment_in") != "model":
        default = {"status": "failed", "error": f"c's default augmented in "
                   f"{default.get('augment_in')!r}, not in the model"}  # fmt: skip
    report["runs"]["d.model"] = {**default, "same_run_as": "c.default"}


def check(args) -> dict | None:
    """The whole check; None when there is no GPU (after printing one line)."""
    clock = Clock(args.budget_s)
    nvml, smi = nvml_info(), smi_info()
    if not args.dry_run_on_cpu and _no_gpu(nvml, smi):
        return None
    report, groups, data, base = _prepare(args, clock, nvml, smi)
    try:
        _execute(args, clock, report, groups, data, base)
    except Exception:  # noqa: BLE001 - a bug here must not cost the figures measured so far
        report["check_error"] = traceback.format_exc()[-3000:]
        say(clock, f"gpu.py failed: {report['check_error'].strip().splitlines()[-1]}")
    finally:
        if not args.work:
            shutil.rmtree(base["work"], ignore_errors=True)
    report["seconds"] = round(clock.elapsed(), 1)
    try:
        _share_default_run(report, args.sections)
        report["sections"] = sections(report, args.sections)
        report["headline"] = headline(report)
    except Exception as e:  # noqa: BLE001 - the figures are kept whatever the summary does
        report["summary_error"] = f"{type(e).__name__}: {e}"
        report.setdefault("sections", {})
        report.setdefault("headline", f"GPU check: {report['gpu']} (summary failed: {e})")
    try:
        write_outputs(report, args.out, final=True)
    except Exception as e:  # noqa: BLE001 - the JSON is written first; the chart may fail
        report["chart_error"] = f"{type(e).__name__}: {e}"
        write_outputs(report, args.out, final=False)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        help="folder for gpu.json and gpu.png (default: benchmarks/; a "
                        "temporary folder with --dry-run-on-cpu)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="wall-clock budget in seconds; sections that no longer fit are "
                        "skipped (default: 480)")  # fmt: skip
    parser.add_argument(
        "--dry-run-on-cpu",
        action="store_true",
        help="run every section's code path on 2 CPU replicas with tiny sizes (never "
        "writes the committed record unless --out says so)",
    )
    parser.add_argument(
        "--sections",
        default="".join(SECTIONS),
        help=f"the sections to run (default: {''.join(SECTIONS)})",
    )
    parser.add_argument("--work", help="folder for the datasets and logs, kept (default: a "
                        "temporary folder, removed)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    unknown = set(args.sections) - set(SECTIONS)
    if unknown or args.budget_s <= OUTPUT_RESERVE_S:
        from mdtrain.errors import UsageError

        what = f"--sections {args.sections}" if unknown else f"--budget-s {args.budget_s:g}"
        raise UsageError(f"{what}: choose from {''.join(SECTIONS)}; a budget above "
                         f"{OUTPUT_RESERVE_S:.0f} s")  # fmt: skip
    if args.out is None:  # a dry run never overwrites the committed record by default
        args.out = (
            Path(tempfile.mkdtemp(prefix="mdtrain-gpu-dry-")) if args.dry_run_on_cpu else HERE
        )
    report = check(args)
    if report is None:
        if args.json:
            print(json.dumps({"gpu": None}))
        return
    print(verdict_table(report))
    print(f"wrote {args.out / 'gpu.json'} and {args.out / 'gpu.png'} ({report['seconds']} s)")
    if args.json:
        print(json.dumps(report, default=str))


if __name__ == "__main__":
    from _common import run_main

    run_main(main)
