"""A parameter-server job's processes: what each task runs.

`python -m mdtrain.ps serve` runs a ps or worker task, `python -m mdtrain.ps
chief <train arguments>` the chief (`main`); `mdtrain launch --workers N --ps M`
(`mdtrain.launch(N, args, num_ps=M)`) starts them.
"""

from __future__ import annotations

import json
import sys

from mdtrain.errors import UsageError
from mdtrain.ps.cluster import serve
from mdtrain.ps.training import train


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
