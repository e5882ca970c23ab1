#!/usr/bin/env bash
# Reruns the committed input-pipeline and training benchmarks:
# benchmarks/pipeline.{json,png} and benchmarks/train.{json,png}.
# Usage, from anywhere: benchmarks/run.sh   (about 15 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
uptime
"$PYTHON" -m mdtrain bench pipeline --output benchmarks --json
"$PYTHON" -m mdtrain bench train --output benchmarks --json
uptime
