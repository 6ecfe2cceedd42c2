"""pargrad.book.instruments: the synchronous trainer with stragglers and backup workers.

Stragglers: a replica of speed 1/k (``scenario=Scenario(...)``) computes its
gradients k times a step (``InstrumentedSyncTrainer._straggler_work``) and
applies the first: real work in the graph, compiled by XLA with
``jit_compile``, not a sleep that would lend its core to the other replicas.
Backup workers: which replicas' gradients make the update, and how long a
step lasts.  Timestamps (``record_times``): the parts of a step each replica
spends launching, computing and waiting.  AsyncTrainer's mitigations (bounded staleness, the
staleness-aware learning rate) are tested in test_asynchronous.py.
"""

import time

import keras
import numpy as np
import pytest

from pargrad._quiet import import_tensorflow_quietly
from pargrad.book.plots_synchronous import device_timeline
from pargrad.book.instruments import InstrumentedSyncTrainer, backup_worker_mask, sync_step_times
from pargrad.book.parabola import parabola_data
from pargrad.scenario import Scenario
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

from linear_problem import linear_data, linear_model, numpy_gradient
from sync_problem import max_gap, mlp, trainer_for

tf = import_tensorflow_quietly()


def speeds(replicas, stragglers):
    """The Scenario of ``replicas`` devices, ``{replica: k}`` of them k times slower (or None)."""
    if not stragglers:
        return None
    return Scenario(tuple(1 / stragglers.get(r, 1) for r in range(replicas)))


def perceptron_trainer(replicas, stragglers=None, jit_compile=False, record_times=False,
                       width=256):
    strategy = sync_strategy(replicas)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)),
                                  keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(1)])
    return InstrumentedSyncTrainer(
        model, strategy, loss=lambda y, p: tf.reduce_mean(tf.square(y - p), axis=-1),
        scenario=speeds(replicas, stragglers), jit_compile=jit_compile, record_times=record_times,
        progress=False)


def data(n=2048, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 64)).astype(np.float32),
            rng.standard_normal((n, 1)).astype(np.float32))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_straggler_applies_the_same_update_bit_for_bit(jit_compile):
    x, y = data()
    plain = perceptron_trainer(2, jit_compile=jit_compile)
    slow = perceptron_trainer(2, {1: 3}, jit_compile=jit_compile)
    plain.fit(x, y, steps=6, batch_size=256, steps_per_call=3)
    slow.fit(x, y, steps=6, batch_size=256, steps_per_call=3)
    for a, b in zip(plain.model.get_weights(), slow.model.get_weights()):
        assert np.array_equal(a, b)
    assert not np.array_equal(plain.model.get_weights()[0],
                              perceptron_trainer(2).model.get_weights()[0])  # it trained


def test_a_straggler_with_batch_statistics_changes_no_state_of_its_own():
    """The extra passes call the model statelessly: the moving statistics move once a step."""
    x, y = data()

    def trainer(stragglers):
        strategy = sync_strategy(2)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32),
                                      keras.layers.BatchNormalization(), keras.layers.Dense(1)])
        return InstrumentedSyncTrainer(model, strategy, scenario=speeds(2, stragglers), progress=False,
                                       loss=lambda y, p: tf.reduce_mean(tf.square(y - p), -1))

    plain, slow = trainer(None), trainer({0: 4})
    plain.fit(x, y, steps=3, batch_size=256)
    slow.fit(x, y, steps=3, batch_size=256)
    for a, b in zip(plain.model.get_weights(), slow.model.get_weights()):
        assert np.array_equal(a, b)


@pytest.mark.timing
def test_a_straggler_holds_its_core():
    """Busy work: each extra pass costs the process CPU time, as much as the step's own pass.

    A sleep would add wall time and almost no CPU time.  One replica, so that
    nothing waits; CPU time, which another program's load barely changes.
    """
    x, y = data()
    trainers = {k: perceptron_trainer(1, {0: k}, width=512) for k in (1, 2, 4)}
    cpu = {k: [] for k in trainers}
    for trainer in trainers.values():
        trainer.fit(x, y, steps=4, batch_size=256, steps_per_call=2)
    for _ in range(5):  # interleaved rounds
        for k, trainer in trainers.items():
            started = time.process_time()
            trainer.fit(x, y, steps=20, batch_size=256, steps_per_call=10)
            cpu[k].append((time.process_time() - started) / 20)
    step = {k: np.median(v) for k, v in cpu.items()}
    per_pass = (step[4] - step[1]) / 3
    assert step[1] < step[2] < step[4], step
    # linear in the passes: the second pass costs what each of passes 2 to 4 costs on average
    assert 0.4 * per_pass < step[2] - step[1] < 2.5 * per_pass, step
    # and a pass costs at least half the whole one-pass step (which adds launching and the update)
    assert per_pass > 0.5 * step[1], step


@pytest.mark.timing
def test_a_straggler_computes_about_factor_times_as_long():
    """The replica's compute time (input ready to gradients ready) grows by one pass a factor."""
    x, y = data()
    trainers = {k: perceptron_trainer(1, {0: k}, record_times=True, width=512) for k in (1, 3)}
    compute = {k: [] for k in trainers}
    for trainer in trainers.values():
        trainer.fit(x, y, steps=3, batch_size=256)
    for _ in range(3):
        for k, trainer in trainers.items():
            compute[k] += list(trainer.fit(x, y, steps=10, batch_size=256).compute[:, 0])
    ratio = np.median(compute[3]) / np.median(compute[1])
    assert 2.0 < ratio < 4.5, ratio


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


@pytest.mark.timing
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
    with pytest.raises(ValueError, match="pass steps=N .*not epochs="):
        trainer.fit(x, y, epochs=1, batch_size=16)
    with pytest.raises(TypeError, match=r"backup_workers must be a whole number from 0 to 3 "
                                        r"\(an int\), got the float 1.0; pass 1"):
        sync_linear_trainer(backup_workers=1.0)
    with pytest.raises(TypeError, match="step_seconds .* must be a positive number of seconds"):
        sync_linear_trainer(backup_workers=0, step_seconds="1")
    with pytest.raises(ValueError, match=r"scenario.jitter must be 0 here, got 0.5 \(a straggler"):
        sync_linear_trainer(backup_workers=0, scenario=Scenario((1, 1, 1, 1), jitter=0.5))


def test_fit_takes_every_option_of_sync_trainers_fit():
    """epochs, shuffle, seed, validation and callbacks: the instrumented trainer stands in."""
    x, y = linear_data(16)
    strategy = sync_strategy(4)
    with strategy.scope():
        model = linear_model()
    plain = SyncTrainer(model, strategy, learning_rate=LEARNING_RATE, progress=False)
    plain.fit(x, y, epochs=2, batch_size=8, shuffle=True, seed=3, validation_data=(x, y))
    instrumented = sync_linear_trainer(0)
    seen = []
    history = instrumented.fit(x, y, epochs=2, batch_size=8, shuffle=True, seed=3,
                               validation_data=(x, y),
                               callbacks=[keras.callbacks.LambdaCallback(
                                   on_epoch_end=lambda epoch, logs: seen.append(epoch))])
    assert seen == [0, 1] and history.epoch == [0, 1] and "val_loss" in history.history
    for a, b in zip(plain.model.get_weights(), instrumented.model.get_weights()):
        np.testing.assert_array_equal(a, b)


# -- what a step costs: the trainer's timestamps (record_times) ---------------------------

def instrumented_for(replicas, model_fn=None, **options):
    return trainer_for(replicas, model_fn, trainer_class=InstrumentedSyncTrainer, **options)


@pytest.mark.parametrize("steps_per_call", [1, 10])
def test_per_replica_times_add_up_to_the_step(steps_per_call):
    """launch + compute + wait fill the step; the all-reduce lines the replicas up."""
    x, y = data()
    trainer = instrumented_for(2, mlp, record_times=True)
    trainer.fit(x, y, steps=steps_per_call, batch_size=512, steps_per_call=steps_per_call)  # trace
    history = trainer.fit(x, y, steps=30, batch_size=512, steps_per_call=steps_per_call)
    slack = 1e-4
    assert (history.launch > -slack).all()
    assert (history.compute > 0).all() and (history.wait > -slack).all()
    parts = history.launch + history.compute + history.wait
    assert (parts <= history.step_time[:, None] + slack).all()
    if steps_per_call > 1:
        # The step ends when its last replica has its update.
        assert np.allclose(parts.max(axis=1), history.step_time, atol=slack)
    # Every replica's update ends at about the same moment: the all-reduce
    # joins them, so a replica that finished computing early waits.
    finish = history.update_end.max(axis=1) - history.update_end.min(axis=1)
    early = history.compute_end.max(axis=1) - history.compute_end.min(axis=1)
    assert np.median(finish) < max(np.median(early), 1e-3)


def test_without_recording_times_it_trains_the_same():
    x, y = parabola_data()
    timed = instrumented_for(2, record_times=True)
    plain = trainer_for(2)      # SyncTrainer: no timestamps
    timed.fit(x, y, steps=50, steps_per_call=10)
    history = plain.fit(x, y, steps=50, steps_per_call=10)
    assert max_gap(timed.model.get_weights(), plain.model.get_weights()) == 0
    assert not hasattr(history, "compute") and (history.step_time > 0).all()  # core: no times
    with pytest.raises(ValueError, match="record_times=True"):
        device_timeline(history)


def test_a_straggler_sets_the_step_time():
    x, y = data()
    common = dict(batch_size=512, steps_per_call=5)
    even = instrumented_for(2, mlp, record_times=True)
    even.fit(x, y, steps=5, **common)
    base = even.fit(x, y, steps=30, **common)
    slow = instrumented_for(2, mlp, scenario=Scenario((1, 1 / 6)), record_times=True)
    slow.fit(x, y, steps=5, **common)
    history = slow.fit(x, y, steps=30, **common)

    def slowest(h):                      # when the last replica finished computing
        return (h.launch + h.compute).max(axis=1)

    assert (history.step_time >= slowest(history)).all()
    # The straggler is the last to finish computing in (almost) every step ...
    assert np.mean(history.compute_end.argmax(axis=1) == 1) >= 0.8
    # ... the step time grows with the slowest replica ...
    longer = np.median(slowest(history)) - np.median(slowest(base))
    assert longer > 0
    assert np.median(history.step_time) - np.median(base.step_time) > 0.6 * longer
    # ... and the other replica spends the difference waiting.
    assert np.median(history.wait[:, 0]) > np.median(history.wait[:, 1]) + 0.5 * longer


@pytest.mark.parametrize("scenario, message", [
    (Scenario((1, 1, 0.5)), r"one positive number per device \(2\)"),
    (Scenario((2, 1)), "factor must be a whole number >= 1"),
    (Scenario((1 / 2.5, 1)), "factor must be a whole number >= 1"),
    (Scenario((1, 0.5), jitter=0.5), "jitter must be 0 here"),
])
def test_a_bad_scenario_is_refused(scenario, message):
    with pytest.raises(ValueError, match=message):
        instrumented_for(2, scenario=scenario)


def test_jit_compile_traces_once_per_replica_and_records_times():
    x, y = data()
    trainer = instrumented_for(2, mlp, jit_compile=True, record_times=True)
    for _ in range(3):
        history = trainer.fit(x, y, steps=10, batch_size=512, steps_per_call=5)
    # One XLA computation per replica, compiled once, not once per call.
    assert trainer._replica_gradients.experimental_get_tracing_count() == 2
    assert (history.compute > 0).all() and (history.wait > -1e-4).all()
