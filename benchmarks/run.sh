#!/usr/bin/env bash
# Reruns the committed benchmarks: benchmarks/pipeline.{json,png} (input pipelines, side by
# side), benchmarks/memory.{json,png} (peak memory and time to the first step at 1,500 and
# 15,000 images) and benchmarks/train.{json,png} (is training input-bound?).
# Usage, from anywhere: benchmarks/run.sh   (about 45 minutes on 2 busy cores)
# BEFORE=<git commit> also measures the package at that commit in benchmarks/memory.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
uptime
"$PYTHON" -m mdtrain bench pipeline --output benchmarks --json
uptime
"$PYTHON" benchmarks/memory.py ${BEFORE:+--before "$BEFORE"}
uptime
"$PYTHON" -m mdtrain bench train --output benchmarks --json
uptime
