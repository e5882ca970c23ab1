"""A line of progress when an epoch runs long, so that a launcher can tell slow from stuck.

Why (`mdtrain launch --hang-timeout`): docs/multi-worker.md, "Fault tolerance".
"""

from __future__ import annotations

import os
import time

import keras

#: The environment variable a launcher sets to the most seconds between two lines.
HEARTBEAT_ENV = "MDTRAIN_HEARTBEAT_S"


class Heartbeat(keras.callbacks.Callback):
    """Prints `epoch E: step S/N` once `every_s` seconds have passed without a line."""

    def __init__(self, every_s: float, clock=time.monotonic):
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._epoch = 0
        self._last = clock()  # when the last line was printed

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._last = self._clock()

    def on_train_batch_end(self, batch, logs=None):
        self._beat(f"step {batch + 1}/{self.params.get('steps') or '?'}")

    def on_test_batch_end(self, batch, logs=None):
        self._beat(f"validation step {batch + 1}")

    def on_epoch_end(self, epoch, logs=None):
        self._last = self._clock()  # Keras prints the epoch's line now

    def _beat(self, where: str) -> None:
        now = self._clock()
        if now - self._last >= self.every_s:
            print(f"epoch {self._epoch + 1}: {where}", flush=True)
            self._last = now


def heartbeat_from_env() -> list[Heartbeat]:
    """`[Heartbeat(...)]` when a launcher asked for one (`MDTRAIN_HEARTBEAT_S`), else `[]`."""
    every = os.environ.get(HEARTBEAT_ENV)
    return [Heartbeat(float(every))] if every else []
