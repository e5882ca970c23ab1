"""`mdtrain.timing.time_epochs`: whole epochs from fresh iterators, repeats interleaved."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from mdtrain.timing import time_epochs


class Epochs:
    """An iterable whose every `iter()` is a fresh epoch of `batches` batches; logs who ran."""

    def __init__(self, name, log, batches=3, size=4):
        self.name, self.log, self.batches, self.size = name, log, batches, size

    def __iter__(self):
        self.log.append(self.name)
        return iter([(np.zeros((self.size, 2)), np.zeros(self.size))] * self.batches)


def test_every_timing_is_a_fresh_whole_epoch_after_one_untimed_epoch_interleaved():
    log = []
    result = time_epochs({"a": Epochs("a", log), "b": Epochs("b", log)}, repeats=2)
    assert log == ["a", "b", "a", "b", "a", "b"]  # warm-up, then the repeats taking turns
    assert list(result) == ["a", "b"]
    for timing in result.values():
        assert len(timing["runs"]) == 2
        assert timing["min"] <= timing["median"] <= timing["max"]


def test_batches_bounds_an_endless_iterator_and_bare_image_batches_count():
    endless = itertools.repeat(np.zeros((5, 8, 8, 3)))  # like flow_from_directory: never ends
    result = time_epochs({"endless": endless}, repeats=1, batches=2, warmup=False)
    assert result["endless"]["median"] > 0


def test_bad_settings_and_empty_pipelines_are_refused():
    with pytest.raises(ValueError, match="repeats=0"):
        time_epochs({"a": []}, repeats=0)
    with pytest.raises(ValueError, match="no batches"):
        time_epochs({"a": []}, repeats=1)


def test_the_step_runs_on_every_batch_and_its_time_counts():
    seen = []

    def step(batch):
        seen.append(len(batch[0]))
        time.sleep(0.05)

    slow = time_epochs({"a": Epochs("a", [], batches=3)}, repeats=1, warmup=False, step=step)
    assert seen == [4, 4, 4]
    assert slow["a"]["median"] < 12 / 0.15  # 12 images took at least 3 steps of 50 ms
