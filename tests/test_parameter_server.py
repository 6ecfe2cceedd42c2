"""ParameterServerStrategy across processes, and surviving a dead worker (chapter "Beyond one machine")."""

import numpy as np
import psutil
import pytest

from pargrad.cluster import LocalCluster
from pargrad.book.parabola import fit_one_device, parabola_data
from pargrad.book.parameter_server import parameter_server_strategy, train_parameter_server


def children():
    return psutil.Process().children(recursive=True)


def test_the_strategy_needs_a_coordinator_with_parameter_servers(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="parameter_servers=1"):
        parameter_server_strategy()


def test_training_survives_a_killed_worker_and_reruns_its_work():
    updates = 200
    with LocalCluster(train_parameter_server, workers=2, parameter_servers=2, timeout=120,
                      kwargs={"updates": updates, "report_every": 25}) as cluster:
        pids = cluster.pids
        cluster.wait_for("updates 100", role="chief")
        cluster.kill("worker", 1)
        killed = __import__("time").time()
        (run,) = cluster.wait()
    assert children() == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)
    worker, finished = np.array(run["worker"]), np.array(run["finished"])
    # Every scheduled update was applied (at least once), the late ones by worker 0 alone.
    assert run["scheduled"] == updates and run["applied"] >= updates
    assert len(run["loss"]) == updates
    assert set(worker[finished > killed].tolist()) == {0}
    assert set(worker[:50].tolist()) <= {0, 1}
    # Variables are cut into shards over the two parameter servers.
    assert run["shard_shapes"][1] == [[3], [2]] and run["shard_shapes"][2] == [[3, 1], [2, 1]]
    assert {d.split("/")[3] for devices in run["shard_devices"] for d in devices} == {"task:0", "task:1"}
    # It trains: close to the one-device loss, and the staleness proxy is a count.
    reference, _ = fit_one_device(*parabola_data(), steps=updates)
    assert run["loss"][-1] < run["loss"][0]
    assert abs(run["loss"][-1] - reference[-1]) < 0.2
    assert np.array(run["staleness"]).min() >= 0
