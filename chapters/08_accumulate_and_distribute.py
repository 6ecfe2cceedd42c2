# %% [markdown]
# # Accumulate and distribute
#
# The synchronous chapter split one batch over several devices; the
# accumulation chapters split one batch over several passes on one device.
# Real training does both: every replica accumulates a few micro-batches, and
# the replicas all-reduce once per update. This chapter puts the two together
# with `SyncTrainer(accumulation_steps=k)`.
#
# **In this chapter you will**
#
# - compute the effective batch, micro-batch × accumulation steps × replicas,
#   and check that three very different runs with the same effective batch
#   train identically;
# - see why accumulating *before* the all-reduce means one all-reduce per
#   update, and measure what that buys;
# - meet the linear scaling rule for the learning rate, and watch it work (and
#   its limit) on a real classification task.
#
# Runs in about a minute on two CPU cores.

# %% tags=["colab"]
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

devices = pargrad.logical_devices(4)

import time

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from pargrad.book import digits
from pargrad.sync import SyncTrainer, sync_strategy

# %% [markdown]
# ## The effective batch
#
# An update of synchronous training with accumulation sees an
# {term}`effective batch`:
#
# $$\text{effective batch} = \text{micro-batch} \times k \times \text{replicas},$$
#
# where $k$ is the number of micro-batches each replica accumulates. Each
# replica sums the gradients of its $k$ micro-batches locally (no
# communication), the replicas all-reduce those sums once, and one update is
# applied. If every loss is scaled by the effective batch, the update is the
# mean gradient over all its examples: the same update as one device on one
# batch of that size.
#
# We check this on the y = x² question's network with 48 of its points (48 splits evenly
# over 4 replicas and 3 micro-batches), starting three runs from the same
# initial weights:
#
# | run | replicas | micro-batches $k$ | micro-batch | effective batch |
# | --- | --- | --- | --- | --- |
# | one device | 1 | 1 | 48 | 48 |
# | four replicas | 4 | 1 | 12 | 48 |
# | four replicas, accumulating | 4 | 3 | 4 | 48 |

# %% [markdown]
# As in the chapter "Synchronous training", the runs are in float64, so that
# "the same weights" means equal up to float64 rounding
# (`pargrad.rounding_tolerance`) on any machine.

# %%
x, y = pargrad.parabola_data(n=48, dtype="float64")
STEPS = 300
four_replicas = sync_strategy(4)  # one strategy for every four-replica run below
tolerance = pargrad.rounding_tolerance("float64", STEPS)


def train_parabola(replicas, accumulation_steps):
    """STEPS full-batch updates of the y = x² network; returns (history, weights, updates)."""
    strategy = four_replicas if replicas == 4 else sync_strategy(replicas)
    with strategy.scope():
        model = pargrad.parabola_model(seed=0, dtype="float64")
    trainer = SyncTrainer(model, strategy, learning_rate=0.01,
                          accumulation_steps=accumulation_steps, progress=False)
    history = trainer.fit(x, y, steps=STEPS, steps_per_call=50)
    return history, model.get_weights(), int(trainer.optimizer.iterations.numpy())


runs = {
    "one device": train_parabola(1, 1),
    "four replicas": train_parabola(4, 1),
    "four replicas, k = 3": train_parabola(4, 3),
}
reference = runs["one device"][1]
for name, (history, weights, updates) in runs.items():
    gap = max(np.max(np.abs(a - b)) for a, b in zip(weights, reference))
    print(f"{name:22} effective batch {history.effective_batch_size:2}  "
          f"micro-batch {history.micro_batch_size:2}  updates {updates}  "
          f"final loss {history.loss[-1]:.6f}  same weights as one device: {gap < tolerance}")
    assert gap < tolerance

# %% [markdown]
# Three different splits, one training run: same weights, same loss. This is the
# property that lets you move a recipe from a machine with many GPUs to one with
# few by raising $k$: keep the effective batch, keep the result.
#
# ## One all-reduce per update
#
# Where the accumulation happens matters. The replica sums its micro-batches'
# gradients *before* anything leaves the device:

# %%
pargrad.show_source(SyncTrainer._accumulated_gradients)

# %% [markdown]
# Only the sum reaches the optimizer, whose `apply_gradients` all-reduces it
# across replicas and applies one update. So the number of all-reduces is the
# number of updates, whatever $k$ is: the optimizer's update counter in the
# table above says 300 for each run, also for the one that computed 900
# micro-batch gradients on every replica.
#
# The alternative, all-reducing every micro-batch's gradient and accumulating
# the reduced results, computes the same numbers but communicates $k$ times as
# often. On real multi-GPU machines communication is often the bottleneck, so
# accumulating first divides the communication per example by $k$. Here we
# measure how many examples per second four logical devices process with a
# fixed micro-batch of 8 and growing $k$:

# %% tags=["nbval-ignore-output"]
def examples_per_second(accumulation_steps, micro_batch=8, steps=40):
    """Measured training throughput on the four replicas with a fixed micro-batch."""
    x_digits, y_digits, _, _ = digits.digits_data(seed=0)
    strategy = four_replicas
    with strategy.scope():
        model = digits.digits_model(seed=0)
    trainer = SyncTrainer(model, strategy, loss=per_example_cross_entropy, learning_rate=0.1,
                          accumulation_steps=accumulation_steps, progress=False)
    batch = micro_batch * accumulation_steps * strategy.num_replicas_in_sync
    trainer.fit(x_digits, y_digits, steps=5, batch_size=batch, steps_per_call=5)  # compile, warm up
    start = time.perf_counter()
    trainer.fit(x_digits, y_digits, steps=steps, batch_size=batch, steps_per_call=steps)
    return steps * batch / (time.perf_counter() - start)


def per_example_cross_entropy(labels, logits):
    """Cross-entropy of each example (SyncTrainer scales by the effective batch)."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(tf.reshape(labels, [-1]), tf.int32), logits=logits)


throughput = {k: examples_per_second(k) for k in (1, 2, 4, 8)}
for k, rate in throughput.items():
    print(f"k = {k}: {rate:8.0f} examples/s  ({rate / throughput[1]:.2f}x k = 1)")
assert throughput[8] > throughput[1], "accumulating should amortise the per-update cost"

# %% [markdown]
# Each update carries a fixed cost here (launching the step, the all-reduce,
# the update itself); accumulating spreads it over $k$ micro-batches, so the
# throughput grows with $k$ until the micro-batches' own computation dominates.
# On two CPU cores the all-reduce is a memory copy; across GPUs or machines it
# is a network transfer, and the gain is larger.
#
# ## The learning rate and the effective batch
#
# Accumulation costs little memory (we measure it below), but it is not free
# in optimisation: with the effective batch $k$ times larger, an epoch has $k$
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
        ramp = min(1.0, update / warm_up_updates)
        trainer.optimizer.learning_rate = BASE_RATE + ramp * (peak_rate - BASE_RATE)
        trainer.fit(x_train, y_train, steps=1, batch_size=batch)
        if update + 1 in evaluate_after:
            accuracies[update + 1] = digits.accuracy(model, x_test, y_test)
    return accuracies


WARM_UP = round(5 * len(x_train) / 1024)  # five epochs, in updates of 1024 examples
same_examples = EXAMPLES // 1024
warm = train_with_warm_up(32, 32 * BASE_RATE, WARM_UP, (same_examples, 4 * same_examples))
print(f"warm-up: {WARM_UP} updates (five epochs of {len(x_train)} training examples)")
no_warm_up = results["batch 1024 (k = 32), lr 1.6, scaled"]
small_batch = results["batch 32 (k = 1), lr 0.05"]
print(f"{f'batch 1024, lr 1.6, no warm-up, {same_examples} updates':46} "
      f"test accuracy {no_warm_up[2]:.3f}")
for updates, test_accuracy in warm.items():
    print(f"{f'batch 1024, lr 1.6, warm-up, {updates} updates':46} test accuracy {test_accuracy:.3f}")
print(f"{f'batch 32, lr 0.05, {len(small_batch[1])} updates':46} "
      f"test accuracy {small_batch[2]:.3f}")
short, long = warm[same_examples], warm[4 * same_examples]
assert short < small_batch[2] - 0.1  # warm-up alone does not rescue 16 updates
assert long > short + 0.1
assert 0.3 < WARM_UP / same_examples < 0.5  # "almost half of them spent warming up"

# %% [markdown]
# Warm-up alone does not rescue the batch of 1024 here: with the same
# examples as the others it makes only a handful of updates, almost half of
# them spent warming up (both counts printed above), and it stays far below
# the small batch. Given four times
# the examples, and so four times the updates, the warmed-up run does much
# better (the last lines above). So the limit this page can state is not
# "beyond some batch size nothing helps": it is that at equal examples, a
# batch that is most of the training set leaves too few updates for the
# linear scaling rule, with or without warm-up. Goyal et al. found the rule,
# with warm-up, held up to batches of 8,192 ImageNet images (a small fraction
# of their training set a batch, and thousands of updates), and broke down
# beyond. Which batch is "too large" depends on the problem and on how many
# updates are left: the rule is a starting point to check, not a law.
#
# ### What accumulation costs in memory
#
# Every run above keeps the micro-batch at 8 examples a replica, so the
# activations of a step stay those of one micro-batch, whatever the effective
# batch. Accumulation adds one thing: the running sum of the gradients, one
# tensor of the same shape as each parameter, on every replica. We measure it
# on the tensors a replica's accumulating step really returns:

# %%
with four_replicas.scope():
    model = digits.digits_model(seed=0)
trainer = SyncTrainer(model, four_replicas, loss=per_example_cross_entropy, learning_rate=0.1,
                      accumulation_steps=4, progress=False)
micro_x = tf.reshape(tf.constant(x_train[:32]), (4, 8, -1))  # k = 4 micro-batches of 8
micro_y = tf.reshape(tf.constant(y_train[:32]), (4, 8))
per_replica = four_replicas.run(lambda: trainer._accumulated_gradients(
    micro_x, micro_y, model.trainable_variables, 128)[1])
sums = [four_replicas.experimental_local_results(g)[0] for g in per_replica]  # one replica's
sum_bytes = sum(int(np.prod(g.shape)) * tf.as_dtype(g.dtype).size for g in sums)
parameter_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
                      for v in model.trainable_variables)
activation_bytes = 8 * (64 + 64 + 10) * 4  # one micro-batch: input, hidden and logits, float32
print(f"gradient sums held while accumulating: {sum_bytes} bytes; the parameters: "
      f"{parameter_bytes} bytes")
print(f"one micro-batch's activations: about {activation_bytes} bytes")
assert sum_bytes == parameter_bytes

# %% [markdown]
# So accumulation is not free in memory: it costs one buffer the size of the
# parameters per replica (a plain training step already holds one gradient
# of that size; accumulating holds the running sum beside the current
# micro-batch's gradient). For this small network that buffer is larger than
# a micro-batch's activations; for a large model with long inputs the
# activations dominate, and that is the trade accumulation makes: a buffer
# the size of the parameters, instead of activations that grow with the
# batch. The chapter "Accumulation in TF2 and Keras 3" measures the peak
# memory of both.
#
# ## Summary
#
# - Effective batch = micro-batch × accumulation steps × replicas. Runs with the
#   same effective batch and the loss scaled by it train identically, however
#   the batch is split.
# - Accumulating on each replica before the all-reduce keeps one all-reduce per
#   update, dividing communication per example by $k$.
# - A larger effective batch means fewer updates per epoch. The linear scaling
#   rule (learning rate × $k$, with warm-up) recovers much of the lost progress;
#   when the batch is most of the training set, too few updates are left for
#   it, with or without warm-up.
# - Accumulation costs one buffer the size of the parameters per replica, and
#   keeps the activations at one micro-batch's.
#
# ## Exercises
#
# 1. Add a run with 2 replicas and $k = 6$ (micro-batch 4) to the first table.
#    Does it still match one device?
#
#    *Hint:* `train_parabola(2, 6)`; $4 \times 6 \times 2 = 48$.
# 2. In the linear-scaling experiment, add a warm-up: train the batch-1024 run
#    with learning rate 0.05 for its first few updates, then 1.6. Does the
#    overshoot at the start disappear? (Hint: call `fit` twice; the trainer
#    continues where it stopped, and `trainer.optimizer.learning_rate` can be
#    assigned.)
#
#    *Hint:* compare the losses of the first updates, where the overshoot
#    happens, not only the final accuracy.
# 3. Replace the micro-batch count $k$ by replicas: 8 logical devices with
#    $k = 4$ against 4 with $k = 8$. Which is faster on two CPU cores, and why
#    would the answer differ on eight real GPUs?
#
#    *Hint:* on two cores, what does a replica add that a micro-batch does
#    not?
#
# ### Solutions
#
# **Exercise 1.** Yes: the effective batch is again 48, and the weights are
# one device's:

# %% tags=["hide-cell"]
history, weights, updates = train_parabola(2, 6)
gap = max(np.max(np.abs(a - b)) for a, b in zip(weights, reference))
print(f"2 replicas, k = 6: effective batch {history.effective_batch_size}, micro-batch "
      f"{history.micro_batch_size}, updates {updates}, same weights as one device (1e-5): "
      f"{gap < 1e-5}")
assert history.effective_batch_size == 48 and gap < 1e-5

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# Train with `learning_rate=0.05` for a few updates (`fit(..., steps=3)`),
# assign `trainer.optimizer.learning_rate = 1.6`, and call `fit` again for
# the remaining updates. The first updates then take small steps while the
# gradient changes fastest, which is where a step 32 times the small-batch
# step overshoots. Compare the first losses of the two runs to see how much
# of the overshoot it removes; whether the final accuracy recovers depends on
# how far the rule's approximation holds later: warm-up addresses the start,
# not the limit of the rule.
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
