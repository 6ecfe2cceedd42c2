"""pargrad.LocalSGDTrainer across processes: two workers of a pargrad.LocalCluster.

The workers run the target of tests/local_sgd_problem.py; its one-process
tests are in tests/test_local_sgd.py.
"""

import os

import numpy as np
import psutil
import pytest

import pargrad
from pargrad.cluster import ClusterError, LocalCluster
from pargrad.strategies import sync_strategy

from local_sgd_problem import least_squares_data, local_sgd_trainer, train_in_worker

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}


def max_gap(weights_a, weights_b):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(weights_a, weights_b))


def test_two_processes_equal_two_replicas_in_one():
    settings = {"local_steps": 3, "rounds": 4, "batch_size": 8}
    one_process = local_sgd_trainer(sync_strategy(2), 3)
    x, y = least_squares_data()
    history = one_process.fit(x, y, rounds=4, batch_size=8)
    with LocalCluster(train_in_worker, workers=2, kwargs=settings, env=ENV, timeout=150) as cluster:
        results = cluster.wait()
    tolerance = pargrad.rounding_tolerance("float64", 12, scale=4.0)
    for result in results:
        assert result["replicas"] == 2
        assert max_gap(result["weights"], one_process.model.get_weights()) < tolerance
        assert np.max(np.abs(result["loss"] - history.loss)) < tolerance * 10
        assert np.array_equal(result["bytes_sent"], history.bytes_sent)


def test_a_non_finite_loss_in_one_process_stops_every_worker():
    settings = {"local_steps": 2, "rounds": 3, "batch_size": 8, "poison_row": 21}
    with LocalCluster(train_in_worker, workers=2, kwargs=settings, env=ENV, timeout=150) as cluster:
        with pytest.raises(ClusterError, match="NonFiniteLossError"):
            cluster.wait()
        pids = cluster.pids
    assert not [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
