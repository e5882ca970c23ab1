"""Tests for mdtrain.gpus: counting GPUs without TensorFlow, one GPU set per worker.

The GPU count comes from a fake `nvidia-smi` on PATH (a real process printing
what the real one prints on Kaggle's 2×T4 and a MIG machine) or a fake `pynvml`.
"""

import stat
import sys
import types
from pathlib import Path

import pytest

from mdtrain.errors import UsageError
from mdtrain.gpus import assign_gpus, visible_gpus, worker_devices

T4X2 = """GPU 0: Tesla T4 (UUID: GPU-2c1d6d4e-8f33-1a2b-9c3d-4e5f6a7b8c9d)
GPU 1: Tesla T4 (UUID: GPU-7a8b9c0d-1e2f-3a4b-5c6d-7e8f9a0b1c2d)
"""
MIG = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-11111111-2222-3333-4444-555555555555)
  MIG 3g.20gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)
  MIG 3g.20gb     Device  1: (UUID: MIG-ffffffff-0000-1111-2222-333333333333)
"""


def fake_nvidia_smi(folder: Path, output: str, exit_code: int = 0) -> str:
    """Writes an executable `nvidia-smi` into `folder`; returns a PATH holding only it."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nassert sys.argv[1:] == ['-L'], sys.argv\n"
        f"print({output!r}, end='')\nsys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(folder)


@pytest.fixture
def no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_cuda_visible_devices_is_the_pool():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-2c1d,GPU-7a8b"}) == ["GPU-2c1d", "GPU-7a8b"]


@pytest.mark.parametrize("spec", ["", "-1", "-1,0"])
def test_cuda_visible_devices_that_hide_every_gpu(spec):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": spec}) == []


def test_cuda_stops_at_the_first_invalid_entry():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,0"}) == ["1"]


def test_nvidia_smi_counts_kaggles_two_t4s(tmp_path, no_pynvml):
    assert visible_gpus({"PATH": fake_nvidia_smi(tmp_path, T4X2)}) == ["0", "1"]


def test_nvidia_smi_counts_gpus_not_mig_slices(tmp_path, no_pynvml):
    assert visible_gpus({"PATH": fake_nvidia_smi(tmp_path, MIG)}) == ["0"]


def test_nvidia_smi_without_a_driver_means_no_gpu(tmp_path, no_pynvml):
    path = fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate", 9)
    assert visible_gpus({"PATH": path}) == []


def test_nvml_when_nvidia_smi_is_not_on_path(tmp_path, monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetCount=lambda: 3,
        nvmlShutdown=lambda: calls.append("shutdown"),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert visible_gpus({"PATH": str(tmp_path)}) == ["0", "1", "2"]
    assert calls == ["init", "shutdown"]


def test_nvml_that_fails_means_no_gpu(tmp_path, monkeypatch):
    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    assert visible_gpus({"PATH": str(tmp_path)}) == []


def test_no_nvidia_smi_and_no_pynvml_means_no_gpu(tmp_path, no_pynvml):
    assert visible_gpus({"PATH": str(tmp_path)}) == []


@pytest.mark.parametrize(
    ("gpus", "workers", "per_worker", "expected"),
    [
        (["0", "1"], 2, None, ["0", "1"]),  # Kaggle 2×T4, 2 workers: one T4 each
        (["0", "1", "2", "3"], 2, None, ["0,1", "2,3"]),
        (["0", "1", "2", "3"], 3, None, ["0", "1", "2"]),  # G/N rounded down, one left over
        (["0", "1", "2", "3"], 2, 1, ["0", "1"]),
        (["4", "5", "6", "7"], 2, 2, ["4,5", "6,7"]),  # the launcher's own subset
        (["0", "1"], 2, 0, ["", ""]),  # --gpus-per-worker 0: the workers on the CPU
        ([], 3, 0, ["", "", ""]),
        ([], 2, None, None),  # a CPU machine: the environment is left alone
    ],
)
def test_assign_gpus(gpus, workers, per_worker, expected):
    assert assign_gpus(gpus, workers, per_worker) == expected


def test_every_gpu_goes_to_one_worker_at_most():
    shares = assign_gpus([str(i) for i in range(8)], 3, 2)
    used = [g for share in shares for g in share.split(",")]
    assert len(used) == len(set(used)) == 6


@pytest.mark.parametrize(
    ("gpus", "workers", "per_worker", "message"),
    [
        (["0"], 2, None, "2 workers but 1 GPU is visible: pass --workers 1 or fewer"),
        (["0", "1", "2"], 2, 2, "--gpus-per-worker 2 with 2 workers needs 4 GPUs but 3 GPUs"),
        ([], 1, 1, "needs 1 GPUs but no GPU is visible"),
        (["0"], 1, -1, "--gpus-per-worker -1: pass 0 or more"),
        (["0"], 0, None, "--workers 0"),
    ],
)
def test_too_few_gpus_is_one_line(gpus, workers, per_worker, message):
    with pytest.raises(UsageError) as caught:
        assign_gpus(gpus, workers, per_worker)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# --- the devices of N local workers: what notebook 05 runs on each machine ------------


@pytest.mark.parametrize(
    ("gpus", "per_worker", "visible", "replicas", "line"),
    [
        ([], 0, ("", ""), 2, "no GPU: 2 workers on the CPU"),  # a laptop, CI
        (["0"], 0, ("", ""), 2, "1 GPU for 2 workers: the workers run on the CPU"),  # Colab
        (["0", "1"], 1, ("0", "1"), 2, "2 GPUs: worker 0 on GPU 0; worker 1 on GPU 1"),  # Kaggle
        (["0", "1", "2", "3"], 2, ("0,1", "2,3"), 4, "worker 1 on GPUs 2,3"),
    ],
)
def test_worker_devices_on_0_1_2_and_4_gpus(gpus, per_worker, visible, replicas, line):
    devices = worker_devices(2, gpus)
    assert devices.gpus_per_worker == per_worker
    assert devices.cuda_visible_devices == visible
    assert devices.num_replicas == replicas
    assert line in devices.describe() and "\n" not in devices.describe()


def test_worker_devices_never_gives_a_gpu_to_two_workers():
    for n in range(1, 6):
        shares = [
            s for s in worker_devices(3, [str(i) for i in range(n)]).cuda_visible_devices if s
        ]
        used = [g for share in shares for g in share.split(",")]
        assert len(used) == len(set(used))


def test_worker_devices_counts_kaggles_gpus_without_tensorflow(tmp_path, no_pynvml, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path, T4X2))
    assert worker_devices(2).cuda_visible_devices == ("0", "1")


def test_worker_devices_refuses_no_workers():
    with pytest.raises(UsageError, match="--workers 0"):
        worker_devices(0, ["0"])
