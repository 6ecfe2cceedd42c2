"""pargrad.SyncTrainer across processes: two workers of a pargrad.LocalCluster.

The one-process tests, and the float64 reference this file repeats, are in
tests/test_sync.py.
"""

import numpy as np
import pytest

import pargrad
from pargrad.book.parabola import fit_one_device, parabola_data, train_parabola
from pargrad.cluster import LocalCluster

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters

STEPS = 2000
EXACT = pargrad.rounding_tolerance("float64", STEPS)
# Keras keeps the learning rate in float32 (keras.backend.floatx()) even for
# a float64 model: the float64 reference uses the same number.
KERAS_RATE = float(np.float32(1e-2))


@pytest.fixture(scope="module")
def reference():
    """The y = x² network on one device with the full batch of 50, in float64: (losses, weights)."""
    x, y = parabola_data(dtype="float64")
    return fit_one_device(x, y, steps=STEPS, learning_rate=KERAS_RATE, seed=0)


def max_gap(weights_a, weights_b):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights_a, weights_b))


def test_two_processes_match_one_process(reference):
    with LocalCluster(train_parabola, workers=2, kwargs={"steps": STEPS, "dtype": "float64"},
                      timeout=240) as cluster:
        results = cluster.wait()
    assert [r["replicas"] for r in results] == [2, 2]
    # Both workers hold the same parameters, equal to the single-device run.
    assert max_gap(results[0]["weights"], results[1]["weights"]) == 0
    assert max_gap(results[0]["weights"], reference[1]) < EXACT
    assert np.max(np.abs(results[0]["loss"] - reference[0])) < EXACT
