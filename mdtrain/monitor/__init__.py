"""Live training monitor: GPU/CPU samplers, throughput, dashboard, verdict.

Importing this package never imports TensorFlow or Keras: the samplers run on
machines without them. The Keras pieces (`MonitorCallback`, `make_monitor`)
load on first use.

Example:

```python
from mdtrain.monitor import make_monitor

monitor = make_monitor(global_batch_size=256, epochs=5)
model.fit(train_ds, epochs=5, callbacks=[monitor])
print(monitor.summary().verdict)
```
"""

from __future__ import annotations

import importlib

from mdtrain.monitor.sampler import DeviceSample, Sample, Sampler
from mdtrain.monitor.summary import DeviceSummary, Summary, verdict

# Loaded on first access: Keras (and so TensorFlow) for the callback,
# ipywidgets for the dashboard.
_LAZY = {
    "MonitorCallback": "mdtrain.monitor.callback",
    "make_monitor": "mdtrain.monitor.callback",
    "Dashboard": "mdtrain.monitor.dashboard",
}

__all__ = [
    "Dashboard",
    "DeviceSample",
    "DeviceSummary",
    "MonitorCallback",
    "Sample",
    "Sampler",
    "Summary",
    "make_monitor",
    "verdict",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mdtrain.monitor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
