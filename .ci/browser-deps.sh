#!/usr/bin/env bash
# Install what tests/test_browser.py needs: Debian's chromium and the playwright
# Python package (its wheel ships the node driver; we never run `playwright
# install`, which downloads browsers). Idempotent and quiet: does nothing when
# both are present. Uses $PYTHON if set, else the python on PATH.
set -euo pipefail

PYTHON="${PYTHON:-python}"

if ! command -v /usr/bin/chromium >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

if ! "$PYTHON" -c "import playwright" >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q playwright
fi
