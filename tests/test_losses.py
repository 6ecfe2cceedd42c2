"""pargrad.losses: per-example and mean losses, metrics, finite losses."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import pargrad
from pargrad.losses import (
    NonFiniteLossError,
    align_targets,
    check_finite_loss,
    keras_metrics,
    mean_loss,
    per_example_loss,
)


def test_a_non_finite_loss_names_its_step_and_who():
    check_finite_loss(1.5, 0, "worker 0")
    with pytest.raises(NonFiniteLossError, match="worker 1 is inf at step 7.*Pass this") as caught:
        check_finite_loss(float("inf"), 7, "worker 1", "Pass this.")
    assert (caught.value.step, caught.value.who) == (7, "worker 1")


@pytest.mark.usefixtures("deterministic_ops")
def test_what_a_loss_function_returns_is_read_as_keras_reads_it():
    """a scalar is the batch's mean; extra axes are averaged per example."""
    y, prediction = tf.constant([[1.0], [3.0]]), tf.constant([[0.0], [0.0]])
    scalar = pargrad.per_example_loss(lambda t, p: tf.reduce_mean(tf.square(t - p)))
    np.testing.assert_allclose(scalar(y, prediction).numpy(), [5.0, 5.0])
    per_output = pargrad.per_example_loss(lambda t, p: tf.square(t - p))    # shape (2, 1)
    np.testing.assert_allclose(per_output(y, prediction).numpy(), [1.0, 9.0])
    flat = pargrad.per_example_loss("mse")(tf.constant([1.0, 3.0]), prediction)  # y of (N,)
    np.testing.assert_allclose(flat.numpy(), [1.0, 9.0])


def test_targets_are_aligned_by_keras_rank_rule():
    y, prediction = align_targets(tf.zeros([4]), tf.zeros([4, 1]))
    assert (y.shape, prediction.shape) == ((4, 1), (4, 1))
    y, prediction = align_targets(tf.zeros([4, 3, 1]), tf.zeros([4, 3]))
    assert (y.shape, prediction.shape) == ((4, 3), (4, 3))


def test_the_mean_loss_keeps_a_scalar_the_function_returned():
    """a function returning the batch's mean is used as returned; other forms are averaged."""
    y, prediction = tf.constant([[1.0], [3.0]]), tf.constant([[0.0], [0.0]])
    returned = mean_loss(lambda t, p: tf.constant(7.0))
    assert float(returned(y, prediction)) == 7.0
    assert float(mean_loss("mse")(y, prediction)) == pytest.approx(5.0)
    assert float(mean_loss(None)(y, prediction)) == pytest.approx(5.0)


@pytest.mark.parametrize("loss, error, message", [
    (3, TypeError, "a Keras loss name such as 'mse'"),
    (keras.losses.MeanSquaredError, TypeError, r"MeanSquaredError\(\)"),
    ("no_such_loss", ValueError, "knows no loss"),
])
def test_a_wrong_loss_says_what_to_pass(loss, error, message):
    for resolve in (per_example_loss, mean_loss):
        with pytest.raises(error, match=message):
            resolve(loss)


def test_metrics_are_keras_metric_objects():
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    assert keras_metrics(accuracy) == [accuracy]
    assert keras_metrics(None) == []
    with pytest.raises(TypeError, match="Keras metric objects.*pass for example"):
        keras_metrics(["accuracy"])
