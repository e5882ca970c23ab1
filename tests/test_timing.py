"""`mdtrain_course.timing.time_epochs`: fresh whole epochs, warm-ups, repeats interleaved."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from mdtrain_course.timing import time_epochs


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
    # Each warms up right before its first timing, then the repeats take turns.
    assert log == ["a", "a", "b", "b", "a", "b"]
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


def test_a_function_makes_a_fresh_pipeline_for_every_epoch_its_warm_up_included():
    log = []
    made = []

    def make():
        made.append(len(made))
        return Epochs("made", log)

    time_epochs({"fresh": make}, repeats=3)
    assert made == [0, 1, 2, 3] and log == ["made"] * 4  # one warm-up, three timings


def test_a_pipeline_can_warm_up_on_another_iterable_a_function_or_nothing():
    log, called = [], []
    pipelines = {name: Epochs(name, log) for name in ("epoch0", "call", "none", "own")}
    warmup = {"epoch0": Epochs("epoch0 warm-up", log), "call": lambda: called.append(1),
              "none": None}  # fmt: skip
    time_epochs(pipelines, repeats=2, warmup=warmup)
    assert called == [1]
    assert log == ["epoch0 warm-up", "epoch0", "call", "none", "own", "own",
                   "epoch0", "call", "none", "own"]  # fmt: skip
    with pytest.raises(ValueError, match="warmup names no pipeline: typo"):
        time_epochs(pipelines, warmup={"typo": None})


def test_warm_ups_are_capped_at_batches_and_run_the_step():
    seen = []
    endless = itertools.repeat((np.zeros((2, 1)), np.zeros(2)))
    time_epochs({"a": Epochs("a", [])}, repeats=1, batches=2, warmup={"a": endless},
                step=lambda batch: seen.append(len(batch[0])))  # fmt: skip
    assert seen == [2, 2, 4, 4]  # two warm-up batches of 2 images, then the timed two of 4
