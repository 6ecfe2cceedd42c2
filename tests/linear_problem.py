"""A two-input linear regression whose gradients the tests compute by hand."""

import keras
import numpy as np

from pargrad.asynchronous import tf


def linear_model():
    """y = x @ w + b with two inputs, starting from fixed weights."""
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.set_weights([np.array([[0.5], [-1.0]], np.float32), np.array([0.25], np.float32)])
    return model


def linear_data(n):
    """``n`` seeded points of y = 2 x0 + x1 + 0.5."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 2)).astype(np.float32)
    y = (x @ np.array([[2.0], [1.0]]) + 0.5).astype(np.float32)
    return x, y


def mse(y, predictions):
    return tf.reduce_mean(tf.square(y - predictions))


def numpy_gradient(w, b, x, y):
    """Gradient of mean((x @ w + b - y)^2), by hand."""
    error = x @ w + b - y
    return 2 * x.T @ error / len(x), 2 * error.mean(axis=0)
