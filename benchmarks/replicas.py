"""Plain Keras `fit` vs `mdtrain train` (default and `--strategy one`) on the main job.

Runs only the comparison part of `mdtrain bench train` (`mdtrain.bench.replicas`)
and stores it as `vs_keras_fit` in `benchmarks/train.json`, keeping the
input-bound figures already there, then redraws `benchmarks/train.png`.

Usage, from the repository root:

    python benchmarks/replicas.py [--repeats 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mdtrain.bench.common import bench_data, machine_info, write_result
from mdtrain.bench.replicas import VARIANTS, replica_benchmark

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved rounds of the comparison (default: 3)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per run, the first not timed (default: 3)")  # fmt: skip
    parser.add_argument("--redraw", action="store_true",
                        help="redraw train.png from train.json (default: measure)")  # fmt: skip
    args = parser.parse_args()
    result = json.loads((HERE / "train.json").read_text())
    if not args.redraw:
        start = time.perf_counter()
        versus = replica_benchmark(str(bench_data(None)), args.repeats, args.epochs)
        versus["seconds"] = round(time.perf_counter() - start, 1)
        versus["machine"] = machine_info()  # the load average when the comparison ended
        result["vs_keras_fit"] = versus
    write_result(result, HERE, "train", _bars(result), None, "Training, images per second")
    print(json.dumps(result["vs_keras_fit"]["ratios"]))


def _bars(result: dict) -> dict[str, float]:
    """The input-bound figures (EfficientNetV2 steps), then the main job's three variants."""
    versus, model = result["vs_keras_fit"], f"{result['model']} {result['image_size']} px"
    size = versus["workload"]["image_size"]
    return {
        f"{model}: real pipeline, 1 replica": result["images_per_sec_real_pipeline"],
        f"{model}: cached batch, 1 replica": result["images_per_sec_cached_batch"],
        f"{model}: cached batch, 2 CPU replicas": round(
            result["batch_size"] / result["step_s_2_replicas"], 1
        ),
        **{
            f"small-cnn {size} px: {VARIANTS[k]}": versus[k]["images_per_sec"]["median"]
            for k in VARIANTS
        },
    }


if __name__ == "__main__":
    main()
