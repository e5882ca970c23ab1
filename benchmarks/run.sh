#!/usr/bin/env bash
# Reruns the committed benchmarks: benchmarks/pipeline.{json,png} (input pipelines, side by
# side), benchmarks/memory.{json,png} (peak memory and time to the first step at 1,500 and
# 15,000 images), benchmarks/train.{json,png} (is training input-bound?) and
# benchmarks/augment_in.{json,png} (augmenting in the pipeline or the model, CPU replicas).
# Usage, from anywhere: benchmarks/run.sh   (about an hour on 2 busy cores)
# BEFORE=<git commit> also measures the package at that commit in benchmarks/memory.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
uptime
"$PYTHON" benchmarks/pipeline.py --output benchmarks --json
uptime
"$PYTHON" benchmarks/memory.py ${BEFORE:+--before "$BEFORE"}
uptime
"$PYTHON" benchmarks/train.py --output benchmarks --json
uptime
"$PYTHON" benchmarks/augment_in.py
uptime
