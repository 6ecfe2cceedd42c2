"""pargrad.book.delay: gradient descent with a delayed gradient on a quadratic, and its bound."""

import math

import numpy as np
import pytest

from pargrad.book import delay


def test_the_bound_is_two_sine_of_pi_over_two_times_two_tau_plus_one():
    assert delay.stable_rate_bound(0) == 2.0
    assert delay.stable_rate_bound(1) == pytest.approx(1.0)
    assert delay.stable_rate_bound(3) == pytest.approx(2 * math.sin(math.pi / 14))


def test_the_delayed_recursion_by_hand():
    # w(t+1) = w(t) - 0.5 w(t - 1); before one update has landed, every read is w(0).
    np.testing.assert_array_equal(delay.delayed_gradient_path(0.5, 1, 1.0, 3),
                                  [1.0, 0.5, 0.0, -0.25])
    path = delay.delayed_gradient_path(0.9 * delay.stable_rate_bound(3), 3, 1.0, 400)
    assert delay.growth_per_update(path, 3) < 1
    path = delay.delayed_gradient_path(1.1 * delay.stable_rate_bound(3), 3, 1.0, 400)
    assert delay.growth_per_update(path, 3) > 1


@pytest.mark.parametrize("call, error, message", [
    (lambda: delay.stable_rate_bound(1.0), TypeError, "staleness .*must be a whole number >= 0 .*pass 1"),
    (lambda: delay.stable_rate_bound(-1), ValueError, "staleness .*must be a whole number >= 0"),
    (lambda: delay.delayed_gradient_path(0.5, 1, updates=-1), ValueError, "updates must be a whole"),
    (lambda: delay.growth_per_update([1.0, 0.5], 1), ValueError, "at least τ \\+ 2 = 3 values"),
])
def test_bad_arguments_say_what_to_pass(call, error, message):
    with pytest.raises(error, match=message):
        call()
