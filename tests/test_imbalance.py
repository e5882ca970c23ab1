"""Class weights: the balanced formula, `--class-weight auto`, and their effect on training."""

from __future__ import annotations

import numpy as np
import pytest

from mdtrain.imbalance import class_weights_for

COUNTS = [10, 5, 3, 2, 1]


def test_auto_class_weights_are_balanced_and_none_is_none():
    weights = class_weights_for("auto", COUNTS)
    np.testing.assert_allclose(weights, [21 / (5 * c) for c in COUNTS])
    # every class then carries the same total weight: n / k
    np.testing.assert_allclose(np.multiply(weights, COUNTS), [21 / 5] * 5)
    assert class_weights_for("auto", [4, 0]) == [0.5, 0.0]
    assert class_weights_for("none", COUNTS) is None


def test_auto_class_weights_reach_the_trainer(tiny_dataset):
    """`TrainConfig(class_weight="auto")` hands the training set's balanced weights to the step."""
    import tensorflow as tf

    from mdtrain.config import TrainConfig
    from mdtrain.data import ImageList, Splits, load_splits
    from mdtrain.parts import model_and_trainer

    splits = load_splits(tiny_dataset, check_decoding=False)
    labels = np.asarray(splits.train.labels)
    keep = [i for y, n in enumerate([8, 4, 2]) for i in np.flatnonzero(labels == y)[:n]]
    train = ImageList([splits.train.files[i] for i in keep], labels[keep].tolist())
    imbalanced = Splits(train, splits.val, splits.class_names, splits.skipped)

    def trainer(class_weight: str):
        config = TrainConfig(class_weight=class_weight)
        return model_and_trainer(config, tf.distribute.get_strategy(), imbalanced, None)[0]

    np.testing.assert_allclose(trainer("auto").class_weights.numpy(), [14 / 24, 14 / 12, 14 / 6],
                               rtol=1e-6)  # fmt: skip
    assert trainer("none").class_weights is None


def _train_tiny(strategy, batches, class_weights, exact: bool, optimizer) -> list[np.ndarray]:
    """A small conv net trained 2 epochs in float64 by `ExactTrainer` or Keras' own `fit`."""
    import keras

    from mdtrain.loop import ExactTrainer

    previous = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")  # rounding of the summation order stays below 1e-12
    keras.config.set_dtype_policy("float64")
    try:
        keras.utils.set_random_seed(0)
        with strategy.scope():
            inputs = keras.Input((8, 8, 3))
            x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
            x = keras.layers.GlobalAveragePooling2D()(x)
            net = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
            if exact:
                model = ExactTrainer(net, class_weights=class_weights)
                model.compile(optimizer=optimizer())
            else:
                model = net
                model.compile(optimizer=optimizer(),
                              loss=keras.losses.SparseCategoricalCrossentropy())  # fmt: skip
        keras_weights = None if exact or class_weights is None else dict(enumerate(class_weights))
        model.fit(batches, epochs=2, shuffle=False, verbose=0, class_weight=keras_weights)
    finally:
        keras.config.set_floatx(previous[0])
        keras.config.set_dtype_policy(previous[1])
    return net.get_weights()


def _max_difference(a, b) -> float:
    return max(
        float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-12)) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_exact_trainer_class_weights_are_keras_class_weight(optimizer):
    """ExactTrainer(class_weights=w) trains what Keras' fit(class_weight=w) trains, with plain
    SGD and with Adam (notebook 08's optimizer), and the weights matter: training without
    them ends elsewhere."""
    import keras
    import tensorflow as tf

    from mdtrain.distribute import make_strategy

    strategy = make_strategy("cpu:2")
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (16, 8, 8, 3))
    labels = np.array([0] * 10 + [1] * 4 + [2] * 2, np.int32)[rng.permutation(16)]
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)  # 4 + 4 per replica
    weights = class_weights_for("auto", np.bincount(labels).tolist())

    make = {"sgd": lambda: keras.optimizers.SGD(0.5), "adam": lambda: keras.optimizers.Adam(0.01)}
    exact = _train_tiny(strategy, batches, weights, True, make[optimizer])
    keras_weighted = _train_tiny(strategy, batches, weights, False, make[optimizer])
    keras_unweighted = _train_tiny(strategy, batches, None, False, make[optimizer])
    assert _max_difference(exact, keras_weighted) < 1e-10
    assert _max_difference(exact, keras_unweighted) > 1e-3


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_notebook_06_replicas_are_the_gpus_when_there_are_any(gpus):
    """Notebook 08's strategy runs one replica per GPU, and on virtual CPUs only without one."""
    import types
    from pathlib import Path

    import nbformat

    path = Path(__file__).resolve().parents[1] / "notebooks" / "08_class_imbalance.ipynb"
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                       if c.cell_type == "code")  # fmt: skip
    assert 'mdtrain.configure_devices("auto", cpu_replicas=2)' in source
    (line,) = [ln for ln in source.splitlines() if ln.startswith("devices = ")]
    virtual_cpus = [types.SimpleNamespace(name=f"/device:CPU:{i}") for i in range(2)]
    found = {"GPU": [types.SimpleNamespace(name=f"/device:GPU:{i}") for i in range(gpus)],
             "CPU": virtual_cpus if gpus == 0 else virtual_cpus[:1]}  # fmt: skip
    config = types.SimpleNamespace(list_logical_devices=lambda kind: found[kind])
    scope = {"tf": types.SimpleNamespace(config=config)}
    exec(line, scope)
    assert [d.name for d in scope["devices"]] == [d.name for d in (found["GPU"] or virtual_cpus)]
