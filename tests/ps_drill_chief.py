"""A parameter-server chief for the fault drill: `mdtrain train`, plus `MarkAfter`.

`launch(..., num_ps=M, train_command=[python, this file, STEPS, MARK_FILE])`
runs it as the chief, with the `mdtrain train` arguments after those two.
"""

from __future__ import annotations

import sys

import mdtrain
from mdtrain.cli import config_from_args
from mdtrain_course.drills import MarkAfter

if __name__ == "__main__":
    steps, mark_file, *train_args = sys.argv[1:]
    mdtrain.train(config_from_args(train_args), callbacks=[MarkAfter(int(steps), mark_file)])
