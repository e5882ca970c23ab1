"""Checks for the notebooks' exercises: each says in words what is wrong.

Every numbered notebook ends with exercises. The learner writes code in one
cell; the next cell calls a check from this package, which prints one line
per problem found, or that the answer works. A collapsed solution follows,
and the same check runs on it with ``strict=True``, so CI, which runs every
notebook, fails if a solution stops working.

A check never raises on the learner's answer: an empty or wrong answer prints
what is wrong, and the notebook runs on. One module per notebook
(``mdtrain_course.exercises.nb01`` for notebook 01, ...) holds its checks; each is a
function that gathers the problems as sentences and hands them to `verdict`.

Example:

```python
from mdtrain_course.exercises import nb01

nb01.check_augmentation_model(my_model)  # prints what is wrong, or that it works
```
"""

from __future__ import annotations

from collections.abc import Iterable


class ExerciseError(AssertionError):
    """A worked solution failed its own check (raised only with ``strict=True``)."""


def verdict(exercise: str, problems: Iterable[str], *, strict: bool = False) -> bool:
    """Prints whether an exercise's answer works, and what is wrong when it does not.

    Args:
        exercise: The exercise's short name, as its heading gives it.
        problems: One sentence per problem found; empty when the answer works.
        strict: Raise instead of printing when there is a problem: for the
            worked solutions, which CI runs. Defaults to ``False``.

    Returns:
        ``True`` when there is no problem.

    Raises:
        ExerciseError: With ``strict=True``, when there is a problem.
    """
    problems = [problem for problem in problems if problem]
    if problems and strict:
        raise ExerciseError(f"{exercise}: " + " ".join(problems))
    if not problems:
        print(f"✓ {exercise}: it works.")
        return True
    print(f"✗ {exercise}: not yet.")
    for problem in problems:
        print(f"  - {problem}")
    return False


def not_written(answer: object, what: str) -> list[str]:
    """The one problem of an answer still at its placeholder (``None`` or ``...``)."""
    if answer is None or answer is Ellipsis:
        return [f"{what} is still the placeholder: write it in the cell above."]
    return []
