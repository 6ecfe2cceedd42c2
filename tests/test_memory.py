"""Tests of pargrad.memory: the formula of bytes per device, and the bytes trainers hold."""

import json

import pytest

from pargrad import memory


def test_zero_figure_1():
    # Rajbhandari et al. 2019, Figure 1: 7.5e9 parameters, K = 12 (mixed-precision Adam), 64 devices.
    gigabytes = [memory.state_bytes(7_500_000_000, replicas=64, stage=stage, precision="mixed",
                                    optimizer="adam")["total"] / 1e9 for stage in range(4)]
    assert [round(g, 1) for g in gigabytes] == [120.0, 31.4, 16.6, 1.9]


def test_playbook_mixed_precision_adam_is_2_2_12_bytes_a_parameter():
    held = memory.state_bytes(1, replicas=1, stage=0, precision="mixed", optimizer="adam")
    assert (held["parameters"], held["gradients"]) == (2, 2)
    assert held["master_weights"] + held["optimizer_state"] == 12
    assert (held["master_weights"], held["optimizer_state"]) == (4, 8)
    assert held["total"] == 16


def test_full_precision_counts():
    # float32 Adam, stage 0: 4 + 4 + 8 bytes a parameter, no master copy.
    assert memory.state_bytes(10, replicas=4, stage=0) == {
        "parameters": 40, "gradients": 40, "optimizer_state": 80, "master_weights": 0,
        "total": 160}
    # Stage 1 on 4 replicas, 10 parameters: shards of ceil(10 / 4) = 3 values, each replica's
    # copy the padded flat vector of 4 x 3 values; no master copy in full precision.
    assert memory.state_bytes(10, replicas=4, stage=1, precision="float64",
                              optimizer="momentum") == {
        "parameters": 96, "gradients": 80, "optimizer_state": 24, "master_weights": 0,
        "total": 200}
    assert memory.state_bytes(10, replicas=4, stage=2, optimizer="sgd")["gradients"] == 12
    stage3 = memory.state_bytes(10, replicas=4, stage=3, optimizer="adam")
    assert stage3 == {"parameters": 12, "gradients": 12, "optimizer_state": 24,
                      "master_weights": 0, "total": 48}
    # One replica shards nothing away.
    assert memory.state_bytes(10, replicas=1, stage=3)["parameters"] == 40


def test_sharded_components():
    assert memory.sharded_components(0) == ()
    assert memory.sharded_components(1) == ("optimizer_state", "master_weights")
    assert memory.sharded_components(2) == ("optimizer_state", "master_weights", "gradients")
    assert memory.sharded_components(3)[-1] == "parameters"


@pytest.mark.parametrize("stage, error", [(4, ValueError), (-1, ValueError), ("1", TypeError),
                                          (True, TypeError), (1.0, TypeError)])
def test_bad_stage(stage, error):
    with pytest.raises(error, match="stage must be"):
        memory.state_bytes(10, replicas=2, stage=stage)


def test_bad_precision_and_optimizer():
    with pytest.raises(ValueError, match="precision must be one of"):
        memory.state_bytes(10, replicas=2, stage=1, precision="float16")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        memory.state_bytes(10, replicas=2, stage=1, optimizer="adamw")
    with pytest.raises(ValueError, match="parameters must be"):
        memory.state_bytes(0, replicas=2, stage=1)


def test_zero_bytes_sent():
    assert memory.zero_bytes_sent(400, replicas=4, stage=1) == 600
    assert memory.zero_bytes_sent(400, replicas=4, stage=2) == 600
    assert memory.zero_bytes_sent(400, replicas=4, stage=3) == 900
    assert memory.zero_bytes_sent(400, replicas=1, stage=3) == 0


def test_peak_bytes_by_device_says_why_not_on_a_cpu():
    import tensorflow as tf
    peaks, reason = memory.peak_bytes_by_device()
    if tf.config.list_logical_devices("GPU"):
        assert reason is None and len(peaks) >= 1
    else:
        assert peaks is None and "one allocator" in reason


# ----------------------------------------------------------------------------
# Counted from the variables TensorFlow holds == the formula
# ----------------------------------------------------------------------------

COUNT_CODE = """
import json, keras, numpy as np, pargrad
from pargrad import memory
devices = pargrad.logical_devices({devices})

def counted(replicas, stage, optimizer="adam"):
    strategy = pargrad.sync_strategy(replicas)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,), dtype="float64"),
                                  keras.layers.Dense(5, activation="tanh", dtype="float64"),
                                  keras.layers.Dense(1, dtype="float64")])
        made = (keras.optimizers.Adam(1e-2) if optimizer == "adam"
                else keras.optimizers.SGD(1e-2, momentum=0.9 if optimizer == "momentum" else 0.0))
    if stage == 0:
        trainer = pargrad.SyncTrainer(model, strategy, optimizer=made, progress=False)
    else:
        trainer = pargrad.ShardedTrainer(model, strategy, stage=stage, optimizer=made,
                                         progress=False)
    table = memory.bytes_by_device(trainer)
    return [table[name] for name in sorted(table)]
"""


def _check_counts(rows):
    for replicas, stage, optimizer, per_device in rows:
        expected = memory.state_bytes(21, replicas=replicas, stage=stage, precision="float64",
                                      optimizer=optimizer)
        assert len(per_device) == replicas, (replicas, stage)
        for held in per_device:
            assert held == expected, (replicas, stage, optimizer, held, expected)


def test_counted_bytes_equal_the_formula(run_python):
    """Stages 0 (SyncTrainer) to 3 on 1, 2 and 4 replicas, and 8 in a process of 8 devices."""
    code = COUNT_CODE + """
rows = [(r, s, o, counted(r, s, o)) for r in {replicas} for s in (0, 1, 2, 3)
        for o in {optimizers}]
print(json.dumps(rows))
"""
    namespace = {}
    exec(COUNT_CODE.format(devices=4).replace("devices = pargrad.logical_devices(4)",
                                              "devices = None"), namespace)
    rows = [(r, s, o, namespace["counted"](r, s, o)) for r in (1, 2, 4) for s in (0, 1, 2, 3)
            for o in (["adam", "momentum", "sgd"] if r == 4 else ["adam"])]
    _check_counts(rows)
    result = run_python(code.format(devices=8, replicas=(8,), optimizers=["adam"]), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_counts(json.loads(result.stdout.strip().splitlines()[-1]))


def test_one_formula_of_bytes_sent_per_step():
    from pargrad.allreduce import ring_bytes, sharded_step_bytes
    assert sharded_step_bytes(400, 4) == ring_bytes(400, 4) == 600
    assert sharded_step_bytes(400, 4, gathers=2) == 1.5 * ring_bytes(400, 4) == 900
    # Stage 3 with two micro-batches: four gathers and two reduce-scatters, 3 all-reduces.
    assert sharded_step_bytes(400, 4, gathers=4, reductions=2) == 3 * ring_bytes(400, 4)
    with pytest.raises((TypeError, ValueError), match="reductions"):
        sharded_step_bytes(400, 4, reductions=0)
    for stage in (0, 1, 2, 3):
        gathers = 2 if stage == 3 else 1
        assert memory.zero_bytes_sent(400, replicas=4, stage=stage) == sharded_step_bytes(
            400, 4, gathers=gathers)


def test_memory_imports_no_trainer():
    import ast
    import pathlib
    source = pathlib.Path(memory.__file__).read_text()
    imported = {node.module for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & {"pargrad.sync", "pargrad.sharded", "pargrad.local_sgd",
                           "pargrad.asynchronous"}, imported


def test_bytes_by_device_refuses_what_reports_no_variables():
    with pytest.raises(TypeError, match="variables by component"):
        memory.bytes_by_device(object())


@pytest.mark.parametrize("precision, p, g, k", [("float32", 4, 4, 8), ("float64", 8, 8, 16),
                                                ("mixed", 2, 2, 12)])
def test_zero_formulas_per_stage(precision, p, g, k):
    """ZeRO's per-device totals, Psi = 1200 parameters (divisible by N), Adam."""
    psi = 1200
    for n in (1, 2, 4, 8):
        totals = [memory.state_bytes(psi, replicas=n, stage=stage, precision=precision)["total"]
                  for stage in range(4)]
        assert totals == [(p + g + k) * psi, (p + g) * psi + k * psi // n,
                          p * psi + (g + k) * psi // n, (p + g + k) * psi // n]
        held = memory.state_bytes(psi, replicas=n, stage=1, precision=precision)
        assert (held["master_weights"] > 0) == (precision == "mixed")
    one = [memory.state_bytes(psi, replicas=1, stage=s, precision=precision) for s in range(4)]
    assert all(held == one[0] for held in one)    # one device: every stage holds stage 0's
