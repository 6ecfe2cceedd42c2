"""The chapter "Communicating rarely": its replay, its conclusions, its stored sweeps, its handovers.

The replay the chapter runs (pargrad.book.replay, on the chapter's problem
of pargrad.book.rare_communication) is checked against LocalSGDTrainer; the chapter's verdicts are re-run on its 20 test seeds at
the stored best rates (cheap: the replay is vectorised), so that a change
that flips one fails; part of the stored sweep is measured again; and the
leave/join handover runs across processes.
"""

import numpy as np
import psutil
import pytest

import pargrad
from pargrad.book import experiments, replay
from pargrad.book import rare_communication as rc
from pargrad.cluster import LocalCluster
from pargrad.local_sgd import LocalSGDTrainer
from pargrad.strategies import sync_strategy


def largest_gap(weights, state):
    return max(float(np.max(np.abs(np.asarray(a) - b[0]))) for a, b in zip(weights, state.weights))


# -- the replay against the trainer ------------------------------------------------

@pytest.mark.claim
@pytest.mark.parametrize("outer", replay.OUTERS)
@pytest.mark.parametrize("local_steps", [1, 4, 16])
def test_the_replay_is_what_the_trainer_computes(outer, local_steps):
    x, y = rc.problem_data()
    rate, updates = 2.0**-4, 64
    strategy = sync_strategy(rc.REPLICAS)
    with strategy.scope():
        model = pargrad.parabola_model(seed=3, hidden=rc.HIDDEN, dtype="float64")
        outer_step = rc.outer_optimizer(outer)
    trainer = LocalSGDTrainer(model, strategy, local_steps, learning_rate=rate,
                              outer_optimizer=outer_step)
    trainer.fit(x, y, rounds=updates // local_steps, batch_size=len(x))
    state, losses = replay.train_rounds(replay.start([3]), (x, y), rc.REPLICAS, rate,
                                        local_steps, updates // local_steps, outer)
    assert largest_gap(model.get_weights(), state) < pargrad.rounding_tolerance("float64", updates)
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(losses[-1, 0], rel=1e-10)
    assert losses[-1, 0] < losses[0, 0]                      # it trained


def test_async_replay_runs_the_contiguous_shards():
    # One worker, no communication: asynchronous SGD is plain full-batch SGD,
    # which is also local SGD with H = 1 on one replica.
    link = pargrad.cost.Link(0.0, 1e12)
    asynchronous = rc.async_losses_in_time(2.0**-4, [0, 1], budget=50.5, link=link,
                                           step_seconds=1.0, speeds=[1.0])
    synchronous = rc.losses_in_time(2.0**-4, [0, 1], 1, 50.5, link, 1.0, replicas=1)
    assert asynchronous == pytest.approx(synchronous, rel=1e-9)


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


# -- the chapter's conclusions ----------------------------------------------------------

@pytest.fixture(scope="module")
def dial():
    return rc.experiment_at_stored_rates("dial")


@pytest.fixture(scope="module")
def races():
    return {link.name: rc.experiment_at_stored_rates(f"race, {link.name}")
            for link in (rc.FAST, rc.SLOW)}


@pytest.mark.claim
def test_diloco_saves_communication_at_similar_loss_only_up_to_a_point(dial):
    assert dial.compare("DiLoCo, H=4", "local SGD, H=1").verdict == "DiLoCo, H=4 ahead"
    assert dial.compare("DiLoCo, H=4", "DiLoCo, H=1").verdict == "no difference shown"
    assert dial.compare("DiLoCo, H=16", "DiLoCo, H=1").verdict == "DiLoCo, H=1 ahead"


@pytest.mark.claim
def test_local_sgd_loses_as_h_grows(dial):
    assert dial.compare("local SGD, H=1", "local SGD, H=64").verdict == "local SGD, H=1 ahead"
    assert dial.compare("local SGD, H=4", "local SGD, H=256").verdict == "local SGD, H=4 ahead"


@pytest.mark.claim
def test_the_outer_nesterov_step_wins_at_small_h_and_loses_at_64(dial):
    for steps in (4, 16):
        assert dial.compare(f"DiLoCo, H={steps}", f"local SGD, H={steps}").verdict == \
            f"DiLoCo, H={steps} ahead"
    assert dial.compare("DiLoCo, H=64", "local SGD, H=64").verdict == "local SGD, H=64 ahead"


@pytest.mark.claim
def test_with_a_slow_worker_async_leads_on_the_fast_link_and_diloco_on_the_slow(races):
    fast, slow = races[rc.FAST.name], races[rc.SLOW.name]
    median = lambda experiment, name: np.median(experiment.scores[name])  # noqa: E731
    assert min(fast.scores, key=lambda n: median(fast, n)) == "async"
    assert min(slow.scores, key=lambda n: median(slow, n)) == "DiLoCo, H=16"
    assert fast.compare("sync", "async").verdict == "async ahead"
    assert slow.compare("async", "DiLoCo, H=16").verdict == "DiLoCo, H=16 ahead"
    assert slow.compare("sync", "DiLoCo, H=16").verdict == "DiLoCo, H=16 ahead"


@pytest.mark.claim
def test_the_first_conclusions_hold_on_other_seeds():
    # The verdicts that the chapter reaches with 20 of 20 or 19 of 20 seeds,
    # on 10 seeds it never used (9 of 10 needed: p = 0.021).
    seeds = np.arange(100, 110)
    dial = rc.experiment_at_stored_rates("dial", seeds)
    rule = lambda a, b: experiments.compare(dial.scores[a], dial.scores[b], a, b,  # noqa: E731
                                            min_seeds=10).verdict
    assert rule("DiLoCo, H=4", "local SGD, H=1") == "DiLoCo, H=4 ahead"
    assert rule("local SGD, H=1", "local SGD, H=64") == "local SGD, H=1 ahead"
    assert rule("DiLoCo, H=4", "local SGD, H=4") == "DiLoCo, H=4 ahead"


def test_the_stored_sweep_repeats():
    stored = rc.stored_sweeps()
    assert stored["grid"] == list(rc.GRID) and stored["updates"] == rc.UPDATES
    assert stored["tuning_seeds"] == rc.TUNING_SEEDS.tolist()
    for set_name, name in [("dial", "local SGD, H=4"), ("dial", "DiLoCo, H=64"),
                           (f"race, {rc.SLOW.name}", "async")]:
        method = next(m for m in rc.experiment_sets()[set_name] if m.name == name)
        live = experiments.sweep(method, rc.TUNING_SEEDS)
        kept = stored["sets"][set_name][name]
        assert live.best == kept["best"]
        finite = np.isfinite(live.medians)
        assert np.allclose(live.medians[finite], np.asarray(kept["medians"])[finite], rtol=0.05)


def test_a_stored_rate_at_the_edge_of_the_grid_is_refused():
    stored = rc.stored_sweeps()
    stored["sets"]["dial"]["local SGD, H=4"]["best"] = stored["grid"][0]
    with pytest.raises(ValueError, match="edge of the grid"):
        rc.experiment_at_stored_rates("dial", np.arange(2), stored=stored)
    with pytest.raises(ValueError, match="set_name must be one of"):
        rc.experiment_at_stored_rates("dials", np.arange(2))


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
        rc.losses_in_time(0.1, [0], 16, 1e-3, rc.SLOW, rc.STEP_SECONDS)
    with pytest.raises(ValueError, match="budget must fit one update"):
        rc.async_losses_in_time(0.1, [0], 1e-3, rc.SLOW, rc.STEP_SECONDS, rc.SPEEDS)
    with pytest.raises(ValueError, match="outer must be one of"):
        rc.outer_optimizer("adam")


def test_a_handover_with_the_wrong_momentum_is_refused():
    with pytest.raises(ValueError, match="velocity must be 4 arrays"):
        rc.train_phase(rounds=1, local_steps=1, learning_rate=0.1, velocity=[np.zeros(1)])
