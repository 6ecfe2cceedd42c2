"""pargrad.LocalCluster: processes on 127.0.0.1 that are always stopped.

The worker targets are defined here; the workers import this module through
PYTHONPATH.
"""

import json
import os
import signal
import socket
import time

import numpy as np
import psutil
import pytest

from pargrad.cluster import (
    ClusterError,
    ClusterTimeoutError,
    LocalCluster,
    free_ports,
    run_cluster,
    tf_config,
)
from pargrad.cluster import main as cluster_main

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}


# -- targets, run inside the workers -----------------------------------------------

def describe(greeting):
    config = json.loads(os.environ["TF_CONFIG"])
    print(f"{greeting} from worker {config['task']['index']}")
    return {"config": config, "pid": os.getpid(), "array": np.arange(3, dtype=np.float32)}


def fail_on_worker_one():
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if index == 1:
        raise RuntimeError("worker one gives up")
    time.sleep(60)


def sleep(seconds):
    time.sleep(seconds)


def finish_at_different_times(flag_path):
    """Worker 0 returns at once; worker 1 returns after it, saying whether 0 was still up."""
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if index == 0:
        with open(flag_path, "w") as flag:
            flag.write(str(os.getpid()))
        return {"pid": os.getpid()}
    deadline = time.monotonic() + 60
    while not os.path.exists(flag_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)          # worker 0 has long handed back its result by now
    peer = int(open(flag_path).read())
    alive = psutil.pid_exists(peer) and psutil.Process(peer).status() != psutil.STATUS_ZOMBIE
    return {"pid": os.getpid(), "peer_alive": alive}


def train_until_killed():
    from pargrad.book.parabola import train_parabola

    print("ready", flush=True)
    train_parabola(steps=10**6, steps_per_call=100)


# -- helpers -------------------------------------------------------------------------

def children():
    return psutil.Process().children(recursive=True)


def assert_all_gone(pids):
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert children() == []


# -- tests ---------------------------------------------------------------------------

def test_each_worker_gets_its_own_tf_config_and_results_come_back():
    with LocalCluster(describe, workers=2, kwargs={"greeting": "hello"}, env=ENV, timeout=120) as cluster:
        results = cluster.wait()
        pids = cluster.pids
    specs = [r["config"]["cluster"]["worker"] for r in results]
    assert specs[0] == specs[1] and len(set(specs[0])) == 2
    assert all(address.startswith("127.0.0.1:") for address in specs[0])
    assert [r["config"]["task"] for r in results] == [
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert [r["pid"] for r in results] == pids
    np.testing.assert_array_equal(results[1]["array"], np.arange(3, dtype=np.float32))
    assert "[worker 0] hello from worker 0" in cluster.log()
    assert "[worker 1] hello from worker 1" in cluster.log()
    assert_all_gone(pids)


def test_a_finished_worker_serves_until_every_worker_has_finished(tmp_path):
    # A collective is pulled by the receiver: a worker that left as soon as it
    # had its own result could cut off a peer still reading from it.
    flag = str(tmp_path / "worker0-finished")
    with LocalCluster(finish_at_different_times, workers=2, kwargs={"flag_path": flag},
                      env=ENV, timeout=120) as cluster:
        first, second = cluster.wait()
        pids = cluster.pids
    assert second["peer_alive"] is True
    assert first["pid"] == pids[0]
    assert_all_gone(pids)


def test_a_failing_worker_raises_and_nothing_survives():
    with pytest.raises(ClusterError, match=r"worker 1 exited with exit code 1(.|\n)*gives up"):
        with LocalCluster(fail_on_worker_one, workers=2, env=ENV, timeout=120) as cluster:
            pids = cluster.pids
            cluster.wait()
    assert_all_gone(pids)


def test_killing_a_worker_of_a_real_run_raises_and_nothing_survives():
    with pytest.raises(ClusterError, match="worker 1 exited with signal SIGKILL"):
        with LocalCluster(train_until_killed, workers=2, env=ENV, timeout=120) as cluster:
            pids = cluster.pids
            deadline = time.monotonic() + 60
            while cluster.log().count("ready") < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)                      # let them start training together
            os.kill(pids[1], signal.SIGKILL)
            cluster.wait()
    assert_all_gone(pids)


@pytest.mark.timing
def test_a_time_out_raises_and_stops_every_worker():
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError, match="did not finish within 1"):
        run_cluster(sleep, workers=2, kwargs={"seconds": 60}, env=ENV, timeout=1)
    assert time.monotonic() - started < 30
    assert children() == []


def test_ctrl_c_stops_every_worker():
    with pytest.raises(KeyboardInterrupt):
        with LocalCluster(sleep, workers=2, kwargs={"seconds": 60}, env=ENV) as cluster:
            pids = cluster.pids
            raise KeyboardInterrupt
    assert_all_gone(pids)


def test_targets_the_workers_cannot_import_are_refused():
    def local_function():
        pass

    with pytest.raises(ValueError, match="cannot import"):
        LocalCluster(local_function)
    with pytest.raises(ValueError, match="module:function"):
        LocalCluster("no_colon_here")
    with pytest.raises(ValueError, match="workers"):
        LocalCluster(sleep, workers=0)



# -- layouts with parameter servers, kills, waiting for lines (chapter "Beyond one machine") --

def report_role():
    config = json.loads(os.environ["TF_CONFIG"])
    print("coordinator up", flush=True)
    return config


def print_then_sleep(seconds):
    print("started", flush=True)
    time.sleep(seconds)


def test_a_parameter_server_layout_runs_the_target_on_the_coordinator_only():
    with LocalCluster(report_role, workers=2, parameter_servers=1, env=ENV, timeout=120) as cluster:
        (config,) = cluster.wait()
        cluster.wait_for("serving as worker 1", timeout=60)   # the servers are up
        pids = cluster.pids
        assert all(p.poll() is None for (role, _), p in cluster.processes.items() if role != "chief")
    assert cluster.roles == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert config["task"] == {"type": "chief", "index": 0}
    assert {job: len(tasks) for job, tasks in config["cluster"].items()} == {
        "chief": 1, "worker": 2, "ps": 1}
    assert "[chief 0] coordinator up" in cluster.log()
    assert_all_gone(pids)


def test_an_expected_kill_is_not_an_error_and_a_crash_is():
    with LocalCluster(print_then_sleep, workers=2, kwargs={"seconds": 1.5}, env=ENV,
                      timeout=60) as cluster:
        cluster.wait_for("started", count=2)
        cluster.kill("worker", 1)
        assert len(cluster.wait()) == 1              # only worker 0's result
        pids = cluster.pids
    assert_all_gone(pids)
    with pytest.raises(ClusterError, match="worker 1 exited with signal SIGKILL"):
        with LocalCluster(print_then_sleep, workers=2, kwargs={"seconds": 60}, env=ENV,
                          timeout=60) as cluster:
            pids = cluster.pids
            cluster.wait_for("started", count=2)
            cluster.kill("worker", 1, expected=False)
            cluster.wait()
    assert_all_gone(pids)


def test_wait_for_raises_on_a_failure_and_on_a_time_out():
    with pytest.raises(ClusterError, match="worker 1 exited with exit code 1"):
        with LocalCluster(fail_on_worker_one, workers=2, env=ENV) as cluster:
            pids = cluster.pids
            cluster.wait_for("never printed", timeout=60)
    assert_all_gone(pids)
    with pytest.raises(ClusterTimeoutError, match="never printed"):
        with LocalCluster(sleep, workers=1, kwargs={"seconds": 60}, env=ENV) as cluster:
            pids = cluster.pids
            cluster.wait_for("never printed", timeout=0.5)
    assert_all_gone(pids)


def test_bad_layouts_get_clear_errors():
    with pytest.raises(ValueError, match="at least one worker"):
        LocalCluster(sleep, workers=0, parameter_servers=1)
    with pytest.raises(ValueError, match="parameter_servers"):
        LocalCluster(sleep, workers=2, parameter_servers=-1)
    with pytest.raises(ValueError, match="ports must be 2 distinct"):
        LocalCluster(sleep, workers=2, ports=[20000, 20000])
    with pytest.raises(ValueError, match="ports must be 4 distinct"):
        LocalCluster(sleep, workers=2, parameter_servers=1, ports=[20000, 20001])
    with pytest.raises(ClusterError, match="Start the cluster"):
        LocalCluster(sleep, workers=1).kill("worker", 0)


def test_a_port_in_use_is_refused_before_anything_starts():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (other,) = free_ports(1)
        cluster = LocalCluster(sleep, workers=2, kwargs={"seconds": 1}, env=ENV, ports=[port, other])
        with pytest.raises(ClusterError, match=f"{port}.*in use"):
            with cluster:
                pass
    assert cluster.processes == {}
    assert children() == []


def test_the_same_target_runs_by_hand_with_tf_config(monkeypatch, capsys):
    # `python -m pargrad.cluster module:function '{kwargs}'` on a real machine
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": ["127.0.0.1:1"]}, "worker", 0))
    assert cluster_main(["test_cluster:describe", '{"greeting": "hi"}'], linger=0) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "hi from worker 0"
    assert json.loads(lines[1])["config"]["task"] == {"type": "worker", "index": 0}
    monkeypatch.delenv("TF_CONFIG")
    assert cluster_main(["test_cluster:describe", '{"greeting": "hi"}'], linger=0) == 2
    assert "Set TF_CONFIG" in capsys.readouterr().err
