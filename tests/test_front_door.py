"""`import mdtrain`: a small documented front door that loads no TensorFlow and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mdtrain
from mdtrain import versions


def test_import_loads_no_tensorflow():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, mdtrain; mdtrain.check_versions(); "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_at_most_thirty_names_each_documented():
    assert len(mdtrain.__all__) <= 30
    assert sorted(dir(mdtrain)) == sorted(mdtrain.__all__)
    assert "Example" in mdtrain.__doc__
    for name in mdtrain.__all__:
        value = getattr(mdtrain, name)
        if name != "__version__":
            assert (value.__doc__ or "").strip(), f"mdtrain.{name} has no docstring"


def test_front_door_names_are_the_functions_not_modules_of_that_name():
    import importlib
    import types

    for name in mdtrain.__all__:
        assert not isinstance(getattr(mdtrain, name), types.ModuleType), name
    for module in ("mdtrain.launcher", "mdtrain.training", "mdtrain.prediction"):
        importlib.import_module(module)  # a submodule, once imported, must not shadow a name
    assert callable(mdtrain.train) and callable(mdtrain.launch) and callable(mdtrain.predict)


def test_documented_submodules_are_attributes_without_an_import():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mdtrain; print(mdtrain.lite0.__name__, mdtrain.launcher.__name__, "
            "mdtrain.monitor.__name__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["mdtrain.lite0", "mdtrain.launcher", "mdtrain.monitor"]


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        mdtrain.trian  # noqa: B018


@pytest.mark.parametrize(
    ("installed", "line"),
    [
        ({"keras": "3.15.1", "tensorflow": "2.21.0"}, None),
        ({"keras": "3.13.2", "tensorflow": "2.20.0"}, None),
        ({"keras": "3.12.0", "tensorflow": "2.20.0"}, "Keras 3.12.0 (tested: 3.13 to 3.15)"),
        (
            {"keras": "3.16.0rc1", "tensorflow": "2.22.0"},
            "Keras 3.16.0rc1 (tested: 3.13 to 3.15) and TensorFlow 2.22.0 (tested: 2.20 to 2.21)",
        ),  # fmt: skip
        ({"keras": None, "tensorflow": None}, None),  # not installed: nothing to say
    ],
)
def test_check_versions_says_one_line_outside_the_tested_range(monkeypatch, capsys, installed,
                                                               line):  # fmt: skip
    monkeypatch.setattr(versions, "_installed", installed.get)
    assert mdtrain.check_versions() is (line is None)
    printed = capsys.readouterr().out
    if line is None:
        assert printed == ""
    else:
        assert printed == f"Note: mdtrain is not tested with {line}.\n"


def test_tested_range_is_the_one_pyproject_installs():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from tests.conftest import REPO

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    cpu = " ".join(extras["optional-dependencies"]["cpu"])
    (k_old, k_new), (t_old, t_new) = versions.TESTED["keras"], versions.TESTED["tensorflow"]
    assert f"keras>={k_old[0]}.{k_old[1]},<{k_new[0]}.{k_new[1] + 1}" in cpu
    assert f"tensorflow-cpu>={t_old[0]}.{t_old[1]},<{t_new[0]}.{t_new[1] + 1}" in cpu


@pytest.mark.slow
def test_the_docstring_examples_run(tmp_path):
    """Both examples of `mdtrain.__doc__`, as written, on the small demo dataset for one epoch."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", mdtrain.__doc__, flags=re.S)
    assert len(blocks) == 2
    script = "\n".join(blocks).replace("epochs=3", "epochs=1").replace("(0, 3)", "(0, 1)")
    script = script.replace("TrainConfig(", "TrainConfig(data=str(mdtrain.dataset_dir()), ")
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MDTRAIN_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "val_accuracy" in done.stdout
