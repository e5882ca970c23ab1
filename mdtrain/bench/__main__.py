"""Worker process of `train_benchmark`: `python -m mdtrain.bench CONFIG_JSON` prints its timings."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

from mdtrain.bench.training import train_worker


def _main(argv: Iterable[str]) -> int:
    (config,) = argv
    print(json.dumps(train_worker(json.loads(config))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
