"""A parameter-server job as separate processes: what each task runs, and a local job.

`python -m mdtrain.ps serve` runs a ps or worker task, `python -m mdtrain.ps
chief <train arguments>` the chief (`main`); `mdtrain launch --workers N --ps M`
starts them, and `run_local` does the same from Python.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mdtrain.errors import UsageError
from mdtrain.ps.cluster import serve
from mdtrain.ps.training import train


def run_local(
    train_args: list[str],
    num_workers: int = 2,
    num_ps: int = 1,
    *,
    log_every: int = 10,
    kill_worker: int | None = None,
    kill_after: int | None = None,
    stream=None,
    hang_timeout_s: float = 300.0,
) -> dict:
    """Runs parameter-server training as separate local processes; returns its summary.

    `mdtrain launch --workers N --ps M` from Python: ps, workers and the chief
    are processes on 127.0.0.1 with their own `TF_CONFIG`. For a fault drill,
    worker `kill_worker` is killed (SIGKILL) once `kill_after` steps are done.

    Args:
        train_args: `mdtrain train` arguments (`--data`, `--epochs`, ...).
        num_workers: workers. Defaults to 2.
        num_ps: parameter servers. Defaults to 1.
        log_every: steps per point of the loss curve. Defaults to 10.
        kill_worker: the worker to kill. Defaults to None: none.
        kill_after: steps after which to kill it. Defaults to None.
        stream: where the tasks' prefixed output goes. Defaults to None: `sys.stdout`.
        hang_timeout_s: stop after this many silent seconds. Defaults to 300.

    Returns:
        The chief's summary (see `train`) plus `exit_code`.

    Raises:
        UsageError: if the job fails.
    """
    import tempfile

    from mdtrain.launcher import kill_worker_when, launch

    out = Path(tempfile.mkdtemp(prefix="mdtrain-ps-"))
    args = [*train_args, "--output", str(out / "run"), "--log-every", str(log_every)]
    if kill_worker is not None:
        args += ["--mark-after", str(kill_after or 1), "--mark-file", str(out / "mark")]
        kill_worker_when(out / "mark", kill_worker, timeout_s=hang_timeout_s)
    code = launch(
        num_workers,
        args,
        num_ps=num_ps,
        log_dir=out / "logs",
        stream=stream,
        hang_timeout_s=hang_timeout_s,
    )
    report = out / "run" / "report.json"
    if code != 0 or not report.exists():
        raise UsageError(f"parameter-server job failed with exit code {code}; logs in {out}")
    return json.loads(report.read_text()) | {"exit_code": code}


def _chief(argv: list[str]) -> int:
    import argparse

    from mdtrain.cli import build_parser
    from mdtrain.training import TrainConfig

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--log-every", type=int, default=10,
                       help="steps per point of the loss curve (default: 10)")  # fmt: skip
    extra.add_argument("--mark-after", type=int,
                       help="fault drill: create --mark-file after this many steps")  # fmt: skip
    extra.add_argument("--mark-file", help="fault drill: the file to create")
    ours, rest = extra.parse_known_args(argv)
    if ours.log_every < 1:
        raise UsageError(f"--log-every {ours.log_every}: must be at least 1")
    args = build_parser().parse_args(["train", *rest])
    options = {k: v for k, v in vars(args).items() if k not in ("command", "json")}
    summary = train(
        TrainConfig(**options),
        log_every=ours.log_every,
        mark_after=ours.mark_after,
        mark_file=ours.mark_file,
    )
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m mdtrain.ps serve` (a ps or worker task) or `... chief <train arguments>`."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["serve"]:
            serve()
            return 0
        if argv[:1] == ["chief"]:
            return _chief(argv[1:])
        raise UsageError("usage: python -m mdtrain.ps serve | chief <mdtrain train arguments>")
    except UsageError as error:
        print(f"mdtrain: error: {error}", file=sys.stderr)
        return 2
