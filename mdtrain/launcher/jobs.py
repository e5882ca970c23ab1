"""`mdtrain train` as a local job, the CLI's `mdtrain launch`: multi-worker or parameter-server."""

from __future__ import annotations

import json
import sys
import time

from mdtrain.errors import UsageError
from mdtrain.launcher.processes import HANG_EXIT_CODE, POLL_S, Job, exit_status
from mdtrain.launcher.workers import free_addresses, run_workers


def _without_strategy(train_args: list[str], wanted: str, why: str) -> list[str]:
    """`train_args` without their `--strategy` options, each of which must be `wanted`.

    Every occurrence is checked, not the first only: argparse keeps the last.
    """
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


def launch(
    num_workers: int, train_args: list[str], *, restarts: int = 0, num_ps: int = 0, **kwargs
) -> int:
    """Runs `mdtrain train` as a local job of `num_workers` workers.

    The CLI's `mdtrain launch`. Without parameter servers every worker runs
    `mdtrain train --strategy multiworker` (`run_workers`); with restarts, pass
    `--backup-dir DIR` in `train_args` so a restarted run resumes instead of
    starting over. With `num_ps` it runs parameter-server training: a worker
    that dies does not stop the job, a ps that dies does, and the job ends
    with the chief.

    Args:
        num_workers: How many workers to start. Must be at least 1.
        train_args: Arguments for `mdtrain train` (with `num_ps`, also
            `mdtrain.ps`'s `--log-every`); a `--strategy` among them must be
            `multiworker` (`ps` with `num_ps`), and is added for you.
        restarts: How many times to restart all workers after one fails;
            not with `num_ps`. Defaults to `0`.
        num_ps: Parameter servers; more than 0 runs parameter-server training.
            Defaults to `0`.
        **kwargs: `run_workers`' options, with `num_ps` too (`host`,
            `log_dir`, `hang_timeout_s`, `env`, `stream`, `gpus_per_worker`).

    Returns:
        The job's exit status, as `mdtrain.launcher`'s table of exit codes gives it.

    Raises:
        UsageError: If `train_args` asks for another strategy, `restarts` comes
            with `num_ps`, or for the reasons `run_workers` gives.

    Example:
        >>> launch(2, ["--epochs", "2", "--backup-dir", "/tmp/bk"], restarts=1)  # doctest: +SKIP
    """
    if not num_ps:
        why = "launch runs multi-worker training; drop --strategy or pass --strategy multiworker"
        command = [sys.executable, "-m", "mdtrain", "train"]
        command += [*_without_strategy(train_args, "multiworker", why), "--strategy", "multiworker"]
        return run_workers(command, num_workers, restarts=restarts, **kwargs)
    if restarts:
        raise UsageError(
            "--restarts with --ps: a parameter-server job outlives a lost worker; drop --restarts"
        )
    # `ps` is what the chief runs anyway: the option goes.
    why = "launch --ps runs parameter-server training; drop --strategy"
    chief = [sys.executable, "-m", "mdtrain.ps", "chief", *_without_strategy(train_args, "ps", why)]
    server = [sys.executable, "-m", "mdtrain.ps", "serve"]
    return _run_ps_cluster(chief, server, num_workers, num_ps, **kwargs)


def _run_ps_cluster(
    chief_command: list[str], server_command: list[str], num_workers: int, num_ps: int,
    *, host: str = "127.0.0.1", **options,
) -> int:  # fmt: skip
    """Runs `num_ps` servers, `num_workers` workers and a chief; the job ends with the chief."""
    if num_workers < 1 or num_ps < 1:
        raise UsageError(f"--workers {num_workers} --ps {num_ps}: pass at least 1 of each")
    job = Job(num_workers, f"{num_ps} ps, {num_workers} workers and a chief", host=host, **options)
    chief, *rest = free_addresses(1 + num_workers + num_ps, host)
    cluster = {"chief": [chief], "worker": rest[:num_workers], "ps": rest[num_workers:]}

    def start_and_watch() -> int:
        roles = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
        for role, index in [*roles, ("chief", 0)]:  # last: the watcher finds the chief at -1
            env = dict(job.env, MDTRAIN_ROLE=role, TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": role, "index": index}}))  # fmt: skip
            if role == "worker":
                env["MDTRAIN_WORKER_INDEX"] = str(index)  # what kill_worker_when looks for
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
    procs, labels, say, hang_timeout_s = job.procs, job.labels, job.say, job.hang_timeout_s
    reported: set[int] = set()
    while True:
        codes = [p.poll() for p in procs]
        if codes[-1] is not None:
            job.join(len(procs) - 1)  # its last lines (its summary) first, then ours
            say(f"the chief exited with code {codes[-1]}; stopping the servers")
            job.stop()
            return exit_status(codes[-1])
        for i, code in enumerate(codes[:-1]):
            if code is None or i in reported:
                continue
            reported.add(i)
            if i < num_ps:
                say(f"{labels[i]} exited with code {code}: its variables are lost; stopping all")
                job.stop()
                return exit_status(code) or 1
            say(f"{labels[i]} exited with code {code}; the chief reruns its steps on the others")
        if hang_timeout_s is not None and time.monotonic() - job.last_output > hang_timeout_s:
            say(f"no output for {hang_timeout_s:.0f}s: stuck; stopping all; exit code "
                f"{HANG_EXIT_CODE}")  # fmt: skip
            job.stop()
            return HANG_EXIT_CODE
        time.sleep(POLL_S)
