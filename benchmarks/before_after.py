"""Nothing slower on CPU: this package beside an earlier commit's, in the same run.

Two figures a CPU user sees, each measured for both versions in rounds that
alternate which goes first (a change in the machine's load hits both alike):

- `mdtrain train` on the demo data with its defaults but `--epochs`: the
  images/s of its `--json` summary (warm-up excluded) and the process's wall
  time;
- `benchmarks/pipeline.py --repeats 1` of each version on the same 1,500
  JPEGs: mdtrain's input pipeline augmenting (`tfdata`), drawing transforms
  for the model (`tfdata_augment_in_model`, `mdtrain train`'s default), not
  augmenting (`tfdata_noaug`), a cached epoch (`tfdata_cached`), and Keras'
  recipe (`keras_directory_layers`) as the yardstick both share.

The earlier version runs from a temporary git worktree of `--before`, each
measurement in a fresh process with that worktree first on `PYTHONPATH`. The
result holds both versions' medians and spreads and the ratio now/before,
taken round by round.

Usage, from the repository root (about 12 minutes on 2 cores at 3 rounds):

    python benchmarks/before_after.py --before REF [--repeats 3] [--epochs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from _common import REPO, bench_data, check_positive, checkout, last_json, machine_info, run_main

PIPELINE = ("tfdata", "tfdata_augment_in_model", "tfdata_noaug", "tfdata_cached",
            "keras_directory_layers")  # fmt: skip


def _measure(source: Path, data: Path, epochs: int) -> dict[str, float]:
    """One round of one version: the training job's rate and wall time, the pipeline's rates."""
    train, seconds = last_json([sys.executable, "-m", "mdtrain", "train", "--data", str(data),
                                 "--epochs", str(epochs), "--json"], source)  # fmt: skip
    pipeline, _ = last_json([sys.executable, str(source / "benchmarks" / "pipeline.py"),
                              "--repeats", "1", "--json"], source)  # fmt: skip
    return {"train_images_per_sec": train["images_per_sec"], "train_wall_s": seconds,
            **{f"pipeline_{name}": pipeline[name] for name in PIPELINE}}  # fmt: skip


def _summary(runs: dict[str, list[dict]]) -> dict:
    """Per figure: each version's median and spread, and now/before round by round."""
    result = {}
    for figure in runs["now"][0]:
        now, before = ([r[figure] for r in runs[v]] for v in ("now", "before"))
        ratios = [a / b for a, b in zip(now, before, strict=True)]
        result[figure] = {
            "now": round(statistics.median(now), 1),
            "now_spread": [round(min(now), 1), round(max(now), 1)],
            "before": round(statistics.median(before), 1),
            "before_spread": [round(min(before), 1), round(max(before), 1)],
            "now_vs_before": round(statistics.median(ratios), 2),
            "now_vs_before_spread": [round(min(ratios), 2), round(max(ratios), 2)],
        }
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git commit of the earlier package")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, versions alternating")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each training job")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "before_after.json"))
    parser.add_argument("--json", action="store_true", help="last line: the result as JSON")
    args = parser.parse_args(argv)
    check_positive(repeats=args.repeats, epochs=args.epochs)
    from mdtrain.sources import dataset_dir

    data = dataset_dir()  # the demo data, made once by this version: both train on it
    bench_data(None)  # the pipeline's 1,500 JPEGs, likewise
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs: dict[str, list[dict]] = {"now": [], "before": []}
    with checkout(args.before) as before:
        sources = {"now": REPO, "before": before}
        for r in range(args.repeats):
            for version in ("now", "before")[:: 1 if r % 2 == 0 else -1]:
                got = _measure(sources[version], data.resolve(), args.epochs)
                print(f"round {r + 1} {version}: {got}", file=sys.stderr, flush=True)
                runs[version].append(got)
    result = {
        "figures": _summary(runs),
        "runs": runs,
        "setup": {"before": args.before, "repeats": args.repeats, "epochs": args.epochs},
        "load_average_before": load_before,
        "machine": machine_info(),
    }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result) if args.json else json.dumps(result["figures"], indent=1))


if __name__ == "__main__":
    run_main(main)
