"""N replicas train to the same weights as 1 replica; Keras' own scaling does not.

The exact runs train small-cnn (batch normalization included; at 32 px in
float64 too, where float32 flips a max-pool near-tie), fine-tune
EfficientNet-Lite0, train it from scratch in float64 (in float32 its ReLU6
kinks turn rounding into differences as large as reordering a batch gives), and
train EfficientNetV2's head on its frozen, random base;
the baselines (Keras' own loss scaling, the naive global-batch division) train
a CNN without normalization, so that only the loss scale differs. Everything
runs in two subprocesses with `cpu:4`: `_SCRIPT`, the exact cases then the
baselines with TensorFlow's oneDNN CPU kernels, and `_BASELINES_ONLY`, the
baselines without them (`TF_ENABLE_ONEDNN_OPTS=0`): plain Keras code never gets
an empty replica slice there, which oneDNN fails on, on AVX-512 CPUs only
(tensorflow/tensorflow#112639). Each configuration trains once, and every check
that compares against it reads the same weights (a TensorFlow start-up and a
trace cost more than the arithmetic checked). Each script prints its
measurements as JSON; the tests below assert on them. Tiny images, one or two
epochs: the point is the arithmetic. The experiment itself is
`tests/numerics_harness.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent

# Float32 rounding of a different summation order stays far below EXACT, as long as no discrete
# decision flips: a max-pool window whose top two values lie within the float32 forward error
# (~1e-5 after batch normalization's first step), or a ReLU input as near 0, routes a gradient
# elsewhere, and the first step then differs by ~1e-3 relative, more after it (docs/numerics.md,
# "Float32: discrete decisions"). One device fed the same batch reordered differs as much. The
# float32 cases below run at 16 px, where none flips (measured 2e-6); the rule itself is checked
# in float64 at 32 px, where float32 flips one window on the first step.
EXACT = 1e-4
WRONG = 1e-3  # a wrong loss scale moves the weights far more than this

# Both scripts start alike: 4 virtual CPUs, then side-by-side strategies over 1, 2 and 4 of them.
_SETUP = """
import json, sys
sys.path.insert(0, sys.argv[1])  # tests/, for the harness
from mdtrain.distribute import BatchGeometry, configure_devices
configure_devices("cpu:4")
import numerics_harness as nm

strategies = nm.side_by_side_strategies((1, 2, 4))
datasets = {"31/16": nm.fixed_dataset(31, 16), "5/16": nm.fixed_dataset(5, 16),
            "7/16": nm.fixed_dataset(7, 16), "75/16": nm.fixed_dataset(75, 16),
            "lite": nm.fixed_dataset(23, 8, image_size=32)}
out = {"shapes": {}, "runs": {}}
trained = {}

def weights(replicas, data, loss="exact", loop="fit", spe=1, **kwargs):
    # One training per configuration: several checks compare against the same run.
    key = repr((replicas, data, loss, loop, spe, sorted(kwargs.items())))
    if key not in trained:
        trained[key] = nm.train_weights(strategies[replicas], datasets[data], loss=loss,
                                        loop=loop, steps_per_execution=spe, **kwargs)
    return trained[key]

def runs(name, data, cases, floor=1e-12, spe=1, **kwargs):  # the reference: 1 step a call
    ref = weights(1, data, **kwargs)
    for replicas, loss, loop in cases:
        try:
            got = weights(replicas, data, loss, loop, spe, **kwargs)
            result = [nm.max_relative_difference(got, ref, floor), None]
        except Exception as error:
            result = [None, f"{type(error).__name__}: {str(error)[:300]}"]
        out["runs"][f"{name} {replicas} {loss} {loop}"] = result
"""

_EXACT = """
for n, gb, r in ((31, 16, 4), (5, 16, 4), (31, 16, 2), (12, 8, 4)):
    sizes = nm.per_replica_batch_sizes(strategies[r], nm.fixed_dataset(n, gb))
    geometry = BatchGeometry(n, gb, r)
    expected = [geometry.split(gb)] * (geometry.steps - 1)
    expected.append(geometry.split(geometry.last_batch_size))
    out["shapes"][f"{n}/{gb}/{r}"] = [sizes, expected]

# The model people train: small-cnn, whose batch normalization is exact too.
runs("partial", "31/16", [(2, "exact", "fit"), (4, "exact", "fit"), (4, "exact", "custom")],
     epochs=1, model="small-cnn")
runs("small", "5/16", [(4, "exact", "custom"), (4, "exact", "fit")], epochs=2, model="small-cnn")
# 3 steps per call over epochs of 5 (the last batch 11 = 3+3+3+2): calls of 3 and 2 steps,
# against 1 step per call on the same replicas: the same steps, bit for bit. (Against one
# replica, 10 steps let float32 rounding grow to ~1e-4 in a conv kernel, spe 1 or 3 alike.)
for replicas, loop in ((4, "fit"), (4, "custom"), (1, "fit")):
    one, three = (weights(replicas, "75/16", "exact", loop, spe, epochs=2, model="small-cnn")
                  for spe in (1, 3))
    out["runs"][f"spe3 {replicas} exact {loop}"] = [nm.max_relative_difference(three, one), None]
# 5 examples (2/2/1/0), one step: a call that ends with the data.
runs("spe3-small", "5/16", [(4, "exact", "fit"), (4, "exact", "custom")],
     epochs=2, model="small-cnn", spe=3)
runs("weighted", "31/16", [(2, "exact", "custom")],
     epochs=1, class_weights=[0.5, 1.0, 3.0], model="small-cnn")
# EfficientNet-Lite0: fine-tuning a pretrained base (its BatchNorm in inference mode).
runs("lite0-fine-tune", "lite", [(2, "exact", "fit")], epochs=1, model="efficientnet-lite0",
     weights="imagenet", fine_tune=True, learning_rate=0.01)
# Lite0 from scratch, in float64: float32 rounding decides which side of ReLU6's kink
# a near-zero input lands on (one device with reordered batches differs by ~2), so the
# rule itself is shown in float64; tensors below 1e-6 are zero in exact arithmetic.
runs("lite0-scratch-f64", "lite", [(2, "exact", "fit")], epochs=1, dtype="float64",
     model="efficientnet-lite0", learning_rate=0.01, floor=1e-6)
# small-cnn at 32 px in float64 (23 examples, batches of 8: 4+4, 4+4, 4+3): in float32 one
# device already rounds a max-pool near-tie the other way; float64 shows the rule (~1e-14).
runs("small-cnn-32px-f64", "lite", [(2, "exact", "fit")], epochs=1, dtype="float64",
     model="small-cnn")
# EfficientNetV2 from random weights: only its head trains, on a frozen base.
runs("v2-scratch", "lite", [(2, "exact", "fit")], epochs=1, model="efficientnetv2-b0",
     learning_rate=0.01)
# fit and the custom loop must run the very same computation, bit for bit (the runs above,
# with 1 step a call on 2 replicas and 3 steps a call on 4).
fit, custom = (weights(2, "31/16", "exact", loop, epochs=1, model="small-cnn")
               for loop in ("fit", "custom"))
out["fit_vs_custom"] = nm.max_relative_difference(fit, custom)
fit, custom = (weights(4, "75/16", "exact", loop, 3, epochs=2, model="small-cnn")
               for loop in ("fit", "custom"))
out["fit_vs_custom_spe3"] = nm.max_relative_difference(fit, custom)
"""

# The common rules, on a model without normalization: only the loss scale differs.
# 31 examples in batches of 16 end with 15 (4+4+4+3); 7 examples are one uneven
# batch (2+2+2+1): never an empty slice, which would fail in oneDNN's kernels.
_BASELINES = """
for name, data, epochs in (("partial-baseline", "31/16", 1), ("small-baseline", "7/16", 2)):
    runs(name, data, [(4, "keras_fit", "fit"), (4, "naive_global_batch", "custom")],
         epochs=epochs, global_batch_size=16)
"""

_RESULT = """
print("RESULT " + json.dumps(out))
"""

#: Every exact case, then the baselines with oneDNN's CPU kernels (their default).
_SCRIPT = _SETUP + _EXACT + _BASELINES + _RESULT
#: The baselines alone, for a process without oneDNN.
_BASELINES_ONLY = _SETUP + _BASELINES + _RESULT


def _measure(script: str, **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, str(TESTS)],
        capture_output=True, text=True, timeout=2400, env={**os.environ, **env},
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def measured() -> dict:
    return _measure(_SCRIPT, TF_ENABLE_ONEDNN_OPTS="1")


@pytest.fixture(scope="module", params=["1", "0"], ids=["onednn", "no-onednn"])
def baselines(request, measured) -> dict:
    """The baselines with TensorFlow's oneDNN CPU kernels on, then off: same verdicts.

    With oneDNN on they ran in `measured`'s process, after the exact cases.
    """
    if request.param == "1":
        return measured
    return _measure(_BASELINES_ONLY, TF_ENABLE_ONEDNN_OPTS=request.param)


def _run(measured, key):
    difference, error = measured["runs"][key]
    return difference, error


@pytest.mark.slow
def test_batch_geometry_split_matches_tf_distribute(measured):
    for case, (sizes, expected) in measured["shapes"].items():
        assert sizes == expected, case
    assert measured["shapes"]["5/16/4"][0] == [[2, 2, 1, 0]]
    assert measured["shapes"]["31/16/4"][0][-1] == [4, 4, 4, 3]


@pytest.mark.slow
@pytest.mark.parametrize(
    "key",
    [
        "partial 2 exact fit",
        "partial 4 exact fit",
        "partial 4 exact custom",
        "small 4 exact custom",
        "spe3-small 4 exact fit",
        "spe3-small 4 exact custom",
    ],
)
def test_replicas_train_like_one_replica(measured, key):
    difference, error = _run(measured, key)
    assert error is None, error
    assert difference < EXACT


@pytest.mark.slow
@pytest.mark.parametrize("key", ["spe3 4 exact fit", "spe3 4 exact custom", "spe3 1 exact fit"])
def test_steps_per_call_run_the_same_steps_bit_for_bit(measured, key):
    difference, error = _run(measured, key)
    assert error is None, error
    assert difference == 0.0


@pytest.mark.slow
def test_fine_tuning_a_pretrained_efficientnet_is_exact(measured):
    difference, error = _run(measured, "lite0-fine-tune 2 exact fit")
    assert error is None, error
    assert difference < EXACT


@pytest.mark.slow
def test_efficientnet_lite0_from_scratch_follows_the_exact_rule_in_float64(measured):
    difference, error = _run(measured, "lite0-scratch-f64 2 exact fit")
    assert error is None, error
    assert difference < 1e-6  # measured 2.5e-9; float32 rounding alone gives ~2


@pytest.mark.slow
def test_small_cnn_at_32_px_follows_the_exact_rule_in_float64(measured):
    difference, error = _run(measured, "small-cnn-32px-f64 2 exact fit")
    assert error is None, error
    assert difference < 1e-9  # measured 1.0e-14; Keras' per-replica BatchNorm: 1.5


@pytest.mark.slow
def test_efficientnetv2_from_scratch_is_exact(measured):
    difference, error = _run(measured, "v2-scratch 2 exact fit")
    assert error is None, error
    assert difference < EXACT


def test_efficientnetv2_frozen_base_is_deterministic_in_training():
    """The outer `training=True` reaches the frozen base; its stochastic depth must be off.

    Keras 3 overrides the base's `training=False` with the outer model's flag:
    with its Dropout layers active, features changed by ~30 % from call to call,
    so no two runs (and no N replicas and 1) trained the same head.
    """
    import keras

    from mdtrain.models import build_model

    net = build_model("efficientnetv2-b0", 3, 32, weights="none", dropout=0.0)
    features = keras.Model(net.input, net.get_layer("head_dense").input)
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3)).astype("float32")
    expected = np.asarray(features(images, training=False))
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(features(images, training=True)), expected)


@pytest.mark.slow
def test_class_weights_under_a_strategy(measured):
    difference, error = _run(measured, "weighted 2 exact custom")
    assert error is None and difference < EXACT


@pytest.mark.slow
def test_fit_on_dataset_smaller_than_one_global_batch(measured):
    difference, error = _run(measured, "small 4 exact fit")
    assert error is None, error
    assert difference < EXACT


@pytest.mark.slow
@pytest.mark.parametrize(
    "key", ["partial-baseline 4 keras_fit fit", "partial-baseline 4 naive_global_batch custom"]
)
def test_naive_loss_scaling_is_wrong_on_a_partial_batch(baselines, key):
    """Both common rules run here, and land far from 1 replica: the exact tests mean something."""
    difference, error = _run(baselines, key)
    assert error is None, error
    assert difference > WRONG


@pytest.mark.slow
def test_naive_loss_scaling_is_wrong_on_a_tiny_dataset(baselines):
    """7 examples, fewer than one global batch of 16: divided by 16, the step is 7/16 too small."""
    difference, error = _run(baselines, "small-baseline 4 naive_global_batch custom")
    assert error is None, error
    assert difference > WRONG


@pytest.mark.slow
def test_keras_fit_fails_on_an_uneven_first_batch(baselines):
    """Keras' fit reduces a sample of the first batch across replicas (keras-team/keras#19246)."""
    difference, error = _run(baselines, "small-baseline 4 keras_fit fit")
    assert difference is None, "Keras' fit ran: the test's premise changed"
    assert error.startswith("InvalidArgumentError") and "AddN" in error, error


@pytest.mark.slow
def test_fit_and_custom_loop_give_identical_weights(measured):
    assert measured["fit_vs_custom"] == 0.0
    assert measured["fit_vs_custom_spe3"] == 0.0  # also with 3 steps per call


def test_max_relative_difference():
    from tests.numerics_harness import max_relative_difference

    a = [np.array([1.0, -2.0]), np.array([[4.0]])]
    assert max_relative_difference(a, a) == 0.0
    b = [np.array([1.0, -2.2]), np.array([[4.0]])]
    assert max_relative_difference(b, a) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        max_relative_difference(a, a[:1])
