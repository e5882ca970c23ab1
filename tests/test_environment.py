"""environment.yml installs what `pip install -e ".[cpu,notebooks,test]"` installs."""

from __future__ import annotations

import re

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from tests.conftest import REPO


def _name(requirement: str) -> str:
    return re.split(r"[<>=!\[ ;]", requirement, maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject_extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = set(project["dependencies"]) | set(
        extras["cpu"] + extras["notebooks"] + extras["test"]
    )
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {r for r in pip_section if not r.startswith("-e")}
    assert {_name(r): r for r in listed} == {_name(r): r for r in wanted}


def test_tensorflow_is_not_a_base_dependency():
    # Kaggle and Colab ship their own TensorFlow; installing mdtrain must not replace it.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(_name(r).startswith("tensorflow") for r in project["dependencies"])


def _minor_release(version: tuple[int, int], step: int = 0) -> str:
    major, minor = version
    return f"{major}.{minor + step}.0"


def test_the_cpu_and_gpu_extras_state_the_tested_range():
    from packaging.requirements import Requirement

    from mdtrain.versions import TESTED

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for extra in ("cpu", "gpu"):
        requirements = [Requirement(r) for r in extras["optional-dependencies"][extra]]
        for library, (oldest, newest) in TESTED.items():
            (specifier,) = [r.specifier for r in requirements if r.name.startswith(library)]
            admitted = [
                specifier.contains(_minor_release(oldest, -1)),
                specifier.contains(_minor_release(oldest)),
                specifier.contains(_minor_release(newest)),
                specifier.contains(_minor_release(newest, 1)),
            ]
            assert admitted == [False, True, True, False], (extra, library, str(specifier))
