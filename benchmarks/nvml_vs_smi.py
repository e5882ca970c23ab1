"""mdtrain's NVML sampler beside `nvidia-smi`, on a real GPU, under a known load.

Runs where a GPU is (it needs PyTorch, or any CUDA program, only to make the
load; TensorFlow is not needed): four phases (idle, a half duty cycle of
matrix products, full load, then 8 GiB held while idle), each read at the same
time by `mdtrain.monitor.Sampler` and by `nvidia-smi --query-gpu ... -lms`.
Both readings of each phase are summarised side by side in
`benchmarks/nvml.json`:

    python benchmarks/nvml_vs_smi.py --out benchmarks/nvml.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mdtrain.monitor import Sampler  # noqa: E402

SMI_FIELDS = "timestamp,utilization.gpu,memory.used,power.draw,temperature.gpu"
PHASE_S = 8.0
SETTLE_S = 1.5  # both tools average utilisation over a window; skip each phase's edges


def _load(torch, seconds: float, duty: float, hold_gib: float = 0.0) -> None:
    """Keeps the GPU busy for ``duty`` of every 200 ms for ``seconds``."""
    a = torch.randn(4096, 4096, device="cuda")
    held = (
        torch.empty(int(hold_gib * 2**30), dtype=torch.uint8, device="cuda") if hold_gib else None
    )
    end = time.time() + seconds
    while time.time() < end:
        busy_until = time.time() + 0.2 * duty
        while time.time() < busy_until:
            a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        time.sleep(0.2 * (1 - duty))
    del held


def _smi_rows(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        stamp = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append(
            {
                "time": stamp,
                "utilization": float(parts[1]),
                "memory_mib": float(parts[2]),
                "power_w": float(parts[3]),
                "temperature_c": float(parts[4]),
            }
        )
    return rows


def _summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def _phase(name, start, end, mdtrain_samples, smi_rows) -> dict:
    lo, hi = start + SETTLE_S, end - SETTLE_S
    ours = [s.gpus[0] for s in mdtrain_samples if lo <= s.time <= hi and s.gpus]
    theirs = [r for r in smi_rows if lo <= r["time"] <= hi]
    return {
        "phase": name,
        "mdtrain": {
            "utilization": _summary([d.utilization for d in ours if d.utilization is not None]),
            "memory_mib": _summary(
                [d.memory_used / 2**20 for d in ours if d.memory_used is not None]
            ),
            "power_w": _summary([d.power_w for d in ours if d.power_w is not None]),
            "temperature_c": _summary(
                [d.temperature_c for d in ours if d.temperature_c is not None]
            ),
        },
        "nvidia_smi": {
            key: _summary([r[key] for r in theirs])
            for key in ("utilization", "memory_mib", "power_w", "temperature_c")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/nvml.json"))
    args = parser.parse_args()
    import torch

    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "250"],
        stdout=subprocess.PIPE,
        text=True,
    )
    phases = [("idle", 0.0, 0.0), ("half load", 0.5, 0.0), ("full load", 1.0, 0.0)]
    phases.append(("8 GiB held, idle", 0.0, 8.0))
    bounds = []
    with Sampler(interval_s=0.25, clock=time.time) as sampler:
        time.sleep(2.0)
        for name, duty, hold in phases:
            start = time.time()
            if duty or hold:
                _load(torch, PHASE_S, duty, hold)
            else:
                time.sleep(PHASE_S)
            bounds.append((name, start, time.time()))
        samples = sampler.history()
        gpu_name = sampler.latest().gpus[0].name if sampler.latest().gpus else None
    smi.terminate()
    rows = _smi_rows(smi.communicate()[0])
    result = {
        "gpu": gpu_name,
        "interval_s": 0.25,
        "settle_s": SETTLE_S,
        "phases": [_phase(n, s, e, samples, rows) for n, s, e in bounds],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for phase in result["phases"]:
        ours, theirs = phase["mdtrain"], phase["nvidia_smi"]
        cells = []
        for key in ("utilization", "memory_mib", "power_w"):
            a, b = ours[key], theirs[key]
            cells.append(f"{key} {a and round(a['median'], 1)} vs {b and round(b['median'], 1)}")
        print(f"{phase['phase']:>18}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
