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


def test_compat_check_fails_loudly_when_the_spare_iterators_condition_moves(monkeypatch):
    condition = (*compat._SPARE_CONDITION, "_steps_counted")  # as if Keras renamed one
    monkeypatch.setattr(compat, "_SPARE_CONDITION", condition)
    with pytest.raises(ImportError, match="EpochIterator._steps_counted"):
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


# --- steps_per_execution, and the fused augmentation on an empty replica slice -------------


def _tiny_net(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))


class _Positions(keras.callbacks.Callback):
    """The optimizer's step count at each epoch's end, and the examples each call trained on."""

    def on_train_begin(self, logs=None):
        self.at_epoch_end, self.examples = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.examples.append(float(self.model.last_step.batch_size))

    def on_epoch_end(self, epoch, logs=None):
        self.at_epoch_end.append(int(self.model.optimizer.iterations.numpy()))


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize(
    "examples, spe, epochs, want",
    [
        (None, 3, 2, [12.0, 8.0, 12.0, 8.0]),  # endless data, 5 steps: calls of 3 and 2
        (34, 8, 3, [12.0, 12.0, 10.0]),  # 9 batches (the last of 2), 3 epochs of 3 steps
    ],
)
def test_steps_per_execution_stops_each_call_at_the_epochs_end(loop, examples, spe, epochs, want):
    """Epochs back to back in one dataset (as `InputData.train_epochs`), N steps per call.

    Keras' own fit would run 3 + 3 steps in a 5-step epoch, the sixth from the next epoch;
    and counting 8 steps per call it would start 9 batches over after 2 epochs of 3.
    """
    from mdtrain.loop import custom_fit
    from tests.numerics_harness import side_by_side_strategies

    strategy = side_by_side_strategies((2,))[2]
    data = np.random.default_rng(0).random((examples or 40, 4), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((data, np.arange(len(data)) % 3)).batch(4)
    dataset = dataset if examples else dataset.repeat()
    steps = 5 if examples is None else 3
    with strategy.scope():
        trainer = ExactTrainer(_tiny_net())
        trainer.compile(optimizer=keras.optimizers.SGD(0.1), steps_per_execution=spe)
    positions = _Positions()
    run = dict(epochs=epochs, steps_per_epoch=steps, callbacks=[positions], verbose=0)
    if loop == "fit":
        trainer.fit(dataset, **run)
    else:
        custom_fit(trainer, strategy, dataset, **run)
    assert positions.at_epoch_end == [steps * (e + 1) for e in range(epochs)]
    assert positions.examples == want  # every call's global examples


@pytest.mark.slow
def test_an_empty_replica_slice_is_augmented_in_the_model_like_one_device(monkeypatch):
    """5 images on 4 replicas (2/2/1/0), the transforms applied in the step (`augment_in="model"`).

    The empty slice is padded before the fused augmentation (compiled with XLA, which on a
    GPU would get a zero-size program) sees it; the weights match one device trained on the
    same images augmented beforehand.
    """
    from mdtrain import loop
    from mdtrain.augment import AugmentPolicy, apply_packed, pack_transforms, sample_transforms
    from tests.numerics_harness import max_relative_difference, side_by_side_strategies

    def never_empty(images, *args):
        message = "an empty slice reached the fused augmentation"
        with tf.control_dependencies([tf.debugging.assert_positive(tf.shape(images)[0], message)]):
            return apply_packed(tf.identity(images), *args)

    monkeypatch.setattr(loop, "apply_packed", never_empty)

    policy = AugmentPolicy(brightness=(0.8, 1.2), contrast=0.2)
    rng = np.random.default_rng(0)
    images = tf.constant(rng.integers(0, 256, (5, 16, 16, 3)), tf.uint8)
    labels = tf.constant([0, 1, 2, 0, 1])
    transforms = pack_transforms(sample_transforms(5, policy, tf.constant([1, 2])), 16.0, 16.0)
    augmented = apply_packed(images, policy, transforms)
    strategies = side_by_side_strategies((1, 4))
    weights = {}
    for replicas, batch, augment in ((1, (augmented, labels), None),
                                     (4, (images, labels, transforms), policy)):  # fmt: skip
        dataset = tf.data.Dataset.from_tensors(batch)
        with strategies[replicas].scope():
            keras.utils.set_random_seed(0)
            trainer = ExactTrainer(build_model("small-cnn", 3, 16, dropout=0.0), augment=augment)
            trainer.compile(optimizer=keras.optimizers.SGD(0.1))
        trainer.fit(dataset, epochs=2, verbose=0)
        weights[replicas] = trainer.net.get_weights()
        assert all(np.isfinite(w).all() for w in weights[replicas])
    assert max_relative_difference(weights[4], weights[1]) < 1e-4


def _examples(shuffled: bool = False) -> tf.data.Dataset:
    """10 examples of 4 features in batches of 4 (the last of 2), reshuffled each pass if asked."""
    rng = np.random.default_rng(0)
    ds = tf.data.Dataset.from_tensor_slices((rng.random((10, 4), np.float32), np.arange(10) % 3))
    return (ds.shuffle(10, seed=1) if shuffled else ds).batch(4)


@pytest.mark.slow
@pytest.mark.parametrize("spe", [1, 2])
def test_each_pass_makes_one_distributed_iterator(monkeypatch, spe):
    """Keras' `fit` makes two a pass of a dataset of known length; the trainer makes one.

    3 epochs on 2 replicas: training makes 3 distributed iterators, not 6, and validation 3
    more; validation reads every batch (its last figure is `evaluate`'s) and leaves
    training as it was.
    """
    from tests.numerics_harness import side_by_side_strategies

    strategy = side_by_side_strategies((2,))[2]
    distributed_type = type(strategy.experimental_distribute_dataset(_examples()))
    make_iterator, iterators = distributed_type.__iter__, []

    def counted(dataset):
        iterators.append(dataset)
        return make_iterator(dataset)

    def trained(**validation):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            trainer = ExactTrainer(_tiny_net())
            trainer.compile(optimizer=keras.optimizers.SGD(0.1), steps_per_execution=spe)
        iterators.clear()
        with monkeypatch.context() as patch:
            patch.setattr(distributed_type, "__iter__", counted)
            history = trainer.fit(_examples(), epochs=3, verbose=0, **validation)
        return trainer, history, len(iterators)

    plain, _, training_iterators = trained()
    validated, history, all_iterators = trained(validation_data=_examples())
    assert (training_iterators, all_iterators) == (3, 6)
    last = validated.evaluate(_examples(), return_dict=True, verbose=0)
    assert history.history["val_loss"][-1] == pytest.approx(last["loss"], rel=1e-6)
    for mine, theirs in zip(validated.net.get_weights(), plain.net.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.slow
def test_reshuffled_epochs_come_in_keras_order():
    """Two `fit` calls of 3 epochs of a seeded reshuffling dataset on 2 replicas end with
    Keras' weights on one device: each pass draws the seeds Keras' passes draw.
    """
    from tests.numerics_harness import side_by_side_strategies

    strategy = side_by_side_strategies((2,))[2]
    keras.utils.set_random_seed(0)
    with strategy.scope():
        trainer = ExactTrainer(_tiny_net())
        trainer.compile(optimizer=keras.optimizers.SGD(0.5))
    theirs = _tiny_net()
    theirs.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
    for model in (trainer, theirs):
        shuffled = _examples(shuffled=True)
        for _ in range(2):
            model.fit(shuffled, epochs=3, verbose=0, validation_data=_examples())
    for mine, keras_weights in zip(trainer.net.get_weights(), theirs.get_weights(), strict=True):
        np.testing.assert_allclose(mine, keras_weights, rtol=1e-5, atol=1e-6)
