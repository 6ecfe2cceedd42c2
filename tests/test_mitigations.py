"""The mitigations of the chapter "Sync vs async in the same time", rule by rule.

Backup workers (SyncTrainer): which replicas' gradients make the update, and
how long a step lasts.  AsyncTrainer's mitigations (bounded staleness, the
staleness-aware learning rate) are tested in test_asynchronous.py.
"""

import numpy as np
import pytest

from pargrad.book.instruments import InstrumentedSyncTrainer, backup_worker_mask, sync_step_times
from pargrad.strategies import sync_strategy

from linear_problem import linear_data, linear_model, numpy_gradient

LEARNING_RATE = 0.05


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
