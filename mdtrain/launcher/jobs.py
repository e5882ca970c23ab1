"""`mdtrain train` as a local job: the CLI's `mdtrain launch`."""

from __future__ import annotations

import sys

from mdtrain.errors import UsageError
from mdtrain.launcher.parameter_servers import run_ps_cluster
from mdtrain.launcher.workers import run_workers


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

    The CLI's `mdtrain launch --workers N [--ps M] [--restarts R] -- <train
    arguments>`. Without parameter servers every worker runs `mdtrain train
    --strategy multiworker` (`run_workers`); with restarts, pass `--backup-dir
    DIR` in `train_args` so a restarted run resumes instead of starting over.
    With `num_ps` (`--ps M`) it runs parameter-server training instead
    (`run_ps_cluster`): the chief runs `python -m mdtrain.ps chief <train
    arguments>`, every ps and worker `python -m mdtrain.ps serve`.

    Args:
        num_workers: How many workers to start. Must be at least 1.
        train_args: Arguments for `mdtrain train` (with `num_ps`, also
            `mdtrain.ps`'s `--log-every`); a `--strategy` among them must be
            `multiworker` (`ps` with `num_ps`), and is added for you.
        restarts: How many times to restart all workers after one fails;
            not with `num_ps`. Defaults to `0`.
        num_ps: Parameter servers; more than 0 runs parameter-server training.
            Defaults to `0`.
        **kwargs: Passed to `run_workers` or `run_ps_cluster` (`host`,
            `log_dir`, `hang_timeout_s`, `env`, `stream`, `gpus_per_worker`).

    Returns:
        The exit status of `run_workers` (of `run_ps_cluster` with `num_ps`).

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
    return run_ps_cluster(chief, server, num_workers, num_ps, **kwargs)
