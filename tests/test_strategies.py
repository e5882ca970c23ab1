"""The strategies `mdtrain train` does not offer are refused in one line that points to notebook 09.

Notebook 09 probes them with plain Keras (`CentralStorageStrategy` stops in
Keras' own `BatchNormalization`, `fit` cannot run under parameter servers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mdtrain.choices import STRATEGY_NOTEBOOK, check_strategy_name
from mdtrain.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name, says",
    [
        ("ps", "mdtrain launch --workers N --ps M"),
        ("parameter_server", "mdtrain launch --workers N --ps M"),
        ("central", "use mirrored"),
        ("CentralStorage", "use mirrored"),
        ("horovod", "unknown; choose one of"),
    ],
)
def test_strategies_train_does_not_offer_point_to_notebook_07(name, says):
    with pytest.raises(UsageError) as caught:
        check_strategy_name(name)
    message = str(caught.value)
    assert says in message and STRATEGY_NOTEBOOK in message and "\n" not in message
    assert (ROOT / STRATEGY_NOTEBOOK).exists()
