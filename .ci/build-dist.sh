#!/usr/bin/env bash
# Builds mdtrain's wheel and sdist and checks their metadata: the one build step
# that CI (tests/test_wheel.py) and the release workflow (.github/workflows/release.yml) run.
#
#   .ci/build-dist.sh [OUTDIR]      # default: dist/
#
# Needs `build` and `twine` (the `test` extra has both). `python -m build` builds the
# sdist, then the wheel from that sdist in an isolated environment, so the wheel holds
# only what the sdist carries.
set -euo pipefail
out=$(realpath -m "${1:-dist}")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
if compgen -G "$out/mdtrain-*" >/dev/null; then
    echo "build-dist: $out already holds mdtrain files; remove them or pass another folder" >&2
    exit 2
fi
"$PYTHON" -m build --outdir "$out" .
"$PYTHON" -m twine check --strict "$out"/mdtrain-*
