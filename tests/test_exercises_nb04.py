"""Notebook 04's exercise check: an exact step passes, fit's and the fixed divisor's rules don't."""

import keras
import pytest
import tensorflow as tf

from mdtrain_course.exercises import ExerciseError, nb04


def _step(loss_rule):
    def exact_train_step(model, optimizer, images, labels):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        with tf.GradientTape() as tape:
            loss = loss_rule(loss_fn(labels, model(images, training=True)), labels)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    return exact_train_step


def _global_count(per_example_loss, labels):
    context = tf.distribute.get_replica_context()
    count = context.all_reduce("sum", tf.cast(tf.shape(labels)[0], per_example_loss.dtype))
    return tf.reduce_sum(per_example_loss) / count


def _fit_rule(per_example_loss, labels):
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return tf.reduce_mean(per_example_loss) / replicas


def _fixed_divisor(per_example_loss, labels):
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=4)


def test_the_exact_step_works(capsys):
    assert nb04.check_exact_train_step(_step(_global_count), strict=True)
    assert "✓ The partial batch, exactly: it works." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        (_step(_fit_rule), "as `fit` does"),
        (_step(_fixed_divisor), "not the mean over the 3 examples"),
    ],
    ids=["fit-rule", "fixed-divisor"],
)
def test_a_rule_wrong_on_the_partial_batch_is_named(capsys, step, problem):
    assert nb04.check_exact_train_step(step) is False
    assert problem in capsys.readouterr().out


def test_a_wrong_worked_solution_raises():
    with pytest.raises(ExerciseError, match="exactly"):
        nb04.check_exact_train_step(_step(_fit_rule), strict=True)
