"""Notebook 02's exercise: a tf.data pipeline with parallel decoding and prefetch.

Example:

```python
from mdtrain_course.exercises import nb02

nb02.check_input_pipeline(fast_ds, global_batch_size=32)  # prints what is wrong, or that it works
```
"""

from __future__ import annotations

import numpy as np

from mdtrain_course.exercises import not_written, verdict


def _stages(ds) -> list[str]:
    from mdtrain.compat import dataset_stages

    return dataset_stages(ds)


def _stage_problems(stages: list[str]) -> list[str]:
    problems = []
    if "MapDataset" in stages:
        problems.append(
            "a `map` runs one element at a time: give it `num_parallel_calls=AUTOTUNE`."
        )
    elif not any(stage.startswith("ParallelMap") for stage in stages):
        problems.append("nothing decodes the files: `map` your decode function over them.")
    if not any(stage.startswith("Batch") or stage.startswith("ParallelBatch") for stage in stages):
        problems.append("the images are not batched: add `.batch(global_batch_size)`.")
    if "PrefetchDataset" not in stages:
        problems.append("there is no `prefetch`: end the pipeline with `.prefetch(AUTOTUNE)`.")
    elif not set(stages[stages.index("PrefetchDataset") + 1 :]) <= {"OptionsDataset"}:
        after = [s for s in stages[stages.index("PrefetchDataset") + 1 :] if s != "OptionsDataset"]
        problems.append(f"`prefetch` comes before {', '.join(after)}: put it last.")
    return problems


def _batch_problems(ds, global_batch_size: int, image_size: int | None) -> list[str]:
    try:
        element = next(iter(ds))
    except Exception as error:  # the learner's code: say what it raised
        return [f"reading a batch from it raised {type(error).__name__}: {error}"]
    if not isinstance(element, tuple) or len(element) != 2:
        return ["its elements are not `(images, labels)` pairs."]
    images, labels = (np.asarray(part) for part in element)
    expected = (global_batch_size, image_size, image_size, 3)
    problems = []
    if images.ndim != 4 or (image_size and images.shape[1:] != expected[1:]):
        problems.append(f"a batch of images is {images.shape}, not (batch, *{expected[1:]}).")
    elif images.shape[0] != global_batch_size:
        problems.append(f"a batch holds {images.shape[0]} images, not {global_batch_size}.")
    if images.dtype != np.uint8:
        problems.append(f"the images are {images.dtype}: keep them uint8 until the model.")
    if labels.shape[:1] != images.shape[:1]:
        problems.append(f"{labels.shape[0]} labels for {images.shape[0]} images.")
    return problems


def check_input_pipeline(
    ds, *, global_batch_size: int, image_size: int | None = None, strict: bool = False
) -> bool:
    """Checks a tf.data input pipeline for the stages that make it fast.

    The pipeline must decode in a parallel `map`, batch by `global_batch_size`,
    end with `prefetch`, and give `(images, labels)` batches of `uint8` images.
    The stages are read from the dataset's graph (`mdtrain.compat.dataset_stages`),
    as the learner wrote them, before tf.data's own optimizations.

    Args:
        ds: The learner's `tf.data.Dataset`, or the placeholder `None`.
        global_batch_size: The batch size it must give.
        image_size: The side of its square images; `None` accepts any.
            Defaults to None.
        strict: Raise instead of printing (the worked solution). Defaults to False.

    Returns:
        `True` when the pipeline has all of that.

    Raises:
        ExerciseError: With `strict=True`, when it does not.

    Example:

    ```python
    nb02.check_input_pipeline(names_ds.map(decode).batch(32), global_batch_size=32)
    ```
    """
    title = "Exercise 1, a pipeline that beats ImageDataGenerator"
    problems = not_written(ds, "the pipeline")
    if not problems and not hasattr(ds, "element_spec"):
        problems = [f"the pipeline is a {type(ds).__name__}, not a tf.data.Dataset."]
    if not problems:
        problems = _stage_problems(_stages(ds)) + _batch_problems(ds, global_batch_size, image_size)
    return verdict(title, problems, strict=strict)


def compare_with(ds, baseline, *, batches: int, repeats: int = 1) -> dict[str, float]:
    """Times `ds` beside `baseline` (e.g. ImageDataGenerator) and prints the ratio.

    Nothing is asserted: the figure is for the learner, measured on their machine.

    Args:
        ds: The learner's pipeline.
        baseline: The pipeline to beat, an iterable of batches.
        batches: Batches timed per epoch of each.
        repeats: Timed epochs of each, interleaved. Defaults to 1.

    Returns:
        `{"yours": images/s, "baseline": images/s}`, medians.

    Example:

    ```python
    nb02.compare_with(fast_ds, idg_batches, batches=10)
    ```
    """
    from mdtrain_course.timing import time_epochs

    timings = time_epochs({"yours": ds, "baseline": baseline}, repeats=repeats, batches=batches)
    rates = {name: timing["median"] for name, timing in timings.items()}
    print(
        f"your pipeline: {rates['yours']:.0f} images/s, the baseline {rates['baseline']:.0f}: "
        f"{rates['yours'] / rates['baseline']:.1f}x"
    )
    return rates
