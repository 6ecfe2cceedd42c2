"""pargrad.LocalSGDTrainer: local SGD and DiLoCo, against SyncTrainer and a NumPy reference.

The session has 4 logical devices (tests/conftest.py); the two-process runs
are in tests/test_local_sgd_cluster.py.
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import pargrad
from pargrad import cost
from pargrad.book.parabola import parabola_data, parabola_model
from pargrad.allreduce import ring_bytes
from pargrad.local_sgd import LocalSGDTrainer
from pargrad.scenario import Scenario
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

from local_sgd_problem import (
    START,
    least_squares_data,
    linear_model,
    local_sgd_trainer,
)


def keras_rate(rate):
    """Keras keeps a learning rate (and casts a momentum) in float32, even for a float64 model."""
    return float(np.float32(rate))


def max_gap(weights_a, weights_b):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(weights_a, weights_b))


# -- a NumPy reference -----------------------------------------------------------

def gradient(w, b, x, y):
    """Gradient of mean((x @ w + b - y)^2) over the rows, by hand."""
    error = x @ w + b - y
    return [2 * x.T @ error / len(x), 2 * error.mean(axis=0)]


def numpy_local_sgd(x, y, replicas, local_steps, rounds, batch_size, outer,
                    inner_rate=0.0625, inner_momentum=0.5):
    """Local SGD (outer "average") or DiLoCo (outer "nesterov"), in NumPy float64.

    Inner SGD with momentum as Keras writes it (v = m v - lr g; w += v), one
    state a replica kept across rounds; DiLoCo's outer Nesterov step as the
    paper's PyTorch code writes it (buf = mu buf + delta; w -= lr (delta + mu buf)).
    """
    shared = [p.copy() for p in START]
    velocity = [[np.zeros_like(p) for p in START] for _ in range(replicas)]
    buffer = [np.zeros_like(p) for p in START]
    lr, m = keras_rate(inner_rate), inner_momentum
    outer_lr, mu = (1.0, 0.0) if outer == "average" else (keras_rate(0.7), keras_rate(0.9))
    per_replica, position = batch_size // replicas, 0
    for _ in range(rounds):
        changes = []
        for r in range(replicas):
            mine = [p.copy() for p in shared]
            for h in range(local_steps):
                rows = (position + h * batch_size + r * per_replica
                        + np.arange(per_replica)) % len(x)
                for p, v, g in zip(mine, velocity[r], gradient(*mine, x[rows], y[rows])):
                    v[...] = m * v - lr * g
                    p += v
            changes.append([s - p for s, p in zip(shared, mine)])
        delta = [np.mean(parts, axis=0) for parts in zip(*changes)]
        for p, buf, d in zip(shared, buffer, delta):
            buf[...] = mu * buf + d
            p -= outer_lr * (d + mu * buf)
        position = (position + local_steps * batch_size) % len(x)
    return shared


# -- equalities -------------------------------------------------------------------

@pytest.mark.claim
@pytest.mark.parametrize("dtype, steps", [("float64", 100), ("float32", 100)])
def test_one_local_step_with_rate_one_averaging_is_sync_sgd(dtype, steps):
    x, y = parabola_data(n=48, dtype=dtype)
    local_strategy, sync = sync_strategy(2), sync_strategy(2)
    with local_strategy.scope():
        local_model = parabola_model(seed=0, dtype=dtype)
    with sync.scope():
        sync_model = parabola_model(seed=0, dtype=dtype)
    local = LocalSGDTrainer(local_model, local_strategy, local_steps=1, learning_rate=0.01)
    history = local.fit(x, y, rounds=steps, batch_size=24)
    sync_history = SyncTrainer(sync_model, sync, learning_rate=0.01, progress=False).fit(
        x, y, steps=steps, batch_size=24)
    tolerance = pargrad.rounding_tolerance(dtype, steps)
    assert max_gap(local_model.get_weights(), sync_model.get_weights()) < tolerance
    assert np.max(np.abs(history.loss - sync_history.loss)) < tolerance * 10
    assert history.loss[-1] < history.loss[0] / 2          # it did train


@pytest.mark.claim
@pytest.mark.parametrize("outer", ["average", "nesterov"])
@pytest.mark.parametrize("replicas, local_steps", [(2, 4), (4, 3)])
def test_matches_numpy_local_sgd_and_diloco(outer, replicas, local_steps):
    x, y = least_squares_data()
    rounds, batch = 6, 8
    trainer = local_sgd_trainer(sync_strategy(replicas), local_steps, outer)
    trainer.fit(x, y, rounds=rounds, batch_size=batch)
    expected = numpy_local_sgd(x, y, replicas, local_steps, rounds, batch, outer)
    tolerance = pargrad.rounding_tolerance("float64", rounds * local_steps, scale=4.0)
    assert max_gap(trainer.model.get_weights(), expected) < tolerance
    assert max_gap(trainer.model.get_weights(), START) > 0.1      # it moved


def test_evaluate_is_the_shared_models_mean_loss():
    x, y = least_squares_data()
    trainer = local_sgd_trainer(sync_strategy(2), 3)
    assert trainer.evaluate(x, y) == pytest.approx(
        {"loss": np.mean((x @ START[0] + START[1] - y) ** 2)}, rel=1e-12)
    trainer.fit(x, y, rounds=3, batch_size=8)
    w, b = trainer.model.get_weights()
    assert trainer.evaluate(x, y) == pytest.approx({"loss": np.mean((x @ w + b - y) ** 2)},
                                                   rel=1e-12)


def test_two_fits_continue_as_one():
    x, y = least_squares_data()
    once = local_sgd_trainer(sync_strategy(2), 2)
    once.fit(x, y, rounds=4, batch_size=8)
    twice = local_sgd_trainer(sync_strategy(2), 2)
    twice.fit(x, y, rounds=1, batch_size=8)
    twice.fit(x, y, rounds=3, batch_size=8)
    assert max_gap(once.model.get_weights(), twice.model.get_weights()) == 0


def test_a_fit_of_2k_rounds_equals_two_fits_of_k_resumed_from_a_checkpoint(tmp_path):
    # The position, the outer optimizer and every replica's inner optimizer
    # (momentum) are in the checkpoint: bit for bit in float64.
    x, y = least_squares_data()
    once = local_sgd_trainer(sync_strategy(2), 2)
    whole = once.fit(x, y, rounds=6, batch_size=8)
    first = local_sgd_trainer(sync_strategy(2), 2)
    first.fit(x, y, rounds=3, batch_size=8)
    path = tf.train.Checkpoint(trainer=first).save(str(tmp_path / "ckpt"))
    resumed = local_sgd_trainer(sync_strategy(2), 2)
    tf.train.Checkpoint(trainer=resumed).restore(path).assert_consumed()
    assert resumed.position.numbers()["step"] == 6
    second = resumed.fit(x, y, rounds=3, batch_size=8)
    assert max_gap(once.model.get_weights(), resumed.model.get_weights()) == 0
    assert np.array_equal(whole.replica_loss[3:], second.replica_loss)


def test_callbacks_see_rounds_and_validation_is_logged():
    x, y = least_squares_data()
    trainer = local_sgd_trainer(sync_strategy(2), 2)
    seen = []
    logger = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(batch),
        on_epoch_end=lambda epoch, logs: seen.append(sorted(logs)))
    history = trainer.fit(x, y, rounds=3, batch_size=8, callbacks=[logger],
                          validation_data=(x, y))
    assert seen == [1, 3, 5, ["loss", "val_loss"]]
    assert history.history["val_loss"] == [pytest.approx(trainer.evaluate(x, y)["loss"])]
    assert history.history["loss"] == [pytest.approx(float(history.loss.mean()))]


def test_evaluate_adds_the_regularization_as_sync_does():
    strategy = sync_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,), dtype="float64"), keras.layers.Dense(
            1, dtype="float64", kernel_regularizer=keras.regularizers.L2(0.5))])
        model.set_weights([w.copy() for w in START])
    trainer = LocalSGDTrainer(model, strategy, 2)
    x, y = least_squares_data()
    penalty = 0.5 * float(np.sum(START[0] ** 2))
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(
        np.mean((x @ START[0] + START[1] - y) ** 2) + penalty, rel=1e-12)


def test_a_learning_rate_beside_an_inner_optimizer_is_refused_as_sync_refuses_it():
    strategy = sync_strategy(2)
    with strategy.scope():
        model = linear_model()
    with pytest.raises(ValueError, match=r"pass the learning rate to the optimizer, not to "
                                         r"LocalSGDTrainer.*SGD\(learning_rate=0.5\)"):
        LocalSGDTrainer(model, strategy, 2, inner_optimizer=keras.optimizers.SGD(0.1),
                        learning_rate=0.5)


def test_constructor_arguments_after_local_steps_are_keyword_only():
    strategy = sync_strategy(2)
    with strategy.scope():
        model = linear_model()
    with pytest.raises(TypeError):
        LocalSGDTrainer(model, strategy, 2, keras.optimizers.SGD(0.1))


def test_other_data_start_from_their_first_batch():
    # A round's first losses are computed before any update: with the same
    # weights they tell which rows the replicas read.
    x, y = least_squares_data()
    first = local_sgd_trainer(sync_strategy(2), 2).fit(x, y, rounds=1, batch_size=8)
    trainer = local_sgd_trainer(sync_strategy(2), 2)
    trainer.fit(x, y, rounds=1, batch_size=8)
    trainer.model.set_weights([w.copy() for w in START])
    same = trainer.fit(x, y, rounds=1, batch_size=8)               # rows 16.. next
    trainer.model.set_weights([w.copy() for w in START])
    other = trainer.fit(x.copy(), y.copy(), rounds=1, batch_size=8)  # rows 0.. again
    assert np.array_equal(other.replica_loss[0, :, 0], first.replica_loss[0, :, 0])
    assert not np.allclose(same.replica_loss[0, :, 0], first.replica_loss[0, :, 0])


def test_more_local_steps_drift_apart_from_sync():
    # H > 1 is not synchronous SGD: the reference with H = 1 differs.
    x, y = least_squares_data()
    trainer = local_sgd_trainer(sync_strategy(2), 4, "average")
    trainer.fit(x, y, rounds=3, batch_size=8)
    as_sync = numpy_local_sgd(x, y, 2, 1, 12, 8, "average")
    assert max_gap(trainer.model.get_weights(), as_sync) > 1e-3


def test_each_replica_keeps_its_own_inner_optimizer_state():
    # An inner Adam (as DiLoCo's AdamW): one state a replica, carried across rounds.
    x, y = least_squares_data()
    strategy = sync_strategy(2)
    with strategy.scope():
        model = linear_model()
    trainer = LocalSGDTrainer(model, strategy, 3, inner_optimizer=keras.optimizers.Adam(0.01))
    history = trainer.fit(x, y, rounds=2, batch_size=8)
    first, second = trainer.inner_optimizers
    assert first is not second and first.iterations.numpy() == second.iterations.numpy() == 6
    moments = [np.concatenate([np.ravel(v.numpy()) for v in o.variables[2:]])   # m and v
               for o in (first, second)]
    assert np.max(np.abs(moments[0] - moments[1])) > 1e-6      # their own shards, own state
    assert np.all(np.isfinite(history.loss)) and history.replica_loss.shape == (2, 2, 3)


# -- what a round costs ----------------------------------------------------------------

@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_bytes_follow_the_ring_formula(replicas):
    x, y = least_squares_data()
    trainer = local_sgd_trainer(sync_strategy(replicas), 2)
    history = trainer.fit(x, y, rounds=3, batch_size=8)
    parameter_bytes = sum(w.nbytes for w in trainer.model.get_weights())   # 3 float64
    assert parameter_bytes == 24 and history.parameter_bytes == 24
    expected = 2 * (replicas - 1) / replicas * parameter_bytes
    assert np.array_equal(history.bytes_sent, np.full(3, expected))
    assert np.array_equal(history.bytes_received, np.full(3, expected))
    assert ring_bytes(24, replicas) == expected
    assert list(history.updates) == [2, 4, 6]


def test_communication_time_is_the_cost_model_of_the_link():
    x, y = least_squares_data()
    link = cost.Link(latency=1e-3, bandwidth=1e3, name="slow")
    trainer = local_sgd_trainer(sync_strategy(4), 2, link=link)
    history = trainer.fit(x, y, rounds=2, batch_size=8)
    by_hand = 2 * 3 * (1e-3 + 24 / (4 * 1e3))        # 2(R-1) (alpha + n / (R beta))
    assert history.communication_seconds == pytest.approx([by_hand] * 2, rel=1e-12)
    assert history.communication_seconds[0] == cost.ring_all_reduce_time(24, 4, link)
    assert np.all(np.isnan(history.compute_seconds))
    assert history.round_seconds == pytest.approx([by_hand] * 2, rel=1e-12)


def test_one_run_is_charged_on_another_link_as_if_it_had_run_there():
    x, y = least_squares_data()
    slow = cost.Link(latency=50e-3, bandwidth=1e6, name="between data centres")
    fast = cost.Link(latency=5e-6, bandwidth=3e11, name="NVLink-class")
    ran_slow = local_sgd_trainer(sync_strategy(4), 3, link=slow, step_seconds=0.01,
                                 scenario=Scenario((1, 0.5, 1, 1))).fit(x, y, rounds=3, batch_size=8)
    ran_fast = local_sgd_trainer(sync_strategy(4), 3, link=fast, step_seconds=0.01,
                                 scenario=Scenario((1, 0.5, 1, 1))).fit(x, y, rounds=3, batch_size=8)
    assert ran_fast.clock_on(slow, 0.01, Scenario((1, 0.5, 1, 1))) == pytest.approx(ran_slow.clock, rel=1e-12)
    assert ran_slow.clock_on(fast, 0.01, Scenario((1, 0.5, 1, 1))) == pytest.approx(ran_fast.clock, rel=1e-12)
    assert ran_slow.clock_on(fast)[-1] == pytest.approx(3 * cost.ring_all_reduce_time(24, 4, fast))
    with pytest.raises(TypeError, match="pargrad.cost.Link"):
        ran_slow.clock_on("fast")


def test_without_a_link_or_step_time_nothing_is_modelled():
    x, y = least_squares_data()
    history = local_sgd_trainer(sync_strategy(2), 2).fit(x, y, rounds=2, batch_size=8)
    assert np.all(np.isnan(history.communication_seconds))
    assert np.all(np.isnan(history.round_seconds))
    assert np.all(history.wall_seconds > 0)


def test_a_straggler_makes_every_round_late_on_the_virtual_clock_only():
    x, y = least_squares_data()
    link = cost.Link(latency=1e-3, bandwidth=1e6)
    even = local_sgd_trainer(sync_strategy(4), 3, link=link, step_seconds=0.01)
    uneven = local_sgd_trainer(sync_strategy(4), 3, link=link, step_seconds=0.01,
                               scenario=Scenario((1, 1, 0.4, 1)))
    fast = even.fit(x, y, rounds=4, batch_size=8)
    slow = uneven.fit(x, y, rounds=4, batch_size=8)
    communication = cost.ring_all_reduce_time(24, 4, link)
    assert fast.compute_seconds == pytest.approx([3 * 0.01] * 4)
    assert slow.compute_seconds == pytest.approx([3 * 0.01 * 2.5] * 4)
    assert slow.clock == pytest.approx(np.arange(1, 5) * (0.075 + communication))
    assert max_gap(even.model.get_weights(), uneven.model.get_weights()) == 0


# -- bad input ------------------------------------------------------------------------

@pytest.mark.parametrize("local_steps, error_type, says", [
    (0, ValueError, ">= 1"), (-2, ValueError, ">= 1"), (4.0, TypeError, "pass 4"),
    (True, TypeError, "bool"), ("4", TypeError, "whole number"), (None, TypeError, "whole number"),
    (2.5, TypeError, "whole number")])
def test_local_steps_must_be_a_whole_number(local_steps, error_type, says):
    """A wrong type is a TypeError, a wrong value a ValueError; both say what to pass."""
    strategy = sync_strategy(2)
    with strategy.scope():
        model = linear_model()
    with pytest.raises(error_type, match="local_steps") as error:
        LocalSGDTrainer(model, strategy, local_steps)
    assert says in str(error.value)


def test_bad_optimizers_say_what_to_pass():
    strategy = sync_strategy(2)
    with strategy.scope():
        model = linear_model()
    with pytest.raises(TypeError, match="inner_optimizer must be a Keras optimizer"):
        LocalSGDTrainer(model, strategy, 2, inner_optimizer="adam")
    with pytest.raises(TypeError, match=r"inner_optimizer must be a Keras optimizer instance or "
                                        r"None, got 'adam'. Pass for example"):   # not the rate
        LocalSGDTrainer(model, strategy, 2, inner_optimizer="adam", learning_rate=0.01)
    with pytest.raises(TypeError, match="outer_optimizer must be a Keras optimizer"):
        LocalSGDTrainer(model, strategy, 2, outer_optimizer=0.7)
    with pytest.raises(ValueError, match="created outside this strategy's scope"):
        LocalSGDTrainer(model, strategy, 2, outer_optimizer=keras.optimizers.SGD(1.0))


def test_bad_strategy_model_and_scope():
    strategy = sync_strategy(2)
    with pytest.raises(TypeError, match="sync_strategy"):
        LocalSGDTrainer(linear_model(), None, 2)
    with pytest.raises(ValueError, match="outside this strategy's scope"):
        LocalSGDTrainer(linear_model(), strategy, 2)
    with strategy.scope():
        model = linear_model()
        with pytest.raises(ValueError, match="outside `with strategy.scope"):
            LocalSGDTrainer(model, strategy, 2)


def test_a_model_with_non_trainable_state_is_refused():
    strategy = sync_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="LayerNormalization instead"):
        LocalSGDTrainer(model, strategy, 2)


@pytest.mark.parametrize("options, error, says", [
    ({"link": "fast"}, TypeError, r"link must be a pargrad.cost.Link or None.*Pass for example"),
    ({"step_seconds": -1.0}, ValueError, "positive number of seconds"),
    ({"step_seconds": "1"}, TypeError, "step_seconds .* must be a positive number of seconds"),
    ({"scenario": Scenario((1, 2, 3))}, ValueError, r"one positive number per device \(2\)"),
    ({"scenario": Scenario((1, 0.5), jitter=0.1)}, ValueError,
     r"jitter must be 0 here.*no random delays.*pass Scenario\(speeds\) without jitter"),
    ({"scenario": [1, 2]}, TypeError, r"scenario must be a pargrad.Scenario or None.*Pass for"),
])
def test_bad_cost_settings(options, error, says):
    with pytest.raises(error, match=says):
        local_sgd_trainer(sync_strategy(2), 2, **options)


def test_bad_data_and_rounds():
    x, y = least_squares_data()
    trainer = local_sgd_trainer(sync_strategy(2), 2)
    with pytest.raises(ValueError, match="multiple of 2"):
        trainer.fit(x, y, rounds=1, batch_size=7)
    with pytest.raises(ValueError, match="rounds must be a whole number"):
        trainer.fit(x, y, rounds=0, batch_size=8)
    with pytest.raises(TypeError, match="takes arrays x and y"):
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), None, rounds=1)
    x[3, 0] = np.nan
    with pytest.raises(pargrad.NonFiniteDataError, match="row 3 of x"):
        trainer.fit(x, y, rounds=1, batch_size=8)
    assert max_gap(trainer.model.get_weights(), START) == 0


def test_a_non_finite_loss_stops_before_the_average():
    # Batches of 8, H = 2: round 1 reads rows 16..23 in its step 0 and rows
    # 0..7 (wrapped) in step 1; row 21 is replica 1's (rows 20..23) in step 0.
    x, y = least_squares_data(poison_row=21)
    trainer = local_sgd_trainer(sync_strategy(2), 2)
    threads = set(threading.enumerate())
    trainer.fit(x, y, rounds=1, batch_size=8)
    before = trainer.model.get_weights()
    with pytest.raises(pargrad.NonFiniteLossError) as error:
        trainer.fit(x, y, rounds=2, batch_size=8)
    assert error.value.step == 1 and "replica 1 (its local step 0 of round 1)" in str(error.value)
    assert not np.isfinite(error.value.loss)
    assert max_gap(trainer.model.get_weights(), before) == 0   # the average was not applied
    assert set(threading.enumerate()) <= threads


def test_fit_takes_rounds_and_batch_size_by_keyword_only():
    x, y = least_squares_data()
    trainer = local_sgd_trainer(sync_strategy(2), 2)
    with pytest.raises(TypeError):
        trainer.fit(x, y, 1, 8)
    assert len(trainer.fit(x, y, rounds=1, batch_size=8).loss) == 1
