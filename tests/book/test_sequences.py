"""pargrad.book.sequences: accumulated micro-batches of sequences equal the big batch's mean over tokens.

Sequences of unequal lengths, padding masked, the loss a mean over real
tokens.  For SGD and Adam, on 1 and 2 replicas, ``GradientAccumulator(...,
sample_weight=mask)`` and ``SyncTrainer(sample_weight=..., accumulation_steps=k)``
equal the big batch within float64 rounding (``pargrad.rounding_tolerance``);
the mean of the micro-batches' token means does not.
"""

import numpy as np
import pytest

import pargrad
import keras
import tensorflow as tf
from pargrad.accumulate import GradientAccumulator, weighted_mean
from pargrad.book.sequences import (
    mean_of_means_gaps,
    padding_mask,
    relative_gap,
    sequence_data,
    sequence_model,
    squared_error_per_token,
    token_mask,
)

BATCH, STEPS, UPDATES = 16, 4, 3          # 4 micro-batches of 4 sequences, 3 updates
OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam": lambda: keras.optimizers.Adam(0.01),
}


def data():
    return sequence_data(BATCH * UPDATES, seed=3, dtype="float64")


def batches(tokens, targets):
    return [(tokens[u * BATCH:(u + 1) * BATCH], targets[u * BATCH:(u + 1) * BATCH])
            for u in range(UPDATES)]


def micro_batches(x, y, pieces):
    size = len(x) // pieces
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(pieces)]


def token_loss(model, x, y):
    """The micro-batch's mean over its real tokens."""
    return weighted_mean(squared_error_per_token(y, model(x, training=True)), padding_mask(x, "float64"))


def big_batch(optimizer_name):
    model, optimizer = sequence_model(seed=1, dtype="float64"), OPTIMIZERS[optimizer_name]()
    for x, y in batches(*data()):
        with tf.GradientTape() as tape:
            loss = token_loss(model, x, y)
        variables = model.trainable_variables
        # Dense, as the accumulator keeps them: Keras's Adam moves only the rows of
        # an embedding that a sparse gradient names.
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        optimizer.apply_gradients(zip(gradients, variables))
    return model.get_weights()


def gap(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def tolerance(weights):
    scale = max(1.0, max(float(np.abs(w).max()) for w in weights))
    return pargrad.rounding_tolerance("float64", UPDATES * STEPS, scale)


def accumulated(optimizer_name, weighted):
    """One replica: GradientAccumulator over the micro-batches; weighted by tokens, or the
    mean of the micro-batches' token means (each micro-batch counted as its 4 examples)."""
    model = sequence_model(seed=1, dtype="float64")
    accumulator = GradientAccumulator(model.trainable_variables, STEPS, OPTIMIZERS[optimizer_name]())

    @tf.function
    def train_micro_batch(x, y):
        with tf.GradientTape() as tape:
            loss = token_loss(model, x, y)
        gradients = tape.gradient(loss, model.trainable_variables)
        if weighted:
            return accumulator.step(gradients, sample_weight=padding_mask(x, "float64"))
        return accumulator.step(gradients, tf.shape(x)[0])

    for x, y in batches(*data()):
        for xm, ym in micro_batches(x, y, STEPS):
            train_micro_batch(xm, ym)
    return model.get_weights()


@pytest.mark.claim
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_one_replica_weighted_equals_the_big_batch_and_mean_of_means_does_not(optimizer_name):
    big = big_batch(optimizer_name)
    assert gap(accumulated(optimizer_name, weighted=True), big) <= tolerance(big)
    assert gap(accumulated(optimizer_name, weighted=False), big) > 1000 * tolerance(big)


@pytest.mark.claim
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_two_replicas_accumulator_sums_the_weight_over_replicas(optimizer_name, devices):
    """Each replica accumulates 2 micro-batches; apply() sums sums and weights over both."""
    strategy = pargrad.sync_strategy(2)
    with strategy.scope():
        model = sequence_model(seed=1, dtype="float64")
        accumulator = GradientAccumulator(model.trainable_variables, STEPS // 2,
                                          OPTIMIZERS[optimizer_name]())

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = token_loss(model, x, y)
        accumulator.accumulate(tape.gradient(loss, model.trainable_variables),
                               sample_weight=padding_mask(x, "float64"))

    @tf.function
    def accumulate(x, y):
        strategy.run(replica_step, (x, y))

    apply = tf.function(accumulator.apply)
    for x, y in batches(*data()):
        pieces = micro_batches(x, y, STEPS)     # replica r takes pieces r, r + 2
        for step in range(STEPS // 2):
            values = [pieces[2 * step + r] for r in range(2)]
            per_replica = [strategy.experimental_distribute_values_from_function(
                lambda context, part=part: tf.constant(
                    values[context.replica_id_in_sync_group][part])) for part in (0, 1)]
            accumulate(*per_replica)
        tokens = int(padding_mask(x).numpy().sum())
        assert float(accumulator.examples.read_value()) == tokens  # summed over replicas
        apply()
    big = big_batch(optimizer_name)
    assert gap(model.get_weights(), big) <= tolerance(big)


def every_position(x, y):
    return tf.ones(tf.shape(x), y.dtype)


def sync_weights(optimizer_name, replicas, sample_weight):
    strategy = pargrad.sync_strategy(replicas)
    with strategy.scope():
        model = sequence_model(seed=1, dtype="float64")
        optimizer = OPTIMIZERS[optimizer_name]()
    trainer = pargrad.SyncTrainer(model, strategy, loss=squared_error_per_token,
                                  optimizer=optimizer, accumulation_steps=STEPS // replicas,
                                  sample_weight=sample_weight, progress=False)
    tokens, targets = data()
    history = trainer.fit(tokens, targets, steps=UPDATES, batch_size=BATCH)
    return model.get_weights(), history


@pytest.mark.claim
@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_sync_trainer_with_a_mask_equals_the_big_batch(optimizer_name, replicas, devices):
    big = big_batch(optimizer_name)
    weights, history = sync_weights(optimizer_name, replicas, token_mask)
    assert gap(weights, big) <= tolerance(big)
    # Its loss is the big batch's mean over tokens, before each update.
    assert np.isfinite(history.loss).all() and len(history.loss) == UPDATES
    # Weighting every position 1 (the default's mean over positions, padding included)
    # is another loss: the big batch of that, not of the token mean.
    unmasked, _ = sync_weights(optimizer_name, replicas, every_position)
    assert gap(unmasked, big) > 1000 * tolerance(big)


def test_sync_trainer_mask_loss_is_the_token_mean():
    weights, history = sync_weights("sgd", 1, token_mask)
    model = sequence_model(seed=1, dtype="float64")
    x, y = batches(*data())[0]
    assert abs(history.loss[0] - float(token_loss(model, x, y))) <= 1e-12


def test_weighted_mean_of_padding_only_is_zero_and_shapes_must_match():
    values = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    assert float(weighted_mean(values, tf.zeros_like(values))) == 0.0
    assert float(weighted_mean(values, [[1, 0], [1, 1]])) == pytest.approx(8.0 / 3)
    with pytest.raises(ValueError, match="one weight per value"):
        weighted_mean(values, [1.0, 1.0])


def test_bad_weights_say_what_to_pass(devices):
    variables = [tf.Variable(tf.zeros([2]))]
    accumulator = GradientAccumulator(variables, 2)
    with pytest.raises(ValueError, match="exactly one of num_examples"):
        accumulator.accumulate([tf.zeros([2])])
    with pytest.raises(ValueError, match="exactly one of num_examples"):
        accumulator.accumulate([tf.zeros([2])], 3, sample_weight=[1.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=">= 0"):
        accumulator.accumulate([tf.zeros([2])], sample_weight=[1.0, -1.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="nothing accumulated"):
        accumulator.mean_gradients()
    strategy = pargrad.sync_strategy(1)
    with strategy.scope():
        model = sequence_model(seed=1)
    with pytest.raises(TypeError, match="sample_weight must be None or a function"):
        pargrad.SyncTrainer(model, strategy, sample_weight=np.ones(4))
    trainer = pargrad.SyncTrainer(model, strategy, loss=squared_error_per_token, progress=False,
                                  sample_weight=lambda x, y: tf.ones([tf.shape(x)[0]]))
    tokens, targets = sequence_data(8)
    with pytest.raises(ValueError, match="one weight per value"):
        trainer.fit(tokens, targets, steps=1, batch_size=8)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "tf.function"])
def test_a_window_of_padding_only_says_so_not_nothing_accumulated(in_function):
    """accumulate was called, but every weight was 0: the error names the zero total weight."""
    variables = [tf.Variable(tf.zeros([2]))]
    accumulator = GradientAccumulator(variables, 2, keras.optimizers.SGD(0.1))
    accumulate = accumulator.accumulate
    apply = tf.function(accumulator.apply) if in_function else accumulator.apply
    accumulate([tf.ones([2])], sample_weight=[0.0, 0.0])
    accumulate([tf.ones([2])], sample_weight=tf.zeros([3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sums to 0") as error:
        apply()
    assert "nothing accumulated" not in str(error.value)
    assert "padding" in str(error.value) and "reset()" in str(error.value)
    np.testing.assert_array_equal(variables[0].numpy(), [0.0, 0.0])   # nothing applied
    accumulator.reset()
    with pytest.raises(tf.errors.InvalidArgumentError, match="nothing accumulated"):
        apply()


@pytest.mark.claim
def test_sync_trainer_weighted_with_jit_compile_equals_the_big_batch(devices):
    """The token count is all-reduced outside the XLA computation of each replica."""
    strategy = pargrad.sync_strategy(2)
    with strategy.scope():
        model = sequence_model(seed=1, dtype="float64")
        optimizer = OPTIMIZERS["sgd"]()
    trainer = pargrad.SyncTrainer(model, strategy, loss=squared_error_per_token,
                                  optimizer=optimizer, accumulation_steps=2,
                                  sample_weight=token_mask, jit_compile=True, progress=False)
    trainer.fit(*data(), steps=UPDATES, batch_size=BATCH)
    big = big_batch("sgd")
    assert gap(model.get_weights(), big) <= tolerance(big)


def test_mean_of_means_gaps_is_the_gap_of_the_mean_of_token_means():
    """The chapter's measure, one gap a batch: the mean of the micro-batches' token-mean
    gradients against the batch's token-mean gradient; zero when the micro-batches are alike."""
    model = sequence_model(seed=1, dtype="float64")
    x, y = sequence_data(2 * BATCH, seed=5, dtype="float64")
    gaps = mean_of_means_gaps(model, x, y, BATCH, STEPS)
    assert gaps.shape == (2,)

    def gradients(xs, ys):
        with tf.GradientTape() as tape:
            loss = token_loss(model, xs, ys)
        return [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]

    second_x, second_y = x[BATCH:], y[BATCH:]
    parts = [gradients(xm, ym) for xm, ym in micro_batches(second_x, second_y, STEPS)]
    mean_of_means = [np.mean(gs, axis=0) for gs in zip(*parts)]
    explicit = relative_gap(mean_of_means, gradients(second_x, second_y))
    assert explicit > 1e-3 and abs(gaps[1] - explicit) <= 1e-12

    size = BATCH // STEPS   # every micro-batch the same sequences: the same tokens, no gap
    alike = mean_of_means_gaps(model, np.tile(x[:size], (STEPS, 1)), np.tile(y[:size], (STEPS, 1, 1)),
                               BATCH, STEPS)
    assert alike[0] <= pargrad.rounding_tolerance("float64", STEPS)
