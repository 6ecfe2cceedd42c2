"""The mitigations of the chapter "Sync vs async in the same time", rule by rule.

Backup workers (SyncTrainer): which replicas' gradients make the update, and
how long a step lasts.  Bounded staleness (AsyncTrainer): when a worker
waits.  Staleness-aware learning rate: which step each update takes.
"""

import threading

import keras
import numpy as np
import pytest

from pargrad.asynchronous import AsyncTrainer, tf
from pargrad.scenario import Scenario, random_delay
from pargrad.book.instruments import InstrumentedSyncTrainer, backup_worker_mask, sync_step_times
from pargrad.strategies import sync_strategy

from linear_problem import linear_data, linear_model, mse, numpy_gradient

LEARNING_RATE = 0.05


# -- staleness-aware learning rate -------------------------------------------


@pytest.mark.claim
def test_staleness_aware_updates_take_the_rate_divided_by_staleness_plus_one(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], LEARNING_RATE,
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
    assert history["staleness"].tolist() == [0, 1, 1, 1, 1, 1]
    np.testing.assert_allclose(history["learning_rate"], [0.05] + [0.025] * 5)
    for got, expected in zip(trainer.get_weights(), versions[-1]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# -- bounded staleness (stale synchronous parallel) ----------------------------


def test_a_worker_more_than_s_updates_ahead_waits_for_the_slowest(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], LEARNING_RATE,
                           staleness_bound=1, progress=False)
    history = trainer.fit(x, y, steps=8, scenario=Scenario((1.0, 1.0 / 3.0)))
    # Worked out by hand: worker 0 takes 1 time unit, worker 1 takes 3.  After
    # its 2nd update (t=2) worker 0 is 2 ahead of worker 1, more than s = 1,
    # so it waits until worker 1's update at t=3, then reads; and so on.
    assert history["worker"].tolist() == [0, 0, 1, 0, 1, 0, 1, 0]
    assert history["time"].tolist() == [1, 2, 3, 4, 6, 7, 9, 10]
    assert history["read_time"].tolist() == [0, 1, 0, 3, 3, 6, 6, 9]
    assert history["staleness"].tolist() == [0, 0, 2, 0, 1, 0, 1, 0]
    # Without the bound, worker 0 never waits and worker 1's updates go staler.
    free = AsyncTrainer(linear_model(), mse, devices[:2], LEARNING_RATE, progress=False)
    unbounded = free.fit(x, y, steps=8, scenario=Scenario((1.0, 1.0 / 3.0)))
    assert unbounded["worker"].tolist() == [0, 0, 0, 1, 0, 0, 0, 1]
    assert unbounded["staleness"][unbounded["worker"] == 1].tolist() == [3, 3]


def counts_at_each_apply(history, workers):
    """Updates applied by each worker, just after each update."""
    counts, rows = np.zeros(workers, int), []
    for worker in history["worker"]:
        counts[worker] += 1
        rows.append(counts.copy())
    return np.array(rows)


@pytest.mark.parametrize("bound", [0, 2])
def test_bounded_workers_never_drift_more_than_s_plus_one_apart(devices, bound):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices, LEARNING_RATE,
                           staleness_bound=bound, progress=False)
    history = trainer.fit(x, y, steps=60, scenario=Scenario((1, 0.5, 1, 0.25), jitter=0.5), seed=2)
    counts = counts_at_each_apply(history, 4)
    # A worker reads only when at most s ahead, so after its apply at most s + 1.
    assert (counts.max(axis=1) - counts.min(axis=1)).max() == bound + 1
    assert history["staleness"].max() <= (bound + 1) * 3 + 3


def test_free_running_bounded_workers_wait_really_and_finish(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices[:2], LEARNING_RATE,
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


# -- the virtual clock's delays and limit -----------------------------------------


def test_random_delays_have_the_requested_mean_and_pareto_has_the_heavy_tail():
    rng = np.random.default_rng(0)
    exponential = np.array([random_delay(rng, 0.5, "exponential") for _ in range(40000)])
    pareto = np.array([random_delay(rng, 0.5, "pareto") for _ in range(40000)])
    assert random_delay(rng, 0.0, "pareto") == 0.0
    assert abs(exponential.mean() - 0.5) < 0.02
    # Lomax(1.5) scaled to mean 0.5: median 0.5 * 0.5 * (2 ** (1 / 1.5) - 1).
    assert abs(np.median(pareto) - 0.25 * (2 ** (1 / 1.5) - 1)) < 0.01
    # Ten times the mean: about 1 in 100 for Pareto, 1 in 20000 for exponential.
    assert (pareto > 5.0).mean() > 0.005 > 20 * (exponential > 5.0).mean()


def test_a_virtual_time_limit_stops_before_the_first_late_update(devices):
    x, y = linear_data(16)
    trainer = AsyncTrainer(linear_model(), mse, devices, LEARNING_RATE, progress=False)
    history = trainer.fit(x, y, steps=10**6, scenario=Scenario((1, 1, 1, 0.5)),
                          virtual_time_limit=10)
    assert history["time"].max() <= 10
    assert len(history["time"]) == 3 * 10 + 5
    with pytest.raises(ValueError, match="time_limit"):
        trainer.fit(x, y, steps=5, mode="free-running", virtual_time_limit=10)


# -- backup workers -----------------------------------------------------------------


def test_backup_worker_mask_keeps_the_first_n_minus_b_to_finish():
    times = np.array([[1.0, 3.0, 2.0, 4.0],
                      [5.0, 1.0, 1.0, 1.0],    # ties: the lower replica index counts
                      [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(backup_worker_mask(times, 1),
                                  [[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 0]])
    np.testing.assert_array_equal(backup_worker_mask(times, 2),
                                  [[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0]])
    assert backup_worker_mask(times, 0).all()
    # A step lasts until the (N - b)-th gradient has arrived.
    np.testing.assert_array_equal(sync_step_times(times, 0), [4, 5, 2])
    np.testing.assert_array_equal(sync_step_times(times, 1), [3, 1, 2])
    with pytest.raises(ValueError, match="backup_workers"):
        backup_worker_mask(times, 4)


def sync_linear_trainer(backup_workers, **options):
    strategy = sync_strategy(4)
    with strategy.scope():
        model = linear_model()
    return InstrumentedSyncTrainer(model, strategy, learning_rate=LEARNING_RATE, progress=False,
                                   backup_workers=backup_workers, **options)


@pytest.mark.claim
def test_a_backup_step_averages_exactly_the_gradients_that_arrived_first():
    x, y = linear_data(16)  # 4 replicas x 4 examples
    trainer = sync_linear_trainer(backup_workers=1)
    times = np.array([[1.0, 9.0, 2.0, 3.0],    # replica 1 is dropped
                      [4.0, 1.0, 1.0, 2.0]])   # replica 0 is dropped
    history = trainer.fit(x, y, steps=2, replica_times=times)
    w, b = linear_model().get_weights()
    for row in times:
        kept = np.argsort(row, kind="stable")[:3]
        rows = np.concatenate([np.arange(4 * r, 4 * r + 4) for r in sorted(kept)])
        dw, db = numpy_gradient(w, b, x[rows], y[rows])  # the mean over the 12 kept examples
        w, b = w - LEARNING_RATE * dw, b - LEARNING_RATE * db
    got = trainer.model.get_weights()
    np.testing.assert_allclose(got[0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(history.used, [[1, 0, 1, 1], [0, 1, 1, 1]])
    np.testing.assert_array_equal(history.virtual_step_time, [3.0, 2.0])


def test_without_backup_workers_a_virtual_step_lasts_as_long_as_the_slowest():
    x, y = linear_data(16)
    trainer = sync_linear_trainer(backup_workers=0)
    times = np.array([[1.0, 9.0, 2.0, 3.0], [4.0, 1.0, 1.0, 2.0]])
    history = trainer.fit(x, y, steps=2, replica_times=times)
    np.testing.assert_array_equal(history.virtual_step_time, [9.0, 4.0])
    assert history.used.all()
    # Every gradient counts: the update is the full-batch one.
    w, b = linear_model().get_weights()
    for _ in range(2):
        dw, db = numpy_gradient(w, b, x, y)
        w, b = w - LEARNING_RATE * dw, b - LEARNING_RATE * db
    np.testing.assert_allclose(trainer.model.get_weights()[0], w, rtol=1e-5, atol=1e-6)


def test_emulated_steps_last_step_seconds_times_the_nth_fastest_and_drop_the_rest():
    x, y = linear_data(16)
    trainer = sync_linear_trainer(backup_workers=1, step_seconds=0.02)
    times = np.tile([1.0, 1.0, 2.0, 10.0], (4, 1))  # replica 3 would take 0.2 s
    trainer.fit(x, y, steps=1, replica_times=times[:1])  # compile
    history = trainer.fit(x, y, steps=3, replica_times=times[1:])
    # Kept replicas compute (and sleep) for their emulated time; the dropped one
    # is cut off and does not sleep; the step waits for the slowest kept one.
    compute = history.compute
    assert (compute[:, 2] >= 0.04 - 1e-3).all() and (compute[:, 0] >= 0.02 - 1e-3).all()
    assert (compute[:, 3] < 0.1).all()
    assert (history.step_time >= 0.04 - 1e-3).all() and np.median(history.step_time) < 0.15


def test_backup_options_are_validated():
    with pytest.raises(ValueError, match="backup_workers"):
        sync_linear_trainer(backup_workers=4)
    trainer = sync_linear_trainer(backup_workers=1)
    x, y = linear_data(16)
    with pytest.raises(ValueError, match="replica_times"):
        trainer.fit(x, y, steps=1)
    with pytest.raises(ValueError, match="replica_times"):
        trainer.fit(x, y, steps=2, replica_times=np.ones((1, 4)))
