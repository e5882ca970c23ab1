"""Parameter-server jobs: roles `ps`, `worker` and `chief`; the job ends with the chief."""

from __future__ import annotations

import json
import os
import time
from typing import TextIO

from mdtrain.errors import UsageError
from mdtrain.gpus import share_gpus, visible_gpus
from mdtrain.launcher.addresses import cluster_tf_config, ps_cluster
from mdtrain.launcher.processes import (
    HANG_EXIT_CODE,
    HANG_TIMEOUT_S,
    POLL_S,
    Job,
    Tasks,
    check_hang_timeout,
    exit_status,
    stop,
)


def run_ps_cluster(
    chief_command: list[str],
    server_command: list[str],
    num_workers: int,
    num_ps: int,
    *,
    host: str = "127.0.0.1",
    log_dir: str | os.PathLike | None = None,
    hang_timeout_s: float | None = HANG_TIMEOUT_S,
    env: dict[str, str] | None = None,
    stream: TextIO | None = None,
    gpus_per_worker: int | None = None,
) -> int:
    """Runs a parameter-server job: `num_ps` servers, `num_workers` workers and a chief.

    Every task gets `TF_CONFIG` with its role (`ps`, `worker`, `chief`) and
    `MDTRAIN_ROLE`; workers also get `MDTRAIN_WORKER_INDEX` (for
    `kill_worker_when`). Parameter servers and workers run `server_command`
    and never end on their own; the chief runs `chief_command`, and the job
    ends with it. Unlike `run_workers`, a worker that dies does not stop the
    job: the chief's coordinator runs its steps on the other workers. A
    parameter server that dies ends the job (it held variables). Output goes
    to `stream` as `[ps i] ...`, `[worker i] ...`, `[chief] ...`.

    Args:
        chief_command: what the chief runs (the training).
        server_command: what every ps and worker runs (a server).
        num_workers: workers, at least 1.
        num_ps: parameter servers, at least 1.
        host: the address the tasks use. Defaults to `"127.0.0.1"`.
        log_dir: per-task logs. Defaults to None: a fresh temporary folder.
        hang_timeout_s: stop everything after this many seconds without
            output from any task. Defaults to `300.0`.
        env: environment for the tasks. Defaults to None: this process's.
        stream: where output goes. Defaults to None: `sys.stdout`.
        gpus_per_worker: GPUs of each worker, as in `run_workers`; the ps and
            the chief get none. Defaults to None: the visible GPUs split
            evenly, or, with fewer GPUs than workers, none: the workers run
            on the CPU, and one line says so (`mdtrain.gpus.share_gpus`).

    Returns:
        The chief's exit status; a dead ps's (at least 1); 124 when stuck;
        130 on Ctrl-C; 143 on SIGTERM.

    Raises:
        UsageError: for fewer than 1 worker or ps, `hang_timeout_s <= 0`, too
            few GPUs for `gpus_per_worker`, or a command that cannot start.

    Example:
        >>> run_ps_cluster(["python", "chief.py"], ["python", "serve.py"], 2, 1)  # doctest: +SKIP
    """
    if num_workers < 1 or num_ps < 1:
        raise UsageError(f"--workers {num_workers} --ps {num_ps}: pass at least 1 of each")
    check_hang_timeout(hang_timeout_s)
    gpus, note = share_gpus(visible_gpus(env), num_workers, gpus_per_worker)
    job = Job(log_dir, stream)  # after the checks: a usage error leaves no log folder behind
    cluster = ps_cluster(num_workers, num_ps, host)
    job.say(f"{num_ps} ps, {num_workers} workers and a chief on {host}; logs in {job.log_dir}")
    if note:
        job.say(note)
    base_env = dict(os.environ if env is None else env)

    def start_and_watch() -> int:
        tasks = job.new_tasks()
        for role, index in _ps_roles(num_ps, num_workers):
            command = chief_command if role == "chief" else server_command
            task_env = _ps_task_env(base_env, cluster, role, index, gpus)
            tasks.spawn(command, task_env, "chief" if role == "chief" else f"{role} {index}")
        tasks.start_pumps()
        status = _watch_ps(tasks, num_ps, hang_timeout_s, job.say)
        tasks.join()  # every task's last lines are copied before we return
        return status

    return job.run(start_and_watch)


def _ps_roles(num_ps: int, num_workers: int) -> list[tuple[str, int]]:
    roles = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
    return [*roles, ("chief", 0)]  # last: the watcher finds the chief at procs[-1]


def _ps_task_env(base_env, cluster, role: str, index: int, gpus) -> dict[str, str]:
    env = dict(base_env)
    env.update(TF_CONFIG=json.dumps(cluster_tf_config(cluster, role, index)), MDTRAIN_ROLE=role)
    if role == "worker":
        env["MDTRAIN_WORKER_INDEX"] = str(index)
    if gpus is not None:  # workers compute; the ps and the chief only hold and schedule
        env["CUDA_VISIBLE_DEVICES"] = gpus[index] if role == "worker" else ""
    return env


def _watch_ps(tasks: Tasks, num_ps: int, hang_timeout_s, say) -> int:
    """Waits for the chief; stops the servers then. Returns the job's exit status."""
    procs, labels = tasks.procs, tasks.labels
    reported: set[int] = set()
    while True:
        codes = [p.poll() for p in procs]
        if codes[-1] is not None:
            tasks.join(len(procs) - 1)  # its last lines (its summary) first, then ours
            say(f"the chief exited with code {codes[-1]}; stopping the servers")
            stop(procs)
            return exit_status(codes[-1])
        for i, code in enumerate(codes[:-1]):
            if code is None or i in reported:
                continue
            reported.add(i)
            if i < num_ps:
                say(f"{labels[i]} exited with code {code}: its variables are lost; stopping all")
                stop(procs)
                return exit_status(code) or 1
            say(f"{labels[i]} exited with code {code}; the chief reruns its steps on the others")
        if hang_timeout_s is not None and time.monotonic() - tasks.last_output > hang_timeout_s:
            say(f"no output for {hang_timeout_s:.0f}s: stuck; stopping all; exit code "
                f"{HANG_EXIT_CODE}")  # fmt: skip
            stop(procs)
            return HANG_EXIT_CODE
        time.sleep(POLL_S)
