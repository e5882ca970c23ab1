"""Every committed notebook follows the series' conventions (docs/DESIGN.md, Notebooks).

Checks the files only; running them is nbval's job (`pytest --nbval-lax notebooks/`).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>-])/(work|home|tmp|root|Users|private/var)/")
MAX_IMAGE_BYTES = 200_000


def _ids(path: Path) -> str:
    return path.name


def _output_texts(cell) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            texts.append(output["text"])
        texts += output.get("traceback", [])
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/") or mime == "application/json":
                texts.append(value if isinstance(value, str) else str(value))
    return texts


@pytest.fixture(params=NOTEBOOKS, ids=_ids)
def notebook(request):
    return nbformat.read(request.param, as_version=4)


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


def test_header_cell(notebook):
    first = notebook.cells[0]
    assert first.cell_type == "markdown", "the first cell must be markdown"
    assert re.match(r"\s*# \S", first.source), "the first cell must start with a '# ' title"
    assert re.search(r"what you will learn", first.source, re.I), "no 'What you will learn'"


def test_parameters_cell_reads_smoke(notebook):
    tagged = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged `parameters`"
    assert tagged[0].cell_type == "code"
    assert "MDTRAIN_SMOKE" in tagged[0].source


def test_last_code_cell_asserts(notebook):
    code = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]
    assert code and re.search(r"^\s*assert\b", code[-1].source, re.M), (
        "the last code cell must be a sanity check with `assert`"
    )


def test_committed_with_outputs_from_a_real_run(notebook):
    code = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]
    unexecuted = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not unexecuted, f"code cells {unexecuted} were not executed: run notebooks/regenerate.py"
    assert any(c.get("outputs") for c in code), "no outputs: commit the notebook after a real run"
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, f"a cell failed: {errors[0].get('ename')}: {errors[0].get('evalue')}"


def test_outputs_hold_no_absolute_paths(notebook):
    found = [
        m.group(0) + "..."
        for cell in notebook.cells
        for text in _output_texts(cell)
        for m in ABSOLUTE_PATH.finditer(text)
    ]
    assert not found, f"absolute paths in outputs (run notebooks/regenerate.py): {found[:5]}"


def test_output_images_are_small(notebook):
    for i, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            for mime, value in output.get("data", {}).items():
                if mime.startswith("image/") and mime != "image/svg+xml":
                    size = len(base64.b64decode("".join(value)))
                    assert size <= MAX_IMAGE_BYTES, f"cell {i}: {mime} of {size} bytes"
