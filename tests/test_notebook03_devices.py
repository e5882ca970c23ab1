"""The MirroredStrategy lessons' device decisions on 0, 1 and 2 GPUs, with fake devices.

Notebooks 03, 04 and 05 call `configure_devices("auto", cpu_replicas=4)`, then
build `MirroredStrategy` over the GPUs, or over the CPU devices when there is
none. On a GPU machine no virtual CPU may be made and every GPU must hold a
replica; without one, 4 CPU replicas. The strategy cells of 03 and 04 and
05's scaling line run here as written in the notebooks, against a fake `tf`.
"""

from __future__ import annotations

import types
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
STRATEGY_NOTEBOOKS = ["03_mirrored_strategy.ipynb", "04_exact_uneven_batches.ipynb"]
SCALING_NOTEBOOK = "05_mirrored_performance.ipynb"


def _cell(notebook: str, text: str) -> str:
    cells = nbformat.read(NOTEBOOKS / notebook, as_version=4).cells
    found = [c.source for c in cells if c.cell_type == "code" and text in c.source]
    assert len(found) == 1, f"{notebook} must have one cell with {text!r}"
    return found[0]


class _Device(types.SimpleNamespace):
    pass


def _fake_tf(num_gpus: int, num_cpus: int) -> types.SimpleNamespace:
    gpus = [
        _Device(name=f"/job:localhost/replica:0/task:0/device:GPU:{i}") for i in range(num_gpus)
    ]
    cpus = [
        _Device(name=f"/job:localhost/replica:0/task:0/device:CPU:{i}") for i in range(num_cpus)
    ]

    class Strategy:
        def __init__(self, devices):
            self.devices = list(devices) if isinstance(devices, list) else [devices]
            self.num_replicas_in_sync = len(self.devices)

    config = types.SimpleNamespace(
        list_logical_devices=lambda kind: {"GPU": gpus, "CPU": cpus}[kind]
    )
    distribute = types.SimpleNamespace(MirroredStrategy=Strategy, OneDeviceStrategy=Strategy)
    return types.SimpleNamespace(config=config, distribute=distribute)


@pytest.mark.parametrize("notebook", STRATEGY_NOTEBOOKS)
@pytest.mark.parametrize(
    ("num_gpus", "num_cpus", "replicas", "kind"),
    [(0, 4, 4, "CPU"), (1, 1, 1, "GPU"), (2, 1, 2, "GPU")],
    ids=["no-gpu", "1-gpu", "2-gpus"],
)
def test_notebook_strategy_uses_the_gpus_or_the_virtual_cpus(
    notebook, num_gpus, num_cpus, replicas, kind
):
    namespace = {"tf": _fake_tf(num_gpus, num_cpus), "BATCH_SIZE_PER_REPLICA": 8}
    cell = _cell(notebook, "strategy = tf.distribute.MirroredStrategy(")
    exec(cell, namespace)  # noqa: S102  (the notebook's own cell, against fakes)
    strategy = namespace["strategy"]
    assert strategy.num_replicas_in_sync == replicas
    assert all(f"device:{kind}:" in d for d in strategy.devices), strategy.devices
    assert namespace["global_batch_size"] == 8 * replicas
    if "one_device" in namespace:  # 04's reference: one of the strategy's devices
        assert namespace["one_device"].devices == strategy.devices[:1]


@pytest.mark.parametrize(
    ("num_devices", "counts"), [(4, [1, 2, 4]), (1, [1]), (2, [1, 2]), (3, [1, 2, 3])]
)
def test_scaling_measures_one_replica_up_to_every_device(num_devices, counts):
    """05's scaling runs cover 1 replica to every device (the CPU's 4, 1 GPU, 2 GPUs)."""
    cell = _cell(SCALING_NOTEBOOK, "replica_counts = ")
    (line,) = [ln for ln in cell.splitlines() if ln.startswith("replica_")]
    namespace = {"devices": [f"device:{i}" for i in range(num_devices)]}
    exec(line, namespace)  # noqa: S102  (the notebook's own line)
    assert namespace["replica_counts"] == counts


@pytest.mark.parametrize(("num_gpus", "virtual_cpus"), [(0, 4), (1, None), (2, None)])
def test_configure_devices_auto_makes_virtual_cpus_only_without_gpus(
    monkeypatch, num_gpus, virtual_cpus
):
    from mdtrain import distribute

    made = []
    gpus = [f"GPU:{i}" for i in range(num_gpus)]
    monkeypatch.setattr(distribute.tf.config, "list_physical_devices",
                        lambda kind: gpus if kind == "GPU" else ["CPU:0"])  # fmt: skip
    monkeypatch.setattr(distribute.tf.config.experimental, "set_memory_growth", lambda *a: None)
    monkeypatch.setattr(distribute, "_tpu_available", lambda: False)
    monkeypatch.setattr(distribute, "_virtual_cpus", made.append)
    monkeypatch.setattr(distribute, "_cpu_runtime", lambda replicas: None)
    distribute.configure_devices("auto", cpu_replicas=4)
    assert made == ([] if virtual_cpus is None else [virtual_cpus])
