"""pargrad.book.lost_updates: threads adding to one variable, and the adds they lose."""

import keras
import pytest

import pargrad  # noqa: F401  (first: TensorFlow quietly)
import tensorflow as tf
from pargrad.book.lost_updates import lost_updates
from pargrad.checks import ArgumentTypeError


def test_keras_assign_add_loses_updates_under_threads_native_does_not(devices):
    assert lost_updates(tf.Variable(0.0), threads=2, increments=1000) == 0
    # Losing is a matter of luck; it has happened on every try so far, but allow three.
    assert any(lost_updates(keras.Variable(0.0), threads=2, increments=1000) > 0
               for _ in range(3))


def test_one_thread_loses_nothing_and_counts_from_zero():
    variable = keras.Variable(5.0)
    assert lost_updates(variable, threads=1, increments=10) == 0
    assert float(variable.numpy()) == 10.0


def test_bad_counts_say_what_to_pass():
    with pytest.raises(ValueError, match="threads"):
        lost_updates(tf.Variable(0.0), threads=0)
    with pytest.raises(ArgumentTypeError, match="increments"):
        lost_updates(tf.Variable(0.0), increments="10")
