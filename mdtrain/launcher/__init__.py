"""Local launcher for multi-worker and parameter-server training.

Starts the tasks of a job on one machine, each with its own `TF_CONFIG`. The user
guide, with the exit codes and a security note (keep `host` on loopback or a
trusted network), is docs/multi-worker.md.
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
