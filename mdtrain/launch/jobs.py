"""`mdtrain train` as a local job: the CLI's `mdtrain launch`."""

from __future__ import annotations

import sys

from mdtrain.errors import UsageError
from mdtrain.launch.parameter_servers import run_ps_cluster
from mdtrain.launch.workers import run_workers


def strategy_arg(train_args: list[str]) -> str | None:
    for i, arg in enumerate(train_args):
        if arg == "--strategy":
            return train_args[i + 1] if i + 1 < len(train_args) else ""
        if arg.startswith("--strategy="):
            return arg.split("=", 1)[1]
    return None


def launch(
    num_workers: int, train_args: list[str], *, restarts: int = 0, num_ps: int = 0, **kwargs
) -> int:
    """Runs `mdtrain train --strategy multiworker` as `num_workers` local workers.

    The CLI's `mdtrain launch --workers N [--restarts R] -- <train arguments>`.
    With restarts, pass `--backup-dir DIR` in `train_args` so a restarted run
    resumes instead of starting over. With `num_ps` (`--ps M`) it runs
    parameter-server training instead (`launch_ps`).

    Args:
        num_workers: How many workers to start. Must be at least 1.
        train_args: Arguments for `mdtrain train`; `--strategy multiworker`
            is added unless already there.
        restarts: How many times to restart all workers after one fails.
            Defaults to `0`.
        num_ps: Parameter servers; more than 0 runs `launch_ps`. Defaults to `0`.
        **kwargs: Passed to `run_workers` (`host`, `log_dir`,
            `hang_timeout_s`, `env`, `stream`).

    Returns:
        The exit status of `run_workers`.

    Raises:
        UsageError: If `train_args` asks for another strategy, or for the
            reasons `run_workers` gives.

    Example:
        >>> launch(2, ["--epochs", "2", "--backup-dir", "/tmp/bk"], restarts=1)  # doctest: +SKIP
    """
    if num_ps:
        if restarts:
            raise UsageError("--restarts with --ps: a parameter-server job outlives a lost worker; "
                             "drop --restarts")  # fmt: skip
        return launch_ps(num_workers, num_ps, train_args, **kwargs)
    strategy = strategy_arg(train_args)
    command = [sys.executable, "-m", "mdtrain", "train", *train_args]
    if strategy is None:
        command += ["--strategy", "multiworker"]
    elif strategy != "multiworker":
        raise UsageError(
            f"--strategy {strategy}: launch runs multi-worker training; "
            "drop --strategy or pass --strategy multiworker"
        )
    return run_workers(command, num_workers, restarts=restarts, **kwargs)


def launch_ps(num_workers: int, num_ps: int, train_args: list[str], **kwargs) -> int:
    """Runs parameter-server training of `mdtrain train` arguments as a local cluster.

    The CLI's `mdtrain launch --workers N --ps M -- <train arguments>`: the
    chief runs `python -m mdtrain.ps chief <train arguments>`, every ps and
    worker `python -m mdtrain.ps serve`.

    Args:
        num_workers: workers, at least 1.
        num_ps: parameter servers, at least 1.
        train_args: `mdtrain train` arguments (plus `mdtrain.ps`'s `--log-every`).
        **kwargs: passed to `run_ps_cluster` (`host`, `log_dir`,
            `hang_timeout_s`, `env`, `stream`).

    Returns:
        The exit status of `run_ps_cluster`.

    Raises:
        UsageError: if `train_args` asks for a strategy other than `ps`.
    """
    strategy = strategy_arg(train_args)
    if strategy not in (None, "ps"):
        raise UsageError(f"--strategy {strategy}: launch --ps runs parameter-server training; "
                         "drop --strategy")  # fmt: skip
    if strategy is not None:  # `ps` is what the chief runs anyway
        at = next(i for i, a in enumerate(train_args) if a.startswith("--strategy"))
        train_args = train_args[:at] + train_args[at + (1 if "=" in train_args[at] else 2) :]
    chief = [sys.executable, "-m", "mdtrain.ps", "chief", *train_args]
    server = [sys.executable, "-m", "mdtrain.ps", "serve"]
    return run_ps_cluster(chief, server, num_workers, num_ps, **kwargs)
