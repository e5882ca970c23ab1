"""Notebook 03's exercise check: a right step passes, each usual mistake is named."""

import keras
import pytest
import tensorflow as tf

from mdtrain_course.exercises import ExerciseError, nb03


def _step(loss_rule, regularization):
    def train_step(model, optimizer, images, labels, global_batch_size):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        with tf.GradientTape() as tape:
            per_example_loss = loss_fn(labels, model(images, training=True))
            loss = loss_rule(per_example_loss, global_batch_size)
            if regularization is not None:
                loss += regularization(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    return train_step


def _global(per_example_loss, global_batch_size):
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def _own_mean(per_example_loss, global_batch_size):
    return tf.reduce_mean(per_example_loss)


def test_the_right_step_works(capsys):
    assert nb03.check_train_step(_step(_global, tf.nn.scale_regularization_loss), strict=True)
    assert "✓ A training step with weight decay: it works." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        (_step(_global, None), "regularization losses (`model.losses`) are missing"),
        (_step(_global, lambda penalty: penalty), "counted once on each of the 2 replicas"),
        (_step(_own_mean, tf.nn.scale_regularization_loss), "its own number of examples"),
    ],
    ids=["no-penalty", "penalty-per-replica", "own-mean"],
)
def test_each_mistake_is_named_without_raising(capsys, step, problem):
    assert nb03.check_train_step(step) is False
    assert problem in capsys.readouterr().out


def test_the_placeholder_and_a_step_that_raises_are_said_in_words(capsys):
    assert nb03.check_train_step(None) is False
    assert nb03.check_train_step(lambda *args: None) is False
    out = capsys.readouterr().out
    assert "train_step is still the placeholder" in out and "calling it raised" in out


def test_a_wrong_worked_solution_raises():
    with pytest.raises(ExerciseError, match="weight decay"):
        nb03.check_train_step(_step(_global, None), strict=True)


def test_on_one_device_half_a_global_batch_still_tells_the_rules_apart(monkeypatch, capsys):
    from mdtrain_course.exercises import steps

    monkeypatch.setattr(nb03, "step_devices", lambda count: steps.step_devices(1))
    assert nb03.check_train_step(_step(_global, tf.nn.scale_regularization_loss), strict=True)
    assert nb03.check_train_step(_step(_own_mean, tf.nn.scale_regularization_loss)) is False
    assert "its own number of examples" in capsys.readouterr().out
