"""pargrad.SyncTrainer across processes: two workers of a pargrad.LocalCluster.

The one-process tests are in tests/test_sync.py; the float64 single-device
reference both compare with is tests/conftest.py's ``parabola_reference``.
"""

import numpy as np
import pytest

import pargrad
from pargrad.book.parabola import train_parabola
from pargrad.cluster import LocalCluster

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters

STEPS = 2000   # the reference's steps (tests/conftest.py's parabola_reference)
EXACT = pargrad.rounding_tolerance("float64", STEPS)


def max_gap(weights_a, weights_b):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights_a, weights_b))


def test_two_processes_match_one_process(parabola_reference):
    losses, weights = parabola_reference
    with LocalCluster(train_parabola, workers=2, kwargs={"steps": STEPS, "dtype": "float64"},
                      timeout=240) as cluster:
        results = cluster.wait()
    assert [r["replicas"] for r in results] == [2, 2]
    # Both workers hold the same parameters, equal to the single-device run.
    assert max_gap(results[0]["weights"], results[1]["weights"]) == 0
    assert max_gap(results[0]["weights"], weights) < EXACT
    assert np.max(np.abs(results[0]["loss"] - losses)) < EXACT
