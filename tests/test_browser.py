"""The dashboard renders in a real JupyterLab, driven by headless Chromium.

Starts JupyterLab on 127.0.0.1 (random free port, random token) in a temp
folder holding a notebook that trains a tiny Keras model with the dashboard,
runs all cells through the JupyterLab menu, and waits for the widget to show a
non-zero images/sec, then for the run's end: the widget's figures and verdict,
and below it the chart as a plain image (the picture a saved notebook keeps).
Needs Debian's chromium and the playwright package (.ci/browser-deps.sh
installs both); skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
NOTEBOOK = "browser_notebook.ipynb"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

# The notebook: 3 epochs x 20 steps, a 40 ms pause per step so the
# dashboard lives for a few seconds. display="widget" is forced because CI sets
# MDTRAIN_SMOKE=1, which would otherwise choose the text fallback.
CELLS = [
    "import time\nimport numpy as np\nimport keras\nfrom mdtrain.monitor import make_monitor",
    "x = np.random.default_rng(0).random((640, 16, 16, 3), dtype='float32')\n"
    "y = np.arange(640) % 4\n"
    "model = keras.Sequential([\n"
    "    keras.Input((16, 16, 3)),\n"
    "    keras.layers.Conv2D(8, 3, activation='relu'),\n"
    "    keras.layers.GlobalAveragePooling2D(),\n"
    "    keras.layers.Dense(4),\n"
    "])\n"
    "model.compile('adam', keras.losses.SparseCategoricalCrossentropy(from_logits=True))\n"
    "pause = keras.callbacks.LambdaCallback(\n"
    "    on_train_batch_end=lambda batch, logs: time.sleep(0.04))",
    "monitor = make_monitor(32, epochs=3, display='widget', interval_s=0.2)\n"
    "model.fit(x, y, batch_size=32, epochs=3, callbacks=[monitor, pause], verbose=0)",
    "print('MONITOR-DONE', round(monitor.summary().images_per_sec, 1))",
]


def _notebook() -> dict:
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [
            {
                "cell_type": "code",
                "id": f"cell{i}",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": src,
            }
            for i, src in enumerate(CELLS)
        ],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer {url} within {timeout_s:.0f} s")


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server in tmp_path/root; yields (base URL, token); always killed."""
    root = tmp_path / "root"
    root.mkdir()
    (root / NOTEBOOK).write_text(json.dumps(_notebook()))
    _write_lab_settings(tmp_path / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        # Fresh settings and workspace: no saved layout, no news pop-up.
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--ServerApp.terminals_enabled=False",
    ]  # fmt: skip
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyterlab.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", proc, timeout_s=60)
        yield base, token
    finally:
        # The kernel is a child of the server: kill the whole process group.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        log.close()


def _require_browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: run .ci/browser-deps.sh (apt-get install chromium)")
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} is not executable")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: run .ci/browser-deps.sh (pip install playwright)")
    return sync_playwright


def _write_lab_settings(settings: Path) -> None:
    """Start the notebook's kernel without asking, and no news pop-up over the page."""
    for plugin, values in {
        "notebook-extension/tracker": {"autoStartDefaultKernel": True},
        "apputils-extension/notification": {"fetchNews": "false"},
    }.items():
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _accept_kernel_dialog(page) -> None:
    """If JupyterLab still asks which kernel to start, take the preferred one."""
    button = page.locator(".jp-Dialog .jp-mod-accept")
    try:
        button.wait_for(state="visible", timeout=3_000)
    except Exception:
        return
    button.click()


def _run_all_cells(page) -> None:
    """Run > Run All Cells through the menu bar, as a user would."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(timeout=30_000)
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click(
        timeout=10_000
    )


@pytest.fixture
def sync_playwright():
    """Playwright's entry point, or a skip saying what to install (before any server starts)."""
    return _require_browser()


def test_dashboard_renders_in_jupyterlab(sync_playwright, jupyterlab, tmp_path):
    base, token = jupyterlab
    screenshot = tmp_path / "dashboard.png"
    with sync_playwright() as pw:
        # A persistent context is how playwright takes a fresh --user-data-dir.
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            timeout=60_000,
            viewport={"width": 1280, "height": 1400},
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}&reset", timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            _accept_kernel_dialog(page)
            _run_all_cells(page)
            rate = page.locator(".mdtrain-images-per-sec")
            rate.first.wait_for(state="visible", timeout=60_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll('.mdtrain-images-per-sec')]"
                ".some(e => parseFloat(e.textContent) > 0)",
                timeout=90_000,
            )
            text = rate.first.inner_text()
            # Let training finish so the screenshot shows the chart and verdict.
            done = page.locator(".jp-OutputArea-output", has_text="MONITOR-DONE")
            done.first.wait_for(timeout=90_000)
            final = page.locator(".mdtrain-monitor", has_text="verdict")
            final.first.wait_for(timeout=10_000)
            done_text = done.first.inner_text().strip()
            widget_text = final.first.inner_text()
            picture = page.locator(".jp-RenderedImage img")  # an image/png output, not a widget
            picture.first.wait_for(timeout=10_000)
            picture_width = picture.first.evaluate("img => img.naturalWidth")
            summary = page.locator(".jp-OutputArea-output", has_text="mdtrain monitor:")
            summary.first.wait_for(timeout=10_000)
            page.locator(".mdtrain-monitor").first.scroll_into_view_if_needed()
            page.screenshot(path=str(screenshot), full_page=True)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    value = float(re.search(r"[\d.]+", text).group())
    assert value > 0, text
    assert "images/sec" in text
    assert screenshot.stat().st_size > 10_000
    assert float(done_text.split()[-1]) > 0, done_text
    for shown in ("CPU", "util", "images/sec", "step ", "input wait", "verdict:", "done"):
        assert shown in widget_text, (shown, widget_text)
    assert picture_width == 800  # the chart at 100 dpi, below the widget
    print(f"images/sec shown: {value}; screenshot: {screenshot}")
