"""Synchronous training across processes, killed and resumed from a checkpoint (chapter "Beyond one machine")."""

import os

import numpy as np
import psutil
import pytest

from pargrad import rounding_tolerance
from pargrad.cluster import ClusterError, LocalCluster
from pargrad.book.multiworker import train_parabola_multiworker
from pargrad.book.parabola import fit_one_device, parabola_data

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters


# Keras keeps the learning rate in float32; the float64 reference uses the same number.
KERAS_RATE = float(np.float32(1e-2))


def children():
    return psutil.Process().children(recursive=True)


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


def test_a_killed_worker_resumes_from_the_last_checkpoint(tmp_path):
    settings = {"steps": 400, "checkpoint_dir": str(tmp_path), "checkpoint_every": 200,
                "seconds_between_reports": 0.2,  # time to kill worker 1 after step 250
                "dtype": "float64", "deterministic": True}
    with pytest.raises(ClusterError, match="worker 1 exited with signal SIGKILL"):
        with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as first:
            pids = first.pids
            first.wait_for("step 250")
            first.kill("worker", 1, expected=False)
            first.wait()
    assert children() == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)
    saved = [line for _, index, line in first.lines if line.startswith("checkpoint") and index == 0]
    assert saved == ["checkpoint 200"]
    with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as second:
        results = second.wait()
    assert children() == []
    assert [r["resumed_at"] for r in results] == [200, 200]
    assert "[worker 0] step 225" in second.log()          # the first step after the checkpoint
    assert all(len(r["loss"]) == 200 for r in results)      # only the missing steps were redone
    for a, b in zip(results[0]["weights"], reference_weights(400)):
        np.testing.assert_allclose(a, b, rtol=0, atol=rounding_tolerance("float64", 400))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-200.data-00000-of-00001",
                                           "ckpt-200.index", "ckpt-400.data-00000-of-00001",
                                           "ckpt-400.index"]
