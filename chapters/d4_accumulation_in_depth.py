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
# [Accumulation in TF2 and across replicas](07_accumulation_tf2) only cites.
# Read it after that chapter, in any order of its sections.
#
# **In this chapter you will**
#
# - measure the accumulation thread's other reason to accumulate, gradient
#   noise, and see when a learning-rate schedule is the cheaper answer;
# - measure what accumulating before the all-reduce buys in throughput;
# - try the linear scaling rule and warm-up on a digits classifier;
# - measure the memory of the gradient buffers on every replica;
# - stop a training in the middle of an accumulation window and resume it,
#   bit for bit.

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
import tempfile
import time

import numpy as np
import pargrad

devices = pargrad.logical_devices(4)

import keras  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402
from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.book import digits, memory  # noqa: E402
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


def per_example_cross_entropy(labels, logits):
    """Cross-entropy of each example (SyncTrainer scales by the effective batch)."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(tf.reshape(labels, [-1]), tf.int32), logits=logits)

# %% [markdown]
# ## Noise: the accumulation thread's other reason
#
# Memory is one reason to accumulate. The asker of the accumulation thread
# ([Where this book starts](00_sources)) gave another: the gradient of one
# small batch is too noisy. A mini-batch gradient is an estimate of the
# full-batch gradient $g$, and its {term}`gradient noise`, the mean of
# $\lVert g_b - g \rVert^2$ over random batches of $b$ examples, falls as
# $1/b$: with $\sigma^2$ the mean of $\lVert g_i - g \rVert^2$ over the
# $N$ examples' own gradients $g_i$, drawing $b$ of them without replacement
# gives $\frac{\sigma^2}{b} \cdot \frac{N - b}{N - 1}$. We measure it on the
# y = x² question's network, from the 50 examples' own gradients (float64, so
# that only the sampling varies), at the initial weights and after 2000
# full-batch steps, with 2000 random batches for each size:

# %%
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
ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# {numref}`fig-gradient-noise` confirms the $1/b$ law, and shows when the
# asker is right. At the initial weights the full-batch gradient is large: a
# batch of 5 points already has less noise than the squared length of the
# gradient it estimates. After 2000 steps the full-batch gradient is small and
# the examples' own gradients are not: even a batch of 25 has more noise than
# that, and an update from one or two points is mostly noise. Accumulating
# $k$ micro-batches of $b$, drawn without replacement, is a batch of $kb$ and
# has its noise (the line "5 accumulated micro-batches of 2" above differs
# from a batch of 10 only by sampling), for the memory of one micro-batch.
#
# ### Accumulation, or a smaller learning rate?
#
# What the noise does to training is the random part of each step,
# $\eta\,(g_b - g)$: its size grows with the learning rate $\eta$ and falls
# with the batch $b$. To first order, SGD's wandering depends on the
# ratio $\eta / b$ {cite}`smith2018dont,mccandlish2018empirical`, so there are
# two ways to quiet it: a larger (accumulated) batch, or a smaller learning
# rate, for example a schedule that lowers $\eta$ as training goes on. The
# runs of the section "The learning rate and the effective batch size" in
# [Accumulation in TF2 and across replicas](07_accumulation_tf2) show the
# trade on this problem: 5 accumulated
# micro-batches of 10 at the same learning rate make a fifth of the updates,
# each five times less noisy, and end far higher than plain batches of 10;
# scaled by 5, the learning rate brings them level. Here, noise is not what
# limits training, the number of updates is.
#
# So, on one device:
#
# - **A learning-rate schedule** (lower $\eta$ as the loss flattens) is the
#   cheaper answer to noise alone: no extra memory, no fewer updates per
#   epoch. Smith et al. {cite}`smith2018dont` show that growing the batch
#   during training works like decaying the learning rate, with fewer
#   updates.
# - **Accumulation** is the right tool when the *effective batch* itself is
#   what you need: a recipe (learning rate, schedule, warm-up) tuned for a
#   batch that does not fit your device; updates that are expensive, such as
#   an all-reduce across machines, which accumulation makes $k$ times rarer
#   (the next section); or an optimizer whose per-update
#   state should see large-batch gradients. Beyond the batch size at which
#   the noise is small next to the gradient, McCandlish et al.'s *critical
#   batch size* {cite}`mccandlish2018empirical`, a larger batch only costs
#   time.

# %% [markdown]
# ## What accumulating before the all-reduce buys
#
# `SyncTrainer(accumulation_steps=k)` sums each replica's micro-batch
# gradients before the all-reduce, so there is one all-reduce per update.
# The alternative, all-reducing every micro-batch's gradient and accumulating
# the reduced results, computes the same numbers but communicates $k$ times as
# often. On real multi-GPU machines communication is often the bottleneck, so
# accumulating first divides the communication per example by $k$. Here we
# measure how many examples per second four logical devices process with a
# fixed micro-batch of 8 and growing $k$. A timing on shared cores varies,
# so one run says little: each $k$ is measured in three interleaved rounds,
# and the cell prints the best and the spread:

# %% tags=["nbval-ignore-output"]
def throughput_trainer(accumulation_steps, micro_batch=8, steps=40):
    """A trainer on the four replicas with a fixed micro-batch, traced and warmed up."""
    with four_replicas.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, four_replicas, loss=per_example_cross_entropy, learning_rate=0.1,
                          accumulation_steps=accumulation_steps, progress=False)
    batch = micro_batch * accumulation_steps * four_replicas.num_replicas_in_sync
    trainer.fit(x_digits, y_digits, steps=steps, batch_size=batch, steps_per_call=steps)  # trace
    return trainer, batch


def examples_per_second(trainer, batch, steps=40):
    """Measured training throughput of one call of `steps` steps."""
    start = time.perf_counter()
    trainer.fit(x_digits, y_digits, steps=steps, batch_size=batch, steps_per_call=steps)
    return steps * batch / (time.perf_counter() - start)


def per_example_cross_entropy(labels, logits):
    """Cross-entropy of each example (SyncTrainer scales by the effective batch)."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(tf.reshape(labels, [-1]), tf.int32), logits=logits)


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
# Each update carries a fixed cost here (launching the step, the all-reduce,
# the update itself); accumulating spreads it over $k$ micro-batches, so the
# throughput grows with $k$ until the micro-batches' own computation dominates
# (the cell checks only the robust part: every round at $k = 8$ beats every
# round at $k = 1$; the steps between are within the rounds' spread). On a
# CPU the all-reduce is a memory copy. Across GPUs or machines it is a
# network transfer, a larger fixed cost to spread; how much more
# accumulation gains there, this page cannot measure (the chapter "What
# communication costs" models it).
#
# ## The linear scaling rule on the digits
#
# Accumulation costs little memory, but it is not free in optimisation: with the effective batch $k$ times larger, an epoch has $k$
# times fewer updates. Each update has a better (less noisy) gradient, but it
# is still one step of the same length. Goyal et al. {cite}`goyal2017accurate`
# made ResNet-50 train in one hour on
# 256 GPUs with the **linear scaling rule**: when the batch is multiplied by
# $k$, multiply the learning rate by $k$ (with a few epochs of warm-up, because
# the rule fails at the very start of training). The rule rests on an
# approximation: $k$ small steps with gradients $g_1, \ldots, g_k$ move the
# weights by about $-\eta \sum_i g_i$, which is one large step with the mean
# gradient and learning rate $k\eta$, *if the gradients barely change over those
# $k$ steps*.
#
# We test it on the handwritten digits (scikit-learn's 8×8 images, a small MLP)
# with four replicas, comparing at equal numbers of examples seen:

# %%
x_train, y_train, x_test, y_test = digits.digits_data(seed=0)
EXAMPLES = 16_384


def train_digits(accumulation_steps, learning_rate, micro_batch=8):
    """Train on EXAMPLES examples; returns (examples seen per update, losses, test accuracy)."""
    strategy = four_replicas
    with strategy.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, strategy, loss=per_example_cross_entropy,
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
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# In {numref}`fig-linear-scaling`, with the learning rate unchanged, the larger effective batch learns far less
# from the same examples: it makes eight times fewer steps of the same length.
# Scaling the learning rate with the batch brings it back close to the small
# batch. Push $k$ further and the rule's approximation breaks: the gradients do
# change over 32 small steps, so a single step 32 times longer overshoots. The
# loss of the batch-1024 run bounces instead of falling, and its test accuracy
# in the table above collapses.
#
# ### Warm-up
#
# Goyal et al. do not start at the scaled rate: they raise the learning rate
# linearly from the small batch's rate to $k$ times it over the first five
# epochs, because the rule fails most at the start, where the gradients change
# fastest. Our batch of 1024 is most of the training set, so five epochs are a
# handful of updates (printed below). We run the batch-1024 training update by
# update and set the rate before each one. (At a rate of 1.6 the accuracies
# below depend on the order of floating-point additions, so another machine
# prints other digits; the two checks at the end of the cell hold on any.)

# %% tags=["nbval-ignore-output"]
def train_with_warm_up(accumulation_steps, peak_rate, warm_up_updates, evaluate_after,
                       micro_batch=8):
    """Linear warm-up from BASE_RATE to peak_rate; test accuracy after each of evaluate_after."""
    strategy = four_replicas
    with strategy.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, strategy, loss=per_example_cross_entropy,
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
# Warm-up alone does not rescue the batch of 1024 here: with the same
# examples as the others it makes only a handful of updates, a good part of
# them spent warming up (both counts printed above), and it stays far below
# the small batch. Given four times the examples, and so four times the
# updates, the warmed-up run does much better (the last lines above), but
# so does the control, the same 64 updates at the scaled rate without
# warm-up: most of the recovery comes from the extra updates. Whether the
# warm-up adds anything beyond them, one run at this rate cannot tell (its
# accuracy moves with the order of additions; exercise 2 says how to find
# out). So the limit this page can state is not "beyond some batch size
# nothing helps": it is that at equal examples, a batch that is most of the
# training set leaves too few updates for the
# linear scaling rule, with or without warm-up. Goyal et al. found the rule,
# with warm-up, held up to batches of 8,192 ImageNet images (a small fraction
# of their training set a batch, and thousands of updates), and broke down
# beyond. Which batch is "too large" depends on the problem and on how many
# updates are left: the rule is a starting point to check, not a law.

# %% [markdown]
# ## The gradient buffers' memory
#
# Every run above keeps the micro-batch at 8 examples a replica, so the
# activations of a step stay those of one micro-batch, whatever the effective
# batch. Accumulation adds one thing: the running sum of the gradients, one
# tensor of the same shape as each parameter, on every replica. We measure it
# by running one update in a fresh process, once without accumulation and
# once accumulating four micro-batches of the same size, as the chapter
# "Accumulation in TF2 and across replicas" measures peak memory
# (`pargrad.book.memory`). The digits network's few kilobytes of
# parameters would vanish in the process's memory, so the probe is a wider
# network of the same shape. Each run is a fresh process because memory a
# finished run gave back stays in the process and would hide the next
# run's peak:

# %% tags=["nbval-ignore-output"]
from pargrad.book import memory

buffer_mb = memory.REPLICAS * memory.probe_parameter_bytes(1024) / 2**20
plain_update = memory.sync_update_peak_memory(1, width=1024)
accumulating = memory.sync_update_peak_memory(4, width=1024)
extra_buffers = (accumulating["rise_mb"] - plain_update["rise_mb"]) / buffer_mb
print(f"peak rose by {plain_update['rise_mb']:.0f} MB without accumulation, "
      f"{accumulating['rise_mb']:.0f} MB accumulating 4 micro-batches ({accumulating['device']})")
print(f"the difference: {extra_buffers:.1f} x the parameters' size on every replica")
if accumulating["resettable"]:
    # "not free in memory": at least about one parameter-sized buffer on every replica
    assert extra_buffers > 0.5

# %% [markdown]
# So accumulation is not free in memory: the difference is at least about
# one buffer the size of the parameters on every replica (the running sum,
# beside the current micro-batch's gradient), and here it is more (printed
# above). `SyncTrainer` unrolls the $k$ micro-batches into one graph, and
# their gradients do not depend on each other, so TensorFlow may compute
# several at once and hold them together; a loop that forces one micro-batch
# after the other would hold one. For this small network the buffers are
# larger than a micro-batch's activations; for a large model with long
# inputs the activations dominate, and that is the trade accumulation makes:
# gradient buffers the size of the parameters, instead of activations that
# grow with the batch.

# %% [markdown]
# ## Stop in the middle of a window, resume bit for bit
#
# Long trainings get interrupted. If the accumulator's state were Python
# numbers, a restart in the middle of a window would lose the micro-batches
# already summed. `GradientAccumulator` is a `tf.Module` whose sums and counts
# are variables, so `tf.train.Checkpoint` saves them with the model and the
# optimizer. We train twelve micro-batches (two windows of five, and two
# micro-batches into the third) in one go, then again with a stop after
# seven micro-batches, a checkpoint, and a restart into freshly built
# objects.
#
# "Bit for bit" needs one more thing: the same inputs must give the same
# outputs every time. A CPU's kernels do; a GPU's are free to add in
# whatever order its threads finish, so two identical runs can differ in the
# last digits. `enable_op_determinism` makes TensorFlow pick deterministic
# kernels (on a CPU it changes nothing here):

# %%
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
print("identical to the uninterrupted run, bit for bit:",
      all(np.array_equal(a, b) for a, b in zip(model.get_weights(), uninterrupted)))

# %% [markdown]
# ## Summary
#
# - Gradient noise falls as one over the batch size, and accumulating $k$
#   micro-batches of $b$ has the noise of a batch of $kb$; against noise
#   alone a learning-rate schedule is cheaper, accumulation is for when the
#   effective batch itself is needed.
# - Accumulating before the all-reduce spreads each update's fixed cost
#   (launch, all-reduce, update) over $k$ micro-batches.
# - The linear scaling rule recovers much of the progress a larger batch
#   loses per example; a batch that is most of the training set leaves too
#   few updates for it, with or without warm-up.
# - Accumulation costs at least one buffer the size of the parameters per
#   replica.
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
