"""The GPU check (`benchmarks/gpu.py`) and what a real GPU must do.

- Here, without a GPU: the check says so in one line and exits 0; its plan
  leaves a replica empty, runs correctness first and labels a split card's
  figures; figures that miss their bound fail their section; a worker
  that dies costs its run only (`tests/test_benchmarks.py` runs the whole check
  on CPU replicas, `--dry-run-on-cpu`).
- `gpu`-marked, where NVML sees an NVIDIA GPU (skipped elsewhere): TensorFlow
  lists it; two logical GPUs train exactly like one with TF32 off (an empty
  replica slice included); mixed precision is bfloat16 from compute capability
  8.0 and float16 with loss scaling below; a short `mdtrain train` runs on the
  GPUs. Each device layout runs in its own subprocess (under a minute and a half
  in all on an H100).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # gpu.py imports gpu_worker and _common by name


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


gpu = _script("gpu")


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _nvml_gpus() -> list[dict]:
    return gpu.nvml_info().get("gpus") or []


# --- without a GPU -------------------------------------------------------------------------


def test_without_a_gpu_the_check_says_so_in_one_line():
    if _nvml_gpus():
        pytest.skip("this machine has a GPU: the check would run in full")
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "gpu.py")], capture_output=True,
                          text=True, timeout=300, env=_env(), cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu.py: no NVIDIA GPU"), proc.stdout


@pytest.mark.parametrize("replicas", [2, 3, 4, 8])
def test_the_small_dataset_ends_with_a_batch_that_leaves_a_replica_empty(replicas):
    batch = 64 * replicas
    classes, per_class = gpu._small_geometry(2300, batch, replicas)
    last = classes * per_class % batch
    assert 0 < last < replicas and 2 <= classes <= 5 and classes * per_class >= 2000


def test_correctness_runs_first_and_every_two_device_figure_names_its_layout():
    _, groups = gpu.make_plan(gpu.GPU_SIZES, 2, Path("/tmp/x"), dry_run=False, two=gpu.SPLIT_LABEL)
    order = [r.section for g in groups for r in g.runs]
    assert order == sorted(order, key=list(gpu.SECTIONS).index)  # run in the order of value
    assert order.index("n") < order.index("s") < order.index("c") < order.index("g")
    assert [g.name for g in groups] == ["probe", "correctness", "throughput"]
    labels = {r.id: r.label for g in groups for r in g.runs}
    for rid in ("n.cases", "s.overflow", "g.recipe", "g.mdtrain", "f.all"):
        assert gpu.SPLIT_LABEL in labels[rid], rid
    assert {f"e.{norm}" for norm in gpu.BATCH_NORMS} <= set(labels)
    gpu.set_deadlines(groups, end=1000.0, start_s=20.0)
    assert all(r.deadline == 1000.0 for g in groups for r in g.runs)  # nothing held back


def test_a_less_valuable_run_gives_way_to_a_more_valuable_one_in_a_later_worker():
    early = gpu.Group("early", [gpu.Run("f.one", "f", "", "mdtrain", 25.0)])
    late = gpu.Group("late", [gpu.Run("n.cases", "n", "", "numerics", 45.0)])
    gpu.set_deadlines([early, late], end=1000.0, start_s=20.0)
    assert early.runs[0].deadline == 1000.0 - 20.0 - 45.0
    assert late.runs[0].deadline == 1000.0


def test_figures_that_miss_their_bound_or_compare_sides_at_chance_fail_their_section():
    report = {"dry_run": False}
    above = [{"id": "n.cases", "status": "ok", "passed": False}]
    assert gpu._judge("n", above, report) == ("failed", "n.cases: the figures miss their bound")
    flat = [{"id": "g.recipe", "status": "ok", "val_accuracy": 0.21, "classes": 5},
            {"id": "g.mdtrain", "status": "ok", "val_accuracy": 0.9, "classes": 5}]  # fmt: skip
    status, error = gpu._judge("g", flat, report)
    assert status == "failed" and error.startswith("g.recipe: at chance")
    assert gpu._judge("g", flat, {"dry_run": True}) == ("ok", None)  # tiny data: not judged
    flat[0]["val_accuracy"] = 0.8
    assert gpu._judge("g", flat, report) == ("ok", None)


def test_pytest_outcomes_are_read_test_by_test(tmp_path):
    xml = tmp_path / "report.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_gpu" name="test_b" time="2.0">'
        '<failure message="assert 0.002 &lt; 0.0001">long text</failure></testcase>'
        '<testcase classname="tests.test_gpu" name="test_c" time="0">'
        '<skipped message="no NVIDIA GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    cases = gpu._junit_cases(xml)
    assert [(c["test"], c["outcome"]) for c in cases] == [
        ("test_a", "passed"), ("test_b", "failed"), ("test_c", "skipped")
    ]  # fmt: skip
    assert cases[1]["message"] == "assert 0.002 < 0.0001" and cases[0]["seconds"] == 1.5


def test_a_worker_that_dies_costs_only_the_run_it_was_in(monkeypatch, tmp_path):
    runs = [gpu.Run(f"c.{n}", "c", n, "mdtrain", 1.0) for n in ("one", "two", "three")]
    scripts = [  # what each worker prints before it ends: the second dies in run "two"
        [("start", "c.one"), ("result", "c.one"), ("start", "c.two")],
        [("start", "c.three"), ("result", "c.three")],
    ]
    launched = []

    def fake_launch(config, kill_at, work, on_event):
        launched.append([r["id"] for r in config["runs"]])
        for kind, rid in scripts[len(launched) - 1]:
            on_event({"event": kind, "id": rid, **({"status": "ok"} if kind == "result" else {})})
        dies = len(launched) == 1
        return {"group": "small", "exit": "killed by SIGSEGV" if dies else "exit 0",
                "seconds": 1.0, "notable": ["Fatal Python error: Segmentation fault"] if dies
                else [], "tail": []}  # fmt: skip

    monkeypatch.setattr(gpu, "launch", fake_launch)
    report = {"runs": {}, "processes": [], "layouts": {}}
    clock = gpu.Clock(600)
    gpu.run_group(gpu.Group("small", runs), {}, clock, tmp_path, report)
    assert launched == [["c.one", "c.two", "c.three"], ["c.three"]]
    got = report["runs"]
    assert got["c.one"]["status"] == got["c.three"]["status"] == "ok"
    assert got["c.two"]["status"] == "crashed" and "SIGSEGV" in got["c.two"]["error"]
    assert "Segmentation fault" in got["c.two"]["error"]
    section = gpu.sections({**report, "labels": {}}, "c")["c"]
    assert section["status"] == "failed" and section["error"].startswith("c.two: worker killed")


def test_an_error_is_recorded_by_the_line_that_says_what_failed():
    from gpu_worker import error_text

    class UnimplementedError(Exception):  # TensorFlow's graph errors, as they print
        pass

    node = "gradient_tape/lite0/dw/DepthwiseConv2dNativeBackpropFilter"
    message = (
        f"Graph execution error:\n\nDetected at node {node} defined at (most recent call last):\n"
        '  File "/x/gpu_worker.py", line 400, in <module>\n\n'
        '  File "/x/keras/src/trainers/trainer.py", line 100, in fit\n\n'
        "A deterministic GPU implementation of DepthwiseConv2dNativeBackpropFilter is not "
        f"currently available.\n\t [[{{{{node {node}}}}}]] [Op:__inference_step_1234]"
    )
    line, detail = error_text(UnimplementedError(message))
    assert line.startswith("UnimplementedError: A deterministic GPU implementation of Depthwise")
    assert f"[[{{{{node {node}}}}}]]" in line and detail == message
    assert error_text(ValueError("bad\nmore"))[0] == "ValueError: bad"


def test_nvml_answers_become_the_report_of_the_gpus(monkeypatch):
    class NVMLError(Exception):
        pass

    def unsupported(handle):
        raise NVMLError("Not Supported")

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"580.159.04",  # bytes from old releases
        nvmlSystemGetCudaDriverVersion_v2=lambda: 13000,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=81559 * 2**20),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId="00000000:1B:00.0"),
        nvmlDeviceGetMigMode=unsupported, nvmlDeviceGetPowerManagementLimit=lambda h: 700000,
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = gpu.nvml_info()
    assert info["driver"] == "580.159.04" and info["cuda_driver"] == "13.0"
    assert info["count"] == 1
    assert info["gpus"][0] == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
        "memory_total_mib": 81559, "pci_bus_id": "00000000:1B:00.0",
        "mig_mode": "error: Not Supported", "power_limit_mw": 700000,
    }  # fmt: skip


def test_nvml_and_nvidia_smi_readings_are_paired_by_time(tmp_path):
    from mdtrain.monitor import DeviceSample, Sample

    pair = gpu.UtilisationPair(tmp_path)
    start = 1_800_000_000.0
    ours = [Sample(start + 0.25 * k, (DeviceSample("GPU 0 (H100)", "gpu", 40.0 + k),
                                      DeviceSample("CPU", "cpu", 10.0)))
            for k in range(20)]  # fmt: skip
    pair.sampler.history = lambda: ours
    stamp = dt.datetime.fromtimestamp  # nvidia-smi writes local time
    pair.smi_text = (
        "".join(
            f"{stamp(start + 0.5 * k + 0.1):%Y/%m/%d %H:%M:%S.%f}, 0, {42.0 + 2 * k}\n"
            for k in range(10)
        )
        + "2026/11/28 02:03:29.123, 0, [N/A]\n"
    )
    got = pair.result(dry_run=False)
    assert got["status"] == "ok" and got["pairs"] == 10
    assert got["abs_difference"]["max"] == 2.0  # 42 + 2k beside 40 + 2k, 0.1 s apart
    assert got["mdtrain_utilization"]["n"] == 20 and got["nvidia_smi_utilization"]["n"] == 10
    pair.sampler.close()


def test_a_section_is_partial_when_the_budget_cut_some_of_its_runs():
    assert gpu._section_status([{"status": "ok"}, {"status": "skipped"}]) == "partial"
    assert gpu._section_status([{"status": "skipped"}]) == "skipped"
    assert gpu._section_status([{"status": "ok"}, {"status": "timeout"}]) == "failed"
    assert gpu._section_status([{"status": "ok"}, {"status": "ok"}]) == "ok"


@pytest.mark.slow
def test_a_gpu_that_tensorflow_cannot_use_is_reported_section_by_section(monkeypatch, tmp_path):
    # NVML sees an H100 but TensorFlow lists no GPU (CUDA libraries it cannot load): every
    # section says so, the report and chart are still written, and nothing trains on the CPU.
    h100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
            "memory_total_mib": 81559}  # fmt: skip
    monkeypatch.setattr(gpu, "nvml_info", lambda: {"count": 1, "driver": "580", "gpus": [h100]})
    monkeypatch.setattr(gpu, "smi_info", lambda: {"error": "not found"})
    monkeypatch.setattr(gpu, "GPU_SIZES", gpu.DRY_SIZES)  # tiny datasets
    args = types.SimpleNamespace(budget_s=600.0, dry_run_on_cpu=False, sections="abnscdfh",
                                 work=None, out=tmp_path)  # fmt: skip
    report = gpu.check(args)
    assert (tmp_path / "gpu.json").exists() and (tmp_path / "gpu.png").exists()
    assert report["gpu"] == "NVIDIA H100 80GB HBM3" and report["replicas"] == 2
    sections = report["sections"]
    assert sections["a"]["status"] == "failed"
    assert "lists 0 GPU(s)" in sections["a"]["key"]
    assert "TensorFlow lists no GPU" in sections["a"]["error"]
    for sid in "nscdf":
        assert sections[sid]["status"] == "skipped", sections[sid]
        assert "TensorFlow lists no GPU" in sections[sid]["error"]
    assert sections["h"]["status"] == "failed"  # no reading from either side
    assert "GPU check: NVIDIA H100 80GB HBM3 x1" in gpu.verdict_table(report)


# --- on a real GPU -------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not _nvml_gpus(), reason="no NVIDIA GPU (NVML sees none)")

_N_VS_1 = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])  # tests/, for the harness
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) == 1:  # one card as two logical GPUs
        config = tf.config.LogicalDeviceConfiguration(memory_limit=2048)
        tf.config.set_logical_device_configuration(gpus[0], [config, config])
    else:
        for g in gpus:
            tf.config.experimental.set_memory_growth(g, True)
    tf.config.experimental.enable_tensor_float_32_execution(False)
    import numerics_harness as nm
    from mdtrain.compat import fresh_collective_keys

    one = tf.distribute.OneDeviceStrategy("/gpu:0")
    fresh_collective_keys()
    # NCCL refuses two ranks on one card: reduce through one device (any layout allows it)
    two = tf.distribute.MirroredStrategy(
        ["/gpu:0", "/gpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    out = {}
    for n, gb in ((31, 16), (17, 16)):  # last batches 15 (8 + 7) and 1 (1 + an empty slice)
        ds = nm.fixed_dataset(n, gb)
        ref = nm.train_weights(one, ds, epochs=1, model="small-cnn")
        got = nm.train_weights(two, ds, epochs=1, model="small-cnn")
        out[f"{n}/{gb}"] = nm.max_relative_difference(got, ref)
    print("RESULT " + json.dumps(out))
    """
)


def _train(data: Path, *options: str) -> tuple[list[str], dict]:
    """`mdtrain train --data DATA OPTIONS --json` in a subprocess: its lines and summary."""
    proc = subprocess.run(
        [sys.executable, "-m", "mdtrain", "train", "--data", str(data), "--monitor", "none",
         "--json", *options],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    return lines, json.loads(lines[-1])


@pytest.mark.gpu
@needs_gpu
def test_tensorflow_lists_the_gpu():
    import tensorflow as tf

    assert tf.config.list_physical_devices("GPU"), "NVML sees a GPU, TensorFlow lists none"


@pytest.mark.gpu
@needs_gpu
def test_two_logical_gpus_train_like_one_with_tf32_off():
    proc = subprocess.run([sys.executable, "-c", _N_VS_1, str(REPO / "tests")],
                          capture_output=True, text=True, timeout=300, env=_env())  # fmt: skip
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and results, proc.stderr[-3000:]
    for case, difference in json.loads(results[-1][len("RESULT ") :]).items():
        assert difference < 1e-4, (case, difference)  # tests/test_numerics.py's EXACT


@pytest.mark.gpu
@needs_gpu
def test_mixed_precision_is_bfloat16_from_compute_capability_8(tiny_dataset):
    capabilities = {float(g["compute_capability"]) for g in _nvml_gpus()}
    if min(capabilities) < 8 <= max(capabilities):
        pytest.skip(f"GPUs of both kinds here: {sorted(capabilities)}")
    lines, summary = _train(tiny_dataset, "--epochs", "1", "--mixed-precision")
    said = [ln for ln in lines if ln.startswith("mixed precision: ")]
    if min(capabilities) >= 8:
        assert summary["precision"] == "mixed_bfloat16"
        assert said and said[0].startswith("mixed precision: bfloat16 ("), lines
    else:
        assert summary["precision"] == "mixed_float16"
        assert said and said[0].startswith("mixed precision: float16 with loss scaling ("), lines
    assert len(said) == 1 and "compute capability" in said[0]


@pytest.mark.gpu
@needs_gpu
def test_mdtrain_trains_on_the_gpus(tiny_dataset):
    from mdtrain.gpus import visible_gpus

    lines, summary = _train(tiny_dataset, "--epochs", "2")
    assert summary["replicas"] == len(visible_gpus())
    assert summary["augment_in"] == "model"  # the fused warp, compiled by XLA on the GPU
    assert len(summary["history"]) == 2
    assert all(math.isfinite(row["loss"]) for row in summary["history"])
    assert any(ln.startswith("strategy MirroredStrategy") for ln in lines), lines
