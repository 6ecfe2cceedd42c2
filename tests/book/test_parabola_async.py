"""The NumPy replica of AsyncTrainer's scheduled runs, and the conclusions of the chapter
"Asynchronous training" that rest on it, each at a reduced seed count (20, the rule's minimum).
The delay bound's, momentum's and the staleness-aware rule's verdicts are re-run on seeds the
pages were not chosen on in tests/claims/test_stale_gradients_conclusions.py and
tests/claims/test_delay_compensation_conclusions.py."""

import numpy as np
import pytest

import pargrad
from pargrad.asynchronous import AsyncTrainer
from pargrad.scenario import Scenario, virtual_schedule
from pargrad.book import delay, experiments, parabola_async, replay
from pargrad.book.parabola import parabola_data, parabola_model, squared_error

SEEDS = np.arange(20)
TUNING = np.arange(100, 110)
RATES = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.4, 0.6]


@pytest.fixture(scope="module")
def devices():
    return pargrad.logical_devices(4)


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


# -- the chapter's conclusions, over 20 seeds ------------------------------------------------

def test_one_worker_ends_below_four_at_the_chapters_small_rate():
    four = parabola_async.final_losses(4, 0.03, SEEDS)
    one = parabola_async.final_losses(1, 0.03, SEEDS)
    assert experiments.compare(four, one, "4", "1").verdict == "1 ahead"


def test_each_at_its_best_rate_more_workers_end_higher_with_smaller_rates():
    methods = [experiments.Method(str(n), lambda r, s, n=n: parabola_async.final_losses(n, r, s),
                                  RATES) for n in (1, 4, 8)]
    result = experiments.run_experiment(methods, SEEDS, TUNING)
    assert result.rates["1"] > result.rates["4"] > result.rates["8"]
    for n in ("4", "8"):
        assert result.compare(n, "1").verdict == "1 ahead"


def test_the_mean_matched_control_really_matches():
    schedule = virtual_schedule(Scenario((1.0, 1.0, 1.0, 0.1)), 400)
    staleness = np.arange(400) - schedule["read_version"]
    assert parabola_async.mean_rate(schedule, 0.1, True) == pytest.approx(
        np.mean(0.1 / (staleness + 1)), rel=1e-12)
    assert parabola_async.mean_rate(schedule, 0.1, False) == 0.1


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
