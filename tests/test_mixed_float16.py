"""Mixed float16 on 2 CPU replicas: an overflow on any replica skips the step on all of them.

Real float16 arithmetic (TensorFlow runs it on the CPU) under `mixed_float16`, where Keras'
`compile` wraps the optimizer in a `LossScaleOptimizer` (initial scale 2**15). One layer
multiplies replica 1's logits past float16's largest value (65504), so only that replica's
gradients are not finite. mdtrain's step skips the update everywhere and halves the scale;
Keras 3.15's own `fit` reads replica 0's verdict only and writes NaN into the weights
(`mdtrain.trainer_hooks.skip_together`, docs/numerics.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from mdtrain.loop import ExactTrainer, custom_fit  # noqa: E402
from tests.numerics_harness import side_by_side_strategies  # noqa: E402

pytestmark = pytest.mark.slow
SCALE = 2.0**15  # LossScaleOptimizer's initial scale


class OverflowOn(keras.layers.Layer):
    """Multiplies the logits of replica `replica` (None: of none) by 30,000: past 65504."""

    def __init__(self, replica=None, **kwargs):
        super().__init__(**kwargs)
        self.replica = replica

    def call(self, logits):
        context = tf.distribute.get_replica_context()  # None while the model is built
        if self.replica is None or context is None:
            return logits
        here = tf.equal(context.replica_id_in_sync_group, self.replica)
        return logits * tf.cast(tf.where(here, 3e4, 1.0), logits.dtype)


def _net(replica) -> keras.Model:
    inputs = keras.Input((4,))
    logits = keras.layers.Dense(3, kernel_initializer="ones")(inputs)  # logits of 4.0: finite
    logits = OverflowOn(replica)(logits)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(logits))


def _one_step(kind: str, replica) -> tuple[list, list, float]:
    """Weights before and after one step of 4 examples (2 per replica), and the loss scale."""
    strategy = side_by_side_strategies((2,))[2]
    dataset = tf.data.Dataset.from_tensor_slices((np.ones((4, 4), "float32"), [0, 1, 2, 0]))
    dataset = dataset.batch(4)
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        with strategy.scope():
            net = _net(replica)
            model = net if kind == "keras" else ExactTrainer(net)
            loss = {"loss": "sparse_categorical_crossentropy"} if kind == "keras" else {}
            model.compile(keras.optimizers.SGD(0.1), **loss)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert net.layers[1].compute_dtype == "float16"
        before = net.get_weights()
        if kind == "custom":
            custom_fit(model, strategy, dataset, epochs=1, steps_per_epoch=1, verbose=0)
        else:
            model.fit(dataset, epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    return before, net.get_weights(), float(model.optimizer.dynamic_scale.numpy())


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_an_overflow_on_replica_1_skips_the_step_on_every_replica(loop):
    before, after, scale = _one_step(loop, replica=1)
    assert all(np.isfinite(w).all() for w in after)
    for got, want in zip(after, before, strict=True):
        np.testing.assert_array_equal(got, want)  # the step was skipped
    assert scale == SCALE / 2


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_finite_step_under_loss_scaling_trains(loop):
    before, after, scale = _one_step(loop, replica=None)
    assert all(np.isfinite(w).all() for w in after)
    assert not np.array_equal(after[0], before[0])
    assert scale == SCALE


def test_keras_own_fit_loses_the_weights_on_an_overflow_on_replica_1():
    """Keras 3.15's bug, kept in view: when this test fails, Keras decides on every replica."""
    _, after, scale = _one_step("keras", replica=1)
    fixed = all(np.isfinite(w).all() for w in after) and scale == SCALE / 2
    assert not fixed, "Keras fixed it: drop the workaround (mdtrain.trainer_hooks.skip_together)"
    assert not np.isfinite(after[0]).all() and scale == SCALE


# One worker of two (1 replica each) under MultiWorkerMirroredStrategy: replica 1 is worker 1.
# Each worker's merge call sees only its own replica, so Keras alone would apply the step on
# worker 0 and skip it on worker 1 (whose gradients never join worker 0's all-reduce).
_WORKER = """
import json, sys
sys.path.insert(0, sys.argv[1])  # the repository root, for the test's model
import keras
import numpy as np
import tensorflow as tf
from mdtrain.distribute import configure_devices, make_strategy, shard_by_batch
configure_devices("multiworker")
strategy = make_strategy("multiworker")
from mdtrain.loop import ExactTrainer, custom_fit
from tests.test_mixed_float16 import _net

keras.mixed_precision.set_dtype_policy("mixed_float16")
with strategy.scope():
    net = _net(replica=1)
    trainer = ExactTrainer(net)
    trainer.compile(keras.optimizers.SGD(0.1))
batches = tf.data.Dataset.from_tensor_slices((np.ones((4, 4), "float32"), [0, 1, 2, 0]))
before = net.get_weights()
custom_fit(trainer, strategy, shard_by_batch(batches.batch(4)), epochs=1, steps_per_epoch=1,
           verbose=0)
print(json.dumps({"unchanged": all(np.array_equal(a, b) for a, b in zip(before, net.get_weights())),
                  "scale": float(trainer.optimizer.dynamic_scale.numpy())}))
"""


def test_an_overflow_on_worker_1_skips_the_step_on_both_workers():
    from mdtrain.launcher.jobs import free_ports, tf_config

    root = str(Path(__file__).resolve().parents[1])
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, root], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TF_CONFIG": json.dumps(tf_config(addresses, i))})
        for i in range(2)
    ]  # fmt: skip
    try:
        outputs = [worker.communicate(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"unchanged": True, "scale": SCALE / 2}


_TRAIN = """
import json, sys
import numpy as np
from mdtrain.distribute import configure_devices
configure_devices("cpu:2")
from mdtrain.training import TrainConfig, train

result = train(TrainConfig(data=sys.argv[1], image_size=16, epochs=1, global_batch_size=10,
                           mixed_precision=True, strategy="cpu:2", monitor="none", verbose=0))
print(json.dumps({"finite": all(bool(np.isfinite(w).all()) for w in result.model.get_weights()),
                  "history": result.history, "policy": result.summary()["precision"]}))
"""


def test_train_with_mixed_precision_on_two_replicas(tiny_dataset):
    done = subprocess.run([sys.executable, "-c", _TRAIN, str(tiny_dataset / "train")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["finite"] and np.isfinite(result["history"][0]["loss"])
    assert result["policy"].startswith("mixed_")
