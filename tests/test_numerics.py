"""pargrad.numerics: the unit roundoff and the rounding tolerance the book's equalities use."""

import numpy as np
import pytest

from pargrad.numerics import SAFETY, rounding_tolerance, unit_roundoff


def test_unit_roundoff_is_half_the_gap_above_one():
    assert unit_roundoff("float32") == 2.0 ** -24 == np.finfo(np.float32).eps / 2
    assert unit_roundoff(np.float64) == 2.0 ** -53
    assert unit_roundoff("float16") == 2.0 ** -11
    assert np.float32(1) + np.float32(unit_roundoff("float32") * 2) != np.float32(1)


def test_the_tolerance_grows_with_steps_and_scale():
    assert rounding_tolerance("float32", 1) == SAFETY * 2.0 ** -24
    assert rounding_tolerance("float32", 2000) == 2000 * rounding_tolerance("float32", 1)
    assert rounding_tolerance("float64", 10, scale=4) == 4 * rounding_tolerance("float64", 10)
    assert rounding_tolerance("float64", np.int64(3), scale=np.float32(0.5)) == pytest.approx(
        1.5 * rounding_tolerance("float64", 1))
    assert 1e-3 < rounding_tolerance("float32", 2000) < 2e-3      # the docstring's "about 1e-3"
    assert 1e-12 < rounding_tolerance("float64", 2000) < 3e-12    # and "about 2e-12"


@pytest.mark.parametrize("call, error, words", [
    (lambda: unit_roundoff("int32"), ValueError, "floating-point dtype"),
    (lambda: rounding_tolerance("float32", 0), ValueError, "steps must be a whole number >= 1"),
    (lambda: rounding_tolerance("float32", 2.0), TypeError, "pass 2"),
    (lambda: rounding_tolerance("float32", True), TypeError, "steps must be a whole number"),
    (lambda: rounding_tolerance("float32", 5, scale=0), ValueError, "scale must be a positive"),
    (lambda: rounding_tolerance("float32", 5, scale="1"), TypeError, "scale must be a positive"),
    (lambda: rounding_tolerance("int64", 5), ValueError, "floating-point dtype"),
])
def test_bad_arguments_say_what_to_pass(call, error, words):
    with pytest.raises(error, match=words) as caught:
        call()
    assert isinstance(caught.value, TypeError) == (error is TypeError)
