# %% [markdown]
# # Accumulating sequences
#
# ```{admonition} Takeaway
# On sequences the loss is a mean over tokens, so accumulated micro-batches
# must be weighted by their tokens, not averaged: add each micro-batch's token
# *sum*, divide once by the window's token count, summed over every replica
# too. Then accumulation equals the big batch to float64 rounding; the plain
# mean of means does not.
# ```
#
# The accumulation chapters proved that $k$ accumulated micro-batches equal
# the big batch, as long as each micro-batch is weighted by its number of
# *examples*. Language models do not average over examples: their loss is a
# mean over *tokens*, and sequences have different lengths. Then the mean of
# the micro-batches' token means is not the big batch's token mean. In 2024
# this made gradient accumulation in Hugging Face's `Trainer` train
# differently from the big batch {cite}`trlissue2175,hfblog2024gradacc`. The
# fix counts the tokens of the whole window and divides once
# {cite}`torchtunepr1875`: across the micro-batches first
# {cite}`transformerspr34191`, across the processes in a follow-up
# {cite}`transformerspr34373`. This chapter builds that fix and the traps
# around it.
#
# **In this chapter you will**
#
# - measure how far the mean of micro-batch token means is from the big
#   batch's token mean on sequences of unequal lengths, over many batches,
#   and fix it by weighting each micro-batch by its tokens
#   (`GradientAccumulator(..., sample_weight=mask)`);
# - do the same across two replicas, where the token count must be summed
#   over the replicas too: one all-reduce of one number per update;
# - see what Keras 3's `gradient_accumulation_steps` computes on the same
#   data, and what its step counter does to a learning-rate schedule;
# - meet the other traps between accumulation and the big batch: dropout and
#   shuffling across the window, a partial last window, BatchNorm.

# %% tags=["colab", "hide-input"]
# On Colab: install pargrad from the book's repository. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad @ git+{REPOSITORY}@main"],
        check=True,
    )

# %%
import pargrad

devices = pargrad.logical_devices(2)

import time

import keras
import numpy as np
import tensorflow as tf
from pargrad.accumulate import GradientAccumulator, weighted_mean
from pargrad.book import glue, show_lines
from pargrad.book.sequences import (
    padding_mask,
    sequence_data,
    sequence_model,
    squared_error_per_token,
    token_mask,
)
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

# %% [markdown]
# ## Sequences of unequal lengths
#
# The book's sequence task (`pargrad.book.sequences`) draws sequences of 2 to
# 24 tokens from a vocabulary of 15, pads them with token 0 to length 24, and
# asks a small causal model (an embedding, a convolution over the token and
# the one before it, a dense layer) to predict one number per token. The loss
# is the squared error of each real token; padding is masked out. As in the
# chapter [Synchronous training](03_synchronous), everything runs in float64, so that "equal"
# means equal up to float64 rounding (`pargrad.rounding_tolerance`) on any
# machine.
#
# One batch of 16 sequences, cut into $k = 4$ micro-batches of 4 sequences:

# %%
BATCH, K = 16, 4
x, y = sequence_data(BATCH, seed=0, dtype="float64")
mask = padding_mask(x, "float64")
micro = [(x[i * 4:(i + 1) * 4], y[i * 4:(i + 1) * 4]) for i in range(K)]
tokens = [int(tf.reduce_sum(padding_mask(xm))) for xm, _ in micro]
print("real tokens per micro-batch:", tokens, "| the batch:", sum(tokens),
      "of", x.size, "positions")

# %% [markdown]
# Every micro-batch holds 4 examples, but not the same number of tokens. The
# loss of a micro-batch is the mean over its real tokens,
#
# $$L_i = \frac{1}{n_i} \sum_{t \in \text{micro-batch } i} \ell_t,$$
#
# and the big batch's loss is the mean over all its $n = \sum_i n_i$ tokens,
# $L = \frac{1}{n} \sum_t \ell_t = \sum_i \frac{n_i}{n} L_i$. Averaging the
# micro-batches' means, $\frac{1}{k} \sum_i L_i$, gives each micro-batch the
# weight $1/k$ instead of $n_i / n$: the tokens of a short micro-batch count
# more than those of a long one. {numref}`fig-token-weighting` shows it on four
# short sequences.

# %% mystnb={"figure": {"caption": "Four padded sequences in two micro-batches, with made-up losses per token (hatched: padding, which counts nothing). Micro-batch 1 holds 14 real tokens, micro-batch 2 only 3. The mean of the two micro-batch means gives those 3 tokens as much weight as the other 14; weighting each micro-batch's mean by its share of the tokens counts every token once and gives the big batch's mean.", "name": "fig-token-weighting"}}
from pargrad.book import plots

fig = plots.token_weighting_diagram()

# %%
model = sequence_model(seed=1, dtype="float64")


def token_loss(model, x, y):
    """A (micro-)batch's loss: the mean over its real tokens."""
    return weighted_mean(squared_error_per_token(y, model(x, training=True)),
                         padding_mask(x, "float64"))


def loss_and_gradients(model, x, y):
    with tf.GradientTape() as tape:
        loss = token_loss(model, x, y)
    gradients = tape.gradient(loss, model.trainable_variables)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in gradients]


def relative_gap(gradients, reference):
    """Largest difference, relative to the largest entry of the reference gradient."""
    scale = max(float(np.abs(g).max()) for g in reference)
    return max(float(np.abs(a - b).max()) for a, b in zip(gradients, reference)) / scale


big_loss, big_gradients = loss_and_gradients(model, x, y)
parts = [loss_and_gradients(model, xm, ym) for xm, ym in micro]
mean_of_means_loss = np.mean([loss for loss, _ in parts])
mean_of_means = [np.mean(gs, axis=0) for gs in zip(*[g for _, g in parts])]
weights = np.array(tokens) / sum(tokens)
by_tokens_loss = float(np.dot(weights, [loss for loss, _ in parts]))
by_tokens = [sum(w * g for w, g in zip(weights, gs)) for gs in zip(*[g for _, g in parts])]
TOLERANCE = pargrad.rounding_tolerance("float64", 1)
gap_mean_of_means = relative_gap(mean_of_means, big_gradients)
gap_by_tokens = relative_gap(by_tokens, big_gradients)
print(f"big batch, mean over its tokens:    loss {big_loss:.6f}")
print(f"mean of the micro-batches' means:   loss {mean_of_means_loss:.6f}, "
      f"gradient off by {gap_mean_of_means:.1%}")
print(f"micro-batch means weighted n_i / n: loss {by_tokens_loss:.6f}, "
      f"gradient within float64 rounding ({TOLERANCE:.0e}): {gap_by_tokens <= TOLERANCE}")

# %% tags=["remove-cell"]
assert gap_mean_of_means > 1e-3 and gap_by_tokens <= TOLERANCE
glue("gap_mean_of_means", f"{gap_mean_of_means:.1%}", display=False)

# %% [markdown]
# On this batch the mean of means is off by {glue:text}`gap_mean_of_means` of
# the largest gradient entry, and weighting each micro-batch's mean by its
# share of the tokens, $n_i / n$, gives the big batch's gradient, to rounding.
# One batch can be unusually uneven, though. How large is the error on a
# typical batch of the same task? The same comparison on 200 fresh batches of
# 16 sequences, for the same model, each cut into 4 micro-batches (a
# micro-batch's token *sum* and its token count give both means at once):

# %%
@tf.function(reduce_retracing=True)
def token_sum_and_gradients(xm, ym):
    """A micro-batch's token count and the gradients of its token *sum*."""
    weights = padding_mask(xm, "float64")
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(weights * squared_error_per_token(ym, model(xm, training=True)))
    return tf.reduce_sum(weights), [tf.convert_to_tensor(g)
                                    for g in tape.gradient(total, model.trainable_variables)]


def mean_of_means_gap(xb, yb):
    counts, sums = zip(*[token_sum_and_gradients(xm, ym) for xm, ym in
                         [(xb[i * 4:(i + 1) * 4], yb[i * 4:(i + 1) * 4]) for i in range(K)]])
    big = [sum(gs).numpy() / float(sum(counts)) for gs in zip(*sums)]
    means = [np.mean([(g / n).numpy() for g, n in zip(gs, counts)], axis=0) for gs in zip(*sums)]
    return relative_gap(means, big)


FRESH = 200
x_fresh, y_fresh = sequence_data(BATCH * FRESH, seed=1, dtype="float64")
fresh_gaps = np.array([mean_of_means_gap(x_fresh[b * BATCH:(b + 1) * BATCH],
                                         y_fresh[b * BATCH:(b + 1) * BATCH])
                       for b in range(FRESH)])
low, quarter, median, three_quarters, high = np.percentile(fresh_gaps, [0, 25, 50, 75, 100])
print(f"mean of means vs big batch over {FRESH} fresh batches, gradient off by: "
      f"median {median:.0%}, middle half {quarter:.0%} to {three_quarters:.0%}, "
      f"range {low:.1%} to {high:.0%}")
print(f"the first batch's {gap_mean_of_means:.0%} is larger than on "
      f"{np.mean(fresh_gaps < gap_mean_of_means):.0%} of the fresh batches")

# %% tags=["remove-cell"]
assert fresh_gaps.min() > 1e-3 and median < gap_mean_of_means
glue("fresh_batches", f"{FRESH}", display=False)
glue("fresh_median", f"{median:.0%}", display=False)
glue("fresh_low", f"{low:.1%}", display=False)
glue("fresh_high", f"{high:.0%}", display=False)

# %% [markdown]
# The first batch was an uneven one: on a typical batch the mean of means is
# off by {glue:text}`fresh_median` (the median over {glue:text}`fresh_batches`
# batches), on some by {glue:text}`fresh_low`, on others by
# {glue:text}`fresh_high`. It is never zero, and it does not average out: it
# comes back at every update in which micro-batches differ in length, always
# giving the tokens of short micro-batches more weight.
#
# ## The fix: weight by tokens, over the whole window
#
# The weights $n_i / n$ need $n$, the tokens of the *whole window*, which is
# known only after the last micro-batch. `GradientAccumulator` therefore
# adds $n_i \times \nabla L_i$ (the gradient of the micro-batch's token *sum*)
# and divides by the accumulated $n$ once, when it applies. A mask, given as
# `sample_weight` (the name Keras uses for per-example and per-token
# weights), says what counts:

# %%
show_lines(GradientAccumulator.accumulate, "if sample_weight is None:", "self.micro_batches")

# %%
show_lines(GradientAccumulator.mean_gradients, "called = tf.debugging.assert_positive", "return [total")

# %% [markdown]
# `count` is the micro-batch's size when you pass `num_examples`, and the sum
# of the mask (its real tokens) when you pass `sample_weight`; `examples`
# then holds the window's tokens. A micro-batch of padding only adds weight
# 0 and, because `weighted_mean` returns 0 rather than 0/0, no NaN; a whole
# window of padding only has no mean to take, and applying it says so.
#
# Now three trainings of 8 updates with Adam on 128 sequences, batches of 16
# cut into 4 micro-batches: the big batch; the accumulator weighting by
# tokens; and the accumulator weighting each micro-batch equally, the mean of
# means.

# %%
UPDATES = 8
x_all, y_all = sequence_data(BATCH * UPDATES, seed=0, dtype="float64")
batches = [(x_all[u * BATCH:(u + 1) * BATCH], y_all[u * BATCH:(u + 1) * BATCH])
           for u in range(UPDATES)]


def micro_batches(x, y, pieces=K):
    size = len(x) // pieces
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(pieces)]


def train_big_batch(make_optimizer, batches=batches):
    model, optimizer = sequence_model(seed=1, dtype="float64"), make_optimizer()
    for xb, yb in batches:
        with tf.GradientTape() as tape:
            loss = token_loss(model, xb, yb)
        # Dense, as an accumulator holds them (Keras's Adam moves only the rows
        # of an embedding that a sparse gradient names).
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return model.get_weights()


def train_accumulated(make_optimizer, by_tokens, batches=batches, apply_partial=False):
    model = sequence_model(seed=1, dtype="float64")
    accumulator = GradientAccumulator(model.trainable_variables, K, make_optimizer())

    @tf.function
    def train_micro_batch(xm, ym):
        with tf.GradientTape() as tape:
            loss = token_loss(model, xm, ym)
        gradients = tape.gradient(loss, model.trainable_variables)
        if by_tokens:
            return accumulator.step(gradients, sample_weight=padding_mask(xm, "float64"))
        return accumulator.step(gradients, tf.shape(xm)[0])   # equal sizes: mean of means

    for xb, yb in batches:
        for xm, ym in micro_batches(xb, yb, len(xb) // 4):
            train_micro_batch(xm, ym)
    if apply_partial and int(accumulator.micro_batches) > 0:
        accumulator.apply()
    return model.get_weights()


def weight_gap(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def tolerance_for(weights, steps):
    scale = max(1.0, max(float(np.abs(w).max()) for w in weights))
    return pargrad.rounding_tolerance("float64", steps, scale)


adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
big = train_big_batch(adam)
tolerance = tolerance_for(big, UPDATES * K)
gap_tokens = weight_gap(train_accumulated(adam, by_tokens=True), big)
gap_means = weight_gap(train_accumulated(adam, by_tokens=False), big)
print(f"float64 rounding tolerance after {UPDATES} updates: {tolerance:.0e}")
print(f"weighted by tokens vs big batch: equal within it: {gap_tokens <= tolerance}")
print(f"mean of means vs big batch: max |weight difference| {gap_means:.4f}")

# %% tags=["remove-cell"]
assert gap_tokens <= tolerance < gap_means / 1e6
glue("gap_means_weights", f"{gap_means:.4f}", display=False)
glue("tolerance_8", f"{tolerance:.0e}", display=False)

# %% [markdown]
# Weighted by tokens, the accumulated run is the big batch's run, to float64
# rounding ({glue:text}`tolerance_8`). The mean of means ends
# {glue:text}`gap_means_weights` away in the weights after 8 updates: a
# different training, not a rounding error.
#
# ## Across replicas: sum the tokens over the replicas too
#
# With two replicas, each holding half of the batch, a replica knows only its
# own tokens. If each replica divides by its own count and the replicas'
# gradients are averaged, as a data-parallel trainer does with a per-replica
# mean, the same error returns one level up: the mean of the two replicas'
# token means. At the first batch:

# %%
halves = [(x[:8], y[:8]), (x[8:], y[8:])]
replica_parts = [loss_and_gradients(model, xh, yh) for xh, yh in halves]
replica_tokens = [int(tf.reduce_sum(padding_mask(xh))) for xh, _ in halves]
per_replica_mean = [np.mean(gs, axis=0) for gs in zip(*[g for _, g in replica_parts])]
gap_replicas = relative_gap(per_replica_mean, big_gradients)
print(f"real tokens per replica: {replica_tokens}; mean of the replicas' token means: "
      f"gradient off by {gap_replicas:.1%}")

# %% tags=["remove-cell"]
assert gap_replicas > 1e-3
glue("gap_replicas", f"{gap_replicas:.1%}", display=False)

# %% [markdown]
# The total weight must be summed over the replicas as well, as Hugging
# Face's `Trainer` does since {cite}`transformerspr34373` and Accelerate's
# documentation shows {cite}`acceleratepr3193`. In
# `SyncTrainer(sample_weight=...)` every replica adds up the weights of its
# micro-batches, and one all-reduce of that single number, per update, gives
# the whole global batch's token count $n$; each replica then divides its
# token *sum* by $n$, and the all-reduce of the gradients that follows adds
# up the big batch's token mean. The count depends on the data only, not on
# the model, so it is known before the forward pass:

# %%
show_lines(SyncTrainer._weighted_replica_gradients, "local = tf.add_n", "return self._shard_gradients")

# %% [markdown]
# `sample_weight` is a function of a micro-batch, `sample_weight(x, y)`,
# returning one weight per value of the loss: here
# `pargrad.book.sequences.token_mask`, the padding mask of `x`. Two replicas,
# each accumulating 2 micro-batches of 4 sequences, against the big batch:

# %%
def train_sync(replicas, make_optimizer, sample_weight=token_mask):
    strategy = sync_strategy(replicas)
    with strategy.scope():
        model = sequence_model(seed=1, dtype="float64")
        optimizer = make_optimizer()
    trainer = SyncTrainer(model, strategy, loss=squared_error_per_token, optimizer=optimizer,
                          accumulation_steps=K // replicas, sample_weight=sample_weight,
                          progress=False)
    trainer.fit(x_all, y_all, steps=UPDATES, batch_size=BATCH)
    return model.get_weights()


sync_gaps = []
for replicas in (1, 2):
    sync_gaps.append(weight_gap(train_sync(replicas, adam), big))
    print(f"SyncTrainer, {replicas} replica(s) x {K // replicas} micro-batches, weighted by "
          f"tokens, vs big batch: equal within {tolerance:.0e}: {sync_gaps[-1] <= tolerance}")
every_position = lambda x, y: tf.ones(tf.shape(x), y.dtype)  # noqa: E731
gap_unmasked = weight_gap(train_sync(2, adam, sample_weight=every_position), big)
print(f"SyncTrainer, 2 replicas, every position weighing 1 (padding too): "
      f"{gap_unmasked:.4f} away")

# %% tags=["remove-cell"]
assert max(sync_gaps) <= tolerance
assert gap_unmasked > 1e6 * tolerance

# %% [markdown]
# Weighting every position 1 is what `SyncTrainer` computes without
# `sample_weight` (the loss of an example is the mean over its positions,
# padding included, and the batch's loss the mean over examples, all of the
# same length): the big batch of a *different* loss. A mask is how you ask
# for tokens.
#
# ### What the extra all-reduce costs
#
# One all-reduce of one float64 per update, beside the all-reduce of every
# gradient entry that the update needs anyway. In numbers communicated, the
# count is one more number per update:

# %%
parameters = sum(int(np.prod(w.shape)) for w in model.trainable_variables)
print(f"gradient entries all-reduced per update: {parameters}; the token count adds 1, "
      f"a share of {1 / (parameters + 1):.2%} of the numbers")

# %% [markdown]
# In time, an all-reduce also has a fixed start-up cost, whatever its size
# (the α of the chapter [What communication costs](10_communication_costs)).
# Measured on the two replicas (8 sequences each, no accumulation, so that
# the count is the only difference from the default) as the processor time
# an update takes (all threads; less sensitive to other programs than the
# wall clock): rounds of 20 updates without and with the count,
# interleaved, so that a change in the machine's load hits both alike; each
# pair of rounds gives one ratio.

# %% tags=["nbval-ignore-output"]
def timed_trainer(sample_weight, steps=20):
    strategy = sync_strategy(2)
    with strategy.scope():
        model = sequence_model(seed=1)
    trainer = SyncTrainer(model, strategy, loss=squared_error_per_token, learning_rate=0.01,
                          sample_weight=sample_weight, progress=False)
    xs, ys = sequence_data(BATCH * steps, seed=0)

    def cpu_seconds_per_update():
        start = time.process_time()
        trainer.fit(xs, ys, steps=steps, batch_size=BATCH, steps_per_call=steps)
        return (time.process_time() - start) / steps

    cpu_seconds_per_update()                                   # warm up (traces)
    return cpu_seconds_per_update


PAIRS = 10
plain, weighted = timed_trainer(None), timed_trainer(token_mask)
ratios = np.array([weighted() / plain() for _ in range(PAIRS)])
resolved = not (ratios.min() <= 1 <= ratios.max())
print(f"with / without the token count, processor time per update, {PAIRS} interleaved pairs: "
      f"median ratio {np.median(ratios):.2f}, range {ratios.min():.2f} to {ratios.max():.2f}")
print("a cost this measurement resolves (every pair on the same side of 1):", resolved)

# %% tags=["nbval-ignore-output", "remove-cell"]
assert np.median(ratios) < 2
glue("count_share", f"{1 / (parameters + 1):.2%}", display=False)
glue("cost_verdict", "every pair of rounds puts the count's cost on the same side of 1, so "
     "this measurement resolves it; its size is the median ratio above" if resolved else
     "the ratios of the pairs lie on both sides of 1: the count's cost is below what this "
     "measurement resolves", display=False)

# %% [markdown]
# The count is {glue:text}`count_share` of the numbers sent, and in time
# {glue:text}`cost_verdict`. On this tiny model an update is dominated by
# launching work on the two replicas; on a real model, whose gradients are
# millions of numbers, one more number per update is smaller still.
#
# An alternative without the
# extra all-reduce exists: divide every micro-batch by a constant that does
# not depend on the data (the positions of a full batch), which Keras's
# default reduction does (below) and some trainers choose
# {cite}`trlpr3231`; it keeps micro-batches consistent, but the step then
# shrinks with the share of padding.
#
# ## Keras 3's `gradient_accumulation_steps` on the same data
#
# Keras 3 optimizers accumulate when given `gradient_accumulation_steps=k`.
# Its code (`keras/src/optimizers/base_optimizer.py`,
# `_backend_apply_gradients`) adds each call's gradients into accumulator
# variables and, on every $k$-th call, applies $(g + \sum \text{acc}) / k$:
# the plain mean of the $k$ micro-batch gradients, whatever they hold. With a
# mask passed as `sample_weight` to `fit`, what each micro-batch's gradient
# is depends on the loss's *reduction*:
#
# - `reduction="mean_with_sample_weight"`: the micro-batch's loss is its
#   token mean, and accumulation gives the mean of the token means;
# - the default, `"sum_over_batch_size"`: the micro-batch's loss is its
#   masked sum divided by the number of *positions*, padding included, a
#   divisor that does not depend on the mask.
#
# We check both against our two accumulations, SGD, one update per epoch,
# micro-batches of 4 and $k = 4$ (the loss computed in float64):

# %%
def keras_fit(reduction, accumulation_steps, batch_size, x=x, y=y, epochs=1, make_optimizer=None):
    model = sequence_model(seed=1, dtype="float64")
    options = ({"gradient_accumulation_steps": accumulation_steps}
               if accumulation_steps else {})
    optimizer = (make_optimizer or (lambda **o: keras.optimizers.SGD(0.1, **o)))(**options)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.MeanSquaredError(reduction=reduction, dtype="float64"))
    keras.config.set_floatx("float64")      # compile's total loss is in floatx
    try:
        model.fit(x, y, sample_weight=padding_mask(x, "float64").numpy(),
                  batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    finally:
        keras.config.set_floatx("float32")
    return model, optimizer


sgd = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
one_batch = [(x, y)]
ours_tokens = train_accumulated(sgd, by_tokens=True, batches=one_batch)
ours_means = train_accumulated(sgd, by_tokens=False, batches=one_batch)
tolerance_1 = tolerance_for(ours_tokens, K)
keras_tokens, _ = keras_fit("mean_with_sample_weight", K, 4)
keras_big, _ = keras_fit("mean_with_sample_weight", None, 16)
keras_default, _ = keras_fit("sum_over_batch_size", K, 4)
keras_default_big, _ = keras_fit("sum_over_batch_size", None, 16)
rows = [
    ("mean_with_sample_weight, k = 4 vs our mean of means", keras_tokens.get_weights(), ours_means),
    ("mean_with_sample_weight, batch 16 vs our token-weighted", keras_big.get_weights(), ours_tokens),
    ("mean_with_sample_weight, k = 4 vs its own batch 16", keras_tokens.get_weights(),
     keras_big.get_weights()),
    ("sum_over_batch_size, k = 4 vs its own batch 16", keras_default.get_weights(),
     keras_default_big.get_weights()),
    ("sum_over_batch_size, batch 16 vs our token-weighted", keras_default_big.get_weights(),
     ours_tokens),
]
for name, a, b in rows:
    print(f"Keras {name:58s} equal: {weight_gap(a, b) <= tolerance_1}")

# %% tags=["remove-cell"]
assert [weight_gap(a, b) <= tolerance_1 for _, a, b in rows] == [True, True, False, True, False]

# %% [markdown]
# So, precisely: with the token-mean reduction, Keras's accumulation is the
# mean of the micro-batches' token means (exactly our wrong run), not its own
# big batch. With the default reduction, accumulation does equal Keras's own
# big batch, because every micro-batch is divided by the same number of
# positions; but that loss is not the token mean: a batch with more padding
# takes a smaller step. No Keras setting gives the token mean of the window:
# that needs the window's token count, which Keras's optimizer never sees.
# (Under `MirroredStrategy`, `gradient_accumulation_steps` does not run at
# all: see the chapter "Accumulation in TF2 and across replicas".)
#
# ### A learning-rate schedule counts micro-steps
#
# The same code keeps one step counter, `_iterations`, incremented on *every*
# call, update or not. Its public `iterations` property returns
# `_iterations // k` (updates), and Adam's bias correction reads it; but a
# learning-rate schedule is called with `_iterations` (the docstring says so:
# "Learning rate schedules will look at 'real' iterations value"). A schedule
# written in updates therefore runs $k$ times too fast. Checked by running
# 2 updates of $k = 4$ (32 sequences) with a rate of 0.1 for the first 2
# updates (steps 0 and 1) and 0.01 after, against big batches of 16:

# %%
def step_schedule():
    return keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.1, 0.01])


def keras_sgd(rate):
    return lambda **options: keras.optimizers.SGD(rate, **options)


first_32 = dict(x=x_all[:32], y=y_all[:32])
accumulated_keras, optimizer = keras_fit("sum_over_batch_size", K, 4,
                                         make_optimizer=keras_sgd(step_schedule()), **first_32)
scheduled_big, _ = keras_fit("sum_over_batch_size", None, 16,
                             make_optimizer=keras_sgd(step_schedule()), **first_32)
slow_big, _ = keras_fit("sum_over_batch_size", None, 16, make_optimizer=keras_sgd(0.01),
                        **first_32)
tolerance_2 = tolerance_for(scheduled_big.get_weights(), 2 * K)
as_scheduled = weight_gap(accumulated_keras.get_weights(), scheduled_big.get_weights())
at_001 = weight_gap(accumulated_keras.get_weights(), slow_big.get_weights())
print(f"after 2 updates of k = 4: iterations {int(optimizer.iterations)}, "
      f"_iterations {int(optimizer._iterations)}")
print(f"Keras accumulation vs its big batch with the schedule:       equal: "
      f"{as_scheduled <= tolerance_2}")
print(f"Keras accumulation vs its big batch at 0.01 for both updates: equal: "
      f"{at_001 <= tolerance_2}")

# %% tags=["remove-cell"]
assert int(optimizer.iterations) == 2 and int(optimizer._iterations) == 2 * K
assert at_001 <= tolerance_2 < as_scheduled

# %% [markdown]
# Without the schedule these two runs were equal (the default reduction,
# above); with it, the accumulated run took both updates at 0.01: the
# schedule was called at micro-steps $k - 1$ and $2k - 1$, both past its boundary. In
# Keras, give the optimizer a schedule of updates, `step // k`, a few lines
# around yours:

# %%
class PerUpdate(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule written in updates, for an optimizer that counts micro-steps."""

    def __init__(self, schedule, accumulation_steps):
        self.schedule, self.accumulation_steps = schedule, accumulation_steps

    def __call__(self, step):
        return self.schedule(step // self.accumulation_steps)


fixed_keras, _ = keras_fit("sum_over_batch_size", K, 4,
                           make_optimizer=keras_sgd(PerUpdate(step_schedule(), K)), **first_32)
gap_fixed = weight_gap(fixed_keras.get_weights(), scheduled_big.get_weights())
print(f"Keras accumulation with PerUpdate(schedule, 4) vs its big batch with the schedule: "
      f"equal: {gap_fixed <= tolerance_2}")

# %% tags=["remove-cell"]
assert gap_fixed <= tolerance_2

# %% [markdown]
# A custom loop with `GradientAccumulator` calls the optimizer once per
# update, so its `iterations` and its schedule count updates, and the big
# batch's schedule applies unchanged:

# %%
scheduled = lambda: keras.optimizers.Adam(  # noqa: E731
    keras.optimizers.schedules.PiecewiseConstantDecay([3], [0.01, 0.001]))
big_scheduled = train_big_batch(scheduled)
gap_scheduled = weight_gap(train_accumulated(scheduled, by_tokens=True), big_scheduled)
print(f"GradientAccumulator with a schedule in updates vs the big batch: equal within "
      f"{tolerance:.0e}: {gap_scheduled <= tolerance}")

# %% tags=["remove-cell"]
assert gap_scheduled <= tolerance

# %% [markdown]
# ## Other ways accumulation differs from the big batch
#
# ### Dropout
#
# Dropout draws a new random mask on every forward pass. The big batch draws
# one mask for its 16 sequences; four micro-batches draw four. The two runs
# are then not equal, but they are the same *random* computation: each token
# is dropped with the same probability either way. How far apart are they,
# next to how far the big batch is from itself with another draw?

# %%
def gradients_with_dropout(seed, pieces):
    model = sequence_model(seed=1, dtype="float64", dropout=0.2, dropout_seed=seed)
    sums, total = None, 0.0
    for xm, ym in micro_batches(x, y, pieces):
        n = float(tf.reduce_sum(padding_mask(xm)))
        _, gradients = loss_and_gradients(model, xm, ym)
        sums = [n * g for g in gradients] if sums is None else [
            s + n * g for s, g in zip(sums, gradients)]
        total += n
    return [s / total for s in sums]


reference = gradients_with_dropout(seed=10, pieces=1)
gap_other_draw = relative_gap(gradients_with_dropout(seed=11, pieces=1), reference)
gap_accumulated = relative_gap(gradients_with_dropout(seed=10, pieces=K), reference)
print(f"big batch, another dropout draw:          gradient {gap_other_draw:.0%} away")
print(f"accumulated by tokens, same seed:         gradient {gap_accumulated:.0%} away")
print(f"same order (within a factor of 4): {gap_other_draw / 4 < gap_accumulated < 4 * gap_other_draw}")

# %% tags=["remove-cell"]
assert gap_other_draw / 4 < gap_accumulated < 4 * gap_other_draw

# %% [markdown]
# With dropout, the accumulated gradient differs from the big batch's by about
# as much as the big batch differs from itself under another draw: dropout's
# noise, not an accumulation error. Equality to rounding needs dropout off
# (or the same masks, cut into micro-batches by hand).
#
# ### Shuffling across the window
#
# Within a window, the order of the micro-batches does not matter: the
# accumulator adds them up, and addition does not care, to rounding. Across
# windows it does: a pipeline that shuffles its examples after they were cut
# into windows, or draws micro-batches independently, trains on other big
# batches. Moving one sequence between the first two windows:

# %%
reordered = [(xb[::-1], yb[::-1]) for xb, yb in batches]        # micro-batches reversed
gap_reordered = weight_gap(train_accumulated(adam, by_tokens=True, batches=reordered), big)
swapped_x, swapped_y = x_all.copy(), y_all.copy()
swapped_x[[0, BATCH]], swapped_y[[0, BATCH]] = x_all[[BATCH, 0]], y_all[[BATCH, 0]]
swapped = [(swapped_x[u * BATCH:(u + 1) * BATCH], swapped_y[u * BATCH:(u + 1) * BATCH])
           for u in range(UPDATES)]
gap_swapped = weight_gap(train_accumulated(adam, by_tokens=True, batches=swapped), big)
print(f"micro-batches in reverse order within each window: equal within {tolerance:.0e}: "
      f"{gap_reordered <= tolerance}")
print(f"one sequence moved to the next window: equal: {gap_swapped <= tolerance}")

# %% tags=["remove-cell"]
assert gap_reordered <= tolerance < gap_swapped

# %% [markdown]
# To compare accumulation with a big batch, cut the big batch into
# micro-batches; to reproduce a run, seed the shuffling of whole windows.
#
# ### A partial last window
#
# 120 sequences in windows of 16 leave a last window of 8: two micro-batches
# where the accumulator expects four. Three choices:
#
# - **apply it**: weighted by tokens, its update is the token mean of its own
#   8 sequences, the same update as a big-batch run whose last batch is
#   smaller (Keras's `fit` does that with a last, smaller batch);
# - **drop it**: throws data away every epoch, and with a fixed order always
#   the same data;
# - **rescale it** as if it were full (divide by a full window's count):
#   shrinks its step by the missing share, for no reason a loss can state.
#
# We apply it: it is the only choice that is again some big batch. With
# `GradientAccumulator`, call `apply()` once more after the loop when
# `micro_batches` is not 0; it equals the big batch with a short last batch:

# %%
short = batches[:7] + [(x_all[112:120], y_all[112:120])]
gap_partial = weight_gap(train_accumulated(adam, by_tokens=True, batches=short,
                                           apply_partial=True), train_big_batch(adam, short))
print(f"7 full windows and one of 8 sequences, applied: equal to the big batch with a last "
      f"batch of 8 within {tolerance:.0e}: {gap_partial <= tolerance}")
_, keras_optimizer = keras_fit("sum_over_batch_size", K, 4, x=x_all[:24], y=y_all[:24])
left = max(float(np.abs(a.numpy()).max()) for a in keras_optimizer._accumulated_gradients)
print(f"Keras, 24 sequences in micro-batches of 4, k = 4: {int(keras_optimizer.iterations)} "
      f"update, {int(keras_optimizer._iterations) % K} micro-batches left in its accumulators "
      f"(largest entry {left:.2f}): neither applied nor dropped")

# %% tags=["remove-cell"]
assert gap_partial <= tolerance
assert int(keras_optimizer._iterations) % K == 2 and left > 0

# %% [markdown]
# Keras keeps the partial window's gradients and adds them to the first
# micro-batches of the next epoch, where they join a window of other data
# (and of older weights). `SyncTrainer` avoids the question by refusing a last
# batch that does not split evenly over replicas × micro-batches, with an
# error that says which sizes work.
#
# ### BatchNorm
#
# BatchNorm normalises each example with its batch's statistics, so $k$
# micro-batches normalise with $k$ different statistics, which the big batch
# never does: accumulation is then not the big batch, with or without
# tokens. The chapter [Accumulation in TF2 and across replicas](07_accumulation_tf2)
# measures it (its section "BatchNorm: micro-batches are not the big batch"),
# the replicas' side included. Sequence models mostly use layer normalisation, which looks at one
# token at a time and so accumulates exactly.
#
# ## The accumulation thread, on sequences
#
# The accumulation thread's answers 1 and 3 ([Where this book
# starts](00_sources)) accumulate $k$ gradients and then apply either their
# *sum* (answer 1) or their sum divided by a counter of micro-batches
# (answer 3, the mean). On micro-batches of equal size and a loss that is a
# mean over examples, answer 3 is right and answer 1 takes a step $k$ times
# too large ([Accumulating gradients in TF1 graphs](06_accumulation_tf1)).
# On sequences, each micro-batch's
# gradient is of its token mean, and:

# %%
answer_1 = [K * g for g in mean_of_means]          # the sum of the k gradients
answer_3 = mean_of_means                           # the sum / counter of micro-batches
for name, gradients in (("answer 1 (sum)", answer_1), ("answer 3 (mean)", answer_3),
                        ("count tokens, not micro-batches", by_tokens)):
    print(f"{name:32s} gradient off the big batch's token mean by "
          f"{relative_gap(gradients, big_gradients):.1%}")

# %% tags=["remove-cell"]
assert relative_gap(answer_3, big_gradients) > 1e-3
assert relative_gap(answer_1, big_gradients) > 1
assert relative_gap(by_tokens, big_gradients) <= TOLERANCE

# %% [markdown]
# Answer 3 becomes the mean of token means, answer 1 that times $k$ (on top of
# its step $k$ times too large). The fix keeps answer 3's shape, a counter
# and one division, but counts tokens: accumulate each micro-batch's token
# *sum* (or its mean times its tokens) and divide by the window's tokens,
# over all replicas.
#
# ## Summary
#
# - On sequences the loss is a mean over tokens. Micro-batches with the same
#   number of sequences hold different numbers of tokens, so the mean of
#   their token means is not the big batch's token mean: here
#   typically {glue:text}`fresh_median` of the gradient (from
#   {glue:text}`fresh_low` to {glue:text}`fresh_high` over fresh batches), and
#   a different training after a few updates.
# - `GradientAccumulator(..., sample_weight=mask)` weights each micro-batch
#   by its tokens and divides by the window's tokens once: the big batch to
#   float64 rounding, for SGD and Adam.
# - Across replicas the token count must be summed over the replicas too:
#   `SyncTrainer(sample_weight=token_mask)` adds one all-reduce of one number
#   per update; the mean of per-replica token means is off by
#   {glue:text}`gap_replicas` here.
# - Keras 3's `gradient_accumulation_steps` averages its $k$ micro-batch
#   gradients equally: with the token-mean reduction that is the mean of
#   means; with the default reduction it matches Keras's own big batch, whose
#   loss divides by positions, padding included. Its schedules count
#   micro-steps, not updates.
# - Dropout makes accumulation differ from the big batch by about the noise
#   of another dropout draw; shuffling within a window changes nothing,
#   across windows it changes the batches; a partial last window is best
#   applied; BatchNorm breaks the equality ([Accumulation in TF2 and
#   Keras 3](07_accumulation_tf2)).
#
# ## Exercises
#
# 1. Sort the 128 sequences by length before cutting them into batches (as
#    length-bucketing pipelines do). Is the mean of means now further from
#    the big batch, or closer?
#
#    *Hint:* what happens to the spread of $n_i$ across the micro-batches of
#    one window?
# 2. Give `SyncTrainer` per-example weights instead of a mask: weight each
#    *sequence* 1, whatever its length, with a loss that is each sequence's
#    token mean. Which big batch does it then equal?
#
#    *Hint:* `sample_weight` must have the shape of the loss's values; a loss
#    that returns one value per sequence takes one weight per sequence.
# 3. Make Keras's default reduction compute the token mean of a batch of
#    fixed shape, without a custom loop. What would you have to know in
#    advance?
#
#    *Hint:* the default divides by positions, a constant; the token mean
#    divides by tokens.
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# Sorted by length, the micro-batches of a window hold sequences of similar
# lengths, but consecutive micro-batches still differ (short ones first, long
# ones last), and within a window the spread of $n_i$ can grow or shrink.
# The hidden cell below measures it: either way the weighted accumulation is
# exact, and the mean of means is not; bucketing changes the size of the
# error, not its existence.
# ```

# %% tags=["hide-cell"]
order = np.argsort((x_all > 0).sum(axis=1), kind="stable")
sorted_batches = [(x_all[order][u * BATCH:(u + 1) * BATCH], y_all[order][u * BATCH:(u + 1) * BATCH])
                  for u in range(UPDATES)]
big_sorted = train_big_batch(adam, sorted_batches)
gap_sorted = weight_gap(train_accumulated(adam, by_tokens=False, batches=sorted_batches), big_sorted)
gap_sorted_tokens = weight_gap(train_accumulated(adam, by_tokens=True, batches=sorted_batches),
                               big_sorted)
print(f"sorted by length: mean of means {gap_sorted:.4f} away (unsorted: {gap_means:.4f}); "
      f"weighted by tokens equal: {gap_sorted_tokens <= tolerance}")
assert gap_sorted_tokens <= tolerance and gap_sorted > 1e6 * tolerance

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# With a loss that returns one value per sequence (its token mean) and
# `sample_weight=lambda x, y: tf.ones([tf.shape(x)[0]])`, the total weight is
# the number of sequences, and the update is the big batch's mean over
# *sequences* of their token means: every sequence counts the same, a long
# one no more than a short one. That is a legitimate, different loss (some
# trainers call it "sequence mean"); what matters is that accumulation and
# the big batch agree on it, which they do because the weights are counted
# over the whole window.
# ```
#
# ```{dropdown} Solution to exercise 3
# The default divides a batch's masked sum by its positions, batch × length.
# Multiplying the mask by positions / tokens of the *whole batch* turns that
# into the token mean, but a micro-batch does not know the whole batch's
# tokens; you would have to count them before the window starts (in the data
# pipeline) and pass them as part of the weights: exactly the count that the
# accumulator or `SyncTrainer` sums for you.
# ```
