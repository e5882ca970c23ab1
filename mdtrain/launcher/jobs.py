"""The jobs of `mdtrain launch`: N multi-worker workers, restarted together, or a ps cluster."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from typing import TextIO

from mdtrain.errors import USAGE_EXIT_CODE, UsageError
from mdtrain.launcher.processes import HANG_EXIT_CODE, HANG_TIMEOUT_S, POLL_S, Job, exit_status


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns `count` distinct TCP ports that are free on `host` right now.

    The sockets are held open together, so the ports are distinct, then closed
    for the workers to bind; a port taken in between fails one attempt, and a
    restart takes fresh ports.

    Args:
        count: How many ports to return.
        host: The address to bind. Defaults to `"127.0.0.1"`.

    Returns:
        A list of `count` distinct port numbers.

    Example:
        >>> len(set(free_ports(3)))
        3
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as held:  # every socket closes on the way out
        sockets = [held.enter_context(socket.socket(family)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def tf_config(worker_addresses: list[str], index: int) -> dict:
    """Builds the `TF_CONFIG` dictionary of one worker.

    Worker 0 is the chief: MultiWorkerMirroredStrategy makes it the one that
    saves checkpoints and writes summaries.

    Args:
        worker_addresses: `"host:port"` of every worker, in index order.
        index: The index of the worker this config is for.

    Returns:
        `{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": index}}`,
        for `json.dumps` into the `TF_CONFIG` environment variable.

    Raises:
        UsageError: If `index` is not a valid position in `worker_addresses`.

    Example:
        >>> tf_config(["127.0.0.1:2222", "127.0.0.1:2223"], 1)["task"]
        {'type': 'worker', 'index': 1}
    """
    if not 0 <= index < len(worker_addresses):
        raise UsageError(f"no task worker {index} in the cluster {{'worker': {worker_addresses}}}")
    return {
        "cluster": {"worker": list(worker_addresses)},
        "task": {"type": "worker", "index": index},
    }


def free_addresses(count: int, host: str) -> list[str]:
    """`count` free `host:port` addresses, with an IPv6 host in brackets (`[::1]:2222`)."""
    bracketed = f"[{host}]" if ":" in host else host
    return [f"{bracketed}:{port}" for port in free_ports(count, host)]


def run_workers(
    command: list[str],
    num_workers: int,
    *,
    restarts: int = 0,
    host: str = "127.0.0.1",
    log_dir: str | os.PathLike | None = None,
    hang_timeout_s: float | None = HANG_TIMEOUT_S,
    env: dict[str, str] | None = None,
    stream: TextIO | None = None,
    gpus_per_worker: int | None = None,
) -> int:
    """Runs `command` as `num_workers` cooperating workers and waits for them.

    `mdtrain launch`'s workers: their ports, environment, logs and restarts are
    docs/multi-worker.md's, "Try it on one machine" and "Fault tolerance".
    Keep `host` on loopback or a trusted network (docs/multi-worker.md, "Security").

    Args:
        command: The program and its arguments that every worker runs.
        num_workers: How many workers to start. Must be at least 1.
        restarts: How many times to restart all workers after one fails.
            Defaults to `0`.
        host: The address workers bind and reach each other on.
            Defaults to `"127.0.0.1"`.
        log_dir: Where per-worker logs go. Defaults to `None`, a fresh
            temporary folder whose path is printed at the start.
        hang_timeout_s: Seconds after which workers count as stuck, when one
            has finished and others have not, or none has printed anything.
            `None` disables the check. Defaults to `300.0`.
        env: Environment for the workers. Defaults to `None`, this process's.
        stream: Where prefixed output and launcher messages go.
            Defaults to `None`, the `sys.stdout` of the moment (a notebook's too).
        gpus_per_worker: GPUs for each worker, set in its `CUDA_VISIBLE_DEVICES`
            (`worker_devices`); `0` runs the workers on the CPU, and so
            does `None` with fewer GPUs than workers (one line says so).
            Defaults to `None`: the visible GPUs split evenly, none on a CPU machine.

    Returns:
        The job's exit status, as docs/multi-worker.md, "Exit codes", gives it.

    Raises:
        UsageError: If `command` is empty or cannot be started, `num_workers < 1`,
            `restarts < 0`, `hang_timeout_s <= 0`, or too few GPUs.

    Example:
        >>> run_workers([sys.executable, "train.py"], 2, restarts=1)  # doctest: +SKIP
    """
    if not command:
        raise UsageError("empty worker command; pass the program to run, e.g. ['python', 'x.py']")
    if restarts < 0:
        raise UsageError(f"--restarts {restarts}: pass 0 or more restarts")
    job = Job(
        num_workers,
        f"{num_workers} workers",
        host=host,
        log_dir=log_dir,
        env=env,
        hang_timeout_s=hang_timeout_s,
        stream=stream,
        gpus_per_worker=gpus_per_worker,
    )
    if job.gpus is not None:
        shares = (f"worker {i}: {g or '(none)'}" for i, g in enumerate(job.gpus))
        job.say("CUDA_VISIBLE_DEVICES " + "; ".join(shares))
    if hang_timeout_s is not None:  # the chief's training shows life at least this often
        job.env["MDTRAIN_HEARTBEAT_S"] = f"{hang_timeout_s / 4:g}"  # mdtrain.heartbeat

    def attempts() -> int:
        attempt, status = 0, None
        while status is None:  # None: restart; the last attempt always has a status
            attempt += 1
            addresses = free_addresses(num_workers, host)  # fresh ones for every attempt
            job.say(f"attempt {attempt}: " + " ".join(addresses))
            job.new_attempt()
            header = f"=== attempt {attempt} ({time.strftime('%Y-%m-%d %H:%M:%S')}) ===\n"
            for index in range(num_workers):
                worker_env = dict(job.env, TF_CONFIG=json.dumps(tf_config(addresses, index)))
                worker_env.update(MDTRAIN_WORKER_INDEX=str(index), MDTRAIN_ATTEMPT=str(attempt))
                if job.gpus is not None:  # this worker's own GPUs
                    worker_env["CUDA_VISIBLE_DEVICES"] = job.gpus[index]
                job.spawn(command, worker_env, f"worker {index}", header)
            job.start_pumps()
            status = _watch(job, attempt, restarts)
            job.join()
        return status

    return job.run(attempts, noun="workers")


def _watch(job: Job, attempt: int, restarts: int) -> int | None:
    """Waits for one attempt; returns its exit status, or None to restart."""
    procs, first_done = job.procs, None
    limit = float("inf") if job.hang_timeout_s is None else job.hang_timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        # Once the chief has finished cleanly the job's result is saved: later failures are noise.
        if failed and codes[0] != 0:
            return _after_failure(job, failed, attempt, restarts)
        running = [i for i, c in enumerate(codes) if c is None]
        if not running:
            if failed:
                index, code = failed[0]
                job.say(f"worker {index} exited with code {code} after the chief finished")
            return exit_status(codes[0])
        now = time.monotonic()
        if first_done is None and len(running) < len(procs):
            first_done = now
        if first_done is not None and now - first_done > limit:
            why = f"worker {codes.index(0)} finished {now - first_done:.0f}s ago"
        elif now - job.last_output > limit:
            why = f"no output for {now - job.last_output:.0f}s"
        else:
            time.sleep(POLL_S)
            continue
        stuck = ", ".join(map(str, running))
        job.say(
            f"workers {stuck} appear stuck (probably waiting in a collective for a worker "
            f"that is gone): {why}; stopping all; exit code {HANG_EXIT_CODE}"
        )
        job.stop()
        return HANG_EXIT_CODE


def _after_failure(job: Job, failed, attempt: int, restarts: int) -> int | None:
    """Stops the workers after `failed`; returns the exit status, or None to restart."""
    # Exit code 2 is a usage error (argparse, mdtrain's CLI): a restart would repeat it.
    usage = any(c == USAGE_EXIT_CODE for _, c in failed)
    left = attempt <= restarts and not usage
    plan = f"restart {attempt} of {restarts}" if left else "no restarts left"
    plan = "bad input, not restarting" if usage and attempt <= restarts else plan
    what = ", ".join(f"worker {i} exited with code {c}" for i, c in failed)
    job.say(f"{what}; stopping the others; {plan}")
    job.stop()
    # The chief's own failure if it failed, else the worker's: not our SIGTERM to the chief.
    return None if left else exit_status(failed[0][1])


def _without_strategy(train_args: list[str], wanted: str, why: str) -> list[str]:
    """`train_args` without their `--strategy` options, each (argparse keeps the last) `wanted`."""
    rest, args = [], iter(train_args)
    for arg in args:
        if arg == "--strategy":
            value = next(args, "")
        elif arg.startswith("--strategy="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
            continue
        if value != wanted:
            raise UsageError(f"--strategy {value}: {why}")
    return rest


#: What every training process of a `launch` job runs, unless told otherwise.
MDTRAIN_TRAIN = (sys.executable, "-m", "mdtrain", "train")


def launch(
    num_workers: int,
    train_args: list[str],
    *,
    restarts: int = 0,
    num_ps: int = 0,
    train_command: list[str] | None = None,
    **kwargs,
) -> int:
    """Runs `mdtrain train` as a local job of `num_workers` workers.

    The CLI's `mdtrain launch`: multi-worker training (`run_workers`), or with
    `num_ps` parameter-server training (docs/multi-worker.md).

    Args:
        num_workers: How many workers to start. Must be at least 1.
        train_args: Arguments for `mdtrain train`; a `--strategy` among them
            must be `multiworker` (`ps` with `num_ps`), and is added for you.
        restarts: How many times to restart all workers after one fails;
            not with `num_ps`. Defaults to `0`.
        num_ps: Parameter servers; more than 0 runs parameter-server training.
            Defaults to `0`.
        train_command: The program that trains, in place of `mdtrain train`:
            every worker's, or with `num_ps` the chief's, given `train_args` and
            `--strategy` (a fault drill's chief: docs/multi-worker.md, "Parameter
            servers"). Defaults to `None`: `python -m mdtrain train`.
        **kwargs: `run_workers`' options, with `num_ps` too (`host`,
            `log_dir`, `hang_timeout_s`, `env`, `stream`, `gpus_per_worker`).

    Returns:
        The job's exit status, as docs/multi-worker.md, "Exit codes", gives it.

    Raises:
        UsageError: If `train_args` asks for another strategy, `restarts` comes
            with `num_ps`, or for the reasons `run_workers` gives.

    Example:
        >>> launch(2, ["--epochs", "2", "--backup-dir", "/tmp/bk"], restarts=1)  # doctest: +SKIP
    """
    trainer = list(train_command or MDTRAIN_TRAIN)
    if not num_ps:
        why = "launch runs multi-worker training; drop --strategy or pass --strategy multiworker"
        command = [*trainer, *_without_strategy(train_args, "multiworker", why)]
        command += ["--strategy", "multiworker"]
        return run_workers(command, num_workers, restarts=restarts, **kwargs)
    if restarts:
        raise UsageError(
            "--restarts with --ps: a parameter-server job outlives a lost worker; drop --restarts"
        )
    why = "launch --ps runs parameter-server training; drop --strategy"
    chief = [*trainer, *_without_strategy(train_args, "ps", why), "--strategy", "ps"]
    server = [sys.executable, "-m", "mdtrain.ps", "serve"]
    return _run_ps_cluster(chief, server, num_workers, num_ps, **kwargs)


def _run_ps_cluster(
    chief_command: list[str],
    server_command: list[str],
    num_workers: int,
    num_ps: int,
    *,
    host: str = "127.0.0.1",
    **options,
) -> int:
    """Runs `num_ps` servers, `num_workers` workers and a chief; the job ends with the chief."""
    if num_workers < 1 or num_ps < 1:
        raise UsageError(f"--workers {num_workers} --ps {num_ps}: pass at least 1 of each")
    # The chief counts a worker's GPUs as replicas, and each would take a whole batch.
    if (options.get("gpus_per_worker") or 0) > 1:
        raise UsageError(
            f"--gpus-per-worker {options['gpus_per_worker']} with --ps: a "
            "parameter-server worker computes on one GPU; pass 1 or 0"
        )
    chief, *rest = free_addresses(1 + num_workers + num_ps, host)  # a bad host fails first
    job = Job(
        num_workers,
        f"{num_ps} ps, {num_workers} workers and a chief",
        host=host,
        most_gpus_per_worker=1,
        **options,
    )
    cluster = {"chief": [chief], "worker": rest[:num_workers], "ps": rest[num_workers:]}

    def start_and_watch() -> int:
        roles = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
        for role, index in [*roles, ("chief", 0)]:  # last: the watcher finds the chief at -1
            env = dict(
                job.env,
                MDTRAIN_ROLE=role,
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}),
            )
            if role == "worker":
                env["MDTRAIN_WORKER_INDEX"] = str(index)  # what a fault drill looks for
            if job.gpus is not None:  # workers compute; the ps and the chief hold and schedule
                env["CUDA_VISIBLE_DEVICES"] = job.gpus[index] if role == "worker" else ""
            command = chief_command if role == "chief" else server_command
            job.spawn(command, env, "chief" if role == "chief" else f"{role} {index}")
        job.start_pumps()
        status = _watch_ps(job, num_ps)
        job.join()  # every task's last lines are copied before we return
        return status

    return job.run(start_and_watch)


def _watch_ps(job: Job, num_ps: int) -> int:
    """Waits for the chief; stops the servers then. Returns the job's exit status."""
    procs, labels, say = job.procs, job.labels, job.say
    hang_timeout_s = job.hang_timeout_s
    reported: set[int] = set()
    while True:
        codes = [p.poll() for p in procs]
        if codes[-1] is not None:
            job.join(len(procs) - 1)  # its last lines (its summary) first, then ours
            say(f"the chief exited with code {codes[-1]}; stopping the servers")
            job.stop()
            return exit_status(codes[-1])
        for task, code in enumerate(codes[:-1]):
            if code is None or task in reported:
                continue
            reported.add(task)
            if task < num_ps:
                say(f"{labels[task]} exited with code {code}: its variables are lost; stopping all")
                job.stop()
                return exit_status(code) or 1
            say(f"{labels[task]} exited with code {code}; the chief reruns its steps on the others")
        if hang_timeout_s is not None and time.monotonic() - job.last_output > hang_timeout_s:
            say(
                f"no output for {hang_timeout_s:.0f}s: stuck; stopping all; exit code "
                f"{HANG_EXIT_CODE}"
            )
            job.stop()
            return HANG_EXIT_CODE
        time.sleep(POLL_S)
