"""Training histories as rows: one dict of metrics per epoch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def history_rows(history) -> list[dict[str, float]]:
    """One dict of metrics per epoch, from a Keras `History`, its `.history` dict or a row list."""
    columns = getattr(history, "history", history)
    if isinstance(columns, Sequence):
        return [dict(row) for row in columns]
    if not isinstance(columns, Mapping):
        raise TypeError(f"not a training history: {type(history).__name__}")
    epochs = len(next(iter(columns.values()), []))
    return [
        {name: float(values[epoch]) for name, values in columns.items()} for epoch in range(epochs)
    ]
