"""Local launcher for multi-worker and parameter-server training.

Starts N worker processes on one machine, each with its own `TF_CONFIG`, so the
same `mdtrain train --strategy multiworker` that runs on a cluster can be tried
and taught on a laptop; with parameter servers (`launch(..., num_ps=M)`) it
starts `ps`, `worker` and `chief` tasks instead. The user guide, security
included, is docs/multi-worker.md.

Exit codes of `run_workers` and `launch`: the chief's (worker 0's) status when
every worker ends on its own; the failing worker's status when a worker fails and
no restarts are left (exit code 2, a usage error, is never restarted); 124 when
workers appear stuck; 130 on Ctrl-C; 143 on SIGTERM. A process killed by signal N
counts as 128 + N, as in a shell. With parameter servers: the chief's status; a dead
parameter server's (at least 1: its variables are lost); 124, 130 and 143 as above.

Security: TensorFlow's gRPC servers are unauthenticated and unencrypted, and
listen on every interface of their port: keep `host` on loopback (the default)
or a trusted network, and firewall the ports (docs/multi-worker.md, "Security").
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
