"""pargrad.asynchronous: AsyncTrainer, its virtual clock, DC-ASGD, bounded staleness, hold_core.

The algorithm against updates computed by hand, the scheduled mode against
pargrad.scenario's virtual clock, the float64 replay, a reader's own model and
data, and the API's errors.  The chapters' conclusions are claim tests of their own.
"""

import threading
import time

import keras
import numpy as np
import pytest

import pargrad  # noqa: F401  (first: TensorFlow quietly)
import tensorflow as tf
from pargrad.asynchronous import (
    HISTORY_KEYS, AsyncHistory, AsyncTrainer, delay_compensated, hold_core,
)
from pargrad.book import replay
from pargrad.book.parabola import parabola_data, parabola_model, squared_error
from pargrad.numerics import rounding_tolerance
from pargrad.scenario import SCHEDULE_KEYS, Scenario, virtual_schedule
from pargrad import NonFiniteDataError, NonFiniteLossError

from linear_problem import linear_data, linear_model, mse, numpy_gradient

# Runs are compared bit for bit, so with deterministic kernels (not all of a GPU's are by default).
pytestmark = pytest.mark.usefixtures("deterministic_ops")

LEARNING_RATE = 0.05
TRUE_KERNEL = np.array([1.0, -2.0, 0.5])


def async_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pargrad-async")]


def regression_data(n=64):
    """``n`` seeded points of y = x @ [1, -2, 0.5] + 0.1 + noise; y of shape (n,), float64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    return x, x @ TRUE_KERNEL + 0.1 + 0.01 * rng.standard_normal(n)


def regression_model(*layers, seed=0, **dense):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(shape=(3,)), *layers, keras.layers.Dense(1, **dense)])


def keras_fit(model, x, y, steps, optimizer=None):
    """What Keras fit does with loss="mse", the whole data as one batch a step."""
    model.compile(optimizer or keras.optimizers.SGD(LEARNING_RATE), loss="mse")
    model.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    return model.get_weights()


def counts_at_each_apply(history, workers):
    """Updates applied by each worker, just after each update."""
    counts, rows = np.zeros(workers, int), []
    for worker in history.worker:
        counts[worker] += 1
        rows.append(counts.copy())
    return np.array(rows)


# -- the algorithm: stale updates, checked against updates computed by hand --------------------


@pytest.mark.claim
def test_one_worker_is_plain_sgd_with_staleness_zero(devices):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:1], learning_rate=LEARNING_RATE,
                           progress=False)
    history = trainer.fit(x, y, steps=15)
    w, b = linear_model().get_weights()
    for _ in range(15):
        dw, db = numpy_gradient(w, b, x, y)
        w, b = w - LEARNING_RATE * dw, b - LEARNING_RATE * db
    np.testing.assert_allclose(trainer.get_weights()[0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.get_weights()[1], b, rtol=1e-5, atol=1e-6)
    assert history.staleness.tolist() == [0] * 15


@pytest.mark.claim
@pytest.mark.parametrize("jit_compile", [False, True])
def test_two_scheduled_workers_apply_the_stale_updates_computed_by_hand(devices, jit_compile):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=LEARNING_RATE,
                           progress=False,
                           jit_compile=jit_compile)
    history = trainer.fit(x, y, steps=8)
    shards = [(x[0::2], y[0::2]), (x[1::2], y[1::2])]
    # Both workers read version 0 at time 0; with equal speeds they then take
    # turns, and each applies a gradient taken at the version before the
    # current one: w[k+1] = w[k] - lr * g_(k mod 2)(w[k-1]).
    versions = [linear_model().get_weights()]
    reads = [0, 0, 1, 2, 3, 4, 5, 6]
    for k, read in enumerate(reads):
        w, b = versions[-1]
        dw, db = numpy_gradient(*versions[read], *shards[k % 2])
        versions.append((w - LEARNING_RATE * dw, b - LEARNING_RATE * db))
    np.testing.assert_allclose(trainer.get_weights()[0], versions[-1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.get_weights()[1], versions[-1][1], rtol=1e-5, atol=1e-6)
    assert history.worker.tolist() == [0, 1] * 4
    assert history.read_version.tolist() == reads
    assert history.staleness.tolist() == [0, 1, 1, 1, 1, 1, 1, 1]
    # The stale sequence really differs from one worker's plain SGD.
    plain = AsyncTrainer(linear_model(), mse, devices[:1], learning_rate=LEARNING_RATE,
                         progress=False)
    plain.fit(x, y, steps=8)
    assert not np.allclose(plain.get_weights()[0], versions[-1][0], atol=1e-3)


@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_every_requested_update_is_applied_and_counted(devices, mode):
    x, y = parabola_data()
    trainer = AsyncTrainer(parabola_model(), squared_error, devices,
                           learning_rate=0.01, progress=False)
    history = trainer.fit(x, y, steps=37, batch_size=4, mode=mode,
                          scenario=Scenario((1.0,) * len(devices), jitter=0.5))
    assert trainer.version == 37
    assert len(history.staleness) == 37
    assert np.bincount(history.staleness).sum() == 37
    assert history.applied_version.tolist() == list(range(37))
    np.testing.assert_array_equal(history.staleness,
                                  history.applied_version - history.read_version)
    assert history.staleness.min() >= 0
    # fit continues from where it stopped, and the Keras model holds the result.
    trainer.fit(x, y, steps=5, mode=mode)
    assert trainer.version == 42
    for weight, parameter in zip(trainer.model.get_weights(), trainer.get_weights()):
        np.testing.assert_array_equal(weight, parameter)


def test_equal_speeds_give_staleness_workers_minus_one_and_a_slow_worker_more(devices):
    x, y = parabola_data()
    trainer = AsyncTrainer(parabola_model(), squared_error, devices,
                           learning_rate=0.01, progress=False)
    history = trainer.fit(x, y, steps=40)
    assert history.staleness[4:].tolist() == [3] * 36
    history = trainer.fit(x, y, steps=60, scenario=Scenario((1, 1, 1, 0.25)))
    slow = history.worker == 3
    assert history.staleness[slow][1:].min() >= 12  # 3 others x 4 steps each
    assert history.staleness[~slow].mean() < 3
    # Each update lands inside the 3 other workers' computations, whatever the speeds.
    assert 2.7 < history.staleness.mean() <= 3


def test_staleness_aware_learning_rate_divides_by_staleness_plus_one(devices):
    x, y = parabola_data()
    trainer = AsyncTrainer(parabola_model(), squared_error, devices,
                           learning_rate=0.1, staleness_aware=True, progress=False)
    history = trainer.fit(x, y, steps=20, scenario=Scenario((1.0,) * len(devices), jitter=1.0))
    np.testing.assert_allclose(history.learning_rate, 0.1 / (history.staleness + 1))
    assert history.staleness.max() > 0


@pytest.mark.claim
def test_staleness_aware_updates_take_the_rate_divided_by_staleness_plus_one(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=LEARNING_RATE,
                           staleness_aware=True, progress=False)
    history = trainer.fit(x, y, steps=6)
    # Two equal workers take turns; update k reads version k - 1 (staleness 1)
    # and steps by LEARNING_RATE / 2, except the very first (staleness 0).
    shards = [(x[0::2], y[0::2]), (x[1::2], y[1::2])]
    versions = [linear_model().get_weights()]
    for k, read in enumerate([0, 0, 1, 2, 3, 4]):
        rate = LEARNING_RATE / (k - read + 1)
        dw, db = numpy_gradient(*versions[read], *shards[k % 2])
        w, b = versions[-1]
        versions.append((w - rate * dw, b - rate * db))
    assert history.staleness.tolist() == [0, 1, 1, 1, 1, 1]
    np.testing.assert_allclose(history.learning_rate, [0.05] + [0.025] * 5)
    for got, expected in zip(trainer.get_weights(), versions[-1]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.claim
def test_scheduled_runs_repeat_exactly(devices):
    x, y = parabola_data()

    def run():
        trainer = AsyncTrainer(parabola_model(), squared_error, devices,
                               learning_rate=0.02, progress=False)
        history = trainer.fit(x, y, steps=30, batch_size=5,
                              scenario=Scenario((1, 0.7, 1, 0.5), jitter=0.5), seed=3)
        return history, trainer.get_weights()

    (first, weights1), (second, weights2) = run(), run()
    # The schedule (who reads and applies when) repeats exactly; the numbers
    # repeat exactly on a CPU and up to float32 rounding on a GPU, whose
    # kernels may add in a different order each run.
    rounding = rounding_tolerance("float32", 30)
    for key in HISTORY_KEYS:
        if key == "loss":
            np.testing.assert_allclose(first.loss, second.loss, rtol=rounding)
        else:
            np.testing.assert_array_equal(getattr(first, key), getattr(second, key))
    for a, b in zip(weights1, weights2):
        np.testing.assert_allclose(a, b, rtol=0, atol=rounding)
    assert len(set(first.staleness.tolist())) > 1  # the jitter did reorder the workers


# -- the virtual clock: the scheduled mode runs on pargrad.scenario's --------------------------


@pytest.mark.parametrize("scenario", [
    Scenario((1.0, 1.0, 1.0, 1.0)),
    Scenario((1.0, 0.5, 0.8), jitter=0.3),
    Scenario((1.0, 1.0, 1.0, 0.25), jitter=0.5, delay_distribution="pareto"),
], ids=["equal", "jitter", "pareto"])
def test_a_scheduled_fit_applies_the_virtual_schedule_of_its_scenario_and_seed(devices, scenario):
    x, y = parabola_data()
    trainer = AsyncTrainer(parabola_model(), squared_error, devices[:len(scenario.speeds)],
                           learning_rate=0.01, progress=False)
    history = trainer.fit(x, y, steps=150, batch_size=4, scenario=scenario, seed=11)
    schedule = virtual_schedule(scenario, 150, seed=11)
    for key in SCHEDULE_KEYS:
        np.testing.assert_array_equal(getattr(history, key), schedule[key], err_msg=key)
    # A second fit starts a new clock: the same schedule, versions counted on.
    again = trainer.fit(x, y, steps=150, batch_size=4, scenario=scenario, seed=11)
    np.testing.assert_array_equal(again.time, schedule["time"])
    np.testing.assert_array_equal(again.read_version, schedule["read_version"] + 150)

def test_a_virtual_time_limit_stops_before_the_first_late_update(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices, learning_rate=LEARNING_RATE,
                           progress=False)
    history = trainer.fit(x, y, steps=10**6, scenario=Scenario((1, 1, 1, 0.5)),
                          virtual_time_limit=10)
    assert history.time.max() <= 10
    assert len(history.time) == 3 * 10 + 5
    with pytest.raises(ValueError, match="time_limit"):
        trainer.fit(x, y, steps=5, mode="free-running", virtual_time_limit=10)


# -- bounded staleness (stale synchronous parallel) --------------------------------------------


def test_a_worker_more_than_s_updates_ahead_waits_for_the_slowest(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=LEARNING_RATE,
                           staleness_bound=1, progress=False)
    history = trainer.fit(x, y, steps=8, scenario=Scenario((1.0, 1.0 / 3.0)))
    # Worked out by hand: worker 0 takes 1 time unit, worker 1 takes 3.  After
    # its 2nd update (t=2) worker 0 is 2 ahead of worker 1, more than s = 1,
    # so it waits until worker 1's update at t=3, then reads; and so on.
    assert history.worker.tolist() == [0, 0, 1, 0, 1, 0, 1, 0]
    assert history.time.tolist() == [1, 2, 3, 4, 6, 7, 9, 10]
    assert history.read_time.tolist() == [0, 1, 0, 3, 3, 6, 6, 9]
    assert history.staleness.tolist() == [0, 0, 2, 0, 1, 0, 1, 0]
    # Without the bound, worker 0 never waits and worker 1's updates go staler.
    free = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=LEARNING_RATE,
                        progress=False)
    unbounded = free.fit(x, y, steps=8, scenario=Scenario((1.0, 1.0 / 3.0)))
    assert unbounded.worker.tolist() == [0, 0, 0, 1, 0, 0, 0, 1]
    assert unbounded.staleness[unbounded.worker == 1].tolist() == [3, 3]


@pytest.mark.parametrize("bound", [0, 2])
def test_bounded_workers_never_drift_more_than_s_plus_one_apart(devices, bound):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices, learning_rate=LEARNING_RATE,
                           staleness_bound=bound, progress=False)
    history = trainer.fit(x, y, steps=60, scenario=Scenario((1, 0.5, 1, 0.25), jitter=0.5), seed=2)
    counts = counts_at_each_apply(history, 4)
    # A worker reads only when at most s ahead, so after its apply at most s + 1.
    assert (counts.max(axis=1) - counts.min(axis=1)).max() == bound + 1
    assert history.staleness.max() <= (bound + 1) * 3 + 3


def test_free_running_bounded_workers_wait_really_and_finish(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=LEARNING_RATE,
                           staleness_bound=1, progress=False)
    history = trainer.fit(x, y, steps=40, mode="free-running", scenario=Scenario((1.0, 0.25)),
                          step_seconds=0.004)
    counts = counts_at_each_apply(history, 2)
    assert np.abs(counts[:, 0] - counts[:, 1]).max() <= 2
    # The fast worker was held back: it applied about as often as the slow one,
    # not four times as often.  At the end the slow worker stops holding it back.
    assert trainer.version == 40
    assert not [t for t in threading.enumerate() if t.name.startswith("pargrad-async")]


def test_staleness_bound_is_validated(devices):
    with pytest.raises(ValueError, match="staleness_bound"):
        AsyncTrainer(linear_model(), mse, devices[:2], staleness_bound=-1)
    with pytest.raises(TypeError, match="staleness_bound"):  # a wrong type, not a wrong value
        AsyncTrainer(linear_model(), mse, devices[:2], staleness_bound=1.5)


# -- delay compensation (DC-ASGD) --------------------------------------------------------------


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
    schedule = virtual_schedule(Scenario(speeds, jitter), steps, seed=7)
    weights = replay.stacked_weights([3])
    replayed = replay.train_async(weights, x64, y64, workers, schedule, rate,
                                    staleness_aware=aware, delay_compensation=strength)[0]
    plain = replay.train_async(weights, x64, y64, workers, schedule, rate,
                                 staleness_aware=aware)[0]
    tolerance = rounding_tolerance("float32", steps, scale=trained)
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
        np.testing.assert_allclose(a, b, rtol=0, atol=rounding_tolerance("float32", 40))


@pytest.mark.parametrize("optimizer", [None, "sgd"])
def test_lambda_zero_is_plain_asynchronous_sgd_bit_for_bit(devices, optimizer):
    """delay_compensation=0 is where a sweep of λ starts: the run of None, to the last bit."""
    x, y = parabola_data()
    runs = []
    for strength in (None, 0, 0.0):
        trainer = AsyncTrainer(parabola_model(seed=1), squared_error, devices,
                               learning_rate=None if optimizer else 0.05,
                               optimizer=keras.optimizers.SGD(0.05) if optimizer else None,
                               delay_compensation=strength, progress=False)
        history = trainer.fit(x, y, steps=40, scenario=Scenario((1.0, 0.5, 1.0, 0.7), jitter=0.5),
                              seed=2)
        runs.append((history, trainer.get_weights()))
        assert trainer.delay_compensation == strength
    (plain, plain_weights), *zeros = runs
    assert plain.staleness.max() > 0
    for history, weights in zeros:
        for key in HISTORY_KEYS:
            np.testing.assert_array_equal(getattr(history, key), getattr(plain, key), err_msg=key)
        for a, b in zip(weights, plain_weights):
            np.testing.assert_array_equal(a, b)

@pytest.mark.parametrize("bad, error", [
    (-1.0, ValueError), (-0.5, ValueError), (float("nan"), ValueError), ("0.1", TypeError),
    (True, TypeError), (False, TypeError),
])
def test_bad_delay_compensation_says_what_to_pass(devices, bad, error):
    with pytest.raises(error, match="delay_compensation .*0 or None to apply the stale gradient"):
        AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1, delay_compensation=bad)


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
        np.testing.assert_allclose(a, b, rtol=0, atol=rounding_tolerance("float32", 60))


# -- free-running: threads, failures, time limits, emulated slow devices -----------------------


@pytest.mark.timing
def test_a_failing_worker_ends_fit_promptly_and_leaves_no_thread(devices):
    x, y = parabola_data()
    trainer = AsyncTrainer(parabola_model(), squared_error, devices[:2],
                           learning_rate=0.01, progress=False)
    healthy = trainer._gradient_fns[1]
    calls, failed_at = [], []

    def failing(*args):
        calls.append(1)
        if len(calls) > 3:
            failed_at.append(time.perf_counter())
            raise RuntimeError("device 1 fell over")
        return healthy(*args)

    trainer._gradient_fns[1] = failing
    with pytest.raises(RuntimeError, match="device 1 fell over") as caught:
        trainer.fit(x, y, steps=10**7, mode="free-running")
    assert time.perf_counter() - failed_at[0] < 1.0
    assert "worker 1" in " ".join(getattr(caught.value, "__notes__", []))
    assert async_threads() == []
    assert trainer.version == len(trainer.history.loss) > 3


@pytest.mark.timing
def test_a_time_limit_stops_a_free_running_fit(devices):
    x, y = parabola_data()
    trainer = AsyncTrainer(parabola_model(), squared_error, devices[:2],
                           learning_rate=0.01, progress=False)
    trainer.fit(x, y, steps=2, mode="free-running")  # compile first
    started = time.perf_counter()
    history = trainer.fit(x, y, steps=10**7, mode="free-running", time_limit=0.3)
    assert time.perf_counter() - started < 1.3
    assert 0 < len(history.loss) == trainer.version - 2 < 10**7
    assert async_threads() == []


@pytest.mark.timing
def test_hold_core_keeps_the_thread_busy_for_the_time_asked():
    started, cpu = time.perf_counter(), time.thread_time()
    held = hold_core(0.3)
    busy = time.thread_time() - cpu
    assert 0.3 <= held <= time.perf_counter() - started
    # a sleep would use about 0.0001 s of this thread's CPU time; busy work uses
    # all it gets (on a loaded machine, a share of the 0.3 s)
    assert busy > 0.01


@pytest.mark.timing
def test_hold_core_stops_when_the_run_stops():
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    assert hold_core(10.0, stop) < 2.0
    assert hold_core(0.0) < 0.1


# -- a reader's own model and data: targets, losses, regularization, state, casts, optimizers ---


def test_targets_of_shape_n_train_as_keras_fit_with_mse(devices):
    """y of shape (N,) with squared_error (the docstring's example) = Keras mse."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), squared_error, devices[:1],
                           learning_rate=LEARNING_RATE, progress=False)
    history = trainer.fit(x, y, steps=40)
    expected = keras_fit(regression_model(), x, y, 40)
    assert np.all(np.isfinite(history.loss))
    for got, want in zip(trainer.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    column = AsyncTrainer(regression_model(), squared_error, devices[:1],
                          learning_rate=LEARNING_RATE, progress=False)
    column.fit(x, y[:, None], steps=40)
    for got, want in zip(trainer.get_weights(), column.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("loss", [
    "mse", "mean_squared_error", keras.losses.MeanSquaredError(), keras.losses.mean_squared_error,
    squared_error, lambda y, p: tf.square(y - p)[:, 0],  # per example, reduced by the trainer
], ids=["mse", "mean_squared_error", "MeanSquaredError()", "function", "squared_error",
        "per-example lambda"])
def test_loss_takes_strings_keras_losses_and_callables(devices, loss):
    """The loss forms SyncTrainer takes (strings, Keras loss objects, callables) all train alike."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), loss, devices[:2], learning_rate=LEARNING_RATE,
                           progress=False)
    trainer.fit(x, y, steps=20)
    reference = AsyncTrainer(regression_model(), squared_error, devices[:2],
                             learning_rate=LEARNING_RATE, progress=False)
    reference.fit(x, y[:, None], steps=20)
    for got, want in zip(trainer.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.claim
def test_regularization_is_in_each_workers_loss_at_the_parameters_it_read(devices):
    """model.losses (an L2 penalty) is added to each worker's loss, at its read parameters."""
    penalty = 0.3
    x, y = linear_data(12)
    model = linear_model()
    regularized = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(
        1, kernel_regularizer=keras.regularizers.L2(penalty))])
    regularized.set_weights(model.get_weights())
    trainer = AsyncTrainer(regularized, "mse", devices[:2], learning_rate=LEARNING_RATE,
                           progress=False)
    history = trainer.fit(x, y, steps=6)
    # By hand, as in test_asynchronous.py: w[k+1] = w[k] - lr * g(w[read]), where
    # g now includes the penalty's gradient 2 * penalty * w at the read version.
    shards = [(x[0::2], y[0::2]), (x[1::2], y[1::2])]
    versions, losses = [model.get_weights()], []
    for k, read in enumerate([0, 0, 1, 2, 3, 4]):
        w, b = versions[-1]
        w_read, b_read = versions[read]
        dw, db = numpy_gradient(w_read, b_read, *shards[k % 2])
        dw = dw + 2 * penalty * w_read
        losses.append(np.mean((shards[k % 2][0] @ w_read + b_read - shards[k % 2][1]) ** 2)
                      + penalty * np.sum(w_read ** 2))
        versions.append((w - LEARNING_RATE * dw, b - LEARNING_RATE * db))
    np.testing.assert_allclose(trainer.get_weights()[0], versions[-1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.get_weights()[1], versions[-1][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.loss, losses, rtol=1e-5)


def test_dropout_is_active_and_each_worker_drops_its_own_units(devices):
    """The workers run the model with training=True, so Dropout drops units."""
    x, y = regression_data(32)
    x, y = np.repeat(x, 2, axis=0), np.repeat(y, 2)  # worker 0's shard = worker 1's shard

    def dropout_model():
        keras.utils.set_random_seed(0)  # before the Dropout layer draws its seed
        return regression_model(keras.layers.Dense(16, activation="relu"),
                                keras.layers.Dropout(0.5))

    trainer = AsyncTrainer(dropout_model(), "mse", devices[:2], learning_rate=LEARNING_RATE,
                           progress=False)
    history = trainer.fit(x, y, steps=2)
    at_start = float(keras.losses.mean_squared_error(y[:, None], dropout_model()(x)).numpy().mean())
    # Both updates were computed at version 0, on the same examples: without
    # dropout their losses would both equal the inference-mode loss.
    assert history.read_version.tolist() == [0, 0]
    assert history.loss[0] != pytest.approx(at_start, rel=1e-4)
    assert history.loss[0] != pytest.approx(history.loss[1], rel=1e-4)
    # Scheduled runs repeat exactly, dropout masks included; a later fit draws new masks.
    again = AsyncTrainer(dropout_model(), "mse", devices[:2], learning_rate=LEARNING_RATE,
                         progress=False)
    np.testing.assert_array_equal(again.fit(x, y, steps=2).loss, history.loss)
    assert not np.array_equal(again.fit(x, y, steps=2).loss[:1], history.loss[:1])
    # The trained model still predicts in inference mode: no dropout there.
    np.testing.assert_array_equal(trainer.model(x[:4]), trainer.model(x[:4]))


def test_batch_normalization_trains_on_batch_statistics_and_keeps_them(devices):
    """BatchNormalization normalises by the batch and updates its moving mean in training."""
    x, y = regression_data()
    x = x + 3.0  # features with mean 3: the moving mean must move away from 0
    model = regression_model(keras.layers.BatchNormalization(momentum=0.5))
    trainer = AsyncTrainer(model, "mse", devices[:2], learning_rate=LEARNING_RATE, progress=False)
    trainer.fit(x, y, steps=16)
    moving_mean = model.layers[0].moving_mean.numpy()
    np.testing.assert_allclose(moving_mean, x.mean(axis=0), atol=0.3)


def test_lists_integers_and_float64_are_cast_to_the_models_dtypes(devices):
    """Python lists, integer and float64 features and targets train as float32 arrays do."""
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, size=(24, 3))
    y = x @ np.array([1, -2, 1]) + 1  # integers
    reference = AsyncTrainer(regression_model(), "mse", devices[:2], learning_rate=0.01,
                             progress=False)
    reference.fit(x.astype(np.float32), y.astype(np.float32), steps=10)
    for features, targets in [(x.tolist(), y.tolist()), (x, y), (x.astype(np.float64), y * 1.0)]:
        trainer = AsyncTrainer(regression_model(), "mse", devices[:2], learning_rate=0.01,
                               progress=False)
        trainer.fit(features, targets, steps=10)
        for got, want in zip(trainer.get_weights(), reference.get_weights()):
            np.testing.assert_array_equal(got, want)


def test_a_mixed_float16_model_is_refused_with_what_to_do(devices):
    """Float16 gradients need loss scaling, which AsyncTrainer lacks: a clear refusal."""
    model = keras.Sequential([keras.Input(shape=(3,)),
                              keras.layers.Dense(4, dtype="mixed_float16"),
                              keras.layers.Dense(1, dtype="float32")])
    with pytest.raises(ValueError, match="float32.*policy"):
        AsyncTrainer(model, "mse", devices[:2], learning_rate=LEARNING_RATE, progress=False)


@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_a_non_finite_loss_stops_training_naming_the_update_and_worker(devices, mode):
    """NonFiniteLossError names the update and the worker; no NaN is applied; no thread lives on."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], learning_rate=5.0,
                           progress=False)
    with pytest.raises(NonFiniteLossError) as caught:
        trainer.fit(x, y, steps=10**6, mode=mode)
    error = caught.value
    # Scheduled: the run stops right there.  Free-running: an update another
    # worker was already applying may still land.
    assert error.step <= trainer.version <= error.step + (mode == "free-running") < 10**6
    assert f"update {error.step}" in str(error) or f"step {error.step}" in str(error)
    assert "worker" in str(error.who) and str(error.who) in str(error)
    assert not np.isfinite(error.loss)
    assert all(np.all(np.isfinite(w)) for w in trainer.get_weights())
    for weight, parameter in zip(trainer.model.get_weights(), trainer.get_weights()):
        np.testing.assert_array_equal(weight, parameter)
    assert async_threads() == []


def test_the_caller_can_opt_out_and_train_on(devices):
    """stop_on_non_finite=False keeps the old behaviour: every update applied, NaN recorded."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], learning_rate=5.0,
                           progress=False, stop_on_non_finite=False)
    history = trainer.fit(x, y, steps=200)
    assert trainer.version == 200
    assert not np.all(np.isfinite(history.loss))


def test_a_keras_optimizer_trains_as_keras_does_with_slots_on_the_parameter_device(devices):
    """optimizer=keras.optimizers.Adagrad: Keras's update, slots on the parameter device."""
    x, y = regression_data()
    optimizer = keras.optimizers.Adagrad(0.1)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:1], optimizer=optimizer,
                           parameter_device=devices[1], progress=False)
    history = trainer.fit(x, y, steps=25)
    expected = keras_fit(regression_model(), x, y, 25, keras.optimizers.Adagrad(0.1))
    for got, want in zip(trainer.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    where = tf.DeviceSpec.from_string(devices[1])
    slots = [v for v in optimizer.variables if "accumulator" in v.path]
    assert len(slots) == 2  # one for the kernel, one for the bias
    for variable in slots:
        assert tf.DeviceSpec.from_string(variable.value.device).device_index == where.device_index
    assert int(optimizer.iterations) == trainer.version == 25
    np.testing.assert_allclose(history.learning_rate, 0.1)


@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_optimizer_updates_are_atomic_and_staleness_is_recorded(devices, mode):
    """With a Keras optimizer every update is applied once, under the lock, with its staleness."""
    x, y = regression_data()
    optimizer = keras.optimizers.Adagrad(0.05)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:4], optimizer=optimizer,
                           progress=False)
    history = trainer.fit(x, y, steps=40, batch_size=4, mode=mode,
                          scenario=Scenario((1.0,) * 4, jitter=0.5))
    assert trainer.version == int(optimizer.iterations) == 40
    assert history.applied_version.tolist() == list(range(40))
    np.testing.assert_array_equal(history.staleness,
                                  history.applied_version - history.read_version)
    assert history.staleness.max() > 0
    assert async_threads() == []


def test_staleness_aware_keras_sgd_is_the_plain_rule(devices):
    """staleness_aware divides the optimizer's rate by staleness + 1; with SGD = the plain path."""
    x, y = regression_data()
    options = dict(steps=30, batch_size=8, scenario=Scenario((1.0,) * 4, jitter=1.0), seed=4)
    plain = AsyncTrainer(regression_model(), "mse", devices[:4], learning_rate=0.1,
                         staleness_aware=True, progress=False)
    plain_history = plain.fit(x, y, **options)
    keras_sgd = AsyncTrainer(regression_model(), "mse", devices[:4], staleness_aware=True,
                             optimizer=keras.optimizers.SGD(0.1), progress=False)
    history = keras_sgd.fit(x, y, **options)
    assert plain_history.staleness.max() > 0
    np.testing.assert_array_equal(history.staleness, plain_history.staleness)
    np.testing.assert_allclose(history.learning_rate, 0.1 / (history.staleness + 1))
    for got, want in zip(keras_sgd.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_validation_data_and_keras_metrics(devices, mode):
    """fit(validation_data=, validation_every=) and metrics= give val_loss and val_<metric>."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((120, 3)).astype(np.float32)
    labels = (x @ TRUE_KERNEL > 0).astype(np.int64)  # shape (N,), integers
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(2)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = AsyncTrainer(model, loss, devices[:2], learning_rate=0.5, progress=False,
                           metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    history = trainer.fit(x[:80], labels[:80], steps=12, batch_size=8,
                          validation_data=(x[80:], labels[80:]), validation_every=5, mode=mode)
    assert history.validation["val_version"].tolist() == [5, 10, 12]
    assert len(history.loss) == 12
    logits = model(x[80:])
    np.testing.assert_allclose(history.validation["val_loss"][-1], float(loss(labels[80:], logits)),
                               rtol=1e-5)
    accuracy = np.mean(np.argmax(logits, axis=1) == labels[80:])
    assert history.validation["val_accuracy"][-1] == pytest.approx(accuracy)
    assert history.validation["val_accuracy"][-1] > 0.8
    assert async_threads() == []


# -- the API: keyword-only, one name a thing, errors that say what to pass ---------------------


@pytest.mark.parametrize("bad, error, message", [
    (dict(devices="/device:CPU:0"), TypeError, "devices must be a list of device names.*logical_"),
    (dict(devices=[0, 1]), TypeError, "each of devices must be a device name.*logical_devices"),
    (dict(devices=[]), ValueError, "logical_devices"),
    (dict(learning_rate=0), ValueError, "learning_rate"),
    (dict(model="a model"), TypeError, "model must be a built keras.Model, got 'a model'. Pass"),
    (dict(model=keras.Sequential([keras.layers.Dense(1)])), ValueError, "build it first"),
    (dict(optimizer="adam", learning_rate=0.1), TypeError,
     "optimizer must be a Keras optimizer instance or None, got 'adam'. Pass for example"),
    (dict(progress="yes"), TypeError, "progress must be True or False"),
])
def test_bad_constructor_arguments_say_what_to_pass(devices, bad, error, message):
    """A wrong type is a TypeError, a wrong value a ValueError, as in pargrad.checks."""
    arguments = dict(model=linear_model(), loss=mse, devices=devices[:2], learning_rate=0.1)
    with pytest.raises(error, match=message) as caught:
        AsyncTrainer(**{**arguments, **bad})
    assert isinstance(caught.value, TypeError) != isinstance(caught.value, ValueError)


def test_the_history_is_keras_shaped_beside_the_updates(devices):
    """fit returns an AsyncHistory: per-update arrays, and Keras's per-fit history dict."""
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1, progress=False)
    history = trainer.fit(x, y, steps=6, validation_data=(x, y), validation_every=3)
    assert isinstance(history, AsyncHistory) and history is trainer.history and len(history) == 6
    assert history.epoch == [0] and history.params["steps"] == 6
    assert history.history["loss"] == [pytest.approx(float(np.mean(history.loss)))]
    assert history.history["val_loss"] == [pytest.approx(history.validation["val_loss"][-1])]
    assert history.validation["val_version"].tolist() == [3, 6]


def test_evaluate_is_the_mean_loss_of_the_shared_parameters_as_sync_trainers(devices):
    """evaluate(x, y) -> {"loss": ...}: the mean over every example, in batches or at once."""
    x, y = regression_data(32)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], progress=False,
                           metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
    trainer.fit(x, y, steps=4, batch_size=4, validation_data=(x, y))
    trainer.model.compile(loss="mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
    expected = trainer.model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    whole, batched = trainer.evaluate(x, y), trainer.evaluate(x, y, batch_size=5)
    assert set(whole) == {"loss", "mae"}
    assert whole["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert whole["mae"] == pytest.approx(expected["mae"], rel=1e-5)
    assert batched["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert whole["loss"] == pytest.approx(trainer.history.validation["val_loss"][-1], rel=1e-6)
    with pytest.raises(TypeError, match="batch_size .* must be a whole number"):
        trainer.evaluate(x, y, batch_size=2.5)


@pytest.mark.parametrize("bad, message", [
    (dict(loss="msee"), "msee"),
    (dict(loss=3), "loss"),
    (dict(loss=keras.losses.MeanSquaredError), "MeanSquaredError()"),
    (dict(optimizer=keras.optimizers.Adagrad(keras.optimizers.schedules.ExponentialDecay(
        0.1, 10, 0.9)), staleness_aware=True), "fixed rate"),
    (dict(optimizer="adagrad"), "keras.optimizers"),
    (dict(optimizer=keras.optimizers.SGD(0.1), learning_rate=0.1), "optimizer"),
    (dict(metrics=["accuracy"]), "keras.metrics"),
])
def test_bad_losses_optimizers_and_metrics_say_what_to_pass(devices, bad, message):
    """Unknown loss names, non-losses, optimizer and metric strings are refused clearly."""
    arguments = dict(model=regression_model(), loss="mse", devices=devices[:2])
    with pytest.raises((ValueError, TypeError), match=message):
        AsyncTrainer(**{**arguments, **bad})


def test_the_constructor_takes_only_model_loss_and_devices_by_position(devices):
    """A fourth positional argument (a learning rate? an optimizer?) is refused: name it."""
    with pytest.raises(TypeError, match="positional"):
        AsyncTrainer(linear_model(), mse, devices[:2], 0.1)
    assert AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1).learning_rate == 0.1


@pytest.mark.parametrize("arguments, error, message", [
    (dict(updates=3), TypeError, "updates"),
    (dict(steps=3, speeds=[1.0, 0.5]), TypeError, "speeds"),
    (dict(steps=3, jitter=0.5), TypeError, "jitter"),
    (dict(steps=3, delay_distribution="pareto"), TypeError, "delay_distribution"),
    (dict(steps=3, batchsize=4), TypeError, "batchsize"),
    (dict(), TypeError, "steps"),
    (dict(steps=3, scenario=(1.0, 1.0)), TypeError, "pargrad.Scenario"),
    (dict(steps=3, scenario=Scenario((1.0, 1.0, 1.0))), ValueError,
     "one positive number per device"),
])
def test_fit_takes_steps_and_a_scenario_and_no_other_names(devices, arguments, error, message):
    """One name a thing: steps= for the length, scenario= for the devices' speeds and delays."""
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1, progress=False)
    with pytest.raises(error, match=message):
        trainer.fit(x, y, **arguments)
    assert trainer.version == 0



@pytest.mark.parametrize("bad, message", [
    (dict(steps=0), "steps"),
    (dict(mode="async"), "mode"),
    (dict(scenario=Scenario((1.0,))), "speeds"),
    (dict(batch_size=100), "batch_size"),
    (dict(mode="free-running", virtual_time_limit=10), "time_limit"),
    (dict(validation_every=2), "validation_data"),
])
def test_bad_fit_arguments_say_what_to_pass(devices, bad, message):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1, progress=False)
    with pytest.raises(ValueError, match=message):
        trainer.fit(x, y, **{"steps": 5, **bad})


@pytest.mark.parametrize("bad, message", [
    (dict(x=tf.data.Dataset.from_tensor_slices(np.zeros((8, 3)))), "arrays"),
    (dict(x=tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros(8))).batch(4),
          y=None), "arrays"),
    (dict(y=None), "targets y"),
    (dict(batch_size=16.0), "pass 16"),
    (dict(steps=2.5), "whole number"),
    (dict(x=np.zeros((0, 3)), y=np.zeros(0)), "no examples"),
    (dict(x=np.array([["a", "b", "c"]] * 8), y=np.zeros(8)), "not numbers"),
    (dict(y=np.zeros(5)), "one target row per example"),
    (dict(validation_data=np.zeros(3)), "validation_data"),
])
def test_bad_fit_inputs_say_what_to_pass(devices, bad, message):
    """A dataset, a float batch size, empty or string data get errors naming the fix."""
    x, y = regression_data(32)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], progress=False)
    arguments = dict(x=x, y=y, steps=3, batch_size=4)
    with pytest.raises((ValueError, TypeError), match=message):
        trainer.fit(**{**arguments, **bad})
    assert async_threads() == []


def test_fit_takes_no_positional_arguments_after_y(devices):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1, progress=False)
    with pytest.raises(TypeError):
        trainer.fit(x, y, 64)   # a Keras user's batch size would have run 64 updates
    assert trainer.version == 0


def test_fits_first_docstring_line_says_batch_size_is_per_worker():
    first_line = AsyncTrainer.fit.__doc__.strip().splitlines()[0]
    assert "batch_size" in first_line and "per worker" in first_line


def test_progress_bar_counts_the_updates_and_on_update_sees_each_record(devices, capsys):
    x, y = linear_data(12)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], learning_rate=0.1, progress=True)
    seen = []
    trainer.fit(x, y, steps=6, on_update=lambda record: seen.append(record["applied_version"]))
    assert "6/6" in capsys.readouterr().err
    assert seen == list(range(6))


# -- the data check and targets ------------------------------------------------------

def small_data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=(n, 1))
    return x, y


def small_async_trainer(devices, loss=None, **options):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    return AsyncTrainer(model, loss, devices[:2], learning_rate=0.05, progress=False, **options)


def mean_squared(y, prediction):
    """A reader's own loss that does no casting of its own."""
    return tf.reduce_mean(tf.square(y - prediction))


@pytest.mark.usefixtures("deterministic_ops")
def test_async_refuses_non_finite_arrays_naming_the_row(devices):
    x, y = small_data()
    x[9, 0] = -np.inf
    trainer = small_async_trainer(devices)
    before = [w.copy() for w in trainer.model.get_weights()]
    with pytest.raises(NonFiniteDataError, match=r"-inf at row 9 of x(.|\n)*stop_on_non_finite=False"):
        trainer.fit(x, y.astype(np.float32), steps=4)
    for old, new in zip(before, trainer.model.get_weights()):
        np.testing.assert_array_equal(old, new)
    history = small_async_trainer(devices, stop_on_non_finite=False).fit(
        np.nan_to_num(x, neginf=0.0), y.astype(np.float32), steps=4)
    assert len(history.loss) == 4


@pytest.mark.usefixtures("deterministic_ops")
@pytest.mark.parametrize("loss", [None, mean_squared], ids=["default", "own function"])
def test_async_trains_on_integer_targets_as_on_floats(devices, loss):
    x, y = small_data()
    as_int = small_async_trainer(devices, loss).fit(x, y.astype(np.int64), steps=6, batch_size=8)
    as_float = small_async_trainer(devices, loss).fit(x, y.astype(np.float32), steps=6, batch_size=8)
    np.testing.assert_array_equal(as_int.loss, as_float.loss)


@pytest.mark.usefixtures("deterministic_ops")
def test_class_indices_stay_integers_for_a_sparse_loss(devices):
    x, y = small_data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    history = AsyncTrainer(model, "sparse_categorical_crossentropy", devices[:2],
                           learning_rate=0.05, progress=False).fit(x, y, steps=3)
    assert np.isfinite(history.loss).all()
