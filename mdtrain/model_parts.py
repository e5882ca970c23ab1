"""What every classifier shares: the softmax head, and weights given by name or file.

Both `models` and `lite0` build on these, so neither imports the other for them:
`models` uses `lite0`, never the reverse.
"""

from __future__ import annotations

import os
import warnings

import keras
from keras import layers

from mdtrain.errors import UsageError


def classification_head(features, num_classes: int, dropout: float, name: str = "head", dtype=None):
    """Dropout and a dense layer of dtype policy `dtype`, then the softmax `probabilities`."""
    dtype = keras.dtype_policies.get(dtype)
    if dropout:
        features = layers.Dropout(dropout, name=f"{name}_dropout", dtype=dtype)(features)
    logits = layers.Dense(num_classes, name=f"{name}_dense", dtype=dtype)(features)
    # float16 would lose small probabilities; float64 in `tests/numerics_harness.py`.
    softmax_dtype = "float64" if dtype.compute_dtype == "float64" else "float32"
    return layers.Activation("softmax", dtype=softmax_dtype, name="probabilities")(logits)


def resolve_weights(weights: str | None, file_kind: str) -> str | None:
    """`weights` as None, `"imagenet"` or the path of a file that exists (else a UsageError)."""
    if weights in (None, "none", "None"):
        return None
    if weights != "imagenet" and not os.path.isfile(weights):
        raise UsageError(
            f"--weights {weights}: no such file; pass imagenet, none, or the path of {file_kind}"
        )
    return weights


def load_weights_file(model: keras.Model, path: str, name: str) -> None:
    """`model.load_weights(path)`, with one line for a file that does not fit."""
    # Keras' error lists every layer (99 lines for Lite0) after a warning for each
    # ("Skipping variable loading ..."): keep its first line, and the warnings if it loads.
    with warnings.catch_warnings(record=True) as caught:
        try:
            model.load_weights(path)
        except Exception as error:  # Keras raises several types for a file that does not fit
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UsageError(
                f"--weights {path}: cannot be loaded into {name} ({first_line})"
            ) from None
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
