"""Synchronous training across processes, killed and resumed from a checkpoint (chapter "Beyond one machine")."""

import os

import numpy as np
import psutil
import pytest

from pargrad.cluster import ClusterError, LocalCluster
from pargrad.multiworker import train_parabola_multiworker
from pargrad.parabola import fit_one_device, parabola_data


def children():
    return psutil.Process().children(recursive=True)


def test_in_one_process_it_equals_one_device(tmp_path):
    run = train_parabola_multiworker(steps=100, verbose=False)
    _, weights = fit_one_device(*parabola_data(48), steps=100)
    assert run["replicas"] == 4 and run["resumed_at"] == 0
    for a, b in zip(run["weights"], weights):
        np.testing.assert_allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of report_every"):
        train_parabola_multiworker(checkpoint_dir=str(tmp_path), checkpoint_every=30, report_every=25)


def test_a_killed_worker_resumes_from_the_last_checkpoint(tmp_path):
    settings = {"steps": 400, "checkpoint_dir": str(tmp_path), "checkpoint_every": 200,
                "seconds_between_reports": 0.2}  # time to kill worker 1 after step 250
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
    _, weights = fit_one_device(*parabola_data(48), steps=400)
    for a, b in zip(results[0]["weights"], weights):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-200.data-00000-of-00001",
                                           "ckpt-200.index", "ckpt-400.data-00000-of-00001",
                                           "ckpt-400.index"]
