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
# Runs in under two minutes on two CPU cores.

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
from pargrad.book import digits, show_source
from pargrad.book.parabola import parabola_data, parabola_model
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

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
x, y = parabola_data(n=48, dtype="float64")
STEPS = 300
four_replicas = sync_strategy(4)  # one strategy for every four-replica run below
tolerance = pargrad.rounding_tolerance("float64", STEPS)


def train_parabola(replicas, accumulation_steps):
    """STEPS full-batch updates of the y = x² network; returns (history, weights, updates)."""
    strategy = four_replicas if replicas == 4 else sync_strategy(replicas)
    with strategy.scope():
        model = parabola_model(seed=0, dtype="float64")
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
show_source(SyncTrainer._accumulated_gradients)

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
# fixed micro-batch of 8 and growing $k$. Other programs share this
# machine's two cores, so one run says little: each $k$ is measured in three
# interleaved rounds, and the cell prints the best and the spread:

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
# "accumulating spreads the fixed cost": the worst round at k = 8 beats the best at k = 1
assert min(rounds[8]) > max(rounds[1]), "accumulating should amortise the per-update cost"

# %% [markdown]
# Each update carries a fixed cost here (launching the step, the all-reduce,
# the update itself); accumulating spreads it over $k$ micro-batches, so the
# throughput grows with $k$ until the micro-batches' own computation dominates
# (the cell checks only the robust part: every round at $k = 8$ beats every
# round at $k = 1$; the steps between are within the rounds' spread). On two
# CPU cores the all-reduce is a memory copy. Across GPUs or machines it is a
# network transfer, a larger fixed cost to spread; how much more
# accumulation gains there, this page cannot measure (the chapter "What
# communication costs" models it).
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
#
# ### What accumulation costs in memory
#
# Every run above keeps the micro-batch at 8 examples a replica, so the
# activations of a step stay those of one micro-batch, whatever the effective
# batch. Accumulation adds one thing: the running sum of the gradients, one
# tensor of the same shape as each parameter, on every replica. We measure it
# by running one update in a fresh process, once without accumulation and
# once accumulating four micro-batches of the same size, as the chapter
# "Accumulation in TF2 and Keras 3" measures peak memory
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
# - Accumulation costs at least one buffer the size of the parameters per
#   replica (measured: more, when the unrolled micro-batches run at once),
#   and keeps the activations at one micro-batch's.
#
# ## Exercises
#
# 1. Add a run with 2 replicas and $k = 6$ (micro-batch 4) to the first table.
#    Does it still match one device?
#
#    *Hint:* `train_parabola(2, 6)`; $4 \times 6 \times 2 = 48$.
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
# **Exercise 1.** Yes: the effective batch is again 48, and the weights are
# one device's:

# %% tags=["hide-cell"]
history, weights, updates = train_parabola(2, 6)
gap = max(np.max(np.abs(a - b)) for a, b in zip(weights, reference))
print(f"2 replicas, k = 6: effective batch {history.effective_batch_size}, micro-batch "
      f"{history.micro_batch_size}, updates {updates}, same weights as one device: "
      f"{gap < tolerance}")
assert history.effective_batch_size == 48 and gap < tolerance

# %% [markdown]
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
