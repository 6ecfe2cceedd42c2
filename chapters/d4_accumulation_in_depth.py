# %% [markdown]
# # Accumulation in depth
#
# ```{admonition} Takeaway
# A small batch's gradient is noisy in proportion to one over its size, and
# accumulating $k$ micro-batches has a $k$ times larger batch's noise. The
# accumulator's state survives a checkpoint in mid-window. On replicas,
# accumulating spreads each update's fixed cost over $k$ micro-batches; the
# linear scaling rule holds until too few updates are left.
# ```
#
# This optional page holds the measurements that the chapter
# [Accumulation in TF2 and across replicas](07_accumulation_tf2) only cites;
# read its sections in any order.
#
# **In this chapter you will**
#
# - measure gradient noise, the accumulation thread's other reason to
#   accumulate, and see when a learning-rate schedule is the cheaper answer;
# - measure what accumulating before the all-reduce buys in throughput;
# - try the linear scaling rule and warm-up on a digits classifier;
# - measure the gradient buffers' memory on every replica;
# - stop a training in mid-window and resume it bit for bit.

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

# %% tags=["hide-input"]
import tempfile
import time

import numpy as np
import pargrad

devices = pargrad.logical_devices(4)

import keras  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402
from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.book import digits  # noqa: E402
from pargrad.book.parabola import (  # noqa: E402
    fit_one_device, initial_weights, parabola_data, parabola_forward, parabola_model)
from pargrad.strategies import sync_strategy  # noqa: E402
from pargrad.sync import SyncTrainer  # noqa: E402

keras.utils.set_random_seed(0)
tf.config.experimental.enable_tensor_float_32_execution(False)
x_all, y_all = parabola_data()
K = 5  # micro-batches per update, of 10 examples each
four_replicas = sync_strategy(4)


def mean_squared_error(model, x, y):
    return tf.reduce_mean(tf.square(model(x, training=True) - y))


def micro_batch_stepper(model, accumulator):
    """A compiled function: gradients of one micro-batch, handed to the accumulator."""

    @tf.function
    def train_micro_batch(x, y):
        with tf.GradientTape() as tape:
            loss = mean_squared_error(model, x, y)
        gradients = tape.gradient(loss, model.trainable_variables)
        return accumulator.step(gradients, tf.shape(x)[0])

    return train_micro_batch


# %% [markdown]
# ## Noise: the accumulation thread's other reason
#
# The asker of the accumulation thread ([Where this book starts](00_sources))
# had a second reason besides memory: one small batch's gradient is too
# noisy. Its {term}`gradient noise`, the mean of $\lVert g_b - g \rVert^2$
# over random batches of $b$ examples ($g$ the full-batch gradient), falls as
# $1/b$: with $\sigma^2$ the mean of $\lVert g_i - g \rVert^2$ over the $N$
# examples' own gradients $g_i$, $b$ of them drawn without replacement give
# $\frac{\sigma^2}{b} \cdot \frac{N - b}{N - 1}$. We measure it on the y = x²
# network in float64, at the initial weights and after 2000 full-batch
# steps, with 2000 random batches per size:

# %% tags=["hide-input"]
def per_example_gradients(weights):
    """One row per example: the gradient of its squared error, all weights flattened."""
    variables = [tf.Variable(w.astype(np.float64)) for w in weights]
    x64, y64 = x_all.astype(np.float64), y_all.astype(np.float64)
    with tf.GradientTape() as tape:
        losses = tf.reduce_sum(tf.square(parabola_forward(x64, variables) - y64), axis=1)
    return np.concatenate([tf.reshape(j, [len(x64), -1]).numpy()
                           for j in tape.jacobian(losses, variables)], axis=1)


_, trained_weights = fit_one_device(x_all, y_all, steps=2000, learning_rate=0.01, seed=0)
NOISE_SIZES, DRAWS, N = [1, 2, 5, 10, 25], 2000, len(x_all)
noise = {}
for label, weights in [("initial weights", initial_weights(seed=0)),
                       ("after 2000 steps", trained_weights)]:
    per_example = per_example_gradients(weights)
    full = per_example.mean(axis=0)
    sigma2 = np.mean(np.sum((per_example - full) ** 2, axis=1))
    rng = np.random.default_rng(0)
    draws = [np.array([np.sum((per_example[rng.choice(N, b, replace=False)].mean(axis=0)
                               - full) ** 2) for _ in range(DRAWS)]) for b in NOISE_SIZES]
    measured = [d.mean() for d in draws]
    standard_errors = [d.std() / np.sqrt(DRAWS) for d in draws]
    predicted = [sigma2 / b * (N - b) / (N - 1) for b in NOISE_SIZES]
    # accumulating 5 micro-batches of 2, drawn without replacement within a window
    accumulated = np.mean([np.sum((np.mean(np.split(per_example[rng.choice(N, 10, replace=False)], 5),
                                           axis=(0, 1)) - full) ** 2) for _ in range(DRAWS)])
    scale = np.sum(full ** 2)
    noise[label] = (np.array(measured) / scale, np.array(predicted) / scale, accumulated / scale)
    print(f"{label}: noise / |g|^2 for batches of {NOISE_SIZES}:",
          [f"{v:.3g}" for v in noise[label][0]])
    print(f"{'':{len(label)}}  5 accumulated micro-batches of 2: {noise[label][2]:.3g}"
          f"  (a batch of 10: {noise[label][0][NOISE_SIZES.index(10)]:.3g})")
    # The prediction is exact for draws without replacement; the measured mean
    # of DRAWS draws misses it only by sampling error: within five standard errors.
    assert all(abs(m - p) < 5 * se for m, p, se in zip(measured, predicted, standard_errors))
at_start, trained = noise["initial weights"][0], noise["after 2000 steps"][0]
assert at_start[NOISE_SIZES.index(5)] < 1 < trained[NOISE_SIZES.index(25)]

# %% mystnb={"figure": {"caption": "Gradient noise of the y = x\u00b2 network against the batch size, relative to the squared length of the full-batch gradient, at the initial weights and after 2000 full-batch steps. Dots: measured over random batches; dashed: the prediction, which falls as one over the batch size.", "name": "fig-gradient-noise"}}
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.4))
for (label, (measured, predicted, _)), color in zip(noise.items(), ["C0", "C1"]):
    ax.loglog(NOISE_SIZES, measured, "o", color=color, label=f"{label}, measured")
    ax.loglog(NOISE_SIZES, predicted, "--", color=color, label=f"{label}, predicted")
ax.set_xlabel("batch size b")
ax.set_ylabel("noise / |full-batch gradient|²")
ax.legend(fontsize=9)
fig.tight_layout()

# %% [markdown]
# {numref}`fig-gradient-noise` confirms the $1/b$ law and shows when the
# asker is right. At the initial weights the full-batch gradient is large: a
# batch of 5 already has less noise than the gradient's squared length. After
# 2000 steps the full-batch gradient is small and the examples' own gradients
# are not: even a batch of 25 is noisier than that. Accumulating $k$
# micro-batches of $b$, drawn without replacement, is a batch of $kb$ with its
# noise (the line "5 accumulated micro-batches of 2" above), for the memory
# of one micro-batch.
#
# ### Accumulation, or a smaller learning rate?
#
# The noise enters each step as $\eta\,(g_b - g)$, so to first order SGD's
# wandering depends on the ratio $\eta / b$
# {cite}`smith2018dont,mccandlish2018empirical`: a larger (accumulated) batch
# and a smaller learning rate quiet it alike. Against noise alone, a
# learning-rate schedule (lower $\eta$ as the loss flattens) is cheaper: no
# extra memory, no fewer updates; growing the batch during training works
# like decaying the rate {cite}`smith2018dont`. Accumulation is the tool when
# the *effective batch* itself is needed: a recipe tuned for a batch that
# does not fit your device, or expensive updates, such as an all-reduce
# across machines, made $k$ times rarer. Beyond McCandlish et al.'s *critical
# batch size* {cite}`mccandlish2018empirical`, where the noise is small next
# to the gradient, a larger batch only costs time.

# %% [markdown]
# ## What accumulating before the all-reduce buys
#
# `SyncTrainer(accumulation_steps=k)` sums each replica's micro-batch
# gradients before the all-reduce: one all-reduce per update instead of $k$.
# We measure how many examples per second four logical devices process with
# a fixed micro-batch of 8 and growing $k$, each $k$ in three interleaved
# rounds, and print the best and the spread:

# %% tags=["nbval-ignore-output", "hide-input"]
def throughput_trainer(accumulation_steps, micro_batch=8, steps=40):
    """A trainer on the four replicas with a fixed micro-batch, traced and warmed up."""
    with four_replicas.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, four_replicas, loss=digits.cross_entropy_per_example,
                          learning_rate=0.1, accumulation_steps=accumulation_steps, progress=False)
    batch = micro_batch * accumulation_steps * four_replicas.num_replicas_in_sync
    trainer.fit(x_digits, y_digits, steps=steps, batch_size=batch, steps_per_call=steps)  # trace
    return trainer, batch


def examples_per_second(trainer, batch, steps=40):
    """Measured training throughput of one call of `steps` steps."""
    start = time.perf_counter()
    trainer.fit(x_digits, y_digits, steps=steps, batch_size=batch, steps_per_call=steps)
    return steps * batch / (time.perf_counter() - start)


x_digits, y_digits, _, _ = digits.digits_data(seed=0)
throughput_trainers = {k: throughput_trainer(k) for k in (1, 2, 4, 8)}
rounds = {k: [] for k in throughput_trainers}
for _ in range(3):  # interleaved, so that a busy moment cannot favour one k
    for k, (trainer, batch) in throughput_trainers.items():
        rounds[k].append(examples_per_second(trainer, batch))
throughput = {k: max(rates) for k, rates in rounds.items()}
for k, rates in rounds.items():
    print(f"k = {k}: best {max(rates):8.0f} examples/s ({max(rates) / throughput[1]:.2f}x k = 1), "
          f"rounds from {min(rates):.0f} to {max(rates):.0f}")

# %% tags=["remove-cell"]
# "accumulating spreads the fixed cost": the worst round at k = 8 beats the best at k = 1
assert min(rounds[8]) > max(rounds[1]), "accumulating should amortise the per-update cost"

# %% [markdown]
# Each update carries a fixed cost (launching the step, the all-reduce, the
# update); accumulating spreads it over $k$ micro-batches, so the throughput
# grows with $k$ until the micro-batches' own computation dominates. The cell
# checks only the robust part: every round at $k = 8$ beats every round at
# $k = 1$. Across GPUs or machines the all-reduce is a network transfer, a
# larger fixed cost to spread (the chapter "What communication costs").
#
# ## The linear scaling rule on the digits
#
# With the effective batch $k$ times larger, an epoch has $k$ times fewer
# updates of the same length. Goyal et al.'s {term}`linear scaling rule`
# {cite}`goyal2017accurate` multiplies the learning rate by $k$, after a
# warm-up; the chapter
# [Accumulation in TF2 and across replicas](07_accumulation_tf2) gives the
# approximation it rests on. We test it on scikit-learn's 8×8 handwritten
# digits (a small MLP) on four replicas, at equal numbers of examples seen:

# %% tags=["hide-input"]
x_train, y_train, x_test, y_test = digits.digits_data(seed=0)
EXAMPLES = 16_384


def train_digits(accumulation_steps, learning_rate, micro_batch=8):
    """Train on EXAMPLES examples; returns (examples seen per update, losses, test accuracy)."""
    strategy = four_replicas
    with strategy.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, strategy, loss=digits.cross_entropy_per_example,
                          learning_rate=learning_rate, accumulation_steps=accumulation_steps,
                          progress=False)
    batch = micro_batch * accumulation_steps * strategy.num_replicas_in_sync
    steps = EXAMPLES // batch
    history = trainer.fit(x_train, y_train, steps=steps, batch_size=batch, steps_per_call=steps)
    seen = batch * np.arange(1, steps + 1)
    return seen, history.loss, digits.accuracy(model, x_test, y_test)


BASE_RATE = 0.05
configurations = {  # name: (accumulation steps k, learning rate)
    "batch 32 (k = 1), lr 0.05": (1, BASE_RATE),
    "batch 256 (k = 8), lr 0.05": (8, BASE_RATE),
    "batch 256 (k = 8), lr 0.4, scaled": (8, 8 * BASE_RATE),
    "batch 1024 (k = 32), lr 1.6, scaled": (32, 32 * BASE_RATE),
}
results = {name: train_digits(*settings) for name, settings in configurations.items()}
for name, (seen, losses, test_accuracy) in results.items():
    print(f"{name:42} updates {len(losses):3}  final loss {np.mean(losses[-4:]):.3f}  "
          f"test accuracy {test_accuracy:.3f}")

# %% mystnb={"figure": {"caption": "Training loss of the digits MLP on four replicas against the examples seen, for effective batches of 32, 256 and 1024, with the learning rate unchanged and scaled with the batch (the linear scaling rule).", "name": "fig-linear-scaling"}}
fig, ax = plt.subplots(figsize=(6.5, 3.6))
for name, (seen, losses, _) in results.items():
    ax.plot(seen, losses, label=name)
ax.set_xlabel("examples seen")
ax.set_ylabel("training loss (batch)")
ax.set_yscale("log")
ax.set_title("Same examples, different effective batches")
ax.legend(fontsize=9)
fig.tight_layout()

# %% [markdown]
# With the learning rate unchanged ({numref}`fig-linear-scaling`), the larger
# effective batch learns far less from the same examples: eight times fewer
# steps of the same length. Scaling the rate with the batch brings it close to
# the small batch. At $k = 32$ the approximation breaks: the gradients change
# over 32 small steps, so one step 32 times longer overshoots, the loss
# bounces, and the test accuracy collapses.
#
# ### Warm-up
#
# Goyal et al. raise the rate linearly from the small batch's to $k$ times it
# over the first five epochs, where the gradients change fastest. Our batch of
# 1024 is most of the training set, so five epochs are a handful of updates
# (printed below). At a rate of 1.6 the accuracies depend on the order of
# floating-point additions, so another machine prints other digits; the
# cell's checks hold on any.

# %% tags=["nbval-ignore-output", "hide-input"]
def train_with_warm_up(accumulation_steps, peak_rate, warm_up_updates, evaluate_after,
                       micro_batch=8):
    """Linear warm-up from BASE_RATE to peak_rate; test accuracy after each of evaluate_after."""
    strategy = four_replicas
    with strategy.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, strategy, loss=digits.cross_entropy_per_example,
                          learning_rate=BASE_RATE, accumulation_steps=accumulation_steps,
                          progress=False)
    batch = micro_batch * accumulation_steps * strategy.num_replicas_in_sync
    accuracies = {}
    for update in range(max(evaluate_after)):
        ramp = min(1.0, update / warm_up_updates) if warm_up_updates else 1.0
        trainer.optimizer.learning_rate = BASE_RATE + ramp * (peak_rate - BASE_RATE)
        trainer.fit(x_train, y_train, steps=1, batch_size=batch)
        if update + 1 in evaluate_after:
            accuracies[update + 1] = digits.accuracy(model, x_test, y_test)
    return accuracies


WARM_UP = round(5 * len(x_train) / 1024)  # five epochs, in updates of 1024 examples
same_examples = EXAMPLES // 1024
warm = train_with_warm_up(32, 32 * BASE_RATE, WARM_UP, (same_examples, 4 * same_examples))
cold = train_with_warm_up(32, 32 * BASE_RATE, 0, (same_examples, 4 * same_examples))  # the control
print(f"warm-up: {WARM_UP} updates (five epochs of {len(x_train)} training examples)")
no_warm_up = results["batch 1024 (k = 32), lr 1.6, scaled"]
small_batch = results["batch 32 (k = 1), lr 0.05"]
print(f"{f'batch 1024, lr 1.6, no warm-up, {same_examples} updates':46} "
      f"test accuracy {no_warm_up[2]:.3f}")
for updates, test_accuracy in warm.items():
    print(f"{f'batch 1024, lr 1.6, warm-up, {updates} updates':46} test accuracy {test_accuracy:.3f}")
for updates, test_accuracy in cold.items():
    print(f"{f'batch 1024, lr 1.6, no warm-up, {updates} updates':46} "
          f"test accuracy {test_accuracy:.3f}")
print(f"{f'batch 32, lr 0.05, {len(small_batch[1])} updates':46} "
      f"test accuracy {small_batch[2]:.3f}")

# %% tags=["remove-cell"]
short, long = warm[same_examples], warm[4 * same_examples]
assert short < small_batch[2] - 0.1  # warm-up alone does not rescue 16 updates
assert long > short + 0.1
assert cold[4 * same_examples] > cold[same_examples] + 0.1  # the control: more updates help too

# %% [markdown]
# Warm-up alone does not rescue the batch of 1024: with the same examples as
# the others it makes a handful of updates, a good part of them warming up,
# and stays far below the small batch. With four times the examples, and so
# the updates, the warmed-up run does much better, but so does the control,
# the same 64 updates at the scaled rate without warm-up: most of the
# recovery comes from the extra updates (whether warm-up adds more, one run
# at this rate cannot tell; see exercise 2). At equal examples, then, a batch that is most of the
# training set leaves too few updates for the linear scaling rule, with or
# without warm-up. Goyal et al.'s rule, with warm-up, held up to batches of
# 8,192 ImageNet images (a small fraction of their training set) and broke
# down beyond: a starting point to check, not a law.

# %% [markdown]
# ## The gradient buffers' memory
#
# Every run above keeps the micro-batch at 8 examples a replica, so a step's
# activations stay one micro-batch's. Accumulation adds the running sum of
# the gradients, one tensor per parameter, on every replica. We measure one
# update without accumulation and one accumulating four micro-batches, each
# in a fresh process, since memory a finished run gave back would hide the
# next peak (`pargrad.book.peaks`), on a wider network of the digits MLP's
# shape:

# %% tags=["nbval-ignore-output"]
from pargrad.book import peaks

buffer_mb = peaks.REPLICAS * peaks.probe_parameter_bytes(1024) / 2**20
plain_update = peaks.sync_update_peak_memory(1, width=1024)
accumulating = peaks.sync_update_peak_memory(4, width=1024)
extra_buffers = (accumulating["rise_mb"] - plain_update["rise_mb"]) / buffer_mb
print(f"peak rose by {plain_update['rise_mb']:.0f} MB without accumulation, "
      f"{accumulating['rise_mb']:.0f} MB accumulating 4 micro-batches ({accumulating['device']})")
print(f"the difference: {extra_buffers:.1f} x the parameters' size on every replica")
if accumulating["resettable"]:
    # "not free in memory": at least about one parameter-sized buffer on every replica
    assert extra_buffers > 0.5

# %% [markdown]
# So accumulation is not free in memory: at least about one parameter-sized
# buffer on every replica (the running sum, beside the current micro-batch's
# gradient), and here more (printed above): `SyncTrainer` unrolls the $k$
# micro-batches into one graph, and TensorFlow may compute their independent
# gradients at once and hold them together. For this small network the
# buffers outweigh a micro-batch's activations; for a large model with long
# inputs the activations dominate. That is accumulation's trade: buffers the
# size of the parameters instead of activations that grow with the batch.

# %% [markdown]
# ## Stop in the middle of a window, resume bit for bit
#
# `GradientAccumulator` is a `tf.Module` whose sums and counts are variables,
# so `tf.train.Checkpoint` saves a half-summed window with the model and the
# optimizer. We train twelve micro-batches (two windows of five and two into
# the third) in one go, then again with a stop after seven, a checkpoint, and
# a restart into freshly built objects. Bit for bit also needs deterministic
# kernels: a GPU may add in whatever order its threads finish;
# `enable_op_determinism` rules that out (on a CPU it changes nothing here):

# %% tags=["hide-input"]
tf.config.experimental.enable_op_determinism()
schedule = [(x_all[i::K], y_all[i::K]) for i in range(K)] * 3  # 15 micro-batches of 10


def fresh_training(seed):
    model = parabola_model(seed=seed)
    optimizer = keras.optimizers.Adam(0.05)
    accumulator = GradientAccumulator(model.trainable_variables, K, optimizer)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, accumulator=accumulator)
    return model, accumulator, checkpoint, micro_batch_stepper(model, accumulator)


model, _, _, train_micro_batch = fresh_training(seed=0)
for x, y in schedule[:12]:
    train_micro_batch(x, y)
uninterrupted = model.get_weights()

with tempfile.TemporaryDirectory() as directory:
    model, accumulator, checkpoint, train_micro_batch = fresh_training(seed=0)
    for x, y in schedule[:7]:
        train_micro_batch(x, y)
    path = checkpoint.save(f"{directory}/training")
    print("stopped with", int(accumulator.micro_batches), "micro-batches and",
          int(accumulator.examples), "examples in the window")

    model, accumulator, checkpoint, train_micro_batch = fresh_training(seed=1)
    checkpoint.restore(path).assert_consumed()
    print("restored:   ", int(accumulator.micro_batches), "micro-batches and",
          int(accumulator.examples), "examples in the window")
    for x, y in schedule[7:12]:
        train_micro_batch(x, y)
resumed_gap = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), uninterrupted))
print("largest weight difference from the uninterrupted run:", resumed_gap)

# %% tags=["remove-cell"]
assert resumed_gap == 0.0  # bit for bit

# %% [markdown]
# ## Summary
#
# - Gradient noise falls as one over the batch size; $k$ accumulated
#   micro-batches of $b$ have the noise of a batch of $kb$. Against noise
#   alone a learning-rate schedule is cheaper; accumulate when the effective
#   batch itself is needed.
# - Accumulating before the all-reduce spreads each update's fixed cost
#   (launch, all-reduce, update) over $k$ micro-batches.
# - The linear scaling rule recovers much of the progress a larger batch
#   loses per example; a batch that is most of the training set leaves too
#   few updates for it, with or without warm-up.
# - Accumulation costs at least one parameter-sized buffer per replica.
# - The accumulator's state is checkpointed with the model: a run stopped in
#   mid-window resumes bit for bit.
#
# ## Exercises
#
# 1. Measure the gradient noise at the initial weights for batches drawn
#    *with* replacement. Which factor of the prediction disappears?
#
#    *Hint:* `rng.choice(N, b, replace=True)`.
# 2. Vary the warm-up of the batch-1024 run: half of `WARM_UP`, `WARM_UP`,
#    and twice `WARM_UP` updates, each trained for `4 * same_examples`
#    updates. Does a longer warm-up help, and how would you tell a real
#    difference from the order-of-additions noise at this rate?
#
#    *Hint:* `train_with_warm_up(32, 32 * BASE_RATE, warm_up, (4 * same_examples,))`;
#    repeat each with a few seeds of `digits.digits_model(seed=...)` before
#    comparing.
# 3. Replace the micro-batch count $k$ by replicas: 8 logical devices with
#    $k = 4$ against 4 with $k = 8$. Which is faster on two CPU cores, and why
#    would the answer differ on eight real GPUs?
#
#    *Hint:* on two cores, what does a replica add that a micro-batch does
#    not?
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# Drawn with replacement, the $b$ examples are independent, so the noise is
# $\sigma^2 / b$ exactly: the finite-population factor $(N - b)/(N - 1)$
# disappears. It matters for large $b$: a batch of all 50 points, drawn
# without replacement, has no noise at all.
# ```
#
# ```{dropdown} Solution to exercise 2
# Run the three warm-ups with the same number of updates and compare their
# test accuracies. At this rate a single run's accuracy depends on the order
# of floating-point additions, so one run each cannot rank them: repeat each
# warm-up with several model seeds, fix the rule before looking (for
# example, the mean accuracy over the seeds, with a difference counted only
# when it exceeds twice the standard error of the paired differences), and
# call a smaller difference a tie. Warm-up addresses the first updates,
# where the gradient changes fastest; it cannot restore the updates that a
# batch of most of the training set leaves out, which is the limit the
# section found.
# ```
#
# ```{dropdown} Solution to exercise 3
# On two CPU cores, 4 replicas with $k = 8$ are usually faster: every
# replica adds a shard to the all-reduce and a copy of the step to launch,
# while the two cores stay two; a micro-batch adds only computation. On eight
# real GPUs each replica brings its own compute, so 8 replicas with $k = 4$
# halve the time per update, as long as the all-reduce of the gradients
# stays small next to the computation.
# ```
