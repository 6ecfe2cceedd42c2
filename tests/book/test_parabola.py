"""pargrad.book.parabola: the y = x² question's data, weights and network."""

import numpy as np
import pytest

from pargrad.book.parabola import initial_weights, parabola_data, parabola_model
from pargrad.checks import ArgumentTypeError


def test_the_data_are_evenly_spaced_points_and_their_squares():
    x, y = parabola_data(5, dtype="float64")
    assert x.shape == y.shape == (5, 1) and x.dtype == np.float64
    np.testing.assert_array_equal(x[:, 0], [-2.0, -1.0, 0.0, 1.0, 2.0])
    np.testing.assert_array_equal(y, x**2)


def test_float64_weights_are_the_float32_ones_widened():
    narrow, wide = initial_weights(4), initial_weights(4, dtype="float64")
    for a, b in zip(narrow, wide):
        assert b.dtype == np.float64 and np.array_equal(a.astype(np.float64), b)
    for a, b in zip(parabola_model(seed=4, dtype="float64").get_weights(), wide):
        np.testing.assert_array_equal(a, b)


def test_bad_input_says_what_to_pass():
    with pytest.raises(ValueError, match="n must be a whole number >= 1, got 0"):
        parabola_data(0)
    with pytest.raises(ArgumentTypeError, match="pass 50"):
        parabola_data(50.0)
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'float64', got 'float16'"):
        parabola_data(dtype="float16")
