"""Tests for mdtrain.gpus: counting GPUs without TensorFlow, one GPU set per worker.

The GPU count comes from a fake `pynvml` (NVML, what `nvidia-smi` reads too):
Kaggle's 2×T4, a machine whose driver fails, one without nvidia-ml-py.
"""

import sys
import types

import pytest

from mdtrain.errors import UsageError
from mdtrain.gpus import visible_gpus, worker_devices


def fake_nvml(monkeypatch, count: int) -> list[str]:
    """Makes `import pynvml` find `count` GPUs; returns the calls NVML receives."""
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetCount=lambda: count,
        nvmlShutdown=lambda: calls.append("shutdown"),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return calls


def test_cuda_visible_devices_is_the_pool(monkeypatch):
    fake_nvml(monkeypatch, 8)  # what the launcher's own CUDA_VISIBLE_DEVICES allows wins
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-2c1d,GPU-7a8b"}) == ["GPU-2c1d", "GPU-7a8b"]


@pytest.mark.parametrize("spec", ["", "-1", "-1,0"])
def test_cuda_visible_devices_that_hide_every_gpu(spec):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": spec}) == []


def test_cuda_stops_at_the_first_invalid_entry():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,0"}) == ["1"]


def test_nvml_counts_kaggles_two_t4s(monkeypatch):
    calls = fake_nvml(monkeypatch, 2)
    assert visible_gpus({}) == ["0", "1"]
    assert calls == ["init", "shutdown"]


def test_nvml_that_fails_means_no_gpu(monkeypatch):
    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    assert visible_gpus({}) == []


def test_no_pynvml_means_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert visible_gpus({}) == []


@pytest.mark.parametrize(
    ("gpus", "workers", "per_worker", "expected"),
    [
        (["0", "1"], 2, None, ("0", "1")),  # Kaggle 2×T4, 2 workers: one T4 each
        (["0", "1", "2", "3"], 2, None, ("0,1", "2,3")),
        (["0", "1", "2", "3"], 3, None, ("0", "1", "2")),  # G/N rounded down, one left over
        (["0", "1", "2", "3"], 2, 1, ("0", "1")),
        (["4", "5", "6", "7"], 2, 2, ("4,5", "6,7")),  # the launcher's own subset
        (["0", "1"], 2, 0, ("", "")),  # --gpus-per-worker 0: the workers on the CPU
        ([], 3, 0, ("", "", "")),
    ],
)
def test_gpus_per_worker(gpus, workers, per_worker, expected):
    assert worker_devices(workers, gpus, per_worker).cuda_visible_devices == expected


def test_every_gpu_goes_to_one_worker_at_most():
    shares = worker_devices(3, [str(i) for i in range(8)], 2).cuda_visible_devices
    used = [g for share in shares for g in share.split(",")]
    assert len(used) == len(set(used)) == 6


@pytest.mark.parametrize(
    ("gpus", "workers", "per_worker", "message"),
    [
        (["0", "1", "2"], 2, 2, "--gpus-per-worker 2 with 2 workers needs 4 GPUs but 3 GPUs"),
        ([], 1, 1, "needs 1 GPUs but no GPU is visible"),
        (["0"], 1, -1, "--gpus-per-worker -1: pass 0 or more"),
        (["0"], 0, None, "--workers 0"),
    ],
)
def test_too_few_gpus_is_one_line(gpus, workers, per_worker, message):
    with pytest.raises(UsageError) as caught:
        worker_devices(workers, gpus, per_worker)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# --- the devices of N local workers: what notebook 07 runs on each machine ------------


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


def test_worker_devices_counts_kaggles_gpus_without_tensorflow(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(monkeypatch, 2)
    assert worker_devices(2).cuda_visible_devices == ("0", "1")


def test_worker_devices_refuses_no_workers():
    with pytest.raises(UsageError, match="--workers 0"):
        worker_devices(0, ["0"])
