"""Peak memory and time to the first training step, as the dataset grows.

Runs `mdtrain.training.train` on synthetic datasets of 1,500 and 15,000 training
images (`mdtrain.sources.make_synthetic_dataset`), each run in a fresh
process, and records the process's peak resident memory over one epoch and
the seconds from process start to the end of the first training step:

- `cache none`: streaming (a file-order shuffle of the names, no decoded
  set in memory), first with an empty mdtrain cache folder (the decode check
  scans every file) and then again (the check is remembered);
- `cache memory`: the decoded training set kept in memory (second run);
- `before`: an earlier package (`--before REF`, a git
  commit, run from a temporary worktree): always cached in memory behind a
  dataset-sized shuffle buffer, every file decoded once more to check it.

Usage, from the repository root (about 15 minutes on 2 busy cores):

    python benchmarks/memory.py [--before fa0de91] [--output benchmarks/memory.json]

What to look at: with `cache none`, how much peak memory grows between the two
sizes; with the check remembered, whether the time to the first step grows
with the dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (1500, 15000)
IMAGE_SIZE = 64  # small images and the small CNN: the costs that grow with N stand out


def _worker(config: dict) -> dict:
    """One training run in this process; prints peak memory and time to the first step."""
    import resource

    import keras
    import psutil

    from mdtrain.training import TrainConfig, train

    started = psutil.Process().create_time()
    marks: dict[str, float] = {}

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if "first_step_s" not in marks:
                marks["first_step_s"] = time.time() - started
                # CPU seconds too: on a shared machine wall time says more about the neighbours.
                marks["first_step_cpu_s"] = sum(psutil.Process().cpu_times()[:2])
                marks["rss_first_step_mib"] = psutil.Process().memory_info().rss / 2**20

    cfg = TrainConfig(data=config["data"], model="small-cnn", image_size=IMAGE_SIZE,
                      strategy="one", epochs=1, cache=config["cache"], monitor="none",
                      verbose=0)  # fmt: skip
    result = train(cfg, callbacks=[FirstStep()])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {**marks, "peak_rss_mib": round(peak, 1), "num_train": result.num_train,
            "total_s": round(time.time() - started, 1)}  # fmt: skip


def _run(data: Path, cache: str | bool, cache_dir: Path, source: Path) -> dict:
    env = {**os.environ, "MDTRAIN_CACHE_DIR": str(cache_dir), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(source), "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    config = json.dumps({"data": str(data), "cache": cache})
    out = subprocess.run([sys.executable, __file__, "--worker", config], env=env, cwd=source,
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:  # the worker's own error, not only its exit status
        raise SystemExit(f"run {config} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _dataset(root: Path, n: int) -> Path:
    from mdtrain.sources import make_synthetic_dataset

    path = root / f"synth-{n}"
    if not path.exists():
        make_synthetic_dataset(path, classes=5, per_class=n // 5, image_size=96)
    return path


def _before_tree(ref: str, tmp: Path) -> Path:
    tree = tmp / "before"
    out = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"--before {ref}: {out.stderr.strip()}")
    return tree


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git commit of an earlier package to compare with")
    parser.add_argument("--data-root", default=str(REPO / "data" / "memory-bench"))
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "memory.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))), flush=True)
        return 0
    load = [os.getloadavg()]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        before = _before_tree(args.before, tmp) if args.before else None
        try:
            for n in SIZES:
                data = _dataset(Path(args.data_root), n)
                cache_dir = tmp / f"cache-{n}"  # an empty mdtrain cache folder per size
                runs = {
                    "cache none, first run": _run(data, "none", cache_dir, REPO),
                    "cache none, check remembered": _run(data, "none", cache_dir, REPO),
                    "cache memory, check remembered": _run(data, "memory", cache_dir, REPO),
                }
                if before is not None:
                    runs["before (memory cache, check every run)"] = _run(
                        data, True, cache_dir, before
                    )
                results[str(n)] = runs
                print(n, json.dumps(runs, indent=1), flush=True)
        finally:
            if before is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(before)], check=False)  # fmt: skip
    load.append(os.getloadavg())
    small, large = (results[str(n)] for n in SIZES)
    key = "cache none, check remembered"
    summary = {
        "peak_memory_growth_cache_none": round(
            large[key]["peak_rss_mib"] / small[key]["peak_rss_mib"] - 1, 3
        ),
        "first_step_growth_remembered": round(
            large[key]["first_step_s"] / small[key]["first_step_s"] - 1, 3
        ),
    }
    result = {
        "sizes": list(SIZES),
        "image_size": IMAGE_SIZE,
        "model": "small-cnn",
        "runs": results,
        "summary": summary,
        "goals": {"peak_memory_growth_cache_none": 0.15, "first_step_growth_remembered": 0.15},
        "load_average_1_5_15min": [[round(x, 2) for x in la] for la in load],
        "cpu_count": os.cpu_count(),
    }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    _plot(result, Path(args.output).with_suffix(".png"))
    print(json.dumps(summary))
    return 0


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(next(iter(result["runs"].values())))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(names) + 1.8))
    for ax, metric, label in ((axes[0], "peak_rss_mib", "peak resident memory (MiB)"),
                              (axes[1], "first_step_s", "time to first step (s)")):  # fmt: skip
        height = 0.38
        for i, n in enumerate(result["sizes"]):
            values = [result["runs"][str(n)][k][metric] for k in names]
            ys = [j + (i - 0.5) * height for j in range(len(names))]
            bars = ax.barh(ys, values, height, label=f"{n:,} images")
            ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 10 else f"{v:.1f}" for v in values],
                         fontsize=7, padding=2)  # fmt: skip
        ax.set_yticks(range(len(names)), names if ax is axes[0] else [""] * len(names))
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.spines[["top", "right"]].set_visible(False)
    # Below the panels: inside, the legend would cover the longest bars' labels.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8,
               frameon=False)  # fmt: skip
    fig.suptitle(f"mdtrain train, small CNN at {result['image_size']} px, one epoch", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
