"""`configure_devices("auto", cpu_replicas=N)`, what every notebook calls: virtual CPU
replicas only on a machine without accelerators, the GPUs as they are otherwise."""

from __future__ import annotations

import types

import pytest

from tests.test_gpu_paths import FakeTfConfig


@pytest.mark.parametrize(
    ("num_gpus", "virtual"),
    [(0, [("virtual", "PhysicalDevice(CPU:0)", 4)]), (1, []), (2, [])],
)
def test_auto_uses_gpus_where_they_are_and_virtual_cpus_where_not(monkeypatch, num_gpus,
                                                                   virtual):  # fmt: skip
    distribute = pytest.importorskip("mdtrain.distribute")
    config = FakeTfConfig(num_gpus)
    monkeypatch.setattr(distribute, "tf", types.SimpleNamespace(config=config))
    monkeypatch.setattr(distribute, "_tpu_available", lambda: False)
    distribute.configure_devices("auto", cpu_replicas=4)
    assert [c for c in config.calls if c[0] == "virtual"] == virtual
    assert len([c for c in config.calls if c[0] == "growth"]) == num_gpus
