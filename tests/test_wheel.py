"""The wheel is the whole product, and it installs where the users are.

Builds the wheel and the sdist with `.ci/build-dist.sh` (the release workflow's
build step), then plays a Kaggle or Colab machine: a fresh virtual environment
outside the repository in which `tensorflow-cpu` and a Jupyter kernel were
installed first. There a notebook copied next to the wheel (as a Colab upload
lies in /content) runs in smoke mode: its setup cell finds the wheel and
installs it, and every later cell imports mdtrain from that install. The
TensorFlow and Keras distributions must be exactly those of before, and no
JupyterLab may arrive. The same kernel, before the install, shows the setup
cell's one-line stop.

Cost on the 2-core CI machine: about 25 s to build (none under `.ci/run`, which
builds once for every leg and sets `MDTRAIN_DIST`), 2 min to install TensorFlow
into the fresh environment, 1 min for the notebook.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import nbformat
import pytest

import mdtrain

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SMOKE_NOTEBOOK = ROOT / "notebooks" / "01_load_and_augment.ipynb"  # reads nothing from the repo
KERNEL = "mdtrain-wheel-test"
# The distributions a user's TensorFlow consists of: none may be replaced, upgraded or added.
TF_DISTRIBUTION = re.compile(
    r"^(tensorflow|keras|tf[-_]|tb[-_]|tensorboard|ml[-_]dtypes|h5py)", re.I
)
NOT_WANTED = re.compile(r"^(jupyterlab|notebook|jupyter[-_]server|jupyter)$", re.I)


def _first_code_cell(path: Path) -> str:
    notebook = nbformat.read(path, as_version=4)
    return next(c.source for c in notebook.cells if c.cell_type == "code").rstrip()


# --- fast checks: the setup cell ------------------------------------------------------


def test_every_notebook_has_the_same_setup_cell():
    cells = {path.name: _first_code_cell(path) for path in NOTEBOOKS}
    canonical = cells[NOTEBOOKS[0].name]
    assert canonical.startswith("# @title Setup: ") and 'MDTRAIN_SOURCE = ""' in canonical
    differ = sorted(name for name, cell in cells.items() if cell != canonical)
    assert not differ, f"copy the first code cell of {NOTEBOOKS[0].name} into {differ}"


def test_only_the_setup_cell_runs_pip_and_it_names_no_package():
    runs_pip = re.compile(r"^\s*[!%]pip\b|[\"']pip[\"'],\s*[\"']install", re.M)
    for path in NOTEBOOKS:
        code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert [i for i, source in enumerate(code) if runs_pip.search(source)] == [0], path.name
        # It installs what MDTRAIN_SOURCE names or a wheel it found: no name from an index.
        assert '"install", "-q", source]' in code[0] and "mdtrain[" not in code[0]


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("", "mdtrain is not installed: attach its wheel (Kaggle: Add Input, a dataset"),
        ("mdtrain", "MDTRAIN_SOURCE = 'mdtrain': not a wheel, a git URL ending @TAG"),
        ("git+https://github.com/x/mdtrain", "MDTRAIN_SOURCE = 'git+https://github.com/x/mdtrain'"),
        ("mdtrain>=0.1", "MDTRAIN_SOURCE = 'mdtrain>=0.1': not a wheel, a git URL ending @TAG"),
    ],
)
def test_setup_cell_stops_in_one_line_without_installing(tmp_path, source, line):
    # Run as a script in a Python that cannot import mdtrain (-I: no site, no checkout).
    cell = _first_code_cell(NOTEBOOKS[0]).replace(
        'MDTRAIN_SOURCE = ""', f"MDTRAIN_SOURCE = {source!r}"
    )
    script = tmp_path / "setup_cell.py"
    script.write_text(cell)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(script)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(line), done.stderr


def _run_setup_cell(tmp_path: Path, kaggle_input: Path) -> subprocess.CompletedProcess:
    cell = _first_code_cell(NOTEBOOKS[0]).replace('"/kaggle/input/"', repr(f"{kaggle_input}/"))
    (tmp_path / "setup_cell.py").write_text(cell)
    # -S: no site-packages, so neither mdtrain nor pip can be imported: pip "fails" at once.
    return subprocess.run(
        [sys.executable, "-I", "-S", "setup_cell.py"], cwd=tmp_path, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("where", "found"),
    [("mdtrain-wheel", True), ("datasets/me/mdtrain-wheel/v2", True), ("a/b/c/d/e", False)],
)
def test_setup_cell_finds_a_wheel_attached_on_kaggle(tmp_path, where, found):
    wheel = tmp_path / "input" / where / "mdtrain-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"not really a wheel")
    done = _run_setup_cell(tmp_path, tmp_path / "input")
    last = done.stderr.strip().splitlines()[-1]
    if found:  # it ran pip on the wheel it found
        assert last == f"pip could not install {wheel} (its message is above)."
    else:  # 5 folders deep: not searched
        assert last.startswith("mdtrain is not installed: attach its wheel")


def test_setup_cell_refuses_to_guess_between_two_wheels(tmp_path):
    for version in ("0.1.0", "0.2.0"):
        (tmp_path / f"mdtrain-{version}-py3-none-any.whl").write_bytes(b"")
    done = _run_setup_cell(tmp_path, tmp_path / "no-input")
    assert done.stderr.startswith("several mdtrain wheels found, set MDTRAIN_SOURCE to one of: ")
    assert done.stderr.count("\n") == 1 and done.stderr.count(".whl") == 2


def test_the_version_lives_in_one_place():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mdtrain.__version__"}
    assert re.search(
        rf"(?m)^## {re.escape(mdtrain.__version__)}$", (ROOT / "CHANGELOG.md").read_text()
    )
    done = subprocess.run(
        [sys.executable, "-m", "mdtrain", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout == f"mdtrain {mdtrain.__version__}\n"


# --- the wheel ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The wheel and sdist `.ci/build-dist.sh` makes of this checkout.

    `.ci/run` builds them once for all its legs and names the folder in
    `MDTRAIN_DIST` (its build step stops on a failed `twine check`); without it,
    they are built here.
    """
    if os.environ.get("MDTRAIN_DIST"):
        out = Path(os.environ["MDTRAIN_DIST"]).resolve()
    else:
        out = tmp_path_factory.mktemp("dist")
        env = {**os.environ, "PYTHON": sys.executable}
        done = subprocess.run(
            ["bash", str(ROOT / ".ci" / "build-dist.sh"), str(out)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "PASSED" in done.stdout  # twine check
    (wheel,) = out.glob("mdtrain-*.whl")
    (sdist,) = out.glob("mdtrain-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _package_files() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in ("mdtrain", "mdtrain_course")
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.mark.slow
def test_wheel_and_sdist_hold_every_file_of_the_package(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        in_wheel = {n for n in wheel.namelist() if n.startswith(("mdtrain/", "mdtrain_course/"))}
    assert in_wheel == _package_files()
    assert "mdtrain/imagenet_classes.txt" in in_wheel  # data read at run time travels too
    import tarfile

    with tarfile.open(dist["sdist"]) as sdist:
        prefix = sdist.getnames()[0].split("/")[0] + "/"
        in_sdist = {n.removeprefix(prefix) for n in sdist.getnames()}
    assert _package_files() <= in_sdist
    assert {"pyproject.toml", "README.md"} <= in_sdist


@pytest.mark.slow
def test_wheel_metadata_needs_no_tensorflow(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(name).decode())
        entry_points = wheel.read(name.replace("METADATA", "entry_points.txt")).decode()
    assert metadata["Version"] == mdtrain.__version__
    assert dist["wheel"].name == f"mdtrain-{mdtrain.__version__}-py3-none-any.whl"
    assert metadata["Requires-Python"] == ">=3.10"  # no upper cap
    unconditional = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert unconditional and not [r for r in unconditional if TF_DISTRIBUTION.match(r)]
    assert not [r for r in unconditional if re.match(r"jupyter|notebook|ipy", r)]
    assert "mdtrain = mdtrain.cli:main" in entry_points


# --- installed where TensorFlow already is ----------------------------------------------


def _pip_list(python: Path) -> dict[str, str]:
    done = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(done.stdout)}


def _tensorflow_requirement() -> str:
    # The TensorFlow this checkout was tested with: the same release, from pip's cache if any.
    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            return f"tensorflow-cpu=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            pass
    return "tensorflow-cpu>=2.16"


@pytest.fixture(scope="module")
def kaggle_like(tmp_path_factory) -> Path:
    """A fresh venv outside the repository with TensorFlow and a Jupyter kernel, as on Kaggle."""
    venv = tmp_path_factory.mktemp("kaggle") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    done = subprocess.run(
        [*pip, _tensorflow_requirement(), "ipykernel"], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    subprocess.run(
        [str(python), "-m", "ipykernel", "install", "--prefix", str(venv), "--name", KERNEL],
        check=True, capture_output=True,
    )  # fmt: skip
    return venv


def _run_notebook(notebook, venv: Path, folder: Path, *, allow_errors: bool = False):
    from nbclient import NotebookClient

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        MDTRAIN_SMOKE="1",
        JUPYTER_PATH=str(venv / "share" / "jupyter"),  # where the kernel spec was installed
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
    )
    with pytest.MonkeyPatch.context() as mp:
        for key in ("PYTHONPATH", "VIRTUAL_ENV"):
            mp.delenv(key, raising=False)
        for key, value in env.items():
            mp.setenv(key, value)
        client = NotebookClient(
            notebook, kernel_name=KERNEL, timeout=600, allow_errors=allow_errors,
            resources={"metadata": {"path": str(folder)}},
        )  # fmt: skip
        client.execute()
    return notebook


def _stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.get("name") == "stdout")


@pytest.fixture(scope="module")
def installed(dist, kaggle_like, tmp_path_factory) -> dict:
    """Runs the setup cell with nothing attached, then the notebook beside the wheel."""
    python = kaggle_like / "bin" / "python"
    empty = tmp_path_factory.mktemp("nothing-attached")
    setup_only = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(_first_code_cell(SMOKE_NOTEBOOK))]
    )
    stopped = _run_notebook(setup_only, kaggle_like, empty, allow_errors=True).cells[0]

    before = _pip_list(python)
    content = tmp_path_factory.mktemp("content")  # Colab's upload folder, outside the checkout
    shutil.copy(dist["wheel"], content)
    shutil.copy(SMOKE_NOTEBOOK, content)
    notebook = nbformat.read(content / SMOKE_NOTEBOOK.name, as_version=4)
    ran = _run_notebook(notebook, kaggle_like, content)
    version = subprocess.run(
        [str(kaggle_like / "bin" / "mdtrain"), "--version"], capture_output=True, text=True
    )
    where = subprocess.run(
        [str(python), "-c", "import mdtrain; print(mdtrain.__file__)"],
        cwd=content, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {
        "stopped": stopped, "before": before, "after": _pip_list(python), "notebook": ran,
        "content": content, "version": version, "where": Path(where.stdout.strip()),
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.notebooks
def test_setup_cell_without_a_wheel_stops_in_one_line_in_jupyter(installed):
    (error,) = installed["stopped"].outputs
    assert error.output_type == "error" and error.ename == "SetupStopped"
    assert error.traceback == [error.evalue]  # Jupyter shows this one line, no traceback
    assert error.evalue.startswith("mdtrain is not installed: attach its wheel")


@pytest.mark.slow
@pytest.mark.notebooks
def test_installing_the_wheel_changes_no_tensorflow_or_keras(installed):
    before, after = installed["before"], installed["after"]
    tf_before = {k: v for k, v in before.items() if TF_DISTRIBUTION.match(k)}
    tf_after = {k: v for k, v in after.items() if TF_DISTRIBUTION.match(k)}
    assert "tensorflow-cpu" in tf_before and "keras" in tf_before
    assert tf_after == tf_before  # nothing replaced, upgraded, downgraded or added
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert changed == {}  # nor anything else the user had, numpy included
    assert not [k for k in after if NOT_WANTED.match(k)]  # no JupyterLab pulled in
    assert after.get("mdtrain") == mdtrain.__version__ and "mdtrain" not in before


@pytest.mark.slow
@pytest.mark.notebooks
def test_a_notebook_runs_from_the_installed_wheel_outside_the_checkout(installed):
    cells = [c for c in installed["notebook"].cells if c.cell_type == "code"]
    wheel = next(installed["content"].glob("mdtrain-*.whl")).resolve()
    assert _stdout(cells[0]) == f"mdtrain installed from {wheel}\n"
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert all(c.execution_count for c in cells)  # every cell ran, the last one asserts
    assert ROOT not in installed["where"].parents  # imported from the venv, not this checkout
    assert installed["version"].stdout == f"mdtrain {mdtrain.__version__}\n"
