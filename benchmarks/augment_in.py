"""Training throughput on CPU replicas: augmenting in the pipeline, in the model, or not at all.

`mdtrain train --augment-in auto` augments in the training step (the model)
on every kind of replica. On GPUs that takes the warp off the CPU; this
measures what it costs where the step and the input pipeline share the same
cores, and what augmentation costs a CPU run at all (`--no-augment`). Each
run is `mdtrain train --json` in a fresh process (2 CPU replicas, the demo
data, the small CNN, 2 epochs), at 32 px (the main job: a cheap step) and
at 128 px (a costlier warp, and a far costlier step); the variants are
interleaved, 3 repeats; `images_per_sec` is the monitor's training rate.

Usage, from the repository root (about 30 minutes on 2 cores):

    python benchmarks/augment_in.py [--output benchmarks/augment_in.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLACES = ("pipeline", "model", "none")  # none: --no-augment
SIZES = (32, 128)
TRAIN_ARGS = ["--strategy", "cpu:2", "--epochs", "2", "--monitor", "none"]


def _images_per_sec(size: int, place: str) -> float:
    augment = ["--no-augment"] if place == "none" else ["--augment-in", place]
    command = [sys.executable, "-m", "mdtrain", "train", *TRAIN_ARGS, "--image-size", str(size),
               *augment]  # fmt: skip
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])["images_per_sec"]


def main() -> None:
    from _common import machine_info, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "augment_in.json"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    variants = [(size, place) for size in SIZES for place in PLACES]
    runs: dict[str, list[float]] = {f"{place}_{size}": [] for size, place in variants}
    for _ in range(args.repeats):
        for size, place in variants:  # interleaved: each repeat runs all, one after another
            runs[f"{place}_{size}"].append(_images_per_sec(size, place))
    result = {
        **{name: round(statistics.median(rates), 1) for name, rates in runs.items()},
        "spread": {name: [min(rates), max(rates)] for name, rates in runs.items()},
        "runs": runs,
        "ratios": {
            f"{a}_vs_{b}_{size}": _ratio(runs[f"{a}_{size}"], runs[f"{b}_{size}"])
            for size in SIZES
            for a, b in (("model", "pipeline"), ("model", "none"), ("pipeline", "none"))
        },
        "train_args": TRAIN_ARGS,
        "load_average_before": load_before,
        "machine": machine_info(),
    }
    bars = {_label(size, place): result[f"{place}_{size}"] for size, place in variants}
    write_result(result, args.output, "augment_in", bars, None,
                 "small CNN, 2 CPU replicas: training images/s")  # fmt: skip
    print(json.dumps(result))


def _label(size: int, place: str) -> str:
    return f"{size} px, " + ("no augmentation" if place == "none" else f"augment in the {place}")


def _ratio(numerators: list[float], denominators: list[float]) -> dict[str, float]:
    """Median, min and max of the repeat-by-repeat ratios."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    return {"median": round(statistics.median(ratios), 2), "min": round(min(ratios), 2),
            "max": round(max(ratios), 2)}  # fmt: skip


if __name__ == "__main__":
    main()
