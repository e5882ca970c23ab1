"""What each task of a parameter-server job runs: `python -m mdtrain.ps serve | chief <args>`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import keras

from mdtrain import cli
from mdtrain.config import TrainConfig
from mdtrain.errors import USAGE_EXIT_CODE, UsageError
from mdtrain.ps import serve


class MarkAfter(keras.callbacks.Callback):
    """The fault drill: creates `mark_file` once `steps` steps are done.

    A launcher may kill a worker then (`mdtrain.launcher.kill_worker_when`).
    """

    def __init__(self, steps: int, mark_file: str):
        super().__init__()
        self.steps, self.mark_file, self._epoch = steps, Path(mark_file), 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        done = self._epoch * self.params["steps"] + batch + 1
        if done >= self.steps and not self.mark_file.exists():
            self.mark_file.touch()
            print(f"step {done}: drill mark written", flush=True)


def _chief(argv: list[str]) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--log-every", type=int, default=TrainConfig.log_every,
                       help="steps per point of the loss curve")  # fmt: skip
    extra.add_argument("--mark-after", type=int,
                       help="fault drill: create --mark-file after this many steps")  # fmt: skip
    extra.add_argument("--mark-file", help="fault drill: the file to create")
    ours, rest = extra.parse_known_args(argv)
    args = cli.build_parser().parse_args(["train", *rest])
    args.strategy, args.log_every = "ps", ours.log_every
    drill = ours.mark_after is not None and ours.mark_file
    return cli.run_train(args, [MarkAfter(ours.mark_after, ours.mark_file)] if drill else None)


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
        print(f"mdtrain: error: {error.as_option()}", file=sys.stderr)
        return USAGE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
