"""Local launcher for multi-worker and parameter-server training.

Starts N worker processes on one machine, each with its own `TF_CONFIG`, so the
same `mdtrain train --strategy multiworker` that runs on a cluster can be tried
and taught on a laptop; with parameter servers (`launch(..., num_ps=M)`) it
starts `ps`, `worker` and `chief` tasks instead. The user guide, with the exit
codes and a security note (TensorFlow's gRPC servers are unauthenticated: keep
`host` on loopback or a trusted network), is docs/multi-worker.md.
"""

from mdtrain.gpus import WorkerDevices, worker_devices
from mdtrain.launcher.jobs import free_ports, launch, run_workers, tf_config
from mdtrain.launcher.processes import HANG_EXIT_CODE

__all__ = [
    "HANG_EXIT_CODE",
    "WorkerDevices",
    "free_ports",
    "launch",
    "run_workers",
    "tf_config",
    "worker_devices",
]
