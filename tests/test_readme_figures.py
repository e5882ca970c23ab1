"""The README's benchmark figures are the committed results', not an older run's.

A benchmark rerun rewrites its JSON; these tests fail until the README quotes the new
figures (a table once quoted a run whose JSON had since been overwritten).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _result(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / name).read_text())


def _ratio(median: float, low: float, high: float, digits: int = 2) -> str:
    """A ratio as the README writes it: `2.55× (1.44–6.09×)`."""
    return f"{median:.{digits}f}× ({low:.{digits}f}–{high:.{digits}f}×)"


def test_readme_quotes_the_committed_recipe_benchmark():
    summary = _result("recipe.json")["summary"]
    for key in ("recipe_wall_vs_mdtrain", "recipe_training_step_vs_mdtrain"):
        rounds = summary[key]["rounds"]
        assert _ratio(summary[key]["median"], min(rounds), max(rounds)) in README, key
    for side in ("recipe", "mdtrain"):
        low, high = summary[side]["wall_spread"]
        assert f"{summary[side]['wall_s']:.1f} ({low:.1f}–{high:.1f})" in README, side
        assert f"{summary[side]['training_step_ms']:.1f} ms" in README, side


@pytest.mark.parametrize("dataset", ["finite", "repeated"])
@pytest.mark.parametrize("variant", ["exact_fit", "exact_fit_spe16", "exact_custom_fit_spe16"])
def test_readme_quotes_the_committed_host_cost_benchmark(variant, dataset):
    entry = _result("step_overhead.json")["variants"][f"default/{dataset}/{variant}"]
    for prefix in ("", "steady_"):  # the whole call, the steady state
        figure = _ratio(entry[f"{prefix}vs_keras_fit"], *entry[f"{prefix}vs_keras_fit_spread"])
        assert figure in README, (variant, dataset, prefix)


def test_readme_quotes_the_committed_pipeline_benchmark():
    result = _result("pipeline.json")
    for key in ("keras_directory_layers", "imagedatagenerator", "tfdata_augment_in_model"):
        assert f"{result[key]:,.0f} images/s" in README, key
    for key, digits in [
        ("augment_in_model_vs_keras_directory_layers", 1),
        ("augment_in_model_vs_noaug", 2),
        ("fused_layer_vs_keras_layers", 2),
        ("cached_vs_raw_decode", 1),
    ]:
        ratio = result["ratios"][key]
        assert _ratio(ratio["median"], ratio["min"], ratio["max"], digits) in README, key


def test_readme_quotes_the_committed_replicas_benchmark():
    ratios = _result("train.json")["vs_keras_fit"]["ratios"]
    for key in ("mdtrain_vs_keras_fit", "mdtrain_one_vs_keras_fit"):
        ratio = ratios[key]
        assert _ratio(ratio["median"], ratio["min"], ratio["max"]) in README, key
