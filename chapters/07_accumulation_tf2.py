# %% [markdown]
# # Accumulation in TF2 and across replicas
#
# ```{admonition} Takeaway
# In TensorFlow 2, keep one variable per weight, add each micro-batch's
# gradient into it, and apply the sum divided by the number of examples
# once: the big batch's update. Across replicas, accumulate locally and
# all-reduce once per update; the effective batch is micro-batch × steps ×
# replicas, and BatchNorm still sees micro-batches.
# ```
#
# The chapter [Accumulating gradients in TF1 graphs](06_accumulation_tf1)
# fixed the accumulation thread's recipe in a TensorFlow 1 graph.
# **In this chapter you will** write it in TensorFlow 2, with less ceremony:
# first a plain loop that equals the big batch, then `pargrad.GradientAccumulator`,
# which weights micro-batches by their examples, and Keras 3's
# `gradient_accumulation_steps`, which fails under `MirroredStrategy`
# (Keras issue 20582, live). Then across replicas, with BatchNorm, memory
# and the learning rate. You need [Synchronous training](03_synchronous); the
# optional [Accumulation in depth](d4_accumulation_in_depth) holds the
# measurements this page only cites.

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

# %% [markdown]
# `pargrad` first, then four logical devices (the sections on replicas use
# two and four; everything else uses the first device), then seeds.

# %%
import inspect
import re

import numpy as np
import pargrad

devices = pargrad.logical_devices(4)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from pargrad.book import show_source  # noqa: E402
from pargrad.book.plots_accumulation import peak_memory_against_batch  # noqa: E402
from pargrad.book.plots_one_device import loss_curve  # noqa: E402
from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.book.peaks import peak_memory  # noqa: E402
from pargrad.book.parabola import parabola_data, parabola_model  # noqa: E402
from pargrad.strategies import sync_strategy  # noqa: E402
from pargrad.sync import SyncTrainer  # noqa: E402

keras.utils.set_random_seed(0)
# This chapter compares accumulation with the big batch to float32 rounding.
# On recent NVIDIA GPUs TensorFlow computes float32 matrix products in TF32
# (about 1e-3 relative error) unless told otherwise; no effect on a CPU.
tf.config.experimental.enable_tensor_float_32_execution(False)
print("TensorFlow", tf.__version__, "| Keras", keras.__version__, "| devices:", devices)

# %% [markdown]
# ## Accumulation in a plain TF2 loop
#
# The recipe, here for the y = x² question's network in float64: a
# `tf.Variable` per trainable variable sums the micro-batches' gradients
# (`accumulate`, one compiled call a micro-batch, fed as an argument); after
# $K$ equal micro-batches, `apply` divides the sums by their count, $K$: the
# big batch's mean gradient, applies it once, and sets the sums back to zero.
# The loop outside decides when to apply. A program to copy; its last lines
# train the big batch from the same weights and print the difference:

# %% tags=["program"]
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # set before TensorFlow starts: no start-up logs

import keras
import numpy as np
import tensorflow as tf

# One device is enough. On two devices, split the CPU before TensorFlow makes its devices:
#   tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
#                                              [tf.config.LogicalDeviceConfiguration()] * 2)
x = np.linspace(-2.0, 2.0, 50)[:, None]  # the y = x² question's 50 points, in float64
y = x**2
K = 5  # micro-batches per update, of 10 examples each


def new_model():  # the 1-5-1 tanh network in float64, the same weights at every call
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((1,), dtype="float64"),
                             keras.layers.Dense(5, "tanh", dtype="float64"),
                             keras.layers.Dense(1, dtype="float64")])


model, optimizer = new_model(), keras.optimizers.SGD(learning_rate=1e-2)
sums = [tf.Variable(tf.zeros_like(v)) for v in model.trainable_variables]  # one per variable
count = tf.Variable(0.0, dtype=tf.float64)  # micro-batches added since the last update


@tf.function
def accumulate(x_micro, y_micro):  # one forward-backward pass; nothing is applied
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x_micro) - y_micro))  # the micro-batch's mean
    for total, gradient in zip(sums, tape.gradient(loss, model.trainable_variables)):
        total.assign_add(gradient)
    count.assign_add(1.0)


@tf.function
def apply():  # the mean of the sums, applied once; then the sums start again from zero
    optimizer.apply_gradients(zip([total / count for total in sums], model.trainable_variables))
    for total in sums:
        total.assign(tf.zeros_like(total))
    count.assign(0.0)


for _ in range(200):  # 200 updates; the loop outside decides when to apply
    for x_micro, y_micro in zip(np.split(x, K), np.split(y, K)):
        accumulate(tf.constant(x_micro), tf.constant(y_micro))
    apply()

big, big_optimizer = new_model(), keras.optimizers.SGD(learning_rate=1e-2)  # the check
for _ in range(200):  # the big batch: all 50 points at once
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(big(x) - y))
    big_optimizer.apply_gradients(zip(tape.gradient(loss, big.trainable_variables),
                                      big.trainable_variables))
gap = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), big.get_weights()))
print(f"{K} micro-batches an update, 200 updates: largest weight gap to the big batch "
      f"{'below 1e-14' if gap < 1e-14 else f'{gap:.1e}'}")

# %% tags=["remove-cell"]
assert gap < pargrad.rounding_tolerance("float64", 200)
moved = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), new_model().get_weights()))
assert moved > 0.01

# %% [markdown]
# This answers the accumulation thread's asker, who feared that a batch as
# small as memory allows "makes the model high-variance". A batch's gradient is
# the mean of its examples' gradients, each a noisy estimate of the gradient
# over all the data; for independent examples the variance of that mean falls
# as one over the batch size. A small batch's gradient is therefore noisy,
# but $K$ accumulated micro-batches *are* the big batch's gradient, as the
# program just printed, with the big batch's variance, $1/K$ of one
# micro-batch's, at the memory of one micro-batch; the price is $K$ passes
# an update ([Accumulation in depth](d4_accumulation_in_depth) measures the
# noise).
#
# Dividing by $K$ is right only when the micro-batches have equal sizes; the
# class below counts examples instead, and adds what a training run needs
# around these lines.

# %% [markdown]
# ## `GradientAccumulator` in a custom loop
#
# The TF2 accumulator keeps the TF1 recipe's state, one sum per variable and
# a count, but counts *examples*, not micro-batches: each micro-batch's
# gradient (of a loss that is a mean over the micro-batch) is multiplied by
# the micro-batch's size before it is added, and `apply` divides by the
# total number of examples:

# %%
print(inspect.getsource(GradientAccumulator.accumulate))
print(inspect.getsource(GradientAccumulator.mean_gradients))

# %% [markdown]
# The state lives in variables, so the same object works eagerly and inside a
# `tf.function`. A training loop over micro-batches calls `step`, which
# accumulates and, every `accumulation_steps` calls, applies and starts a new
# window. On the y = x² network's 50 points, micro-batches of 10 and
# `accumulation_steps=5` make one update from the whole data set.

# %% tags=["hide-input"]
x_all, y_all = parabola_data()
K = 5


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


def big_batch_weights(make_optimizer, updates, make_model=parabola_model):
    """Weights after `updates` plain steps on all 50 points."""
    model, optimizer = make_model(), make_optimizer()
    for _ in range(updates):
        with tf.GradientTape() as tape:
            loss = mean_squared_error(model, x_all, y_all)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
    return model.get_weights()


def max_difference(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


OPTIMIZERS = {"SGD": lambda: keras.optimizers.SGD(0.05),
              "Adam": lambda: keras.optimizers.Adam(0.05)}
for name, make_optimizer in OPTIMIZERS.items():
    model = parabola_model()
    accumulator = GradientAccumulator(model.trainable_variables, accumulation_steps=K,
                                      optimizer=make_optimizer())
    train_micro_batch = micro_batch_stepper(model, accumulator)
    applied = [bool(train_micro_batch(xb, yb))
               for _ in range(3)
               for xb, yb in zip(np.split(x_all, K), np.split(y_all, K))]
    difference = max_difference(model.get_weights(), big_batch_weights(make_optimizer, 3))
    print(f"{name:4s}: updates applied at micro-batches "
          f"{[i + 1 for i, a in enumerate(applied) if a]}, "
          f"max |difference| from 3 big-batch steps: {difference:.6f}")
    assert difference < 1e-6

# %% [markdown]
# Fifteen micro-batches, three updates, and the same weights as three steps
# on the whole batch, to float32 rounding. Bad arguments are refused up
# front, with what to pass instead:

# %%
model = parabola_model()
for attempt in [lambda: GradientAccumulator(model.trainable_variables, accumulation_steps=0),
                lambda: GradientAccumulator(model.trainable_variables, 2).accumulate(
                    [tf.zeros([1, 5])], 10),
                lambda: GradientAccumulator(model.trainable_variables, 2,
                                            keras.optimizers.SGD(0.1)).apply()]:
    try:
        attempt()
    except (ValueError, tf.errors.InvalidArgumentError) as error:
        message = error.message if hasattr(error, "message") else str(error)
        print(type(error).__name__, message.splitlines()[0][:160])

# %% [markdown]
# ## Keras 3: `gradient_accumulation_steps`
#
# Keras 3 optimizers take a `gradient_accumulation_steps` argument: the
# optimizer keeps the gradients of that many `apply` calls and updates the
# weights on every `steps`-th call with their mean. With `fit`, batches of 10
# and 5 accumulation steps therefore train like batches of 50:

# %%
def keras_fit(batch_size, make_optimizer, accumulation_steps=None, epochs=3):
    keras.utils.set_random_seed(0)
    model = parabola_model()
    options = {} if accumulation_steps is None else {
        "gradient_accumulation_steps": accumulation_steps}
    model.compile(optimizer=make_optimizer(**options), loss="mse")
    model.fit(x_all, y_all, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


KERAS_OPTIMIZERS = {"SGD": lambda **options: keras.optimizers.SGD(0.05, **options),
                    "Adam": lambda **options: keras.optimizers.Adam(0.05, **options)}
for name, make_optimizer in KERAS_OPTIMIZERS.items():
    accumulated = keras_fit(10, make_optimizer, accumulation_steps=K)
    big = keras_fit(50, make_optimizer)
    print(f"{name:4s}: fit(batch 10, 5 accumulation steps) vs fit(batch 50), "
          f"max |difference| after 3 epochs: {max_difference(accumulated, big):.6f}")

# %% [markdown]
# On one device this is all you need for a model trained with `fit`.
#
# ### Under `MirroredStrategy` it fails
#
# In a `MirroredStrategy` scope, two replicas on our two logical devices,
# `fit` fails on the first batch. Keras applies the accumulated gradients
# inside a conditional (`ops.cond`: "is this the `steps`-th call?"), and the
# update synchronises the replicas (`merge_call`), which TensorFlow does not
# allow inside control flow in a replica's function: Keras issue
# [20582](https://github.com/keras-team/keras/issues/20582); tf.keras users
# met the same limit in their own code
# ([keras issue 17429](https://github.com/keras-team/keras/issues/17429)).
# The cell expects the error, and says so if a future Keras no longer raises
# it.

# %%
strategy = tf.distribute.MirroredStrategy(devices[:2])
with strategy.scope():
    model = parabola_model()
    model.compile(optimizer=keras.optimizers.SGD(0.05, gradient_accumulation_steps=K),
                  loss="mse")
try:
    model.fit(x_all, y_all, batch_size=10, epochs=1, shuffle=False, verbose=0)
    print("UNEXPECTED: gradient_accumulation_steps worked under MirroredStrategy; "
          "keras issue 20582 may be fixed: update this chapter.")
except Exception as error:  # noqa: BLE001  (we report whatever Keras raises)
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    first = next((line for line in text.splitlines() if "merge_call" in line),
                 text.splitlines()[0])
    print(type(error).__name__ + ":", first.split(". ")[0].strip() + ".")

# %% [markdown]
# A custom loop decides *outside* the replicas when to apply, so it has no
# such problem. `GradientAccumulator` keeps its sums in "sync-on-read"
# variables: each replica adds its own gradients into its own copy (inside
# `strategy.run`), and reading the sums in `apply()`, outside
# `strategy.run`, adds the copies up: one all-reduce per update instead of
# one per micro-batch. Here we only check that it equals the big batch:

# %%
with strategy.scope():
    model = parabola_model()
    accumulator = GradientAccumulator(model.trainable_variables, K, keras.optimizers.SGD(0.05))


def replica_micro_batch(x, y):
    with tf.GradientTape() as tape:
        loss = mean_squared_error(model, x, y)
    accumulator.accumulate(tape.gradient(loss, model.trainable_variables), tf.shape(x)[0])


accumulate_on_replicas = tf.function(lambda x, y: strategy.run(replica_micro_batch, (x, y)))
apply_once = tf.function(accumulator.apply)
batches = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x_all, y_all)).batch(10))
for _ in range(3):
    for xb, yb in batches:          # each replica gets 5 of the 10 examples
        accumulate_on_replicas(xb, yb)
    apply_once()
difference = max_difference(model.get_weights(),
                            big_batch_weights(OPTIMIZERS["SGD"], 3))
print(f"2 replicas x 5 micro-batches vs big batch, max |difference|: {difference:.6f}")

# %% [markdown]
# ## Across replicas: the effective batch
#
# Real training does both splits at once: every replica accumulates $k$
# micro-batches, and the replicas all-reduce once per update, as
# `SyncTrainer(accumulation_steps=k)` from the chapter "Synchronous training"
# does. An update then sees an {term}`effective batch`:
#
# $$\text{effective batch} = \text{micro-batch} \times k \times \text{replicas}.$$
#
# Each replica sums its micro-batches' gradients locally (no communication),
# the replicas all-reduce those sums once, and one update is applied. With
# every loss scaled by the effective batch, that is one device's update on
# one batch of that size.
#
# We check this on the y = x² network with 48 of its points (48 splits evenly
# over 4 replicas and 3 micro-batches), three runs from the same initial
# weights:
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

# %% tags=["hide-input"]
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
          f"final loss {history.loss[-1]:.6f}  weight gap to one device "
          f"{'0' if name == 'one device' else f'below {tolerance:.0e}'}")
    assert gap < tolerance

# %% [markdown]
# Three different splits, one training run: same weights, same loss. This lets
# you move a recipe from a machine with many GPUs to one with few by raising
# $k$: keep the effective batch, keep the result.
#
# ## One all-reduce per update
#
# Where the accumulation happens matters. The replica sums its micro-batches'
# gradients *before* anything leaves the device:

# %%
show_source(SyncTrainer._accumulated_gradients)

# %% [markdown]
# Only the sum reaches the optimizer, whose `apply_gradients` all-reduces it
# and applies one update. So there is one all-reduce per update, whatever $k$
# is: the update counter above is the same for every run, also the one that
# computed three micro-batch gradients per update on every replica.
# All-reducing every micro-batch's gradient would compute the same numbers
# and communicate $k$ times as often.
# [Accumulation in depth](d4_accumulation_in_depth) measures the throughput
# this buys.

# %% [markdown]
# ## Unequal micro-batches: count examples, not micro-batches
#
# Fifty examples do not split into micro-batches of 16: the last one holds 2.
# Dividing the accumulated gradients by the *number of micro-batches* (answer
# 3's counter, and what Keras's `gradient_accumulation_steps` does) gives the
# two last examples the weight of sixteen. Weighting each micro-batch by its
# size gives exactly the big batch's gradient:

# %% tags=["hide-input"]
sizes = [16, 16, 16, 2]
pieces = np.split(np.arange(50), np.cumsum(sizes)[:-1])
model = parabola_model()


def gradients_of(x, y):
    with tf.GradientTape() as tape:
        loss = mean_squared_error(model, x, y)
    return tape.gradient(loss, model.trainable_variables)


by_micro_batch = GradientAccumulator(model.trainable_variables, len(sizes))
by_example = GradientAccumulator(model.trainable_variables, len(sizes))
for piece in pieces:
    gradients = gradients_of(x_all[piece], y_all[piece])
    by_micro_batch.accumulate(gradients, 1)              # every micro-batch counts once
    by_example.accumulate(gradients, len(piece))         # weighted by its examples
exact = gradients_of(x_all, y_all)
scale = max(float(np.abs(g).max()) for g in exact)
for name, accumulator in [("count micro-batches", by_micro_batch),
                          ("weight by examples", by_example)]:
    error = max_difference(accumulator.mean_gradients(), exact) / scale
    print(f"{name:20s}: gradient error relative to the largest gradient: {error:.4f}")

keras_unequal = keras_fit(16, KERAS_OPTIMIZERS["SGD"], accumulation_steps=4)
print(f"Keras fit(batch 16, 4 accumulation steps) vs fit(batch 50) after 3 epochs: "
      f"{max_difference(keras_unequal, keras_fit(50, KERAS_OPTIMIZERS['SGD'])):.4f}")

# %% [markdown]
# Counting micro-batches gets the gradient wrong by as much as its largest
# component: the two points at $x \approx 2$, where the network's error is
# largest, weigh as much as sixteen points each, and after three epochs
# Keras's weights sit visibly away from the big batch's. Weighting by
# examples is exact. With `tf.data`, an epoch's last batch is usually the
# short one: drop it (`drop_remainder=True`) or weight by examples.

# %% [markdown]
# ## BatchNorm: micro-batches are not the big batch
#
# Everything so far relied on one fact: the loss of the big batch is the
# mean of per-example losses, each depending only on its own example. Batch
# normalisation {cite}`ioffe2015batch` breaks it: in training, each example is
# normalised with the mean and variance *of its batch*. Accumulating $k$
# micro-batches normalises with $k$ different micro-batch statistics, which
# the big batch never does. We put a `BatchNormalization` layer into the y = x²
# network and compare the accumulated gradient with the big batch's, with
# the 50 points shuffled into micro-batches of 10 as a data pipeline would:

# %%
def parabola_with(batch_norm):
    keras.utils.set_random_seed(0)
    layers = [keras.Input(shape=(1,)), keras.layers.Dense(5)]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.Activation("tanh"), keras.layers.Dense(1)]
    return keras.Sequential(layers)


order = np.random.default_rng(0).permutation(50)
shuffled = list(zip(np.split(x_all[order], K), np.split(y_all[order], K)))
batch_norm_error = {}
for batch_norm in (False, True):
    model = parabola_with(batch_norm)
    accumulator = GradientAccumulator(model.trainable_variables, K)
    for xb, yb in shuffled:
        accumulator.accumulate(gradients_of(xb, yb), len(xb))
    exact = gradients_of(x_all, y_all)
    scale = max(float(np.abs(g).max()) for g in exact)
    batch_norm_error[batch_norm] = max_difference(accumulator.mean_gradients(), exact) / scale
    print(f"BatchNorm {'yes' if batch_norm else 'no '}: accumulated vs big-batch gradient, "
          f"error relative to the largest gradient: {batch_norm_error[batch_norm]:.4f}")

# %% [markdown]
# Without BatchNorm the two agree to rounding; with it, the accumulated
# gradient is a few percent off: not a bug in the accumulator, a different
# function being differentiated. BatchNorm's moving statistics for inference
# are updated once per micro-batch, from micro-batch statistics, too. With
# accumulation, then, BatchNorm behaves as with the *micro*-batch size; if
# small micro-batches hurt, use a normalisation that does not look across
# examples (layer or group normalisation), or, under a strategy, synchronise
# the statistics across replicas
# (`keras.layers.BatchNormalization(synchronized=True)`), which still does
# not reach across micro-batches.
#
# ## Memory: why people accumulate
#
# A batch's gradient needs the activations of all its examples at once;
# accumulation needs one micro-batch's at a time. We measure the peak memory
# of one update for growing batches, computed whole or accumulated from
# micro-batches of 64, on a model with 2048 inputs and two hidden layers of
# 512. Each measurement runs in a fresh process
# (`pargrad.book.peaks.peak_memory`), so nothing this notebook holds counts:
# on a GPU it reads TensorFlow's peak device memory, on a CPU the process's
# peak resident memory, TensorFlow's own few hundred MB included:

# %% mystnb={"figure": {"caption": "Peak memory of one update against the batch size, the whole batch at once and accumulated from micro-batches of 64, on a model with 2048 inputs and two hidden layers of 512.", "name": "fig-peak-memory"}} tags=["nbval-ignore-output"]
BATCH_SIZES = [64, 512, 2048, 8192]
MICRO_BATCH = 64
memory = peak_memory(BATCH_SIZES, MICRO_BATCH)
print(f"peak memory of one update ({memory['device']}), MB:")
print(f"{'batch':>6s} {'whole batch':>12s} {'accumulated':>12s}")
for size, whole, accumulated in zip(BATCH_SIZES, memory["whole_mb"], memory["accumulated_mb"]):
    print(f"{size:6d} {whole:12.0f} {accumulated:12.0f}")
growth_whole = memory["whole_mb"][-1] - memory["whole_mb"][0]
growth_accumulated = memory["accumulated_mb"][-1] - memory["accumulated_mb"][0]
print(f"growth from batch {BATCH_SIZES[0]} to {BATCH_SIZES[-1]}: whole batch "
      f"+{growth_whole:.0f} MB, accumulated +{growth_accumulated:.0f} MB")
_ = peak_memory_against_batch(BATCH_SIZES, memory["whole_mb"], memory["accumulated_mb"],
                              MICRO_BATCH, device=memory["device"])

# %% [markdown]
# In {numref}`fig-peak-memory` the whole batch's peak grows with the batch
# (the batch, the activations and their gradients); accumulation stays flat
# at one micro-batch's, for any number of examples per update. (The numbers
# depend on the machine; the cell checks that the whole batch's growth dwarfs
# the accumulated one's.) The price is time: $k$ small matrix products use
# the hardware less well than one big one (the benchmark
# `benchmarks/accumulation.py`). What accumulation does not shrink is what
# data parallelism holds per parameter on every device: the weight, its
# gradient and the optimizer's state, with Adam in float32 4 + 4 + 8 bytes
# (two moments), plus the running sum's 4 bytes when accumulating
# ([Accumulation in depth](d4_accumulation_in_depth) measures that buffer).
# When these do not fit on one device, the state must be split:
# {doc}`12_sharded_training`.

# %% tags=["remove-cell"]
assert growth_whole > 100 and growth_accumulated < growth_whole / 4

# %% [markdown]
# ## The learning rate and the effective batch size
#
# With the mean (not the sum) an update is the one of its effective batch,
# so the learning rate to use is the one that suits *that* batch size. Going
# from batches of 10 to accumulated batches of 50 means five times fewer
# updates per epoch; Goyal et al.'s {term}`linear scaling rule`
# {cite}`goyal2017accurate` compensates by multiplying the learning rate by the same factor (with a
# warm-up for large factors). On the y = x² network, 200 epochs of shuffled
# data:

# %% tags=["hide-input"]
def train_epochs(micro_batch, steps, learning_rate, epochs=200):
    """Full-data loss after each epoch, accumulating `steps` micro-batches per update."""
    keras.utils.set_random_seed(0)
    model = parabola_model()
    accumulator = GradientAccumulator(model.trainable_variables, steps,
                                      keras.optimizers.SGD(learning_rate))
    pieces = list(zip(np.split(x_all[order], 50 // micro_batch),
                      np.split(y_all[order], 50 // micro_batch)))

    @tf.function
    def epoch():
        for xb, yb in pieces:  # a Python loop: unrolled into one graph per epoch
            with tf.GradientTape() as tape:
                loss = mean_squared_error(model, xb, yb)
            accumulator.step(tape.gradient(loss, model.trainable_variables), len(xb))
        return mean_squared_error(model, x_all, y_all)

    return np.array([float(epoch()) for _ in range(epochs)])


runs = {"batch 10, lr 0.01": train_epochs(10, 1, 0.01),
        "batch 10 x 5 accumulated, lr 0.01": train_epochs(10, 5, 0.01),
        "batch 10 x 5 accumulated, lr 0.05": train_epochs(10, 5, 0.05),
        "batch 50, lr 0.01": train_epochs(50, 1, 0.01)}
for label, losses in runs.items():
    print(f"{label:35s} loss after 200 epochs: {losses[-1]:.4f}")
gap = np.abs(runs["batch 10 x 5 accumulated, lr 0.01"] - runs["batch 50, lr 0.01"]).max()
print(f"accumulated batch of 50 vs real batch of 50, largest loss gap: {gap:.4f}")

# %% mystnb={"figure": {"caption": "The y = x\u00b2 network's loss after each epoch: batches of 10, 5 accumulated micro-batches of 10 (an effective batch of 50) at the same and at a five times larger learning rate. A real batch of 50 lies exactly under the accumulated run at the same learning rate.", "name": "fig-effective-batch"}}
figure = None
for label, losses in runs.items():
    if label != "batch 50, lr 0.01":  # it lies exactly under the accumulated run
        figure = loss_curve(losses, ax=figure.axes[0] if figure else None, label=label,
                            title="Same data, different effective batch")
_ = figure.axes[0].set_xlabel("epoch")

# %% [markdown]
# Accumulating 5 micro-batches of 10 *is* training with batches of 50: the
# curves coincide ({numref}`fig-effective-batch`). Per epoch it is slower
# than batches of 10, because it makes a fifth of the updates; scaled up by
# 5, the learning rate brings it back. Accumulation changes how the work is
# done, not what is computed; the hyperparameters belong to the effective
# batch.
#
# The rule rests on an approximation: $k$ small steps with gradients
# $g_1, \ldots, g_k$ move the weights by about $-\eta \sum_i g_i$, one large
# step with the mean gradient and rate $k\eta$, *if the gradients barely
# change over those $k$ steps*. That fails where the loss curves sharply,
# typically early in training, so Goyal et al. ramp the rate up over the
# first epochs (a {term}`warm-up`); and a batch that is most of the training
# set leaves too few updates for the rule, with or without warm-up.
# [Accumulation in depth](d4_accumulation_in_depth) shows both on a digits
# classifier.

# %% [markdown]
# ## Summary
#
# - A plain TF2 loop sums into one variable per weight and applies the sum
#   divided by the number of micro-batches: the big batch's update.
# - `pargrad.GradientAccumulator(variables, accumulation_steps, optimizer)`
#   weights each micro-batch by its examples, eagerly or in `tf.function`.
# - Keras 3's `gradient_accumulation_steps` gives the same on one device, but
#   fails under `MirroredStrategy` (issue 20582) and divides by the number of
#   micro-batches.
# - Across replicas: effective batch = micro-batch × accumulation steps ×
#   replicas; runs with the same effective batch train identically, with
#   one all-reduce per update.
# - Micro-batches of unequal size must be weighted by their examples.
# - With BatchNorm, statistics are per micro-batch: not the big batch.
# - Accumulation keeps the activations at one micro-batch's, whatever the
#   batch, for one gradient-sized buffer per replica.
# - Choose the learning rate for the effective batch (the linear scaling
#   rule, with warm-up for large factors).
#
# ## Exercises
#
# 1. Give `keras_fit` a data set of 48 points and batches of 16, so that every
#    micro-batch is full. Does Keras's `gradient_accumulation_steps=3` now
#    match `fit` with batches of 48?
#
#    *Hint:* Keras divides by the number of micro-batches; when they are
#    equal, that is the same as weighting by examples.
# 2. Use `accumulator.step` inside `strategy.run`. What error do you get, and
#    why is it the same problem as Keras issue 20582?
#
#    *Hint:* `step` decides inside the replica, with a `tf.cond`, whether to
#    call `apply`.
# 3. Add a run with 2 replicas and $k = 6$ (micro-batch 4) to the table of
#    the section "Across replicas". Does it still match one device?
#
#    *Hint:* `train_parabola(2, 6)`; $4 \times 6 \times 2 = 48$.
# 4. In the BatchNorm experiment, replace `BatchNormalization` by
#    `LayerNormalization`. How large is the gradient error now? Why?
#
#    *Hint:* which examples does layer normalisation look at to normalise
#    one example?
# 5. Add `MICRO_BATCH = 512` to the memory experiment. Where does the
#    accumulated curve sit now? Which micro-batch size would you choose on a
#    GPU, and what decides it?
#
#    *Hint:* the accumulated peak is the peak of one micro-batch.
# 6. Accumulate 25 micro-batches of 10 with the learning rate scaled by 25,
#    `train_epochs(10, 25, 0.25)`: one update every five epochs of the 50
#    points. Is its effective batch really 250? Compare it with the full
#    batch at the same rate, `train_epochs(50, 1, 0.25, epochs=40)`.
#
#    *Hint:* within a window the weights do not move, and every one of the
#    50 points is in the window five times.
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# Yes: with equal micro-batches, Keras's mean over micro-batches is the mean
# over examples, and the weights match the big batch's to float32 rounding
# (the collapsed cell below runs it).
# ```

# %% tags=["hide-cell"]
def keras_fit_on(x, y, batch_size, accumulation_steps=None, epochs=3):
    keras.utils.set_random_seed(0)
    model = parabola_model()
    options = {} if accumulation_steps is None else {
        "gradient_accumulation_steps": accumulation_steps}
    model.compile(optimizer=keras.optimizers.SGD(0.05, **options), loss="mse")
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


x48, y48 = parabola_data(n=48)
gap48 = max_difference(keras_fit_on(x48, y48, 16, accumulation_steps=3),
                       keras_fit_on(x48, y48, 48))
print(f"fit(batch 16, 3 accumulation steps) vs fit(batch 48), 48 points: {gap48:.6f}")
assert gap48 < 1e-6

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# `step` would apply inside a `tf.cond` in the replica's function.
# `GradientAccumulator` refuses with its own error: under a strategy its sums
# only add up across replicas outside `strategy.run`. Had it gone on, the
# optimizer's `apply_gradients` would have needed a `merge_call` across
# replicas inside control flow, which TensorFlow refuses: exactly Keras's
# problem. Decide outside the replicas (call `accumulate` in `strategy.run`,
# `apply` outside), as this chapter does.
# ```

# %% tags=["hide-cell"]
with strategy.scope():
    model = parabola_model()
    accumulator = GradientAccumulator(model.trainable_variables, K, keras.optimizers.SGD(0.05))


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = mean_squared_error(model, x, y)
    return accumulator.step(tape.gradient(loss, model.trainable_variables), tf.shape(x)[0])


try:
    for xb, yb in batches:
        tf.function(lambda x, y: strategy.run(replica_step, (x, y)))(xb, yb)
        break
    print("UNEXPECTED: accumulator.step worked inside strategy.run")
except Exception as error:  # noqa: BLE001  (we report whatever TensorFlow raises)
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    print([line.strip() for line in text.splitlines() if line.strip()][-1])

# %% [markdown]
# ```{dropdown} Solution to exercise 3
# Yes: the effective batch is again 48, and the weights are one device's.
# ```

# %% tags=["hide-cell"]
history, weights, updates = train_parabola(2, 6)
gap = max(np.max(np.abs(a - b)) for a, b in zip(weights, reference))
print(f"2 replicas, k = 6: effective batch {history.effective_batch_size}, micro-batch "
      f"{history.micro_batch_size}, updates {updates}, weight gap to one device below "
      f"{tolerance:.0e}")
assert history.effective_batch_size == 48 and gap < tolerance

# %% [markdown]
# ```{dropdown} Solution to exercise 4
# Layer normalisation normalises each example with its own features'
# statistics, so each example's loss again depends on that example only: the
# accumulated gradient equals the big batch's to rounding.
# ```

# %% tags=["hide-cell"]
def parabola_with_layer_norm():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(5),
                             keras.layers.LayerNormalization(),
                             keras.layers.Activation("tanh"), keras.layers.Dense(1)])


model = parabola_with_layer_norm()
accumulator = GradientAccumulator(model.trainable_variables, K)
for xb, yb in shuffled:
    accumulator.accumulate(gradients_of(xb, yb), len(xb))
exact = gradients_of(x_all, y_all)
scale = max(float(np.abs(g).max()) for g in exact)
layer_norm_error = max_difference(accumulator.mean_gradients(), exact) / scale
print(f"LayerNorm: accumulated vs big-batch gradient, relative error: {layer_norm_error:.4f}")
assert layer_norm_error < 1e-5

# %% [markdown]
# ```{dropdown} Solution to exercise 5
# With micro-batches of 512 the accumulated curve is flat again, at the
# height of the whole-batch curve at 512: accumulation's peak is one
# micro-batch's. On a GPU, choose the largest micro-batch that fits in memory
# with room to spare, because a larger micro-batch uses the GPU better
# ({numref}`fig-peak-memory` shows the memory side; the benchmark
# `benchmarks/accumulation.py` the time side).
# ```
#
# ```{dropdown} Solution to exercise 6
# The window holds every point five times at the same weights, so its mean
# gradient *is* the full-batch gradient: the "effective batch of 250" is the
# 50 points, and the run is full-batch gradient descent at rate 0.25, one
# update every five epochs. Accumulation cannot make a batch larger than the
# data set; it only makes fewer updates. The collapsed cell compares the loss
# after each of its updates with the full batch's (they agree within float32
# rounding over 40 updates). The linear scaling rule was never tested here:
# a larger rate on the same full batch is what the run shows.
# ```

# %% tags=["hide-cell"]
scaled_25 = train_epochs(10, 25, 0.25)
full_batch_25 = train_epochs(50, 1, 0.25, epochs=40)
after_each_update = scaled_25[4::5]      # the loss after epochs 5, 10, ..., 200
relative_gap = np.max(np.abs(after_each_update - full_batch_25)) / np.max(np.abs(full_batch_25))
print(f"40 updates, accumulated 25 x 10 against the full batch: relative loss gap below "
      f"{pargrad.rounding_tolerance('float32', 40):.0e} (float32 rounding)")
assert relative_gap < pargrad.rounding_tolerance("float32", 40)
