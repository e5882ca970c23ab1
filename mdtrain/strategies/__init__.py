"""Which `tf.distribute` strategies work on this machine, measured: a capability matrix.

`capability_matrix()` runs every strategy the series' articles name on the
same small, fixed data, each in a fresh Python process bounded by a timeout
(so a hang is killed, and each gets its own virtual devices), and returns
one `Row` per strategy:

- does `fit` work (`mdtrain.loop.ExactTrainer.fit`, what `mdtrain train --loop fit` runs)?
- does mdtrain's custom loop work (`mdtrain.loop.custom_fit`; for parameter
  servers the coordinator loop of `mdtrain.ps`)?
- for synchronous strategies: are the final weights those of one device
  (`mdtrain.numerics.compare_with_reference` on `small-cnn`, up to float32
  rounding: below `TOLERANCE`)?
- what one training step costs (median, milliseconds);
- the error text, where something fails or hangs.

Importing this module starts no TensorFlow; only the probes do, each in
its own process. Run one probe by hand with `python -m mdtrain.strategies NAME`.

Modules: `matrix` (the rows, the table, a probe in a fresh process) and
`probes` (what runs in that process).
"""

from __future__ import annotations

from mdtrain.strategies.matrix import (
    HEADER,
    LABELS,
    MODEL,
    NO_TPU,
    PROBES,
    TOLERANCE,
    Row,
    capability_matrix,
    format_matrix,
    probe,
    rows_to_dicts,
)
from mdtrain.strategies.probes import main

__all__ = [
    "HEADER",
    "LABELS",
    "MODEL",
    "NO_TPU",
    "PROBES",
    "TOLERANCE",
    "Row",
    "capability_matrix",
    "format_matrix",
    "main",
    "probe",
    "rows_to_dicts",
]
