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
# The accumulation chapters showed that $k$ accumulated micro-batches equal
# the big batch when each micro-batch is weighted by its number of *examples*.
# A language model's loss is a mean over *tokens*, and sequences differ in
# length, so the mean of the micro-batches' token means is not the big batch's
# token mean. In 2024 this made gradient accumulation in Hugging Face's
# `Trainer` train differently from the big batch
# {cite}`trlissue2175,hfblog2024gradacc`. The fix counts the whole window's
# tokens, on every process, and divides once
# {cite}`torchtunepr1875,transformerspr34191,transformerspr34373`.
#
# **In this chapter you will** weight micro-batches by their tokens
# (`GradientAccumulator(..., sample_weight=mask)`), on one device and across
# two replicas (one all-reduce of the token count an update); see what Keras
# 3's `gradient_accumulation_steps` computes and does to a schedule; and meet
# the other traps: dropout, shuffling, a partial last window, BatchNorm.

# %% tags=["colab", "hide-input"]
# On Colab: install pargrad and what its chapters need. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad[book] @ git+{REPOSITORY}@main"],
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
    mean_of_means_gaps,
    padding_mask,
    relative_gap,
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
# asks a small causal model (an embedding, a convolution over each token and
# the one before it, a dense layer) to predict one number per token. The loss
# is the squared error of each real token; padding is masked out. Everything
# runs in float64, so "equal" means equal to float64 rounding
# (`pargrad.rounding_tolerance`), as in the chapter [Synchronous
# training](03_synchronous). One batch of 16 sequences, cut into $k = 4$
# micro-batches of 4:

# %%
BATCH, K = 16, 4
x, y = sequence_data(BATCH, seed=0, dtype="float64")
mask = padding_mask(x, "float64")
micro = [(x[i * 4:(i + 1) * 4], y[i * 4:(i + 1) * 4]) for i in range(K)]
tokens = [int(tf.reduce_sum(padding_mask(xm))) for xm, _ in micro]
print("real tokens per micro-batch:", tokens, "| the batch:", sum(tokens),
      "of", x.size, "positions")

# %% [markdown]
# Every micro-batch holds 4 examples but a different number of tokens. A
# micro-batch's loss is the mean over its real tokens,
#
# $$L_i = \frac{1}{n_i} \sum_{t \in \text{micro-batch } i} \ell_t,$$
#
# and the big batch's is the mean over all its $n = \sum_i n_i$ tokens,
# $L = \frac{1}{n} \sum_t \ell_t = \sum_i \frac{n_i}{n} L_i$. The mean of the
# micro-batches' means, $\frac{1}{k} \sum_i L_i$, gives each micro-batch the
# weight $1/k$ instead of $n_i / n$: a short micro-batch's tokens count more
# than a long one's ({numref}`fig-token-weighting`).

# %% mystnb={"figure": {"caption": "Four padded sequences in two micro-batches, with made-up losses per token (hatched: padding, which counts nothing). Micro-batch 1 holds 14 real tokens, micro-batch 2 only 3. The mean of the two micro-batch means gives those 3 tokens as much weight as the other 14; weighting each micro-batch's mean by its share of the tokens counts every token once and gives the big batch's mean.", "name": "fig-token-weighting"}}
from pargrad.book.plots_accumulation import token_weighting_diagram

fig = token_weighting_diagram()

# %% tags=["hide-input"]
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
      f"gradient off by less than {TOLERANCE:.0e} (float64 rounding)")

# %% tags=["remove-cell"]
assert gap_mean_of_means > 1e-3 and gap_by_tokens <= TOLERANCE
glue("gap_mean_of_means", f"{gap_mean_of_means:.1%}", display=False)

# %% [markdown]
# On this batch the mean of means is off by {glue:text}`gap_mean_of_means` of
# the largest gradient entry; weighting each micro-batch's mean by its share
# of the tokens, $n_i / n$, gives the big batch's gradient to rounding. But
# one batch can be unusually uneven. The same comparison on 200 fresh batches,
# for the same model (`mean_of_means_gaps` takes each micro-batch's token
# count and the gradient of its token *sum*, which give both means):

# %%
FRESH = 200
x_fresh, y_fresh = sequence_data(BATCH * FRESH, seed=1, dtype="float64")
fresh_gaps = mean_of_means_gaps(model, x_fresh, y_fresh, BATCH, K)
low, quarter, median, three_quarters, high = np.percentile(fresh_gaps, [0, 25, 50, 75, 100])
print(f"mean of means vs big batch over {FRESH} fresh batches, gradient off by: "
      f"median {median:.0%}, middle half {quarter:.0%} to {three_quarters:.0%}, "
      f"range {low:.1%} to {high:.0%}")
first_batch_share = np.mean(fresh_gaps < gap_mean_of_means)
print(f"the first batch's {gap_mean_of_means:.0%} is larger than on "
      f"{first_batch_share:.0%} of the fresh batches")

# %% tags=["remove-cell"]
assert fresh_gaps.min() > 1e-3 and median < gap_mean_of_means
glue("fresh_batches", f"{FRESH}", display=False)
glue("fresh_median", f"{median:.0%}", display=False)
glue("fresh_low", f"{low:.1%}", display=False)
glue("fresh_high", f"{high:.0%}", display=False)
glue("first_batch_share", f"{first_batch_share:.0%}", display=False)

# %% [markdown]
# The first batch was an uneven one: typically the mean of means is off by
# {glue:text}`fresh_median` (the median over {glue:text}`fresh_batches`
# batches), ranging from {glue:text}`fresh_low` to {glue:text}`fresh_high`. It
# is never zero and does not average out: every update whose micro-batches
# differ in length gives the short ones' tokens more weight.
#
# ## The fix: weight by tokens, over the whole window
#
# The weights $n_i / n$ need $n$, the tokens of the *whole window*, known only
# after its last micro-batch. So `GradientAccumulator` adds
# $n_i \times \nabla L_i$ (the gradient of the micro-batch's token *sum*) and
# divides by the accumulated $n$ once, when it applies. A mask, passed as
# `sample_weight` (Keras's name for per-example and per-token weights), says
# what counts:

# %%
show_lines(GradientAccumulator.accumulate, "if sample_weight is None:", "self.micro_batches")

# %%
show_lines(GradientAccumulator.mean_gradients, "called = tf.debugging.assert_positive", "return [total")

# %% [markdown]
# `count` is the micro-batch's size with `num_examples`, and the sum of its
# mask (its real tokens) with `sample_weight`; `examples` then holds the
# window's tokens. A micro-batch of padding only adds weight 0 and no NaN
# (`weighted_mean` returns 0, not 0/0); a window of padding only has no mean,
# and applying it says so.
#
# Three trainings of 8 updates with Adam on 128 sequences, batches of 16 in 4
# micro-batches: the big batch, the accumulator weighting by tokens, and the
# accumulator weighting micro-batches equally (the mean of means).

# %% tags=["hide-input"]
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


def gap_text(gap, tolerance):
    """A weight gap as printed: below the rounding tolerance, or its size (2 digits)."""
    return f"below {tolerance:.0e}" if gap <= tolerance else f"{gap:.2g}"


adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
big = train_big_batch(adam)
tolerance = tolerance_for(big, UPDATES * K)
gap_tokens = weight_gap(train_accumulated(adam, by_tokens=True), big)
gap_means = weight_gap(train_accumulated(adam, by_tokens=False), big)
print(f"float64 rounding tolerance after {UPDATES} updates: {tolerance:.0e}")
print(f"weighted by tokens vs big batch: max |weight difference| {gap_text(gap_tokens, tolerance)}")
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
# own tokens. If each divides by its own count and the replicas' gradients are
# averaged, the error returns one level up: the mean of the replicas' token
# means. At the first batch:

# %%
halves = [(x[:8], y[:8]), (x[8:], y[8:])]
replica_parts = [loss_and_gradients(model, xh, yh) for xh, yh in halves]
replica_tokens = [int(tf.reduce_sum(padding_mask(xh))) for xh, _ in halves]
per_replica_mean = [np.mean(gs, axis=0) for gs in zip(*[g for _, g in replica_parts])]
gap_replicas = relative_gap(per_replica_mean, big_gradients)
print(f"real tokens per replica: {replica_tokens}; mean of the replicas' token means: "
      f"gradient off by {gap_replicas:.1%}")
replica_gaps = mean_of_means_gaps(model, x_fresh, y_fresh, BATCH, 2)   # halves of 8
print(f"the same over the {FRESH} fresh batches: median {np.median(replica_gaps):.1%}, "
      f"range {replica_gaps.min():.0%} to {replica_gaps.max():.0%}")

# %% tags=["remove-cell"]
half_tokens = (x_fresh > 0).reshape(FRESH, 2, -1).sum(axis=2)
assert gap_replicas > 1e-3 and np.median(replica_gaps) < gap_replicas
assert np.array_equal(replica_gaps <= TOLERANCE, half_tokens[:, 0] == half_tokens[:, 1])
glue("gap_replicas", f"{gap_replicas:.1%}", display=False)
glue("replica_median", f"{np.median(replica_gaps):.1%}", display=False)
glue("replica_high", f"{replica_gaps.max():.0%}", display=False)

# %% [markdown]
# That is {glue:text}`gap_replicas` on one batch; on the fresh batches above
# the median is {glue:text}`replica_median`, at most
# {glue:text}`replica_high`, and 0 only when both halves hold as many tokens.
#
# So the total weight must be summed over the replicas too, as Hugging Face's
# `Trainer` does since {cite}`transformerspr34373` and Accelerate's
# documentation shows {cite}`acceleratepr3193`. In
# `SyncTrainer(sample_weight=...)` each replica adds up the weights of its
# micro-batches; one all-reduce of that number per update gives the global
# token count $n$; each replica divides its token *sum* by $n$, and the
# gradients' all-reduce then adds up the big batch's token mean. The count
# depends only on the data, so it is known before the forward pass:

# %%
show_lines(SyncTrainer._weighted_replica_gradients, "local = tf.add_n", "return self._shard_gradients")

# %% [markdown]
# `sample_weight(x, y)` returns one weight per value of a micro-batch's loss:
# here `pargrad.book.sequences.token_mask`, the padding mask of `x`. Two
# replicas, each accumulating 2 micro-batches of 4 sequences, against the big
# batch:

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
          f"tokens, vs big batch: weight gap {gap_text(sync_gaps[-1], tolerance)}")
every_position = lambda x, y: tf.ones(tf.shape(x), y.dtype)  # noqa: E731
gap_unmasked = weight_gap(train_sync(2, adam, sample_weight=every_position), big)
print(f"SyncTrainer, 2 replicas, every position weighing 1 (padding too): "
      f"{gap_unmasked:.4f} away")

# %% tags=["remove-cell"]
assert max(sync_gaps) <= tolerance
assert gap_unmasked > 1e6 * tolerance

# %% [markdown]
# Weighting every position 1 is what `SyncTrainer` computes without
# `sample_weight` (each example's loss the mean over its positions, padding
# included): the big batch of a *different* loss. A mask is how you ask for
# tokens.
#
# ### What the extra all-reduce costs
#
# One all-reduce of one float64 per update, beside the all-reduce of every
# gradient entry. In numbers sent:

# %%
parameters = sum(int(np.prod(w.shape)) for w in model.trainable_variables)
print(f"gradient entries all-reduced per update: {parameters}; the token count adds 1, "
      f"a share of {1 / (parameters + 1):.2%} of the numbers")

# %% [markdown]
# In time, an all-reduce also has a fixed start-up cost whatever its size (the
# α of the chapter [What communication costs](10_communication_costs)). We
# measure the processor time of an update on the two replicas (8 sequences
# each, no accumulation, so the count is the only difference; all threads,
# less sensitive to other programs than the wall clock) in interleaved rounds
# of 20 updates without and with the count; each pair gives one ratio.

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
print(f"pairs with the ratio above 1: {int((ratios > 1).sum())} of {PAIRS}")

# %% tags=["nbval-ignore-output", "remove-cell"]
assert np.median(ratios) < 2
glue("count_share", f"{1 / (parameters + 1):.2%}", display=False)
spread = f"the ratios of the pairs run from {ratios.min():.2f} to {ratios.max():.2f}"
glue("cost_verdict", f"{spread}, all on one side of 1, so this measurement resolves the "
     "count's cost; its size is the median ratio above" if resolved else
     f"{spread}, on both sides of 1: the count's cost is below what this measurement "
     "resolves, which is no finer than that scatter between pairs", display=False)

# %% [markdown]
# The count is {glue:text}`count_share` of the numbers sent; in time
# {glue:text}`cost_verdict`. On this tiny model an update is dominated by
# launching work on the two replicas; next to a real model's millions of
# gradient entries, one number is smaller still.
#
# An alternative avoids the extra all-reduce: divide every micro-batch by a
# constant independent of the data, the number of positions a full
# micro-batch can hold. Keras's default reduction does so (below), and so
# does the `dr_grpo` loss of Hugging Face TRL's `GRPOTrainer`, which divides
# by the number of completions in the micro-batch times
# `max_completion_length` {cite}`trlpr3256`: consistent across micro-batches,
# but the step shrinks with the share of padding.
#
# ## Keras 3's `gradient_accumulation_steps` on the same data
#
# Keras 3 optimizers accumulate when given `gradient_accumulation_steps=k`.
# Their code (`keras/src/optimizers/base_optimizer.py`,
# `_backend_apply_gradients`) adds each call's gradients into accumulators
# and, on every $k$-th call, applies $(g + \sum \text{acc}) / k$: the plain
# mean of the $k$ micro-batch gradients. With a mask passed to `fit` as
# `sample_weight`, what each gradient holds depends on the loss's *reduction*:
#
# - `reduction="mean_with_sample_weight"`: the micro-batch's loss is its
#   token mean, and accumulation gives the mean of the token means;
# - the default, `"sum_over_batch_size"`: the micro-batch's loss is its
#   masked sum divided by the number of *positions*, padding included, a
#   divisor that does not depend on the mask.
#
# Both against our two accumulations (SGD, one update, micro-batches of 4,
# $k = 4$, the loss in float64):

# %% tags=["hide-input"]
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
    print(f"Keras {name:58s} weight gap: {gap_text(weight_gap(a, b), tolerance_1)}")

# %% tags=["remove-cell"]
assert [weight_gap(a, b) <= tolerance_1 for _, a, b in rows] == [True, True, False, True, False]

# %% [markdown]
# With the token-mean reduction, Keras's accumulation is the mean of the
# micro-batches' token means (our wrong run), not its own big batch. With the
# default reduction it equals Keras's own big batch, since every micro-batch
# is divided by the same number of positions; but that loss is not the token
# mean: a batch with more padding takes a smaller step. No Keras setting gives
# the window's token mean: that needs the window's token count, which Keras's
# optimizer never sees. (Under `MirroredStrategy`,
# `gradient_accumulation_steps` does not run at all: see the chapter
# "Accumulation in TF2 and across replicas".)
#
# ### A learning-rate schedule counts micro-steps
#
# The same code keeps one step counter, `_iterations`, incremented on *every*
# call. Its public `iterations` returns `_iterations // k` (updates), which
# Adam's bias correction reads; but a learning-rate schedule is called with
# `_iterations` (its docstring: "Learning rate schedules will look at 'real'
# iterations value"). A schedule written in updates runs $k$ times too fast.
# Two updates of $k = 4$ (32 sequences), at a rate of 0.1 for updates 0 and 1
# and 0.01 after, against big batches of 16:

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
print(f"Keras accumulation vs its big batch with the schedule:       weight gap "
      f"{gap_text(as_scheduled, tolerance_2)}")
print(f"Keras accumulation vs its big batch at 0.01 for both updates: weight gap "
      f"{gap_text(at_001, tolerance_2)}")

# %% tags=["remove-cell"]
assert int(optimizer.iterations) == 2 and int(optimizer._iterations) == 2 * K
assert at_001 <= tolerance_2 < as_scheduled

# %% [markdown]
# Without the schedule these runs were equal (the default reduction, above);
# with it, the accumulated run took both updates at 0.01: the schedule was
# called at micro-steps $k - 1$ and $2k - 1$, both past its boundary. In
# Keras, give the optimizer a schedule of updates, `step // k`:

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
      f"weight gap {gap_text(gap_fixed, tolerance_2)}")

# %% tags=["remove-cell"]
assert gap_fixed <= tolerance_2

# %% [markdown]
# `GradientAccumulator` calls the optimizer once per update, so its schedule
# counts updates and the big batch's schedule applies unchanged:

# %%
scheduled = lambda: keras.optimizers.Adam(  # noqa: E731
    keras.optimizers.schedules.PiecewiseConstantDecay([3], [0.01, 0.001]))
big_scheduled = train_big_batch(scheduled)
gap_scheduled = weight_gap(train_accumulated(scheduled, by_tokens=True), big_scheduled)
print(f"GradientAccumulator with a schedule in updates vs the big batch: weight gap "
      f"{gap_text(gap_scheduled, tolerance)}")

# %% tags=["remove-cell"]
assert gap_scheduled <= tolerance

# %% [markdown]
# ## Other ways accumulation differs from the big batch
#
# ### Dropout
#
# Dropout draws a new mask on every forward pass: one for the big batch, four
# for four micro-batches. The runs are then not equal, but they are the same
# *random* computation: each token is dropped with the same probability. How
# far apart are they, next to the big batch under another draw?

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

# %% tags=["remove-cell"]
assert gap_other_draw / 4 < gap_accumulated < 4 * gap_other_draw

# %% [markdown]
# The accumulated gradient differs from the big batch's by about as much as
# another draw does: dropout's noise, not an accumulation error. Equality to
# rounding needs dropout off (or the same masks, cut into micro-batches by
# hand).
#
# ### Shuffling across the window
#
# Within a window the order of the micro-batches does not matter (to
# rounding): the accumulator adds them up. Across windows it does: a pipeline
# that shuffles examples after cutting windows, or draws micro-batches
# independently, trains on other big batches. Reversing each window's
# micro-batches, then moving one sequence between the first two windows:

# %%
reordered = [(xb[::-1], yb[::-1]) for xb, yb in batches]        # micro-batches reversed
gap_reordered = weight_gap(train_accumulated(adam, by_tokens=True, batches=reordered), big)
swapped_x, swapped_y = x_all.copy(), y_all.copy()
swapped_x[[0, BATCH]], swapped_y[[0, BATCH]] = x_all[[BATCH, 0]], y_all[[BATCH, 0]]
swapped = [(swapped_x[u * BATCH:(u + 1) * BATCH], swapped_y[u * BATCH:(u + 1) * BATCH])
           for u in range(UPDATES)]
gap_swapped = weight_gap(train_accumulated(adam, by_tokens=True, batches=swapped), big)
print(f"micro-batches in reverse order within each window: weight gap "
      f"{gap_text(gap_reordered, tolerance)}")
print(f"one sequence moved to the next window: weight gap {gap_text(gap_swapped, tolerance)}")

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
# - **apply it**: weighted by tokens, its update is the token mean of its 8
#   sequences, as in a big-batch run with a smaller last batch (which Keras's
#   `fit` runs);
# - **drop it**: throws data away every epoch, with a fixed order always the
#   same data;
# - **rescale it** as if it were full (divide by a full window's count):
#   shrinks its step by the missing share, for no reason a loss can state.
#
# We apply it, the only choice that is again some big batch: with
# `GradientAccumulator`, call `apply()` after the loop when `micro_batches` is
# not 0:

# %%
short = batches[:7] + [(x_all[112:120], y_all[112:120])]
gap_partial = weight_gap(train_accumulated(adam, by_tokens=True, batches=short,
                                           apply_partial=True), train_big_batch(adam, short))
print(f"7 full windows and one of 8 sequences, applied, vs the big batch with a last "
      f"batch of 8: weight gap {gap_text(gap_partial, tolerance)}")
_, keras_optimizer = keras_fit("sum_over_batch_size", K, 4, x=x_all[:24], y=y_all[:24])
left = max(float(np.abs(a.numpy()).max()) for a in keras_optimizer._accumulated_gradients)
print(f"Keras, 24 sequences in micro-batches of 4, k = 4: {int(keras_optimizer.iterations)} "
      f"update, {int(keras_optimizer._iterations) % K} micro-batches left in its accumulators "
      f"(largest entry {left:.2f}): neither applied nor dropped")

# %% tags=["remove-cell"]
assert gap_partial <= tolerance
assert int(keras_optimizer._iterations) % K == 2 and left > 0

# %% [markdown]
# Keras keeps the partial window's gradients and adds them to the next epoch's
# first micro-batches, a window of other data (and older weights).
# `SyncTrainer` refuses a last batch that does not split evenly over replicas
# × micro-batches, with an error that says which sizes work.
#
# ### BatchNorm
#
# BatchNorm normalises with its batch's statistics, so $k$ micro-batches use
# $k$ different statistics: accumulation is then not the big batch, tokens or
# not. The chapter [Accumulation in TF2 and across
# replicas](07_accumulation_tf2) measures it (its section "BatchNorm:
# micro-batches are not the big batch"), replicas included. Sequence models
# mostly use layer normalisation, which looks at one token at a time and so
# accumulates exactly.
#
# ## The accumulation thread, on sequences
#
# The accumulation thread's answers 1 and 3 ([Where this book
# starts](00_sources)) accumulate $k$ gradients, then apply their *sum*
# (answer 1) or their sum divided by a counter of micro-batches (answer 3).
# With micro-batches of equal size and a mean over examples, answer 3 is right
# and answer 1's gradient is $k$ times too large: a step $k$ times too large
# with SGD or momentum, harmless with the Adam optimizer its own code uses,
# which divides the factor away ([Accumulating gradients in TF1
# graphs](06_accumulation_tf1)). On sequences, each micro-batch's gradient is
# of its token mean:

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
# Answer 3 becomes the mean of token means, answer 1 that times $k$. The fix
# keeps answer 3's shape, a counter and one division, but counts tokens:
# accumulate each micro-batch's token *sum* and divide by the window's tokens,
# over all replicas.
#
# ## Summary
#
# - On sequences the loss is a mean over tokens, and micro-batches of as many
#   sequences hold different numbers of tokens, so the mean of their token means
#   is not the big batch's: here typically {glue:text}`fresh_median` of the
#   gradient ({glue:text}`fresh_low` to {glue:text}`fresh_high` over fresh
#   batches), and a different training after a few updates.
# - `GradientAccumulator(..., sample_weight=mask)` weights each micro-batch
#   by its tokens and divides by the window's tokens once: the big batch to
#   float64 rounding, for SGD and Adam.
# - Across replicas the token count is summed over them too:
#   `SyncTrainer(sample_weight=token_mask)` adds one all-reduce of one number
#   per update; the mean of per-replica token means is typically off by
#   {glue:text}`replica_median`.
# - Keras 3's `gradient_accumulation_steps` averages its $k$ micro-batch
#   gradients equally: with the token-mean reduction that is the mean of
#   means; with the default reduction it matches Keras's own big batch, whose
#   loss divides by positions, padding included. Its schedules count
#   micro-steps, not updates.
# - Dropout makes accumulation differ from the big batch by about the noise of
#   another draw; shuffling within a window changes nothing, across windows it
#   changes the batches; a partial last window is best applied; BatchNorm breaks
#   the equality ([Accumulation in TF2 and across
#   replicas](07_accumulation_tf2)).
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
      f"weighted by tokens {gap_text(gap_sorted_tokens, tolerance)}")
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
