"""DC-ASGD in AsyncTrainer (delay_compensation=λ) and fit's one API (steps=, scenario=, keyword-only)."""

import keras
import numpy as np
import pytest

import pargrad
from pargrad.asynchronous import AsyncTrainer, delay_compensated
from pargrad.book import parabola_async, race
from pargrad.book.parabola import parabola_data, parabola_model, squared_error
from pargrad.scenario import Scenario

from linear_problem import linear_data, linear_model, mse

# Runs are compared bit for bit, so with deterministic kernels (not all of a GPU's are by default).
pytestmark = pytest.mark.usefixtures("deterministic_ops")


@pytest.fixture(scope="module")
def devices():
    return pargrad.logical_devices(4)


def test_the_correction_on_a_hand_made_case_in_float64():
    gradients = [np.array([0.5, -2.0]), np.array([[4.0]])]
    now = [np.array([1.0, 3.0]), np.array([[0.0]])]
    read = [np.array([0.5, 3.5]), np.array([[0.25]])]
    corrected = delay_compensated(gradients, now, read, 0.5)
    # g + λ g² (w_now − w_read): 0.5 + 0.5·0.25·0.5, −2 + 0.5·4·(−0.5), 4 + 0.5·16·(−0.25)
    np.testing.assert_array_equal(corrected[0], [0.5625, -3.0])
    np.testing.assert_array_equal(corrected[1], [[2.0]])
    # A fresh gradient (read = now) is left as it is.
    assert all(np.array_equal(c, g) for c, g in
               zip(delay_compensated(gradients, now, now, 0.5), gradients))


@pytest.mark.parametrize("speeds, jitter, aware, rate, strength", [
    ([1.0, 1.0, 1.0, 1.0], 0.0, False, 0.05, 1.0),
    ([1.0, 1.0, 1.0, 0.1], 0.0, False, 0.05, 0.3),
    ([1.0, 0.5, 0.8], 0.3, True, 0.1, 1.0),
])
def test_the_trainer_with_delay_compensation_equals_the_float64_replay(
        devices, speeds, jitter, aware, rate, strength):
    x, y = parabola_data()
    workers, steps = len(speeds), 200
    trainer = AsyncTrainer(parabola_model(seed=3), squared_error,
                           devices[:workers], learning_rate=rate, staleness_aware=aware,
                           delay_compensation=strength, progress=False)
    trainer.fit(x, y, steps=steps, scenario=Scenario(speeds, jitter), seed=7)
    model = parabola_model()
    model.set_weights(trainer.get_weights())
    trained = float(squared_error(y, model(x)))
    x64, y64 = parabola_data(dtype="float64")
    schedule = parabola_async.virtual_schedule(speeds, steps, jitter=jitter, seed=7)
    weights = parabola_async.stacked_weights([3])
    replayed = parabola_async.train(weights, x64, y64, workers, schedule, rate,
                                    staleness_aware=aware, delay_compensation=strength)[0]
    plain = parabola_async.train(weights, x64, y64, workers, schedule, rate,
                                 staleness_aware=aware)[0]
    tolerance = pargrad.rounding_tolerance("float32", steps, scale=trained)
    assert abs(replayed - trained) <= tolerance
    assert abs(plain - trained) > 10 * tolerance  # the correction did change the run


def test_delay_compensation_through_keras_sgd_is_the_plain_path(devices):
    x, y = parabola_data()
    options = dict(steps=40, scenario=Scenario((1.0, 0.5, 1.0, 0.7), jitter=0.5), seed=2)
    plain = AsyncTrainer(parabola_model(seed=1), squared_error, devices,
                         learning_rate=0.05, delay_compensation=1.0, progress=False)
    plain.fit(x, y, **options)
    through_sgd = AsyncTrainer(parabola_model(seed=1), squared_error, devices,
                               optimizer=keras.optimizers.SGD(0.05), delay_compensation=1.0,
                               progress=False)
    through_sgd.fit(x, y, **options)
    for a, b in zip(plain.get_weights(), through_sgd.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=pargrad.rounding_tolerance("float32", 40))


@pytest.mark.parametrize("bad, error", [
    (0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), ("0.1", TypeError),
    (True, TypeError),
])
def test_bad_delay_compensation_says_what_to_pass(devices, bad, error):
    with pytest.raises(error, match="delay_compensation .*None to apply the stale gradient"):
        AsyncTrainer(linear_model(), mse, devices[:2], 0.1, delay_compensation=bad)


# -- fit's one API: steps= (updates= kept), scenario= (the old knobs kept), keyword-only ----------

def two_runs(devices, first, second):
    x, y = linear_data(12)
    runs = []
    for options in (first, second):
        trainer = AsyncTrainer(linear_model(), mse, devices[:2], 0.1, progress=False)
        runs.append((trainer.fit(x, y, seed=3, **options), trainer.get_weights()))
    return runs


def test_the_old_names_run_exactly_as_the_new_ones(devices):
    (old, old_weights), (new, new_weights) = two_runs(
        devices, dict(updates=9, speeds=[1.0, 0.4], jitter=0.5, delay_distribution="pareto"),
        dict(steps=9, scenario=Scenario((1.0, 0.4), 0.5, "pareto")))
    for key in old:
        np.testing.assert_array_equal(old[key], new[key])
    for a, b in zip(old_weights, new_weights):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(steps=3, updates=3), ValueError, "not both"),
    (dict(steps=3, scenario=Scenario((1.0, 1.0)), jitter=0.5), ValueError, "not both"),
    (dict(steps=3, scenario=(1.0, 1.0)), TypeError, "pargrad.Scenario"),
    (dict(steps=3, scenario=Scenario((1.0, 1.0, 1.0))), ValueError, "one positive number per worker"),
    (dict(steps=3, batchsize=4), TypeError, "batchsize"),
    (dict(), ValueError, "steps=100"),
])
def test_fit_refuses_a_length_or_scenario_given_twice_and_unknown_names(devices, arguments,
                                                                        error, message):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], 0.1, progress=False)
    with pytest.raises(error, match=message):
        trainer.fit(x, y, **arguments)


def test_fit_takes_no_positional_arguments_after_y(devices):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], 0.1, progress=False)
    with pytest.raises(TypeError):
        trainer.fit(x, y, 64)   # a Keras user's batch size would have run 64 updates
    assert trainer.version == 0


@pytest.mark.parametrize("arguments, error", [
    (dict(speeds=()), TypeError), (dict(speeds="fast"), TypeError),
    (dict(speeds=(1.0, -1.0)), ValueError), (dict(speeds=(1.0,), jitter=-0.5), ValueError),
    (dict(speeds=(1.0,), delay_distribution="normal"), ValueError),
])
def test_a_bad_scenario_is_refused_when_it_is_made(arguments, error):
    with pytest.raises(error, match="speeds|jitter|delay_distribution"):
        Scenario(**arguments)


def test_a_scenario_is_one_value_the_race_and_the_library_share():
    assert race.Scenario is pargrad.Scenario
    assert Scenario([1, 0.5]) == Scenario((1.0, 0.5)) and Scenario((1.0,) * 2) == Scenario.equal(2)


def test_delay_compensation_compiled_with_xla_follows_the_plain_tensorflow_run(devices):
    x, y = parabola_data()
    weights = []
    for jit in (False, True):
        trainer = AsyncTrainer(parabola_model(seed=2), squared_error, devices,
                               learning_rate=0.05, delay_compensation=0.3, jit_compile=jit,
                               progress=False)
        trainer.fit(x, y, steps=60, scenario=Scenario((1.0, 1.0, 1.0, 0.1)))
        weights.append(trainer.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=pargrad.rounding_tolerance("float32", 60))


def test_fits_first_docstring_line_says_batch_size_is_per_worker():
    first_line = AsyncTrainer.fit.__doc__.strip().splitlines()[0]
    assert "batch_size" in first_line and "per worker" in first_line
