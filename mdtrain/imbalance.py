"""Class weights for imbalanced data: what `--class-weight auto` multiplies into the loss.

Pure Python, no TensorFlow; `ExactTrainer(class_weights=)` gives them Keras'
`fit(class_weight=...)` meaning.
"""

from __future__ import annotations

from collections.abc import Sequence


def class_weights_for(mode: str, counts: Sequence[int]) -> list[float] | None:
    """The class weights of `--class-weight MODE`, or None for `"none"`."""
    # "auto": `n / (k × n_c)` (scikit-learn's "balanced"), each class the same total weight.
    if mode != "auto":
        return None
    total, num_classes = sum(counts), len(counts)
    return [total / (num_classes * count) if count else 0.0 for count in counts]
