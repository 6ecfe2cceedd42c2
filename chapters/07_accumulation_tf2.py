# %% [markdown]
# # Accumulation in TF2 and Keras 3
#
# The previous chapter fixed the TF1 recipe: accumulate the micro-batches'
# gradients in variables, count, apply the mean. TensorFlow 2 runs code
# eagerly or compiles it with `tf.function`, and Keras 3 has accumulation
# built into its optimizers. This chapter does the same job in both, and
# then looks at what accumulation does *not* give you.
#
# **In this chapter you will**
#
# - use `pargrad.GradientAccumulator` in a custom training loop, eagerly and
#   compiled, and check it against the big batch;
# - use Keras 3's `gradient_accumulation_steps` on one device, and see it fail
#   under `MirroredStrategy` (Keras issue 20582), live;
# - see why micro-batches of unequal size must be weighted by their number of
#   examples, not counted;
# - stop training in the middle of an accumulation window and resume it, bit
#   for bit;
# - measure how far accumulation is from the big batch when the model has
#   BatchNorm;
# - measure the memory that accumulation saves, the reason to use it;
# - connect the effective batch size with the learning rate;
# - measure the accumulation thread's premise, that a small batch's gradient
#   is too noisy, and see when accumulation or a learning-rate schedule is
#   the better answer.
#
# Runs in under two minutes on a two-core CPU; no GPU needed.

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

# %% [markdown]
# `pargrad` first, then two logical devices (the `MirroredStrategy` section
# needs two replicas; everything else uses the first device), then seeds.

# %%
import inspect
import re
import tempfile

import numpy as np
import pargrad

devices = pargrad.logical_devices(2)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from pargrad.book import plots  # noqa: E402
from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.book.memory import peak_memory  # noqa: E402

keras.utils.set_random_seed(0)
# This chapter compares accumulation with the big batch to float32 rounding.
# On recent NVIDIA GPUs TensorFlow computes float32 matrix products in TF32
# (about 1e-3 relative error) unless told otherwise; no effect on a CPU.
tf.config.experimental.enable_tensor_float_32_execution(False)
print("TensorFlow", tf.__version__, "| Keras", keras.__version__, "| devices:", devices)

# %% [markdown]
# ## Accumulation in a plain TF2 loop
#
# The whole recipe fits in one `tf.function`, for the y = x² question's
# network in float64: a `tf.Variable` per trainable variable holds the sum of
# the micro-batches' gradients; after the last of $K$ micro-batches of equal
# size the sum divided by $K$ is the big batch's mean gradient, and one
# `apply_gradients` uses it; then the sums go back to zero. A program to copy:

# %%
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


@tf.function
def accumulated_update():
    for x_micro, y_micro in zip(np.split(x, K), np.split(y, K)):  # K forward-backward passes
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x_micro) - y_micro))  # the micro-batch's mean
        for total, gradient in zip(sums, tape.gradient(loss, model.trainable_variables)):
            total.assign_add(gradient)  # add: nothing is applied yet
    optimizer.apply_gradients(zip([total / K for total in sums], model.trainable_variables))
    for total in sums:
        total.assign(tf.zeros_like(total))  # reset for the next window


for _ in range(200):
    accumulated_update()

# %% [markdown]
# The big batch, trained as long, ends with the same weights within float64
# rounding (`pargrad.rounding_tolerance`, from the chapter "Synchronous
# training"):

# %%
big, big_optimizer = new_model(), keras.optimizers.SGD(learning_rate=1e-2)
for _ in range(200):  # the big batch: all 50 points at once, eagerly
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(big(x) - y))
    big_optimizer.apply_gradients(zip(tape.gradient(loss, big.trainable_variables),
                                      big.trainable_variables))
loop_gap = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), big.get_weights()))
loop_moved = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), new_model().get_weights()))
loop_tolerance = pargrad.rounding_tolerance("float64", 200)
print(f"trained: the weights moved from the start: {loop_moved > 0.01}")
print(f"{K} micro-batches vs the big batch after 200 updates, weight gap < tolerance "
      f"({loop_tolerance:.0e}): {loop_gap < loop_tolerance}")

# %% [markdown]
# Dividing by $K$ is right only when the micro-batches have equal sizes; the
# class below counts examples instead, and adds what a training run needs
# around these lines.

# %% [markdown]
# ## `GradientAccumulator` in a custom loop
#
# The TF2 accumulator keeps the same state as the TF1 recipe: one sum per
# variable and a count. It differs in one respect: it counts *examples*, not
# micro-batches. Each micro-batch's gradient (of a loss that is a mean over
# the micro-batch) is multiplied by the micro-batch's size before it is
# added, and `apply` divides by the total number of examples:

# %%
print(inspect.getsource(GradientAccumulator.accumulate))
print(inspect.getsource(GradientAccumulator.mean_gradients))

# %% [markdown]
# The state lives in variables, so the same object works eagerly and inside a
# `tf.function`. A training loop over micro-batches calls `step`, which
# accumulates and, every `steps` calls, applies and starts a new window. We
# use the y = x² question's network and data again: 50 points, micro-batches of 10, so
# `steps=5` makes one update from the whole data set.

# %%
x_all, y_all = pargrad.parabola_data()
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


def big_batch_weights(make_optimizer, updates, make_model=pargrad.parabola_model):
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
    model = pargrad.parabola_model()
    accumulator = GradientAccumulator(model.trainable_variables, steps=K,
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
model = pargrad.parabola_model()
for attempt in [lambda: GradientAccumulator(model.trainable_variables, steps=0),
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
    model = pargrad.parabola_model()
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
# Put the same model in a `MirroredStrategy` scope, two replicas on our two
# logical devices, and `fit` fails on the first batch. Keras applies the
# accumulated gradients inside a conditional (`ops.cond`: "is this the
# `steps`-th call?"), and the update is a synchronisation point between
# replicas (`merge_call`), which TensorFlow does not allow inside control flow
# in a replica's function. This is Keras issue
# [20582](https://github.com/keras-team/keras/issues/20582); tf.keras users met
# the same limit in their own accumulation code
# ([keras issue 17429](https://github.com/keras-team/keras/issues/17429)).
# The cell below expects the error, and says so if a future Keras no longer
# raises it.

# %%
strategy = tf.distribute.MirroredStrategy(devices)
with strategy.scope():
    model = pargrad.parabola_model()
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
# A custom loop does not have this problem, because it decides *outside* the
# replicas when to apply. `GradientAccumulator` keeps its sums in
# "sync-on-read" variables: under a strategy, each replica adds its own
# gradients into its own copy (inside `strategy.run`), and reading the sums
# outside `strategy.run`, in `apply()`, adds the copies up: one all-reduce per
# update instead of one per micro-batch. The chapter "Accumulate and
# distribute" builds on this; here we only check that it equals the big batch:

# %%
with strategy.scope():
    model = pargrad.parabola_model()
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
# ## Unequal micro-batches: count examples, not micro-batches
#
# Fifty examples do not split into micro-batches of 16: the last one holds 2.
# Dividing the accumulated gradients by the *number of micro-batches* (answer
# 3's counter, and what Keras's `gradient_accumulation_steps` does) gives the
# two last examples the weight of sixteen. Weighting each micro-batch by its
# size gives exactly the big batch's gradient:

# %%
sizes = [16, 16, 16, 2]
pieces = np.split(np.arange(50), np.cumsum(sizes)[:-1])
model = pargrad.parabola_model()


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
# largest, weigh as much as sixteen points each. After three epochs Keras's
# weights sit visibly away from the big batch's. Weighting by examples is exact. With a `tf.data`
# pipeline the last batch of an epoch is usually the short one; either drop
# it (`drop_remainder=True`) or weight by examples.
#
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
    model = pargrad.parabola_model(seed=seed)
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
# function being differentiated. The moving statistics that BatchNorm keeps
# for inference are updated once per micro-batch, from micro-batch
# statistics, too. In practice: with accumulation, BatchNorm behaves as
# with the *micro*-batch size; if small micro-batches hurt, switch to a
# normalisation that does not look across examples (layer or group
# normalisation), or, under a strategy, synchronise the statistics across
# replicas (`keras.layers.BatchNormalization(synchronized=True)`), which
# still does not reach across micro-batches.
#
# ## Memory: why people accumulate
#
# The gradient of a batch needs the activations of every example in it at
# once; accumulation needs those of one micro-batch at a time. We measure
# the peak memory of one update for growing batch sizes, each computed whole
# or accumulated from micro-batches of 64, on a model with 2048 inputs and two
# hidden layers of 512. The measurement runs in a fresh process
# (`pargrad.book.memory.peak_memory`), so that nothing this notebook holds
# counts: on a GPU it reads TensorFlow's peak device memory, on a CPU the
# process's peak resident memory, TensorFlow's own few hundred MB included
# (on Linux the peak is reset before each update). It is the page's longest
# cell:

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
assert growth_whole > 100 and growth_accumulated < growth_whole / 4
_ = plots.peak_memory_against_batch(BATCH_SIZES, memory["whole_mb"], memory["accumulated_mb"],
                                    MICRO_BATCH, device=memory["device"])

# %% [markdown]
# In {numref}`fig-peak-memory`, the whole batch's peak grows with the batch (the batch itself, the
# activations and their gradients); accumulation stays flat at the cost of
# one micro-batch, for any number of examples per update. (The numbers
# depend on the machine; the cell checks that the whole batch's growth
# dwarfs the accumulated one's.) The price is time:
# $k$ small matrix products use the hardware less well than one big one,
# which the benchmark `benchmarks/accumulation.py` measures.
#
# ## The learning rate and the effective batch size
#
# Accumulating $k$ micro-batches of $b$ examples, on $r$ replicas, makes
# updates from an **{term}`effective batch`** of $b \cdot k \cdot r$ examples. With
# the mean (not the sum) the update is the one of that batch, so the
# learning rate to use is the one that suits *that* batch size. Going from
# batches of 10 to accumulated batches of 50 means five times fewer updates
# per epoch; Goyal et al.'s *linear scaling rule* {cite}`goyal2017accurate`
# compensates by multiplying the learning rate by the same factor (with a
# warm-up for large factors). On the y = x² network, 200 epochs of shuffled
# data:

# %%
def train_epochs(micro_batch, steps, learning_rate, epochs=200):
    """Full-data loss after each epoch, accumulating `steps` micro-batches per update."""
    keras.utils.set_random_seed(0)
    model = pargrad.parabola_model()
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
        figure = plots.loss_curve(losses, ax=figure.axes[0] if figure else None, label=label,
                                  title="Same data, different effective batch")
_ = figure.axes[0].set_xlabel("epoch")

# %% [markdown]
# Accumulating 5 micro-batches of 10 *is* training with batches of 50: the
# curves coincide ({numref}`fig-effective-batch`). Per epoch it is slower than batches of 10, because it
# makes a fifth of the updates; scaled up by 5, the learning rate brings it
# back. Accumulation changes how the work is done, not what is computed; the
# hyperparameters belong to the effective batch.
#
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
        losses = tf.reduce_sum(tf.square(pargrad.parabola_forward(x64, variables) - y64), axis=1)
    return np.concatenate([tf.reshape(j, [len(x64), -1]).numpy()
                           for j in tape.jacobian(losses, variables)], axis=1)


_, trained_weights = pargrad.fit_one_device(x_all, y_all, steps=2000, learning_rate=0.01, seed=0)
NOISE_SIZES, DRAWS, N = [1, 2, 5, 10, 25], 2000, len(x_all)
noise = {}
for label, weights in [("initial weights", pargrad.initial_weights(seed=0)),
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
# previous section's runs show the trade on this problem: 5 accumulated
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
#   (chapter "Accumulate and distribute"); or an optimizer whose per-update
#   state should see large-batch gradients. Beyond the batch size at which
#   the noise is small next to the gradient, McCandlish et al.'s *critical
#   batch size* {cite}`mccandlish2018empirical`, a larger batch only costs
#   time.
#
# ## Summary
#
# - `pargrad.GradientAccumulator(variables, steps, optimizer)` accumulates
#   example-weighted gradients in variables and applies their mean, eagerly
#   or in `tf.function`; it equals the big batch to float32 rounding.
# - Keras 3's `gradient_accumulation_steps` gives the same on one device, but
#   fails under `MirroredStrategy` (issue 20582) and divides by the number of
#   micro-batches.
# - Micro-batches of unequal size must be weighted by their examples;
#   counting them over-weights the short one.
# - The accumulator's state is checkpointed with the model: a run stopped in
#   mid-window resumes bit for bit.
# - With BatchNorm, accumulation is not the big batch: statistics are per
#   micro-batch (a few percent of gradient here).
# - Accumulation keeps peak memory at one micro-batch's, whatever the batch;
#   the whole batch's grows with it.
# - The effective batch is micro-batch × steps × replicas; choose the
#   learning rate for it (linear scaling rule).
# - Gradient noise falls as one over the batch size, and accumulating $k$
#   micro-batches of $b$ has the noise of a batch of $kb$; against noise
#   alone a learning-rate schedule is cheaper, accumulation is for when the
#   effective batch itself is needed.
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
# 3. In the BatchNorm experiment, replace `BatchNormalization` by
#    `LayerNormalization`. How large is the gradient error now? Why?
#
#    *Hint:* which examples does layer normalisation look at to normalise
#    one example?
# 4. Add `MICRO_BATCH = 512` to the memory experiment. Where does the
#    accumulated curve sit now? Which micro-batch size would you choose on a
#    GPU, and what decides it?
#
#    *Hint:* the accumulated peak is the peak of one micro-batch.
# 5. Accumulate 25 micro-batches of 10 with the learning rate scaled by 25,
#    `train_epochs(10, 25, 0.25)`: one update every five epochs of the 50
#    points. Is its effective batch really 250? Compare it with the full
#    batch at the same rate, `train_epochs(50, 1, 0.25, epochs=40)`.
#
#    *Hint:* within a window the weights do not move, and every one of the
#    50 points is in the window five times.
# 6. Measure the gradient noise at the initial weights for batches drawn
#    *with* replacement. Which factor of the prediction disappears?
#
#    *Hint:* `rng.choice(N, b, replace=True)`.
#
# ### Solutions
#
# **Exercise 1.** Yes: with equal micro-batches, Keras's mean over
# micro-batches is the mean over examples, and the weights match the big
# batch's to float32 rounding:

# %% tags=["hide-cell"]
def keras_fit_on(x, y, batch_size, accumulation_steps=None, epochs=3):
    keras.utils.set_random_seed(0)
    model = pargrad.parabola_model()
    options = {} if accumulation_steps is None else {
        "gradient_accumulation_steps": accumulation_steps}
    model.compile(optimizer=keras.optimizers.SGD(0.05, **options), loss="mse")
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


x48, y48 = pargrad.parabola_data(n=48)
gap48 = max_difference(keras_fit_on(x48, y48, 16, accumulation_steps=3),
                       keras_fit_on(x48, y48, 48))
print(f"fit(batch 16, 3 accumulation steps) vs fit(batch 48), 48 points: {gap48:.6f}")
assert gap48 < 1e-6

# %% [markdown]
# **Exercise 2.** `step` would apply inside a `tf.cond` in the replica's
# function. `GradientAccumulator` refuses with its own error: under a
# strategy its sums only add up across replicas outside `strategy.run`. Had
# it gone on, the optimizer's `apply_gradients` would have needed a
# `merge_call` across replicas inside control flow, which TensorFlow refuses:
# exactly Keras's problem. Decide outside the replicas (call `accumulate` in
# `strategy.run`, `apply` outside), as this chapter does:

# %% tags=["hide-cell"]
with strategy.scope():
    model = pargrad.parabola_model()
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
# **Exercise 3.** Layer normalisation normalises each example with its own
# features' statistics, so each example's loss again depends on that example
# only: the accumulated gradient equals the big batch's to rounding.

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
# **Exercise 4.** With micro-batches of 512 the accumulated curve is flat
# again, at the height of the whole-batch curve at 512: accumulation's peak
# is one micro-batch's. On a GPU, choose the largest micro-batch that fits
# in memory with room to spare, because a larger micro-batch uses the GPU
# better ({numref}`fig-peak-memory` shows the memory side; the benchmark
# `benchmarks/accumulation.py` the time side).
#
# **Exercise 5.** The window holds every point five times at the same
# weights, so its mean gradient *is* the full-batch gradient: the
# "effective batch of 250" is the 50 points, and the run is full-batch
# gradient descent at rate 0.25, one update every five epochs. Accumulation
# cannot make a batch larger than the data set; it only makes fewer updates.
# The cell compares the loss after each of its updates with the full batch's
# (they agree within float32 rounding over 40 updates):

# %% tags=["hide-cell"]
scaled_25 = train_epochs(10, 25, 0.25)
full_batch_25 = train_epochs(50, 1, 0.25, epochs=40)
after_each_update = scaled_25[4::5]      # the loss after epochs 5, 10, ..., 200
relative_gap = np.max(np.abs(after_each_update - full_batch_25)) / np.max(np.abs(full_batch_25))
print(f"40 updates, accumulated 25 x 10 against the full batch: "
      f"gap within the rounding tolerance: {relative_gap < pargrad.rounding_tolerance('float32', 40)}")
assert relative_gap < pargrad.rounding_tolerance("float32", 40)

# %% [markdown]
# The linear scaling rule was never tested here: a larger rate on the same
# full batch is what the run shows. The rule assumes that the gradient
# changes little over the small steps it replaces by one large step; that
# fails where the loss curves sharply, typically at the start of training.
# Goyal et al. {cite}`goyal2017accurate` found it failing there for large
# factors on ResNet-50 and added a warm-up: the learning rate ramps up from
# the small-batch value over the first epochs.
#
# **Exercise 6.** Drawn with replacement, the $b$ examples are independent,
# so the noise is $\sigma^2 / b$ exactly: the finite-population factor
# $(N - b)/(N - 1)$ disappears. It matters for large $b$: a batch of all 50
# points, drawn without replacement, has no noise at all.
