"""Class weights for imbalanced data: what `--class-weight auto` multiplies into the loss.

Pure Python, no TensorFlow: `mdtrain.training` computes the weights from the
training set's class counts and hands them to `ExactTrainer(class_weights=)`,
which gives them Keras' `fit(class_weight=...)` meaning: each example's loss
is multiplied by its class's weight.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["class_weights_for"]


def class_weights_for(mode: str, counts: Sequence[int]) -> list[float] | None:
    """The class weights `--class-weight MODE` gives a training run.

    `"auto"` weighs class `c` by `n / (k × n_c)`, so that every class carries
    the same total weight: `n` is the number of examples, `k` the number of
    classes and `n_c` the examples of class `c`, whose examples then weigh
    `n / k` in all, as scikit-learn's `compute_class_weight("balanced", ...)`
    computes. A class without examples gets weight 0.

    Args:
        mode: `"auto"` (balanced weights) or `"none"`.
        counts: training examples per class, indexed by label.

    Returns:
        One weight per class, in label order, for `"auto"`; None (no
        weighting) otherwise.

    Example:

    >>> class_weights_for("auto", [30, 10])
    [0.6666666666666666, 2.0]
    >>> class_weights_for("none", [30, 10]) is None
    True
    """
    if mode != "auto":
        return None
    total, k = sum(counts), len(counts)
    return [total / (k * c) if c else 0.0 for c in counts]
