"""The chapter "Communicating rarely": its replay, its conclusions, its stored sweeps, its handovers.

The replay the chapter runs (pargrad.book.replay, on the chapter's problem
of pargrad.book.rare_communication) is checked against LocalSGDTrainer; the
stored sweep is partly measured again, and no stored plateau may touch a grid
edge; the leave/join handover runs across processes.  The chapter's verdicts,
re-decided, are in tests/claims/test_rare_communication_verdicts_conclusions.py
(the page's and held-out seeds) and tests/claims/test_rare_communication_conclusions.py
(a third seed set).  Only the tests that run
TensorFlow are marked ``claim`` (run again under other numerics): the
verdicts come from float64 NumPy replays, which those settings cannot change.
"""

import numpy as np
import psutil
import pytest

import pargrad
from pargrad.book import experiments, replay
from pargrad.book import rare_communication as rc
from pargrad.book.parabola import parabola_model
from pargrad.cluster import LocalCluster
from pargrad.local_sgd import LocalSGDTrainer
from pargrad.strategies import sync_strategy

# It starts multi-process clusters: one at a time, never beside another (tests/conftest.py).
pytestmark = pytest.mark.clusters


def largest_gap(weights, state):
    return max(float(np.max(np.abs(np.asarray(a) - b[0]))) for a, b in zip(weights, state.weights))


# -- the replay against the trainer ------------------------------------------------

@pytest.mark.claim
@pytest.mark.parametrize("outer, outer_rate, momentum", [
    (replay.AVERAGE, 1.0, 0.0), (replay.NESTEROV, 0.7, 0.9), (replay.NESTEROV, 1.4, 0.95),
    (replay.NESTEROV, 0.5, 0.0)])
@pytest.mark.parametrize("local_steps", [1, 4, 16])
def test_the_replay_is_what_the_trainer_computes(outer, outer_rate, momentum, local_steps):
    # the outer step at the paper's setting and at tuned ones, as the sweeps replay them
    x, y = rc.problem_data()
    rate, updates = 2.0**-4, 64
    strategy = sync_strategy(rc.REPLICAS)
    with strategy.scope():
        model = parabola_model(seed=3, hidden=rc.HIDDEN, dtype="float64")
        outer_step = rc.outer_optimizer(outer, outer_rate, momentum)
    trainer = LocalSGDTrainer(model, strategy, local_steps, learning_rate=rate,
                              outer_optimizer=outer_step, progress=False)
    trainer.fit(x, y, rounds=updates // local_steps, batch_size=len(x))
    _, kept_rate, kept_momentum = rc.outer_knobs({"rate": rate, "outer_rate": outer_rate,
                                                  "momentum": momentum})
    state, losses = replay.train_rounds(replay.start([3]), (x, y), rc.REPLICAS, rate,
                                        local_steps, updates // local_steps, outer, kept_rate,
                                        kept_momentum)
    assert largest_gap(model.get_weights(), state) < pargrad.rounding_tolerance("float64", updates)
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(losses[-1, 0], rel=1e-10)
    assert losses[-1, 0] < losses[0, 0]                      # it trained


def test_async_replay_runs_the_contiguous_shards():
    # One worker, no communication: asynchronous SGD is plain full-batch SGD,
    # which is also local SGD with H = 1 on one replica.
    link = pargrad.cost.Link(0.0, 1e12)
    asynchronous = rc.async_curve_in_time(2.0**-4, [0, 1], budget=50.5, link=link,
                                          step_seconds=1.0, speeds=[1.0])
    synchronous = rc.curve_in_time(2.0**-4, [0, 1], 1, 50.5, link, 1.0, replicas=1)
    assert synchronous[0].tolist() == list(range(51))
    assert asynchronous[0] == pytest.approx(synchronous[0], rel=1e-9)   # messages of ~1e-10 s
    assert asynchronous[1] == pytest.approx(synchronous[1], rel=1e-9)


def test_the_race_scores_the_mean_over_the_last_quarter_of_its_time():
    # synchronous SGD fits 256 rounds in the race's budget: the last quarter of the time is
    # held by the losses after rounds 192 to 255, each for one round (the 256th lands at the end)
    sync = next(m for m in rc.uneven_methods(rc.SLOW) if m.name == rc.SYNC_MOMENTUM)
    seeds = np.arange(3)
    times, losses = rc.curve_in_time(2.0**-3, seeds, 1, rc.race_budget(rc.SLOW), rc.SLOW,
                                      rc.STEP_SECONDS, pargrad.Scenario(rc.SPEEDS))
    assert len(times) == rc.SYNC_STEPS_IN_BUDGET + 1
    # momentum 0 with outer rate 1: the outer Nesterov step is the plain average
    assert sync.run.single({"rate": 2.0**-3, "momentum": 0.0}, seeds) == pytest.approx(
        np.mean(losses[192:256], axis=0), rel=1e-12)
    assert not np.allclose(np.mean(losses[192:256], axis=0), losses[-1], rtol=1e-3)


def test_the_grid_runner_runs_the_grid_once_and_equals_single_runs():
    calls = []

    def score(rates, seeds):
        calls.append(len(rates))
        return rc.final_losses(rates, seeds, 4, 16)

    runner = rc.GridRunner(score, [0.03125, 0.0625, 0.125])
    batched = runner(0.0625, np.arange(3))
    assert calls == [9]
    assert np.array_equal(runner(0.125, np.arange(3)), runner(0.125, np.arange(3)))
    assert calls == [9]
    assert batched == pytest.approx(rc.final_losses(0.0625, np.arange(3), 4, 16), rel=1e-12)
    runner(0.5, np.arange(3))                          # off the grid: run alone
    assert calls == [9, 3]


def test_phase_scores_hand_over_what_one_run_would_compute():
    rate, seeds = 2.0**-4, np.arange(3)
    one = rc.phase_scores([(3, 8)], rate, seeds)
    two = rc.phase_scores([(3, 4), (3, 4)], rate, seeds)
    assert np.allclose(one[0], two[0], rtol=1e-12) and np.allclose(one[1], two[1], rtol=1e-12)
    reset = rc.phase_scores([(3, 4), (3, 4)], rate, seeds, reset_momentum=True)
    assert not np.allclose(one[1], reset[1], rtol=1e-6)


def test_the_stored_sweep_repeats():
    stored = rc.stored_sweeps()
    assert stored["grid"] == list(rc.GRID) and stored["updates"] == rc.UPDATES
    assert stored["tuning_seeds"] == {k: v[1].tolist() for k, v in rc.MEASURED_SETS.items()}
    for set_name, name in [("dial", "local SGD, H=4"), ("dial", "DiLoCo, paper's step, H=64"),
                           ("dial", rc.SYNC_MOMENTUM), (f"race, {rc.SLOW.name}", rc.SYNC_MOMENTUM)]:
        method = next(m for m in rc.experiment_sets()[set_name] if m.name == name)
        coarse, line, _ = rc.refined_sweep(method, rc.TUNING_SEEDS)
        kept = stored["sweeps"]["page"][set_name][name]
        assert coarse.best == kept["coarse_best"]
        assert (line.best if not isinstance(coarse.best, dict) else
                {**coarse.best, "rate": line.best}) == kept["best"]
        assert np.ravel(line.rates).tolist() == kept["line"]["rates"]
        finite = np.isfinite(coarse.medians) & (np.asarray(kept["medians"]) >= 0)
        assert np.allclose(coarse.medians[finite], np.asarray(kept["medians"])[finite],
                           rtol=1e-9)


def test_every_method_is_stored_and_no_stored_plateau_touches_an_edge():
    # each method at its own best, so no sweep may end where its grid ends (unless the
    # end is a limit: H = 1, momentum 0); the stored grid is the one the code sweeps now
    stored = rc.stored_sweeps()["sweeps"]
    for seed_set in rc.MEASURED_SETS:
        for set_name, methods in rc.experiment_sets().items():
            for method in methods:
                kept = stored[seed_set][set_name][method.name]
                assert kept["axes"] == method.axes and kept["edge"] is None
                assert kept["coarse_best"] in kept["plateau"]
                assert kept["line"]["rates"][0] < (kept["best"]["rate"] if isinstance(
                    kept["best"], dict) else kept["best"]) < kept["line"]["rates"][-1]
                for setting in kept["plateau"]:
                    setting = setting if isinstance(setting, dict) else {"rate": setting}
                    for knob, value in setting.items():
                        values = method.axes[knob]
                        inside = len(values) == 1 or values[0] < value < values[-1]
                        assert inside or value in (method.limits or {}).get(knob, ()), \
                            (seed_set, set_name, method.name, knob, value)
    assert not rc.stored_edges()


def test_every_diloco_row_has_its_own_tuned_outer_step():
    # the outer rate and momentum are swept at every H the page states a verdict
    for method in rc.dial_methods() + rc.uneven_methods(rc.SLOW) + rc.uneven_methods(rc.FAST):
        if method.name.startswith("DiLoCo") and "paper" not in method.name:
            assert {"rate", "outer_rate", "momentum"} <= set(method.axes)
            assert len(method.axes["momentum"]) >= 3


def test_in_the_race_every_method_has_the_knobs_it_has_tuned():
    # synchronous and asynchronous SGD get momentum as DiLoCo does; local SGD and
    # DiLoCo communicate rarely (H >= 2), H tuned; the method at H = 1 is named for what it is
    for link in (rc.FAST, rc.SLOW):
        methods = {m.name: m for m in rc.uneven_methods(link)}
        assert set(methods) == {rc.SYNC_MOMENTUM, rc.ASYNC, rc.LOCAL_TUNED, rc.DILOCO_TUNED}
        for name in (rc.SYNC_MOMENTUM, rc.ASYNC, rc.DILOCO_TUNED):
            assert methods[name].axes["momentum"] == list(rc.RACE_MOMENTUM)
        for name in (rc.LOCAL_TUNED, rc.DILOCO_TUNED):
            assert min(methods[name].axes["H"]) == 2
    assert rc.method_name(replay.NESTEROV, 1) == rc.SYNC_MOMENTUM
    assert rc.method_name(replay.AVERAGE, 1) == rc.SYNC


def test_a_stored_rate_at_the_edge_of_the_grid_is_refused():
    stored = rc.stored_sweeps()
    stored["sweeps"]["page"]["dial"]["local SGD, H=4"]["best"] = stored["grid"][0]
    with pytest.raises(ValueError, match="edge of the grid"):
        rc.experiment_at_stored_rates("dial", np.arange(2), stored=stored)
    with pytest.raises(ValueError, match="set_name must be one of"):
        rc.experiment_at_stored_rates("dials", np.arange(2))
    with pytest.raises(ValueError, match="seed_set must be one of"):
        rc.experiment_at_stored_rates("dial", np.arange(2), seed_set="fresh")


def test_a_sweep_at_the_edge_is_kept_and_flagged():
    method = experiments.Method("rising", lambda rate, seeds: np.full(len(seeds), rate),
                                [0.1, 0.2, 0.3])
    result, edge = rc.sweep_at_edge_too(method, np.arange(3))
    assert result.best == 0.1 and "edge of the grid" in edge and result.plateau == (0.1,)


# -- leaving and joining across processes ---------------------------------------------------

@pytest.mark.claim
def test_a_worker_leaves_and_one_joins_across_processes():
    phases, rate, steps = [(3, 2), (2, 2), (3, 2)], 2.0**-4, 4
    handed, pids, results = {}, [], []
    for workers, rounds in phases:
        settings = {"rounds": rounds, "local_steps": steps, "learning_rate": rate, **handed}
        with LocalCluster(rc.train_phase, workers=workers, kwargs=settings,
                          timeout=150) as cluster:
            out = cluster.wait()
            pids += cluster.pids
        assert [r["replicas"] for r in out] == [workers] * workers
        results.append(out[0])
        handed = {"weights": out[0]["weights"], "velocity": out[0]["velocity"]}
    state, losses = replay.replay_phases(phases, rc.problem_data(), rate, steps)
    tolerance = pargrad.rounding_tolerance("float64", 6 * steps)
    assert largest_gap(results[-1]["weights"], state) < tolerance
    keras_buffer = [-np.asarray(v) / replay.OUTER_RATE for v in results[-1]["velocity"]]
    assert max(float(np.max(np.abs(a - b[0]))) for a, b in zip(keras_buffer, state.buffer)) \
        < tolerance
    assert np.allclose([r["loss"] for r in results], losses, rtol=1e-9)
    # without the handover of the momentum the last phase would differ
    assert max(float(np.max(np.abs(b))) for b in state.buffer) > 1e-3
    assert not [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


# -- bad input -------------------------------------------------------------------------

def test_bad_input_says_what_to_pass():
    with pytest.raises(ValueError, match="multiple of local_steps"):
        rc.final_losses(0.1, [0], 4, 10)
    with pytest.raises(ValueError, match="updates must be a whole number >= 1"):
        rc.final_losses(0.1, [0], 4, 0)
    with pytest.raises(ValueError, match="seeds must be a non-empty list"):
        rc.final_losses(0.1, [], 4, 8)
    with pytest.raises(ValueError, match="divisor of 48"):
        rc.final_losses(0.1, [0], 4, 8, replicas=5)
    with pytest.raises(TypeError, match="score must be a function"):
        rc.GridRunner(None, [0.1])
    with pytest.raises(ValueError, match="budget must fit one round"):
        rc.curve_in_time(0.1, [0], 16, 1e-3, rc.SLOW, rc.STEP_SECONDS)
    with pytest.raises(ValueError, match="budget must fit one update"):
        rc.async_curve_in_time(0.1, [0], 1e-3, rc.SLOW, rc.STEP_SECONDS, rc.SPEEDS)
    with pytest.raises(ValueError, match="outer must be one of"):
        rc.outer_optimizer("adam")


def test_a_handover_with_the_wrong_momentum_is_refused():
    with pytest.raises(ValueError, match="velocity must be 4 arrays"):
        rc.train_phase(rounds=1, local_steps=1, learning_rate=0.1, velocity=[np.zeros(1)])


# -- the stored tuning pools (the generic tuning: tests/book/test_tuning.py; the chapter's
# verdicts on the stored runs: tests/claims/test_rare_communication_tuned_conclusions.py)

def test_a_stored_set_reads_as_the_generic_tuning_reads_it():
    stored = {"sets": {"page": {"dial": {"A": {"settings": [0.1, 0.2], "picked": {
        "pool": 1, "disjoint": [0], "bootstrap": [1, 0]}, "test": {
        "0": [1.0] * 100, "1": [2.0] * 99 + [-1.0]}}}}}}
    experiment = rc.tuned_experiment("dial", "page", "pool", stored)
    assert experiment.rates == {"A": 0.2}
    assert np.array_equal(experiment.seeds, rc.TUNED_SETS["page"][0])
    assert experiment.scores["A"][-1] == np.inf               # -1 is a diverged run
    assert rc.tuned_experiment("dial", "page", ("bootstrap", 1), stored).rates == {"A": 0.1}


def test_bad_input_to_the_tuned_runs_says_what_to_pass():
    with pytest.raises(ValueError, match="seed_set must be one of"):
        rc.measure_tuned("fresh", "dial", rc.SYNC)
    with pytest.raises(ValueError, match="name must be one of"):
        rc.measure_tuned("page", "dial", "Adam")
