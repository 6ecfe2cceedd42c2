"""The NumPy replica of AsyncTrainer's scheduled runs, at a reduced seed count (20 seeds).
The verdicts of the chapter "Asynchronous training" that rest on it are re-decided in
tests/claims/test_asynchronous_workers_conclusions.py; the delay bound's, momentum's and the
staleness-aware rule's on seeds the pages were not chosen on in
tests/claims/test_stale_gradients_conclusions.py and
tests/claims/test_delay_compensation_conclusions.py."""

import numpy as np
import pytest

import pargrad
from pargrad.asynchronous import AsyncTrainer
from pargrad.scenario import Scenario, virtual_schedule
from pargrad.book import delay, experiments, parabola_async, replay
from pargrad.book.parabola import parabola_data, parabola_model, squared_error

SEEDS = np.arange(20)


@pytest.fixture(scope="module")
def devices():
    return pargrad.logical_devices(4)


@pytest.mark.claim
@pytest.mark.parametrize("speeds, jitter, aware, rate", [
    ([1.0, 1.0, 1.0, 1.0], 0.0, False, 0.03),
    ([1.0, 1.0, 1.0, 0.1], 0.0, True, 0.1),
    ([1.0, 0.5, 0.8], 0.3, False, 0.05),
])
def test_the_replica_replays_the_trainer(devices, speeds, jitter, aware, rate):
    x, y = parabola_data()
    workers = len(speeds)
    trainer = AsyncTrainer(parabola_model(seed=3), squared_error,
                           devices[:workers], learning_rate=rate, staleness_aware=aware,
                           progress=False)
    history = trainer.fit(x, y, steps=200, scenario=Scenario(speeds, jitter), seed=7)
    schedule = virtual_schedule(Scenario(speeds, jitter), 200, seed=7)
    np.testing.assert_array_equal(schedule["worker"], history.worker)
    np.testing.assert_array_equal(schedule["read_version"], history.read_version)
    np.testing.assert_allclose(schedule["time"], history.time)
    model = parabola_model()
    model.set_weights(trainer.get_weights())
    trained = float(squared_error(y, model(x)))
    x64, y64 = parabola_data(dtype="float64")
    replayed = replay.train_async(replay.stacked_weights([3]), x64, y64, workers,
                                  schedule, rate, staleness_aware=aware)[0]
    assert abs(replayed - trained) <= pargrad.rounding_tolerance("float32", 200, scale=trained)


def test_a_schedule_a_seed_equals_running_seeds_one_by_one():
    x, y = parabola_data(dtype="float64")
    schedules = [virtual_schedule(Scenario((1.0, 0.5), 0.5), 60, seed=s) for s in (0, 1)]
    both = {key: np.stack([s[key] for s in schedules], axis=1) for key in ("worker", "read_version")}
    together = replay.train_async(replay.stacked_weights([0, 1]), x, y, 2, both, 0.05)
    alone = [replay.train_async(replay.stacked_weights([s]), x, y, 2, schedules[s], 0.05)[0]
             for s in (0, 1)]
    np.testing.assert_allclose(together, alone, rtol=1e-12)


def test_bad_schedules_are_refused():
    x, y = parabola_data(dtype="float64")
    with pytest.raises(ValueError, match="read_version"):
        replay.train_async(replay.stacked_weights([0]), x, y, 1,
                             {"worker": [0, 0], "read_version": [1, 1]}, 0.1)
    with pytest.raises(TypeError, match="updates must be a whole number"):
        parabola_async.sequential_schedule(2, 10.0)


def test_the_mean_matched_control_really_matches():
    schedule = virtual_schedule(Scenario((1.0, 1.0, 1.0, 0.1)), 400)
    staleness = np.arange(400) - schedule["read_version"]
    assert parabola_async.mean_rate(schedule, 0.1, True) == pytest.approx(
        np.mean(0.1 / (staleness + 1)), rel=1e-12)
    assert parabola_async.mean_rate(schedule, 0.1, False) == 0.1


@pytest.mark.claim
def test_trainer_on_repeated_data_follows_the_delayed_recursion(devices):
    import keras

    x, _ = parabola_data()
    curvature = 2 * float(np.mean(x.astype(np.float64) ** 2))
    for factor in (0.8, 1.2):
        product = factor * delay.stable_rate_bound(3)
        model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1, use_bias=False)])
        model.set_weights([np.array([[1.0]], np.float32)])
        trainer = AsyncTrainer(model, "mse", devices[:4], learning_rate=product / curvature,
                               progress=False, stop_on_non_finite=False)
        path = [1.0]
        trainer.fit(np.repeat(x, 4, axis=0), np.zeros((200, 1), np.float32), steps=80,
                    on_update=lambda r: path.append(float(trainer.get_weights()[0][0, 0])))
        exact = delay.delayed_gradient_path(product, 3, 1.0, 80)
        assert np.abs(np.array(path) - exact).max() <= pargrad.rounding_tolerance(
            "float32", 81, np.abs(exact).max())
        assert (delay.growth_per_update(path, 3) < 1) == (factor < 1)


def test_the_measurements_refuse_bad_input_saying_what_to_pass():
    x, y = parabola_data(dtype="float64")
    weights = replay.stacked_weights([0])
    with pytest.raises(ValueError, match="high must be above low"):
        parabola_async.largest_stable_rate(weights, x, y, 2, low=0.5, high=0.1)
    with pytest.raises(ValueError, match="low must be a positive number"):
        parabola_async.largest_stable_rate(weights, x, y, 2, low=0.0)
    schedules = {"worker": np.zeros((4, 2), int), "read_version": np.zeros((4, 2), int)}
    with pytest.raises(ValueError, match="schedule must be one schedule for all seeds"):
        parabola_async.mean_rate(schedules, 0.1, staleness_aware=True)


def test_remembered_runs_each_setting_once():
    calls = []
    run = parabola_async.remembered(lambda setting, seeds: calls.append(setting) or np.ones(2))
    run({"rate": 0.1, "λ": 0.0}, [0, 1])
    run({"λ": 0.0, "rate": 0.1}, np.array([0, 1]))
    run(0.1, [0, 1])
    assert len(calls) == 2


def knob_method(best_lambda):
    """A fake method whose score is lowest at rate 0.1 and λ = best_lambda."""
    return experiments.Method("fake", lambda s, seeds: np.full(len(seeds), (
        np.log(s["rate"] / 0.1) ** 2 + (s["λ"] - best_lambda) ** 2 + 1.0)),
        grid={"rate": [0.01, 0.1, 1.0], "λ": [0.0, 0.1, 1.0, 10.0]}, limits={"λ": (0.0,)})


def test_resolve_knob_refines_the_second_knob_until_the_neighbours_are_close():
    method, swept = parabola_async.resolve_knob(knob_method(0.3), [0, 1], "λ", step=2 ** 0.5)
    values = list(method.grid["λ"])
    at = values.index(swept.best["λ"])
    assert 0.1 < swept.best["λ"] < 1.0 and len(values) > 4
    assert values[at + 1] / values[at] <= 2 ** 0.5 * (1 + 1e-6)
    assert values[at] / values[at - 1] <= 2 ** 0.5 * (1 + 1e-6)
    # a best at the declared limit (no compensation) is an answer
    method, swept = parabola_async.resolve_knob(knob_method(-1.0), [0, 1], "λ")
    assert swept.best["λ"] == 0.0 and list(method.grid["λ"]) == [0.0, 0.1, 1.0, 10.0]


def test_denser_knob_halves_the_four_gaps_nearest_the_best():
    method = parabola_async.denser_knob(knob_method(1.0), {"rate": 0.1, "λ": 1.0}, "λ")
    assert len(method.grid["λ"]) == 4 + 3   # three gaps exist around 1.0 in this grid
    assert 0.05 in [round(v, 6) for v in method.grid["λ"]]   # half of 0.1 above 0


def test_replicate_resolved_refuses_shared_seeds():
    with pytest.raises(ValueError, match="must not share a seed"):
        parabola_async.replicate_resolved([knob_method(0.3)], [0, 1], [1, 2], [3], [4],
                                          {"fake": "λ"})
