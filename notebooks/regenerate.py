"""Re-runs notebooks for real (not smoke) and scrubs their outputs, ready to commit.

Usage (from anywhere):

    python notebooks/regenerate.py                 # every notebooks/NN_*.ipynb
    python notebooks/regenerate.py 01_load_and_augment.ipynb 04_exact_uneven_batches.ipynb

Each notebook runs top to bottom in a fresh `python3` kernel with cwd
`notebooks/` and `MDTRAIN_SMOKE` unset, and is written back in place. A cell
that raises stops everything with the error (the notebook file is left
untouched). Outputs are then scrubbed: absolute paths of the repository, the
home and temporary directories become relative or `~`/`<tmp>`, the user and
host names disappear, execution timestamps and widget state are dropped.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent
REPO = NOTEBOOKS.parent


def _replacements() -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) pairs, most specific first."""
    pairs: list[tuple[str, str]] = [
        (str(NOTEBOOKS) + os.sep, ""),
        (str(NOTEBOOKS), "."),
        (str(REPO) + os.sep, "../"),
        (str(REPO), ".."),
    ]
    for prefix in (sys.prefix, sys.base_prefix):  # site-packages paths in tracebacks
        pairs.append((str(Path(prefix)) + os.sep, "<python>/"))
    home = str(Path.home())
    if home not in ("/", ""):
        pairs.append((home, "~"))
    for tmp in {tempfile.gettempdir(), "/tmp", "/var/tmp"}:
        pairs.append((tmp.rstrip("/") + "/", "<tmp>/"))
    patterns = [(re.compile(re.escape(old)), new) for old, new in pairs]
    for name in {getpass.getuser(), socket.gethostname()}:
        if len(name) >= 3 and name not in ("root", "python", "localhost"):
            patterns.append((re.compile(rf"\b{re.escape(name)}\b"), "<name>"))
    return patterns


def scrub_text(text: str, patterns=None) -> str:
    """Replaces machine-specific paths and names in `text`."""
    for pattern, new in patterns or _replacements():
        text = pattern.sub(new, text)
    return text


# TensorFlow's start-up and per-trace chatter (C++ logs, INFO logs): noise in a lesson.
_TF_LOG_LINE = re.compile(
    r"^([IWE]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl|"
    r"To enable the following instructions:|INFO:tensorflow:|"
    r"WARNING:tensorflow:\d+ out of the last \d+ calls to .* triggered tf.function retracing).*\n?",
    re.M,
)


_WIDGET = "application/vnd.jupyter.widget-view+json"


def _scrub_value(value, patterns):
    if isinstance(value, str):
        return scrub_text(value, patterns)
    if isinstance(value, list):
        return [_scrub_value(v, patterns) for v in value]
    if isinstance(value, dict):
        return {k: _scrub_value(v, patterns) for k, v in value.items()}
    return value


def scrub_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Removes paths, names, timestamps, widget views and state from a notebook's outputs."""
    patterns = _replacements()
    nb.metadata.pop("widgets", None)  # live widget state: meaningless once the kernel is gone
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps
        if cell.cell_type != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            if _WIDGET in output.get("data", {}):
                continue  # a live widget without its state renders as an error; its summary follows
            if output.get("output_type") == "stream":
                output["text"] = _TF_LOG_LINE.sub("", output["text"])
                if not output["text"].strip():
                    continue
            outputs.append(output)
        cell["outputs"] = outputs
        for output in outputs:
            if "text" in output:
                output["text"] = scrub_text(output["text"], patterns)
            if "traceback" in output:
                output["traceback"] = _scrub_value(output["traceback"], patterns)
            data = output.get("data", {})
            for mime in list(data):
                if mime.startswith("text/") or mime == "application/json":
                    data[mime] = _scrub_value(data[mime], patterns)
    return nb


def run_notebook(path: Path, timeout: int = 3600) -> float:
    """Executes `path` for real, scrubs it and writes it back; returns seconds taken."""
    nb = nbformat.read(path, as_version=4)
    env_smoke = os.environ.pop("MDTRAIN_SMOKE", None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the kernel inherits it
    start = time.perf_counter()
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(NOTEBOOKS)}},
            record_timing=False,
        ).execute()  # raises CellExecutionError on the first failing cell
    finally:
        if env_smoke is not None:
            os.environ["MDTRAIN_SMOKE"] = env_smoke
    seconds = time.perf_counter() - start
    nbformat.write(scrub_notebook(nb), path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files (default: all NN_*.ipynb)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.notebooks] or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    paths = [p if p.is_absolute() or p.exists() else NOTEBOOKS / p for p in paths]
    for path in paths:
        print(f"running {path.name} ...", flush=True)
        seconds = run_notebook(path.resolve(), args.timeout)
        print(f"  {path.name}: {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
