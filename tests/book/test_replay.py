"""pargrad.book.replay: the book's network written once in float64 NumPy, and its replays.

The hand-written backpropagation is checked against TensorFlow's
(``tf.GradientTape`` on the Keras model the trainers train) and against
finite differences; the leading axes (seeds, replicas) against one run at a
time; the replays' argument checks.
"""

import numpy as np
import pytest
import tensorflow as tf

from pargrad.book import replay
from pargrad.book.parabola import parabola_data, parabola_model
from pargrad.checks import ArgumentTypeError

SEEDS = [0, 3, 7]


def tape_gradients(seed, x, y, share=None):
    """TensorFlow's gradient of the (weighted) squared error of the Keras model of ``seed``."""
    model = parabola_model(seed=seed, dtype="float64")
    share = np.full(len(x), 1.0 / len(x)) if share is None else share
    with tf.GradientTape() as tape:
        error = tf.square(model(x)[:, 0] - y[:, 0])
        loss = tf.reduce_sum(share * error)
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def largest_relative_gap(ours, theirs):
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("weighted", [False, True])
def test_the_gradient_is_tensorflows_to_1e_12(weighted):
    x, y = parabola_data(dtype="float64")
    share = None
    if weighted:       # worker 1 of 3: its shard x[1::3], each example 1 / shard size
        share = np.zeros(len(x))
        share[1::3] = 1.0 / len(range(1, len(x), 3))
    ours = replay.gradients(replay.stacked_weights(SEEDS), x[:, 0], y[:, 0], share)
    for i, seed in enumerate(SEEDS):
        theirs = tape_gradients(seed, x, y, share)
        assert [g[i].shape for g in ours] == [g.shape for g in theirs]
        assert largest_relative_gap([g[i] for g in ours], theirs) < 1e-12


def test_the_forward_pass_and_loss_are_the_keras_models():
    x, y = parabola_data(dtype="float64")
    _, prediction = replay.forward(replay.stacked_weights(SEEDS), x[:, 0])
    losses = replay.full_loss(replay.stacked_weights(SEEDS), x, y)
    for i, seed in enumerate(SEEDS):
        keras_prediction = parabola_model(seed=seed, dtype="float64")(x).numpy()[:, 0]
        np.testing.assert_allclose(prediction[i], keras_prediction, rtol=1e-13, atol=1e-15)
        assert losses[i] == pytest.approx(np.mean((keras_prediction - y[:, 0]) ** 2), rel=1e-13)


def test_the_gradient_matches_finite_differences():
    x, y = parabola_data(12, dtype="float64")
    weights = replay.stacked_weights([5])
    ours = replay.gradients(weights, x[:, 0], y[:, 0])
    step = 1e-6
    for i, w in enumerate(weights):
        for index in np.ndindex(w.shape):
            up, down = [list(weights) for _ in range(2)]
            up[i], down[i] = w.copy(), w.copy()
            up[i][index] += step
            down[i][index] -= step
            slope = (replay.full_loss(tuple(up), x, y)[0]
                     - replay.full_loss(tuple(down), x, y)[0]) / (2 * step)
            assert ours[i][index] == pytest.approx(slope, rel=1e-6, abs=1e-9)


def test_a_replica_axis_is_each_replica_alone():
    x, y = parabola_data(12, dtype="float64")
    xs, ys = replay.shards(x[:, 0], y[:, 0], 3)
    stacked = replay.stacked_weights(SEEDS)
    weights = [np.repeat(w[:, np.newaxis], 3, axis=1) for w in stacked]
    together = replay.gradients(weights, xs, ys)
    for r in range(3):
        alone = replay.gradients(stacked, xs[r], ys[r])
        for a, b in zip(together, alone):
            np.testing.assert_allclose(a[:, r], b, rtol=1e-14, atol=1e-16)


def test_one_seed_at_a_time_equals_all_seeds_at_once():
    x, y = parabola_data(48, dtype="float64")
    state, losses = replay.train_rounds(replay.start(SEEDS), (x, y), 4, 2.0**-4, 4, 3,
                                        replay.NESTEROV)
    for i, seed in enumerate(SEEDS):
        alone, alone_losses = replay.train_rounds(replay.start([seed]), (x, y), 4, 2.0**-4, 4,
                                                  3, replay.NESTEROV)
        np.testing.assert_allclose(alone_losses[:, 0], losses[:, i], rtol=1e-13)
        for a, b in zip(alone.weights, state.weights):
            np.testing.assert_allclose(a[0], b[i], rtol=1e-13)


def test_local_sgd_of_one_step_on_one_replica_is_the_asynchronous_replay_of_one_worker():
    # One replica averaging its own change is plain SGD; so is one worker that never waits.
    x, y = parabola_data(dtype="float64")
    _, rounds = replay.train_rounds(replay.start([2]), (x, y), 1, 0.05, 1, 30)
    schedule = {"worker": np.zeros(30, int), "read_version": np.arange(30)}
    asynchronous = replay.train_async(replay.stacked_weights([2]), x, y, 1, schedule, 0.05)
    assert asynchronous[0] == pytest.approx(rounds[-1, 0], rel=1e-12)


def test_an_overflowing_run_scores_inf():
    x, y = parabola_data(dtype="float64")
    _, losses = replay.train_rounds(replay.start([0]), (x, y), 2, 50.0, 1, 200)
    assert losses[-1, 0] == np.inf


def test_bad_input_says_what_to_pass():
    x, y = parabola_data(48, dtype="float64")
    with pytest.raises(ValueError, match="divisor of 48"):
        replay.shards(x, y, 5)
    with pytest.raises(ValueError, match="outer must be one of 'average', 'nesterov', got 'adam'"):
        replay.train_rounds(replay.start([0]), (x, y), 4, 0.1, 4, 2, outer="adam")
    with pytest.raises(ValueError, match="local_steps must be a whole number >= 1, got 0"):
        replay.train_rounds(replay.start([0]), (x, y), 4, 0.1, 0, 2)
    with pytest.raises(ValueError, match="seeds must be a non-empty list"):
        replay.start([])
    with pytest.raises(ArgumentTypeError, match="seeds must be a whole number"):
        replay.start([0.5])
    with pytest.raises(ValueError, match="read_version"):
        replay.train_async(replay.stacked_weights([0]), x, y, 1,
                           {"worker": [0, 0], "read_version": [1, 1]}, 0.1)
