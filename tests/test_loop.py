"""The exact trainer's guard rails, batch normalization's moments, and the Keras internals check."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from mdtrain import compat  # noqa: E402
from mdtrain.history import history_rows  # noqa: E402
from mdtrain.loop import ExactTrainer  # noqa: E402
from mdtrain.models import build_model  # noqa: E402
from mdtrain.norm import ExactBatchNormalization, global_moments, swap_batch_norm  # noqa: E402


@pytest.fixture(scope="module")
def trainer():
    return ExactTrainer(build_model("small-cnn", 3, 16))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss": "mse"},
        {"metrics": ["accuracy"]},
        {"steps_per_execution": 4},
        {"jit_compile": True},
    ],
)
def test_compile_refuses_what_the_exact_steps_would_ignore(trainer, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        trainer.compile(optimizer="adam", **kwargs)


def test_compile_takes_an_optimizer(trainer):
    trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    assert isinstance(trainer.optimizer, keras.optimizers.SGD)


def test_history_rows():
    history = keras.callbacks.History()
    history.history = {"loss": [2.0, 1.0], "accuracy": [0.5, 0.75]}
    assert history_rows(history) == [
        {"loss": 2.0, "accuracy": 0.5},
        {"loss": 1.0, "accuracy": 0.75},
    ]


def test_global_moments_leave_out_zero_weight_examples():
    """A padded dummy example of weight 0 must not move the batch statistics."""
    rng = np.random.default_rng(0)
    real = rng.normal(3.0, 2.0, (5, 4, 4, 2)).astype("float32")
    padded = np.concatenate([real, np.zeros((1, 4, 4, 2), "float32")])
    mean, variance = global_moments(tf.constant(padded), tf.constant([1.0] * 5 + [0.0]))
    np.testing.assert_allclose(mean, real.mean(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(variance, real.var(axis=(0, 1, 2)), rtol=1e-5)


def test_exact_batch_norm_matches_keras_on_one_device():
    x = np.random.default_rng(1).normal(10.0, 3.0, (8, 5, 5, 4)).astype("float32")
    ours, theirs = ExactBatchNormalization(), keras.layers.BatchNormalization()
    for layer in (ours, theirs):
        layer.build(x.shape)
    np.testing.assert_allclose(ours(x, training=True), theirs(x, training=True), atol=1e-4)
    np.testing.assert_allclose(ours.moving_variance, theirs.moving_variance, rtol=1e-5)


def test_swap_batch_norm_swaps_every_batch_norm_and_keeps_the_weights():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3)(inputs)
    x = keras.layers.BatchNormalization()(x)
    inner = keras.Model(inputs, x)
    outer_in = keras.Input((8, 8, 3))
    model = keras.Model(outer_in, keras.layers.BatchNormalization()(inner(outer_in)))
    exact = swap_batch_norm(model, ExactBatchNormalization)
    kinds = [type(layer) for layer in exact.layers[1].layers] + [type(exact.layers[-1])]
    assert kinds.count(ExactBatchNormalization) == 2
    assert keras.layers.BatchNormalization not in kinds
    x = np.random.default_rng(2).uniform(size=(2, 8, 8, 3)).astype("float32")
    np.testing.assert_array_equal(model(x), exact(x))


def test_compat_check_fails_loudly_when_an_internal_moves(monkeypatch):
    compat.check()  # today's Keras and TensorFlow have everything
    monkeypatch.setattr(compat, "_NEEDED", (*compat._NEEDED, (keras.Model, "_renamed_later")))
    with pytest.raises(ImportError, match="Model._renamed_later"):
        compat.check()


def test_backups_find_the_dropout_random_state():
    """Resume is exact only if the dropout seed state is saved; Keras keeps it in `variables`."""
    from mdtrain.backup import _rng_state

    net = build_model("small-cnn", 3, 16, dropout=0.5)
    state = _rng_state(net)
    assert len(state) == 1 and "seed" in state[0].path


def test_per_device_datasets_lose_the_autotuning_model_only_inside_a_run():
    """The datasets `MultiDeviceIterator` makes per replica get mdtrain's workaround in `train`.

    Their options cannot come from the input pipeline, so `mdtrain.compat.run_settings`
    patches where TensorFlow makes them, for the run only: a user's own MirroredStrategy
    pipeline outside `train` keeps TensorFlow's behaviour. This reads the options back
    through TensorFlow internals and fails if those move.
    """
    from mdtrain.compat import run_settings

    def per_device_autotuning() -> list[bool]:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        dataset = tf.data.Dataset.range(8).batch(4)
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        first = strategy.experimental_local_results(next(iterator))
        assert [t.numpy().tolist() for t in first] == [[0, 1], [2, 3]]
        per_device = iterator._iterators[0]._iterator._device_iterators
        assert len(per_device) == 2
        return [d._dataset.options().autotune.enabled is not False for d in per_device]

    assert per_device_autotuning() == [True, True]  # TensorFlow's default, untouched
    with run_settings():
        assert per_device_autotuning() == [False, False]
    assert per_device_autotuning() == [True, True]  # put back
