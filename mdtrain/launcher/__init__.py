"""Local launcher for multi-worker and parameter-server training.

Starts N worker processes on one machine, each with its own `TF_CONFIG`, so the
same `mdtrain train --strategy multiworker` that runs on a cluster can be tried
and taught on a laptop. Output is prefixed with `[worker i] ` and kept in
per-worker log files; a crashed worker stops the others and, if asked, the whole
group is restarted; a hang is reported instead of waited on forever. With
parameter servers (`launch(..., num_ps=M)`) it starts `ps`, `worker` and
`chief` tasks instead, and the job ends with the chief.

Modules: `processes` (a job's processes: start, pump output, stop them all
whatever happens), `workers` (free ports, `TF_CONFIG`, `run_workers`,
restarts, hang detection, `kill_worker_when`), `jobs` (`launch`: the CLI's
`mdtrain launch`, and parameter-server jobs). Every public name imports from
`mdtrain.launcher`, with `worker_devices` (`mdtrain.gpus`): each local worker's
GPUs, or the CPU.

Exit codes of `run_workers` and `launch`: the chief's (worker 0's) status when
every worker ends on its own; the failing worker's status when a worker fails and
no restarts are left (exit code 2, a usage error, is never restarted); 124 when
workers appear stuck; 130 on Ctrl-C; 143 on SIGTERM. A process killed by signal N
counts as 128 + N, as in a shell. With parameter servers: the chief's status; a dead
parameter server's (at least 1: its variables are lost); 124, 130 and 143 as above.

Security: TensorFlow's gRPC servers are unauthenticated and unencrypted; anyone
who can reach a worker's port can join or disrupt the job. The launcher puts only
127.0.0.1 addresses in `TF_CONFIG` unless `host` is given explicitly, so workers
talk over loopback; but TensorFlow's server *listens* on every interface of the
port (it ignores the host; checked with `ss -ltn` under TF 2.21). On a machine
reachable from an untrusted network, firewall the ports or run the workers in a
network namespace or container without outside access.
"""

from mdtrain.gpus import WorkerDevices, worker_devices
from mdtrain.launcher.jobs import launch
from mdtrain.launcher.processes import HANG_EXIT_CODE
from mdtrain.launcher.workers import free_ports, kill_worker_when, run_workers, tf_config

__all__ = [
    "HANG_EXIT_CODE",
    "WorkerDevices",
    "free_ports",
    "kill_worker_when",
    "launch",
    "run_workers",
    "tf_config",
    "worker_devices",
]
