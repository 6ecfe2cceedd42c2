"""pargrad.training: checked input, per-example losses, finite data and losses."""

import numpy as np
import pytest

from pargrad.training import NonFiniteDataError, check_finite_data, first_non_finite_row


def test_the_first_non_finite_row_is_found_in_any_shape():
    images = np.zeros((5, 4, 4, 1), np.float32)
    images[3, 2, 1, 0] = np.inf
    images[4, 0, 0, 0] = np.nan
    assert first_non_finite_row(images) == (3, np.inf)
    assert first_non_finite_row(np.arange(6).reshape(3, 2)) is None      # integers: finite
    with pytest.raises(NonFiniteDataError, match=r"nan at row 1 of y(.|\n)*np.isfinite"):
        check_finite_data(np.zeros((2, 1)), np.array([[0.0], [np.nan]]))
