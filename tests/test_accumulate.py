"""pargrad.GradientAccumulator: k micro-batches equal one big batch, resumable, strict."""

import numpy as np
import pytest

import pargrad  # noqa: F401  (quiet TensorFlow first)
import keras
import tensorflow as tf
from pargrad.accumulate import GradientAccumulator
from pargrad.book.parabola import (initial_weights, parabola_data, parabola_forward, parabola_model,
                                    squared_error)

TOLERANCE = 1e-6

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.05),
}
SIZES = {"equal": (10, 10, 10, 10, 10), "unequal": (16, 16, 16, 2)}


def gradients(variables, x, y):
    with tf.GradientTape() as tape:
        loss = squared_error(y, parabola_forward(x, variables))
    return tape.gradient(loss, variables)


def micro_batches(sizes):
    x, y = parabola_data()
    bounds = np.cumsum((0,) + tuple(sizes))
    return [(x[low:high], y[low:high]) for low, high in zip(bounds[:-1], bounds[1:])]


def big_batch_weights(optimizer_name, updates):
    variables = [tf.Variable(w) for w in initial_weights(seed=1)]
    optimizer = OPTIMIZERS[optimizer_name]()
    x, y = parabola_data()
    for _ in range(updates):
        optimizer.apply_gradients(zip(gradients(variables, x, y), variables))
    return [v.numpy() for v in variables]


def max_difference(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def scale(weights):
    return max(1.0, max(float(np.abs(w).max()) for w in weights))


@pytest.mark.claim
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("sizes", sorted(SIZES))
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_micro_batches_equal_the_big_batch(optimizer_name, sizes, compiled):
    variables = [tf.Variable(w) for w in initial_weights(seed=1)]
    accumulator = GradientAccumulator(variables, len(SIZES[sizes]), OPTIMIZERS[optimizer_name]())

    def train_micro_batch(x, y):
        return accumulator.step(gradients(variables, x, y), tf.shape(x)[0])

    if compiled:
        train_micro_batch = tf.function(train_micro_batch)
    applied = [bool(train_micro_batch(x, y)) for _ in range(3) for x, y in micro_batches(SIZES[sizes])]
    assert sum(applied) == 3 and applied[len(SIZES[sizes]) - 1]
    big = big_batch_weights(optimizer_name, updates=3)
    assert max_difference([v.numpy() for v in variables], big) <= TOLERANCE * scale(big)


@pytest.mark.claim
def test_weighting_by_count_is_wrong_for_unequal_micro_batches():
    variables = [tf.Variable(w) for w in initial_weights(seed=1)]
    by_count = GradientAccumulator(variables, 2)
    by_examples = GradientAccumulator(variables, 2)
    for x, y in micro_batches((48, 2)):
        g = gradients(variables, x, y)
        by_count.accumulate(g, 1)
        by_examples.accumulate(g, len(x))
    x, y = parabola_data()
    exact = gradients(variables, x, y)
    assert max_difference(by_examples.mean_gradients(), exact) < 1e-6
    assert max_difference(by_count.mean_gradients(), exact) > 1e-2


def run_windows(micro_batch_list, variables, optimizer, accumulator):
    step = tf.function(lambda x, y: accumulator.step(gradients(variables, x, y), tf.shape(x)[0]))
    for x, y in micro_batch_list:
        step(x, y)


def fresh(seed=1):
    variables = [tf.Variable(w) for w in initial_weights(seed=seed)]
    optimizer = keras.optimizers.Adam(0.05)
    return variables, optimizer, GradientAccumulator(variables, 4, optimizer)


@pytest.mark.claim
def test_stop_and_resume_mid_window_is_bit_for_bit(tmp_path):
    schedule = micro_batches((13, 13, 12, 12)) * 2 + micro_batches((25, 25))  # 2.5 windows
    variables, optimizer, accumulator = fresh()
    run_windows(schedule, variables, optimizer, accumulator)
    uninterrupted = [v.numpy() for v in variables]

    variables, optimizer, accumulator = fresh()
    run_windows(schedule[:6], variables, optimizer, accumulator)  # stop 2 micro-batches into window 2
    assert int(accumulator.micro_batches) == 2
    checkpoint = tf.train.Checkpoint(weights=variables, optimizer=optimizer, accumulator=accumulator)
    path = checkpoint.save(str(tmp_path / "ckpt"))

    variables, optimizer, accumulator = fresh(seed=7)  # different weights, empty window
    checkpoint = tf.train.Checkpoint(weights=variables, optimizer=optimizer, accumulator=accumulator)
    checkpoint.restore(path).assert_consumed()
    assert int(accumulator.micro_batches) == 2 and int(accumulator.examples) == 26
    run_windows(schedule[6:], variables, optimizer, accumulator)
    resumed = [v.numpy() for v in variables]
    assert all(np.array_equal(a, b) for a, b in zip(resumed, uninterrupted))


def test_checkpoint_holds_only_the_accumulator_state():
    variables, optimizer, accumulator = fresh()
    assert len(accumulator.variables) == len(variables) + 2  # sums, examples, micro_batches
    assert accumulator.target_variables == variables


@pytest.mark.parametrize("steps, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                          (True, TypeError), ("4", TypeError)])
def test_bad_accumulation_steps_raise(steps, error):
    with pytest.raises(error, match="accumulation_steps must be a whole number >= 1"):
        GradientAccumulator([tf.Variable(1.0)], steps)


def test_no_variables_raise():
    with pytest.raises(ValueError, match="no variables"):
        GradientAccumulator([], 2)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_apply_with_nothing_accumulated_raises(compiled):
    variables, optimizer, accumulator = fresh()
    apply = tf.function(accumulator.apply) if compiled else accumulator.apply
    before = [v.numpy() for v in variables]
    with pytest.raises(tf.errors.InvalidArgumentError, match="nothing accumulated"):
        apply()
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, variables))


def test_apply_without_optimizer_raises():
    variables = [tf.Variable(w) for w in initial_weights()]
    accumulator = GradientAccumulator(variables, 2)
    x, y = parabola_data()
    accumulator.accumulate(gradients(variables, x, y), 50)
    with pytest.raises(ValueError, match="needs an optimizer"):
        accumulator.apply()


def test_gradients_that_do_not_match_raise():
    variables, _, accumulator = fresh()
    x, y = parabola_data()
    good = gradients(variables, x, y)
    with pytest.raises(ValueError, match="3 gradients for 4 variables"):
        accumulator.accumulate(good[:3], 50)
    with pytest.raises(ValueError, match="does not match variable"):
        accumulator.accumulate(good[::-1], 50)
    with pytest.raises(ValueError, match="no gradient"):
        accumulator.accumulate([None] + good[1:], 50)
    assert int(accumulator.micro_batches) == 0


@pytest.mark.parametrize("count, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                          (True, TypeError)])
def test_bad_num_examples_raise(count, error):
    variables, _, accumulator = fresh()
    x, y = parabola_data()
    with pytest.raises(error, match="num_examples"):
        accumulator.accumulate(gradients(variables, x, y), count)


def test_zero_examples_as_a_tensor_raise_in_a_function():
    variables, _, accumulator = fresh()
    x, y = parabola_data()
    add = tf.function(lambda g, n: accumulator.accumulate(g, n))
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least 1"):
        add(gradients(variables, x, y), tf.constant(0))


@pytest.mark.claim
def test_under_mirrored_strategy_one_sum_per_update_equals_the_big_batch(devices):
    """Each replica sums its own gradients; apply() adds them up over the replicas."""
    strategy = tf.distribute.MirroredStrategy(devices)
    x, y = parabola_data()
    with strategy.scope():
        model = parabola_model(seed=1)
        optimizer = keras.optimizers.Adam(0.05)
        accumulator = GradientAccumulator(model.trainable_variables, 5, optimizer)

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        accumulator.accumulate(tape.gradient(loss, model.trainable_variables), tf.shape(xb)[0])

    accumulate = tf.function(lambda xb, yb: strategy.run(replica_step, (xb, yb)))
    apply = tf.function(accumulator.apply)
    # 10 examples over 4 replicas: per-replica micro-batches of 3, 3, 2 and 2.
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(10))
    for _ in range(2):
        for xb, yb in batches:
            accumulate(xb, yb)
        assert bool(accumulator.ready) and int(accumulator.examples.read_value()) == 50
        apply()
    with pytest.raises(RuntimeError, match="outside strategy.run"):
        strategy.run(accumulator.apply)
    with strategy.scope(), pytest.raises(RuntimeError, match="inside strategy.run"):
        accumulator.accumulate([tf.zeros(v.shape) for v in model.trainable_variables], 1)

    reference = parabola_model(seed=1)
    reference_optimizer = keras.optimizers.Adam(0.05)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(reference(x) - y))
        variables = reference.trainable_variables
        reference_optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    big = reference.get_weights()
    assert max_difference(model.get_weights(), big) <= TOLERANCE * scale(big)


# -- what a reader's own loop needs --------------------------------------------------

def test_a_non_finite_gradient_is_refused_before_it_is_applied():
    """Checked once per update: a NaN or
    inf gradient in any micro-batch makes apply() fail, naming the variable, with the
    weights and the optimizer untouched; stop_on_non_finite=False applies it."""
    x, y = parabola_data()
    for poison in (np.nan, np.inf):
        for compiled in (False, True):
            variables = [tf.Variable(w) for w in initial_weights(seed=1)]
            before = [v.numpy() for v in variables]
            optimizer = keras.optimizers.Adam(0.05)
            accumulator = GradientAccumulator(variables, 3, optimizer)
            step = tf.function(accumulator.step) if compiled else accumulator.step
            good = gradients(variables, x, y)
            # inf in one micro-batch and -inf in the next: inf - inf is NaN, still caught.
            bad = [g * poison for g in good]
            bad_opposite = [-g * poison for g in good]
            step(good, len(x))
            step(bad, len(x))
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="accumulated gradient of .* holds NaN or inf"):
                step(bad_opposite, len(x))
            assert max_difference([v.numpy() for v in variables], before) == 0
            assert int(optimizer.iterations) == 0
            accumulator.reset()             # drop the window; the next one trains
            for _ in range(3):
                step(good, len(x))
            assert max_difference([v.numpy() for v in variables], before) > 0
    variables = [tf.Variable(w) for w in initial_weights(seed=1)]
    lenient = GradientAccumulator(variables, 2, keras.optimizers.SGD(0.1),
                                  stop_on_non_finite=False)
    lenient.accumulate(gradients(variables, x, y), len(x))
    lenient.accumulate([g * np.nan for g in gradients(variables, x, y)], len(x))
    lenient.apply()
    assert not np.isfinite(variables[0].numpy()).all()


@pytest.mark.parametrize("make, message", [
    (lambda v: GradientAccumulator(v, 4.0), "pass 4"),
    (lambda v: GradientAccumulator(v, 2).accumulate([tf.zeros_like(w) for w in v], 16.0),
     "pass 16"),
    (lambda v: GradientAccumulator(v, 2, stop_on_non_finite="no"), "True or False"),
])
def test_whole_numbers_and_flags_say_what_to_pass(make, message):
    """A float count names the int to pass."""
    variables = [tf.Variable(w) for w in initial_weights(seed=1)]
    with pytest.raises(TypeError, match=message) as caught:
        make(variables)
    assert not isinstance(caught.value, ValueError)


def test_accumulation_steps_is_the_one_name_of_the_micro_batches():
    variables = [tf.Variable(1.0)]
    named = GradientAccumulator(variables, accumulation_steps=3)
    assert named.accumulation_steps == GradientAccumulator(variables, 3).accumulation_steps == 3
    assert not hasattr(named, "steps")
    with pytest.raises(TypeError, match="steps"):
        GradientAccumulator(variables, steps=3)
    with pytest.raises(TypeError, match="accumulation_steps"):
        GradientAccumulator(variables)
    with pytest.raises(TypeError, match="positional"):   # keyword-only after the optimizer
        GradientAccumulator(variables, 3, None, "name", False)
    with pytest.raises(ValueError, match="accumulation_steps must be a whole number >= 1"):
        GradientAccumulator(variables, accumulation_steps=0)
