"""Every committed notebook follows the series' conventions (docs/DESIGN.md, Notebooks).

The layout: a card (title, **What you will learn**, **What you need**, **How long**
on a CPU and on a T4), the collapsed setup cell, the `parameters` cell, numbered
sections, `## N. Check` (a code cell of at most 10 lines that asserts),
`## Summary`, and `## Exercises` last: each `### Exercise K: title` followed by
cells tagged `exercise`, `check`, `solution` (collapsed) and `check` (strict).

Checks the files only; running them is nbval's job (`pytest --nbval-lax notebooks/`).
"""

from __future__ import annotations

import base64
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
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


def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def _collapsed(cell) -> bool:
    return cell.metadata.get("jupyter", {}).get("source_hidden", False)


def _heading(cell, pattern: str) -> bool:
    return cell.cell_type == "markdown" and re.match(pattern, cell.source.strip()) is not None


def _index(notebook, pattern: str) -> int | None:
    found = [i for i, c in enumerate(notebook.cells) if _heading(c, pattern)]
    return found[-1] if found else None


def _number(notebook) -> str:
    return re.match(r"\s*# (\d\d)", notebook.cells[0].source).group(1)


def test_header_cell_is_a_card(notebook):
    first = notebook.cells[0]
    assert first.cell_type == "markdown", "the first cell must be markdown"
    assert re.match(r"\s*# \d\d · \S", first.source), (
        "the first cell must start with '# NN · Title'"
    )
    for part in ("what you will learn", "what you need", "how long"):
        assert re.search(rf"\*\*{part}\b", first.source, re.I), f"the card has no **{part}**"
    how_long = re.search(r"\*\*how long.*", first.source, re.I | re.S).group(0)
    assert re.search(r"CPU", how_long) and re.search(r"T4", how_long), (
        "**How long** must say how long on a CPU and on a T4"
    )


def test_setup_cell_is_collapsed_then_parameters(notebook):
    setup = notebook.cells[1]
    assert setup.cell_type == "code" and _collapsed(setup), (
        "cell 1 must be the collapsed setup cell"
    )
    tagged = [i for i, c in enumerate(notebook.cells) if "parameters" in _tags(c)]
    assert tagged == [2], "cell 2, and only it, must be tagged `parameters`"
    assert "MDTRAIN_SMOKE" in notebook.cells[2].source


def test_nbval_markers_are_not_in_the_lesson(notebook):
    shown = [
        i
        for i, c in enumerate(notebook.cells)
        if c.cell_type == "code" and not _collapsed(c) and "NBVAL_" in c.source
    ]
    assert not shown, f"cells {shown}: nbval markers belong in metadata or the setup cell"


def test_check_summary_then_exercises_last(notebook):
    check = _index(notebook, r"## \d+\. Check\b")
    summary = _index(notebook, r"## Summary\b")
    exercises = _index(notebook, r"## Exercises\b")
    assert check is not None, "no '## N. Check' section"
    assert summary is not None and exercises is not None, "no '## Summary' or '## Exercises'"
    assert check < summary < exercises, "the order is Check, Summary, Exercises"
    later = [(c.source.splitlines() or [""])[0] for c in notebook.cells[exercises + 1 :]]
    assert not [h for h in later if re.match(r"## ", h)], "'## Exercises' must be the last section"


def test_the_check_cell_asserts_in_ten_lines(notebook):
    summary = _index(notebook, r"## Summary\b")
    code = [c for c in notebook.cells[:summary] if c.cell_type == "code" and c.source.strip()]
    assert code and re.search(r"^\s*assert\b", code[-1].source, re.M), (
        "the last code cell before '## Summary' must be the check, with `assert`"
    )
    lines = code[-1].source.strip().splitlines()
    assert len(lines) <= 10, f"the check cell has {len(lines)} lines: at most 10 (harness: tests/)"


def test_each_exercise_has_its_cells(notebook):
    start = _index(notebook, r"## Exercises\b")
    cells = notebook.cells[start + 1 :]
    headings = [i for i, c in enumerate(cells) if _heading(c, r"### Exercise \d+: \S")]
    assert 1 <= len(headings) <= 3, "1 to 3 exercises, each under '### Exercise K: <title>'"
    module = f"nb{_number(notebook)}"
    for i in headings:
        kinds = [(c.cell_type, _tags(c)) for c in cells[i + 1 : i + 5]]
        assert kinds == [
            ("code", ["exercise"]),
            ("code", ["check"]),
            ("code", ["solution"]),
            ("code", ["check"]),
        ], f"exercise at {cells[i].source.splitlines()[0]!r}: cells tagged {kinds}"
        _, check, solution, strict = cells[i + 1 : i + 5]
        assert re.search(rf"\b{module}\.check_\w+\(", check.source), f"no {module}.check_… call"
        assert _collapsed(solution), "the solution cell must be collapsed (source_hidden)"
        assert "strict=True" in strict.source and module in strict.source, (
            "the last cell checks the solution with strict=True"
        )
    # Found where it is imported from: the checkout, or the wheel in the matrix legs.
    assert importlib.util.find_spec(f"mdtrain_course.exercises.{module}"), (
        f"no mdtrain_course/exercises/{module}.py"
    )
    assert (REPO / "tests" / f"test_exercises_{module}.py").is_file(), (
        f"no tests/test_exercises_{module}.py"
    )


def test_no_stderr_in_outputs(notebook):
    noisy = [
        (i, o["text"].strip().splitlines()[0][:80])
        for i, c in enumerate(notebook.cells)
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("name") == "stderr" and o["text"].strip()
    ]
    assert not noisy, f"stderr in outputs (cell, first line): {noisy}"


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
