"""ParameterServerStrategy across processes, and surviving a dead worker (chapter "Beyond one machine")."""

import numpy as np
import psutil
import pytest

from pargrad.book.parabola import fit_one_device, parabola_data
from pargrad.book.parameter_server import kill_worker_after_its_update, parameter_server_strategy

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters


def children():
    return psutil.Process().children(recursive=True)


def test_the_strategy_needs_a_coordinator_with_parameter_servers(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="parameter_servers=1"):
        parameter_server_strategy()


def test_a_worker_killed_right_after_its_update_loses_no_record():
    updates, count = 200, 50
    run, killed = kill_worker_after_its_update(updates=updates, count=count)
    assert children() == []
    worker, finished = np.array(run["worker"]), np.array(run["finished"])
    # Every scheduled update was applied (at least once), the late ones by worker 0 alone.
    assert run["scheduled"] == updates and run["applied"] >= updates
    assert set(worker[finished > killed].tolist()) == {0}
    # Each update's record survives on the parameter servers, one a version: the
    # `count` updates worker 1 had announced before it died are all there, and at
    # most the closure it was running when killed lost its record.
    assert len(run["loss"]) + run["records_lost"] == run["applied"]
    assert run["records_lost"] <= 1
    assert list(run["version"]) == sorted(set(run["version"])) and run["version"][-1] < run["applied"]
    assert (worker[finished < killed] == 1).sum() >= count
    # Variables are cut into shards over the two parameter servers.
    assert run["shard_shapes"][1] == [[3], [2]] and run["shard_shapes"][2] == [[3, 1], [2, 1]]
    assert {d.split("/")[3] for devices in run["shard_devices"] for d in devices} == {"task:0", "task:1"}
    # It trains: close to the one-device loss, and the staleness proxy is a count.
    reference, _ = fit_one_device(*parabola_data(), steps=updates)
    assert run["loss"][-1] < run["loss"][0]
    assert abs(run["loss"][-1] - reference[-1]) < 0.2
    assert np.array(run["staleness"]).min() >= 0
    # Each record's times: read before applied; begun after the kill, worker 0
    # alone ran it and at most one other update landed meanwhile.
    started, staleness = np.array(run["started"]), np.array(run["staleness"])
    assert (started <= finished).all()
    alone = started > killed
    assert alone.sum() > 0 and set(worker[alone].tolist()) == {0}
    assert staleness[alone].max() <= 1
