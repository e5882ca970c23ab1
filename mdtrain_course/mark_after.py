"""The fault drill's Keras half, `MarkAfter`: import it from `mdtrain_course.drills`."""

from __future__ import annotations

import os
from pathlib import Path

import keras


class MarkAfter(keras.callbacks.Callback):
    """A fault drill's signal: creates `mark_file` once `steps` training steps have run.

    The other half of `kill_worker_when(mark_file, worker)`, which kills a
    worker when the file appears: a drill kills it at a known step, not at a
    moment of the clock. It prints `step N: drill mark written`
    once. Give it to the run that counts the steps, the chief's, through
    `train`'s callbacks; the chief's own program is `launch`'s
    `train_command`.

    Args:
        steps: training steps, counted over the epochs, after which to mark.
        mark_file: the file to create.

    Example:

    >>> # the chief's script, given as mdtrain.launch(..., train_command=[python, script]):
    >>> config = mdtrain.cli.config_from_args(sys.argv[1:])  # doctest: +SKIP
    >>> mdtrain.train(config, callbacks=[MarkAfter(100, "kill-now")])  # doctest: +SKIP
    """

    def __init__(self, steps: int, mark_file: str | os.PathLike):
        super().__init__()
        self.steps = steps
        self.mark_file = Path(mark_file)
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        steps_done = self._epoch * self.params["steps"] + batch + 1
        if steps_done >= self.steps and not self.mark_file.exists():
            self.mark_file.touch()
            print(f"step {steps_done}: drill mark written", flush=True)
