"""A figure a notebook's prose quotes is what its outputs print (DESIGN.md, Notebooks).

Every measured figure in a markdown cell carries an invisible reference to the
output it quotes: an HTML comment right after it, naming the code cell (its
nbformat id or one of its tags) and a regular expression with one group,
searched in that cell's printed output:

    `fit` reaches 0.9867<!-- [c07] Epoch 12/(?s:.*?)val_accuracy: ([\\d.]+) --> validation accuracy

The quote must equal the captured text rounded to the quote's precision
(0.983 quotes 0.9833; 0.98 does not quote 0.9867), with thousands separators,
`%` and `×` ignored. Several comments in a row all apply to the figure before
them: a figure printed twice (a table and a verdict) must agree with both.
`[02#c13]` names a cell of another notebook (notebooks/02_*.ipynb).

A number in prose with a decimal point, an exponent, `%`, `×`, or a rate's
or a step's unit (images/s, steps/s, ms) and no reference fails, unless it
is a constant: a literal of the notebook's own code cells, or in the short
lists below (versions, definitions). Inline code, fenced code and link
targets are not prose. docs/development.md,
"Quoting figures in notebook prose", says how to write references.

Files only, no kernel: the outputs are the committed ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_03_contradictions.ipynb.json"

#: Figures that are not measurements, in any notebook: versions of the stack
#: and facts of definition. Keep it short; a measurement belongs in a reference.
CONSTANTS = {
    "2.21",  # TensorFlow
    "3.15",  # Keras
    "3.10",  # Python, the oldest tested
    "3.13",  # Python, the newest tested
    "4×",  # float32 is 4 bytes, uint8 one
    "7.5",  # the T4's compute capability
    "8.0",  # compute capability from which GPUs have bfloat16
}
#: Per notebook (its two-digit number): definitions its prose states.
NOTEBOOK_CONSTANTS: dict[str, set[str]] = {
    # Compute capability 7.0, Lite0's published ImageNet top-1, Keras' loss clip (1e-7), and
    # float16's steps: 0.0005 near 1 (0.9999 rounds to 1.0), nothing below 6e-8.
    "06": {"7.0", "75 %", "1e-7", "0.0005", "0.9999", "1.0", "6e-8"},
    "07": {"12.5%"},  # 28 of 32: the plain step's gradient on the partial batch
}

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_UNIT = r"\s?%|\s?[×x](?![\w×])|\s(?:images/s(?:ec)?|steps/s|ms)\b"
#: A number, with a unit right after it (`2×T4` and `128×128` are not ratios).
FIGURE = re.compile(rf"(?<![\w.])(?P<number>{_NUMBER})(?P<unit>{_UNIT})?(?!\.?\d)")
REFERENCE = re.compile(r"<!--\s*\[(?P<cell>[^\]]+)\]\s?(?P<pattern>.*?)\s*-->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
NOT_PROSE = re.compile(r"```.*?```|`[^`\n]*`|\]\([^)]*\)|https?://\S+", re.S)


@dataclass(frozen=True)
class Problem:
    """One figure the prose gets wrong, or quotes without a reference."""

    cell: int
    text: str

    def __str__(self) -> str:
        return f"  cell [{self.cell}]: {self.text}"


def output_text(cell) -> str:
    """What a code cell printed: its streams and text results, in order."""
    parts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            parts.append(output["text"])
        elif "text/plain" in output.get("data", {}):
            parts.append(output["data"]["text/plain"])
    return "".join(parts)


def _decimal(text: str) -> Decimal | None:
    cleaned = re.sub(r"[,%×x\s]|images/s(ec)?|steps/s|ms", "", text).replace("−", "-")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def quotes(quoted: str, printed: str) -> bool:
    """Whether `quoted` is `printed`, rounded to the quote's own precision.

    Decimal places count for plain numbers (0.983 quotes 0.9833, 1,043 quotes
    1043.1); significant digits for exponents (2.0e-14 quotes 2.04e-14).
    Either rounding of a half is accepted.
    """
    want, have = _decimal(quoted), _decimal(printed)
    if want is None or have is None:
        return False
    if re.search(r"[eE]", quoted):
        digits = len(re.sub(r"\D", "", quoted.lower().split("e")[0]))
        step = Decimal(1).scaleb(have.adjusted() - digits + 1) if have else Decimal(1)
    else:
        step = Decimal(1).scaleb(want.as_tuple().exponent)
    return any(
        have.quantize(step, rounding=mode) == want for mode in (ROUND_HALF_UP, ROUND_HALF_EVEN)
    )


def _code_cells(nb) -> dict[str, nbformat.NotebookNode]:
    """Each code cell under its id and under each of its tags."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            for key in [cell.get("id", ""), *cell.metadata.get("tags", [])]:
                found.setdefault(key, cell)
    return found


def _resolve(name: str, local: dict, notebooks_dir: Path):
    """The cell a reference names: `c07`, `fit-cell`, or `02#c13` in another notebook."""
    if "#" not in name:
        return local.get(name)
    number, _, key = name.partition("#")
    paths = sorted(notebooks_dir.glob(f"{number}_*.ipynb"))
    if len(paths) != 1:
        return None
    other = nbformat.read(paths[0], as_version=4)
    return _code_cells(other).get(key)


def _check_reference(quoted: str, name: str, pattern: str, local: dict, notebooks_dir: Path):
    """None when the quote holds; otherwise what is wrong, in words."""
    cell = _resolve(name, local, notebooks_dir)
    if cell is None:
        return f"{quoted!r} refers to [{name}]: no code cell has that id or tag"
    try:
        regex = re.compile(pattern)
    except re.error as error:
        return f"{quoted!r}: the pattern /{pattern}/ is not a regular expression ({error})"
    if regex.groups != 1:
        return f"{quoted!r}: the pattern /{pattern}/ must capture exactly one group"
    match = regex.search(output_text(cell))
    if match is None:
        return f"{quoted!r}: [{name}]'s output has nothing matching /{pattern}/ (was it rerun?)"
    if not quotes(quoted, match.group(1)):
        return f"{quoted!r} but [{name}] prints {match.group(1)!r} (/{pattern}/)"
    return None


def _prose(source: str) -> str:
    """The markdown with code, link targets and URLs blanked, keeping every offset."""
    return NOT_PROSE.sub(lambda m: " " * len(m.group(0)), source)


def needs_reference(figure: re.Match) -> bool:
    """A measured-looking figure: a decimal point, an exponent, or a unit."""
    return bool(figure["unit"] or re.search(r"[.eE]", figure["number"]))


def _constants(nb, name: str) -> set[str]:
    """Figures that are no measurement: the lists above and the code's own literals."""
    code = " ".join(c.source for c in nb.cells if c.cell_type == "code")
    literals = re.findall(r"(?<![\w.])\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+", code)
    return CONSTANTS | NOTEBOOK_CONSTANTS.get(name[:2], set()) | set(literals)


def _is_constant(figure: re.Match, constants: set[str]) -> bool:
    """A listed figure, a code literal in any unit, or a literal as a percentage (0.15: 15%)."""
    if figure.group(0) in constants or figure["number"] in constants:
        return True
    if "%" not in (figure["unit"] or ""):
        return False
    fraction = _decimal(figure["number"]) / 100
    return any(_decimal(literal) == fraction for literal in constants if _decimal(literal))


def figure_problems(nb, name: str = "", notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Problem]:
    """Every figure of `nb`'s prose that misquotes its output or has no reference.

    `name` is the notebook's file name (its number picks its constants);
    `[NN#cell]` references are looked up in `notebooks_dir`.
    """
    local = _code_cells(nb)
    constants = _constants(nb, name)
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        source = cell.source
        prose = _prose(COMMENT.sub(lambda m: " " * len(m.group(0)), source))
        for figure in FIGURE.finditer(prose):
            quoted = figure.group(0)
            references = []
            position = figure.end()
            while match := REFERENCE.match(source, position):
                references.append(match)
                position = match.end()
            for reference in references:
                wrong = _check_reference(
                    quoted, reference["cell"], reference["pattern"], local, notebooks_dir
                )
                if wrong:
                    problems.append(Problem(index, wrong))
            if not references and needs_reference(figure) and not _is_constant(figure, constants):
                context = " ".join(prose[max(0, figure.start() - 40) : figure.end() + 20].split())
                problems.append(Problem(index, f"{quoted!r} has no reference: …{context}…"))
    return problems


def _report(path: Path, problems: list[Problem]) -> str:
    return (
        f"{path.name}: {len(problems)} figure(s) in the prose are not what the outputs print "
        "(docs/development.md, 'Quoting figures in notebook prose'):\n"
        + "\n".join(map(str, problems))
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_quotes_what_the_outputs_print(path):
    problems = figure_problems(nbformat.read(path, as_version=4), path.name, path.parent)
    assert not problems, _report(path, problems)


def test_the_old_notebook_03s_contradictions_are_all_found():
    """The five contradictions of notebook 03 at c6c9ed1 (issue 37), with references added."""
    problems = [str(p) for p in figure_problems(nbformat.read(FIXTURE, as_version=4))]
    wrong = {
        "[1]": ["'0.9833' but [c07] prints '0.9867'"],  # old [8]: epoch 11's figure
        "[3]": ["'0.983' but [c13] prints '0.990'", "'0.9833' but [c07] prints '0.9867'"],
        "[5]": ["'2.0e-14' but [c20] prints '1.3e-13'"],  # old [21]
        "[7]": ["'2.6e-14' but [c23] prints '1.9e-13'"],  # old [24]
        "[9]": ["'53%' but [c38] prints '59'"],  # old [35]: the table's 53%, its verdict's 59%
    }
    expected = [(cell, text) for cell, texts in wrong.items() for text in texts]
    for cell, text in expected:
        assert any(p.startswith(f"  cell {cell}: {text}") for p in problems), (cell, text, problems)
    assert len(problems) == len(expected), problems  # the figures that agree pass


def test_unreferenced_figures_are_named_all_at_once():
    nb = nbformat.read(FIXTURE, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = COMMENT.sub("", cell.source)
    problems = figure_problems(nb)
    assert all("has no reference" in p.text for p in problems)
    assert {"'0.9833'", "'0.983'", "'2.0e-14'", "'2.6e-14'", "'53%'"} <= {
        p.text.split()[0] for p in problems
    }


@pytest.mark.parametrize(
    ("quoted", "printed", "agree"),
    [
        ("0.983", "0.9833", True),
        ("0.98", "0.9867", False),
        ("1,043", "1043.1", True),
        ("22.5×", "22.5x", True),
        ("53%", "53", True),
        ("2.0e-14", "2.04e-14", True),
        ("2.0e-14", "1.3e-13", False),
        ("0.9833", "0.9867", False),
        ("1.35×", "1.345", True),  # half up and half even both accepted
    ],
)
def test_a_quote_is_the_printed_figure_rounded(quoted, printed, agree):
    assert quotes(quoted, printed) is agree


def test_what_needs_a_reference():
    prose = _prose(
        "Kaggle's 2×T4, 128×128 px, `zoom=0.15`, [a link](https://x.org/1.5), v0.1.0, 3 GPUs, "
        "4.5% and 2.5× at 1,043 images/s, 31 ms a step, 2.0e-14 apart, 0.983 accuracy"
    )
    figures = [m.group(0) for m in FIGURE.finditer(prose) if needs_reference(m)]
    assert figures == ["4.5%", "2.5×", "1,043 images/s", "31 ms", "2.0e-14", "0.983"]


def test_settings_the_code_makes_are_constants():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("zoom = 0.15"),
        nbformat.v4.new_markdown_cell("zoom 0.15, up to ±15%, up to 16%; 2.21; 0.9867"),
    ]
    unreferenced = [p.text.split()[0] for p in figure_problems(nb, "99_x.ipynb")]
    assert unreferenced == ["'16%'", "'0.9867'"]
