"""Synchronous training across processes (chapter "Beyond one machine"): in one process here.

The chapter itself runs it on a two-process cluster, kills a worker and resumes from the
checkpoint; its hidden cells assert what that run must show (no process left behind, both
workers resumed at the checkpoint and redid only the missing steps, the checkpoint files,
weights bit-equal to the uninterrupted run), in every run of the chapter.
"""

import numpy as np
import pytest

from pargrad import rounding_tolerance
from pargrad.book.multiworker import train_parabola_multiworker
from pargrad.book.parabola import fit_one_device, parabola_data

# Keras keeps the learning rate in float32; the float64 reference uses the same number.
KERAS_RATE = float(np.float32(1e-2))


def reference_weights(steps):
    """The one-device float64 run on the 48 points: what every worker must end with."""
    return fit_one_device(*parabola_data(48, dtype="float64"), steps=steps, learning_rate=KERAS_RATE)[1]


@pytest.mark.claim
def test_in_one_process_it_equals_one_device(tmp_path):
    run = train_parabola_multiworker(steps=100, verbose=False, dtype="float64")
    assert run["replicas"] == 4 and run["resumed_at"] == 0
    for a, b in zip(run["weights"], reference_weights(100)):
        np.testing.assert_allclose(a, b, rtol=0, atol=rounding_tolerance("float64", 100))
    with pytest.raises(ValueError, match="multiple of report_every"):
        train_parabola_multiworker(checkpoint_dir=str(tmp_path), checkpoint_every=30, report_every=25)
