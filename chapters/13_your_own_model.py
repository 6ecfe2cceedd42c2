# %% [markdown]
# # Your own model
#
# ```{admonition} Takeaway
# :class: tip
# `SyncTrainer.fit` takes what Keras's `fit` takes: a `tf.data` pipeline,
# validation data, metrics, callbacks. A checkpoint of the model, the
# optimizer and the trainer resumes a run bit for bit. Keras `fit` under
# `strategy.scope()` reaches the same accuracy; the custom loop adds several
# processes, accumulation, exact resumes and a stop on bad data.
# ```
#
# This chapter takes `SyncTrainer` home: a small convolutional network, a
# `tf.data` input pipeline, validation, metrics, Keras callbacks, a checkpoint
# and a run resumed from it, written as a Keras user would. Then Keras's
# own `fit` trains the same model under the same strategy, and we compare.
#
# **In this chapter you will**
#
# - feed `SyncTrainer` from a `tf.data` pipeline of global batches, with
#   validation data, a Keras metric and callbacks, and read its history like
#   Keras's;
# - resume a run from a checkpoint in a new trainer, and check that it ends
#   with *exactly* the uninterrupted run's weights;
# - train the same network with `model.fit` under `strategy.scope()`, see
#   that it reaches the same accuracy, and where the two differ;
# - see what the trainer does with data it cannot train on: a NaN, a
#   fractional batch size, targets of the wrong shape.
#
# No GPU needed.

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
# As in every chapter: `pargrad` first, two logical devices before TensorFlow
# starts, seeds fixed. A resumed run must end *bit for bit* where the
# uninterrupted one does, so the same operations must add their numbers in the
# same order every time. On a CPU they do; on a GPU some kernels (a
# convolution's gradient among them) may pick a faster, nondeterministic
# order, so we ask TensorFlow for deterministic kernels
# (`enable_op_determinism`).

# %%
import pargrad  # first: it imports TensorFlow quietly

devices = pargrad.logical_devices(2)

import pathlib
import tempfile
import time

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from pargrad.book import digits, show_source
from pargrad.data import TrainingPosition, epoch_permutation
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
strategy = sync_strategy(2)
print(strategy.num_replicas_in_sync, "replicas")

# %% [markdown]
# ## The data as a pipeline
#
# The handwritten digits of [Sync vs async in the same time](05_sync_vs_async)
# are 8 × 8 grey images; we keep them as images (8 × 8 × 1) for a
# convolutional network. A `tf.data.Dataset` is TensorFlow's input pipeline: a
# description of how to read, shuffle and batch the data, run as training asks
# for batches, so the data need not fit in memory. Ours holds *global* batches
# of 64 images, each cut into one shard of 32 per replica, as `fit` cuts
# arrays; it drops the last, partial batch (`drop_remainder=True`) so that
# every batch splits evenly over the replicas.
#
# It serves the images in one fixed shuffled order (a permutation drawn once
# from seed 0), the same in every {term}`epoch` (one pass over the training
# set); the section on resuming says why.

# %%
x_train, y_train, x_test, y_test = digits.digits_data(seed=0)
x_train, x_test = x_train.reshape(-1, 8, 8, 1), x_test.reshape(-1, 8, 8, 1)
BATCH = 64


ORDER = np.random.default_rng(0).permutation(len(x_train))


def pipeline():
    """Training batches: one fixed shuffled order, 64 images a batch, the rest dropped."""
    data = tf.data.Dataset.from_tensor_slices((x_train[ORDER], y_train[ORDER]))
    return data.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


test_data = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)
print(f"{len(x_train)} training images, {len(x_train) // BATCH} batches of {BATCH} an epoch; "
      f"{len(x_test)} test images")

# %% [markdown]
# ## The model
#
# A {term}`convolutional network` slides small learned filters over the image,
# so the same pattern is recognised wherever it appears. Ours has two 3 × 3
# convolutions with pooling and a dense layer to the ten classes' *logits*
# (scores before the softmax). The last layer's kernel carries an L2 penalty:
# Keras puts it in `model.losses`, which `SyncTrainer` adds to the loss,
# divided by the number of replicas so that the all-reduce counts it once.

# %%
def digit_network(seed=0):
    """A small convolutional network for 8 x 8 digits: 10 logits."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(10, kernel_regularizer=keras.regularizers.L2(1e-4)),
    ])


def sync_trainer(seed=0):
    """The network, its optimizer and its metric, made in the strategy's scope."""
    with strategy.scope():
        model = digit_network(seed)
        optimizer = keras.optimizers.Adam(3e-3)
        accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    return SyncTrainer(model, strategy, optimizer=optimizer, metrics=[accuracy], progress=False,
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


print(f"{digit_network().count_params()} parameters")

# %% [markdown]
# Everything a replica needs is made inside `strategy.scope()`: the model's
# variables are mirrored on both devices, and the metric's counts live on each
# replica and are summed when read, so the accuracy covers the whole batch.
# The trainer asks the Keras loss object for one value per example and divides
# their sum by the global batch itself.

# %% [markdown]
# ## Training, with validation and a callback
#
# `fit(data, epochs=4, validation_data=...)` reads the pipeline once an epoch,
# evaluates the test set after each epoch (in inference mode), and calls Keras
# callbacks where Keras's `fit` calls them. Our one callback saves a
# checkpoint after the second epoch: a `tf.train.Checkpoint` of the model, the
# optimizer (Adam's moments) and the trainer, whose variables say where
# training stands.

# %%
class SaveAfterEpoch(keras.callbacks.Callback):
    """Save ``checkpoint`` to ``path`` at the end of epoch ``epoch`` (counted from 0)."""

    def __init__(self, checkpoint, path, epoch):
        super().__init__()
        self.checkpoint, self.path, self.epoch, self.saved = checkpoint, path, epoch, None

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.saved = self.checkpoint.save(self.path)


folder = pathlib.Path(tempfile.mkdtemp())
trainer = sync_trainer()
checkpoint = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer,
                                 trainer=trainer)
saver = SaveAfterEpoch(checkpoint, str(folder / "digits"), epoch=1)
start = time.perf_counter()
history = trainer.fit(pipeline(), epochs=4, validation_data=test_data, callbacks=[saver])
sync_seconds = time.perf_counter() - start
print(sorted(history.history), history.epoch)

# %% [markdown]
# The history reads like Keras's: per epoch the mean training loss (with the
# L2 penalty) and accuracy, and the same two on the test set; it also keeps
# one loss per step (`history.loss`). The last digits depend on the order of
# floating-point additions and may differ on your machine:

# %% tags=["nbval-ignore-output"]
for epoch in history.epoch:
    row = {name: values[epoch] for name, values in history.history.items()}
    print(f"epoch {epoch}: " + ", ".join(f"{name} {value:.3f}" for name, value in row.items()))

# %% tags=["remove-cell"]
assert history.history["val_accuracy"][-1] > 0.9 and len(history.loss) == 84

# %% mystnb={"figure": {"caption": "Training and test accuracy of the convolutional network on the digits, per epoch, trained by SyncTrainer on two replicas from a tf.data pipeline.", "name": "fig-own-model-history"}}
figure, ax = plt.subplots(figsize=(5, 3))
ax.plot(history.epoch, history.history["accuracy"], "o-", label="training")
ax.plot(history.epoch, history.history["val_accuracy"], "s-", label="test (validation)")
ax.set_xlabel("epoch")
ax.set_ylabel("accuracy")
ax.set_xticks(history.epoch)
ax.legend()
figure.tight_layout()

# %% [markdown]
# {numref}`fig-own-model-history` shows both accuracies per epoch. The
# property that holds on every machine is printed here:

# %%
final = history.history["val_accuracy"][-1]
print(f"test accuracy after 4 epochs above 0.9: {final > 0.9}")

# %% [markdown]
# ## A checkpoint, and a resumed run
#
# A run that stops (a pre-empted cloud machine, a closed laptop) should
# continue as if nothing had happened. That takes more than the weights: the
# optimizer's state (Adam keeps two running averages per weight) and *where in
# the data* training stood, which `SyncTrainer` keeps in variables
# (`trainer.position`: the step, the epoch, the next batch, the shuffling
# seed) that `tf.train.Checkpoint(trainer=trainer)` saves with the rest. What
# the checkpoint written after epoch 1 holds about the trainer:

# %%
saved = tf.train.load_checkpoint(saver.saved)
print({name.split("/")[2]: int(saved.get_tensor(name))
       for name in sorted(saved.get_variable_to_shape_map())
       if name.startswith("trainer/position/")})

# %% [markdown]
# Two epochs done, the next starting at its first batch. A *new* trainer, with
# a new model whose weights start elsewhere (seed 1), restores that checkpoint
# and trains the remaining two epochs from a freshly built pipeline. If the
# resume is right, its weights are the uninterrupted run's, bit for bit:

# %%
resumed = sync_trainer(seed=1)
tf.train.Checkpoint(model=resumed.model, optimizer=resumed.optimizer,
                    trainer=resumed).restore(saver.saved).assert_consumed()
rest = resumed.fit(pipeline(), epochs=2, validation_data=test_data)
equal = all(np.array_equal(a, b) for a, b in zip(resumed.model.get_weights(),
                                                 trainer.model.get_weights()))
print("epochs of the resumed run:", rest.epoch)
print("resumed run == uninterrupted run, every weight bit for bit:", equal)

# %% tags=["remove-cell"]
assert equal

# %% [markdown]
# Why the pipeline's order is fixed: a `tf.data` shuffle
# (`dataset.shuffle(buffer, seed=...)`) draws a new order each time the *same
# dataset object* is iterated, so epoch 3's order lives in that object's
# state, not in any checkpoint (and its seed combines with TensorFlow's global
# seed, which `keras.utils.set_random_seed` changes). A new pipeline would
# start with another order, and the resumed run would see other batches: a
# correct training run, but not the same one. With in-memory arrays,
# `fit(x, y, epochs=..., shuffle=True, seed=...)` reshuffles every epoch and
# still resumes exactly: its order is a function of the seed and the epoch's
# number, both in the checkpoint.

# %% [markdown]
# Two pieces of `pargrad.data` make the resume exact. The position, a
# `tf.Module` of variables (`pargrad.data.TrainingPosition`, collapsed below)
# that the trainer tracks, puts in the checkpoint the step, the epoch, the
# step into the epoch, the next batch's first row and the shuffling seed. The
# epoch's order, `pargrad.data.epoch_permutation`, comes from a generator
# seeded with the seed *and the epoch's number*, so any epoch's order needs
# only those two numbers, never the generator's state after earlier epochs.
# Keras's own loop {cite}`keras3trainer` keeps its place in an epoch in Python
# objects (its `EpochIterator` counts the steps it has seen), and
# `fit(initial_epoch=...)` starts again at the beginning of an epoch.

# %% tags=["hide-cell"]
show_source(TrainingPosition)

# %%
show_source(epoch_permutation)
third = epoch_permutation(seed=5, epoch=3, n=8)
print("epoch 3, seed 5:", third, "; drawn again:", epoch_permutation(5, 3, 8),
      "; epoch 2:", epoch_permutation(5, 2, 8))

# %% tags=["remove-cell"]
assert np.array_equal(third, epoch_permutation(5, 3, 8))
assert not np.array_equal(third, epoch_permutation(5, 2, 8))

# %% [markdown]
# ## The same model under Keras `fit`
#
# Compiled inside `strategy.scope()`, Keras's own `fit` runs the same
# synchronous algorithm: each global batch is split over the replicas, each
# replica's loss is scaled so that the all-reduced gradient is the batch's
# mean, and one update is applied everywhere. We train the same network from
# the same initial weights, optimizer, data and epochs.

# %%
with strategy.scope():
    keras_model = digit_network(seed=0)
    keras_model.compile(optimizer=keras.optimizers.Adam(3e-3),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
start = time.perf_counter()
keras_history = keras_model.fit(pipeline(), epochs=4, validation_data=test_data, shuffle=False,
                                verbose=0)
keras_seconds = time.perf_counter() - start
print(sorted(keras_history.history))

# %% [markdown]
# The two runs are equal in exact arithmetic: the same batches, shards, scaled
# loss and Adam. In floating point they are equal only if both add the same
# numbers in the same order, which nothing promises: Keras reduces the loss
# and the gradients with its own ops, which a new Keras version, other CPU
# kernels or a GPU may reorder, and Adam's division by the square root of
# running averages lets a rounding difference grow over the steps. A test
# image whose two best logits nearly tie can then be classified differently.
# So we compare the accuracies with a tolerance of 0.02 (a handful of test
# images, counted in the cell):

# %%
keras_final = keras_history.history["val_accuracy"][-1]
gap = abs(final - keras_final)
print(f"both above 0.9: {final > 0.9 and keras_final > 0.9}; same test accuracy within 0.02 "
      f"({round(0.02 * len(x_test))} of {len(x_test)} images): {gap <= 0.02}")

# %% tags=["remove-cell"]
assert gap <= 0.02

# %% tags=["nbval-ignore-output"]
weight_gap = max(float(np.max(np.abs(a - b)))
                 for a, b in zip(trainer.model.get_weights(), keras_model.get_weights()))
print(f"test accuracy: SyncTrainer {final:.4f}, Keras fit {keras_final:.4f}; "
      f"largest weight difference {weight_gap:.2e}")
print(f"wall time for 4 epochs: SyncTrainer {sync_seconds:.1f} s, Keras fit {keras_seconds:.1f} s")

# %% [markdown]
# The cell above prints the accuracies, the weight gap and both wall times.
# The weight gap is zero when both loops run the same float32 operations in
# the same order, and rounding-sized when they do not; the accuracies agree
# either way. Two wall times cannot say which loop is faster: each is one run,
# both include tracing in their first epoch, and other programs may share the
# cores. To compare steps, run `benchmarks/sync.py`, which times a
# `SyncTrainer` step against Keras `fit` and a hand-written loop, repeatedly.
# On a GPU this model is too small to keep it busy: expect times of the same
# order as on a CPU, bound by launching kernels and copying batches.
#
# Where they differ, for a reader choosing one:
#
# | | `SyncTrainer` | Keras `fit` under `strategy.scope()` |
# | --- | --- | --- |
# | the step | about 25 lines you can read ([Synchronous training](03_synchronous)) | inside Keras's trainer |
# | several processes | `MultiWorkerMirroredStrategy` works | fails in Keras 3 (keras issue 20585) |
# | gradient accumulation with replicas | `accumulation_steps=k` | fails under `MirroredStrategy` (keras issue 20582) |
# | a last batch that does not split over the replicas | refused, with the sizes that work | split unevenly |
# | input | arrays, or a dataset read on the host and cut into shards | arrays or datasets, prefetched to each device |
# | a NaN or inf in the data | refused before the step that would use it, names the row | trains on |
# | a NaN loss | stops before the update, names step and replica | trains on (`TerminateOnNaN` stops after) |
# | resuming mid-run | exact, with `tf.train.Checkpoint(trainer=...)` | weights and optimizer; the position in the data is yours to keep |
# | per-step records | loss per step (per replica's times in the book's instruments) | per-epoch logs, per-batch callbacks |
#
# Keras prefetches each replica's shard to its device while the previous step
# runs; `SyncTrainer` reads the global batch on the host and lets each replica
# gather its rows. On CPUs the two are alike; on GPUs with a heavy input
# pipeline, prefetching hides the copy. The trainer avoids `tf.distribute`'s
# distributed iterators on purpose: with TensorFlow 2.21, a process can block
# for good when such an iterator is garbage collected mid-epoch (its
# multi-device buffers run background threads), as this book's tests saw.

# %% [markdown]
# ## When the data or the loss goes bad
#
# A custom loop can silently train on something other than you meant.
# `SyncTrainer` stops instead, in two places. The first is the data: a NaN or
# an infinity in the arrays is refused before the first step, its row named (a
# `tf.data` pipeline is checked batch by batch, before the step that would use
# the batch). The trainer checks the data themselves, not what the network
# makes of them: whether a NaN pixel reaches the loss is the kernels'
# business (TensorFlow's CPU kernels for ReLU and max-pooling can drop a NaN).
# Here image 40 holds a NaN:

# %%
broken = x_train.copy()
broken[40] = np.nan
try:
    sync_trainer().fit(broken, y_train, steps=3, batch_size=BATCH)
except pargrad.NonFiniteDataError as error:
    print(type(error).__name__, error)

# %% [markdown]
# The second is the loss: every replica's loss is checked in every step, and
# a NaN or infinite loss (too large a learning rate, a log of 0) stops the
# fit *before* that step's update is applied, naming the step and the
# replica (`tests/test_sync.py` checks both).

# %% [markdown]
# `SyncTrainer(stop_on_non_finite=False)` trains on, as Keras does. Other
# mistakes are refused with what to pass instead: a batch size computed as a
# float, an integer label per example given to the default squared error
# (ten outputs, one target), a dataset of single examples instead of
# batches:

# %%
attempts = {
    "batch_size=64.0": lambda t: t.fit(x_train, y_train, steps=1, batch_size=64.0),
    "squared error, labels": lambda t: SyncTrainer(t.model, strategy, progress=False).fit(
        x_train, np.eye(10)[y_train][:, :3], steps=1, batch_size=BATCH),
    "unbatched dataset": lambda t: t.fit(
        tf.data.Dataset.from_tensor_slices((x_train, y_train)), steps=1),
}
for name, attempt in attempts.items():
    try:
        attempt(sync_trainer())
    except (ValueError, TypeError) as error:
        print(f"{name}: {type(error).__name__}: {error}\n")

# %% [markdown]
# Targets of shape `(N,)` for a one-output model, NumPy's float64 or
# integer targets, Python lists, a loss given by name (`loss="mse"`), a
# `mixed_float16` policy (with Keras's loss scaling): all of these train as
# Keras's `fit` trains them (`tests/test_sync.py` checks each).

# %% [markdown]
# ## Summary
#
# - `SyncTrainer.fit` takes what Keras's `fit` takes: arrays or a `tf.data`
#   pipeline of global batches, `epochs=`, `validation_data=`, Keras metric
#   objects (made in the strategy's scope, summed over replicas) and Keras
#   callbacks; its history reads like Keras's and keeps one loss per step.
# - A checkpoint of the model, the optimizer and the trainer resumes a run
#   exactly, as long as the input order is a function of what the checkpoint
#   holds (a fixed pipeline order, or arrays shuffled by seed and epoch).
# - The same network under Keras `fit` and `strategy.scope()` reaches the
#   same test accuracy, within the rounding that floating point allows;
#   the custom loop adds several processes, accumulation, exact resumes and
#   a stop on NaN, Keras adds device prefetching and uneven last batches.
# - Bad data stop training with an error that names the step and the replica
#   or says what to pass.
#
# ## Exercises
#
# 1. Resume in the middle of an epoch: save a checkpoint after the 10th step
#    of epoch 2 instead of at the end of epoch 1, and check that the resumed
#    run again ends with the uninterrupted weights.
#
#    *Hint:* a callback's `on_train_batch_end(batch, logs)` is called after
#    every step with the step's index in the epoch; a resumed trainer skips
#    the batches of the epoch it has already seen.
# 2. Change the pipeline to shuffle with `tf.data`
#    (`data.shuffle(len(x_train), seed=0)` before `batch`), repeat the
#    resume, and explain the result. What would you change to make it exact
#    again?
#
#    *Hint:* compare the batches of epoch 2 of a pipeline iterated twice
#    before with those of a new pipeline's first iteration.
# 3. Train the network with `SyncTrainer(..., accumulation_steps=2)` and the
#    pipeline batched by 128: what effective batch does an update see, and
#    how many updates does an epoch make?
#
#    *Hint:* `history.effective_batch_size`, and
#    [the accumulation chapter](07_accumulation_tf2).
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# A callback saves after step 10 of epoch 2 (the trainer's position says:
# epoch 2, 10 steps into it); the resumed trainer's first epoch skips those
# 10 batches and finishes epoch 2, then trains epoch 3, and ends with the
# uninterrupted run's weights. The collapsed cell below runs it.
# ```

# %% tags=["hide-cell"]
class SaveAfterStep(keras.callbacks.Callback):
    def __init__(self, checkpoint, path):
        super().__init__()
        self.checkpoint, self.path, self.saved, self.epoch = checkpoint, path, None, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 2 and batch == 9:
            self.saved = self.checkpoint.save(self.path)


whole = sync_trainer()
middle = SaveAfterStep(tf.train.Checkpoint(model=whole.model, optimizer=whole.optimizer,
                                           trainer=whole), str(folder / "middle"))
whole.fit(pipeline(), epochs=4, callbacks=[middle])
again = sync_trainer(seed=1)
tf.train.Checkpoint(model=again.model, optimizer=again.optimizer,
                    trainer=again).restore(middle.saved)
print("restored at:", again.position.numbers())
again.fit(pipeline(), epochs=2)
same = all(np.array_equal(a, b) for a, b in zip(again.model.get_weights(),
                                                whole.model.get_weights()))
print("resumed mid-epoch == uninterrupted:", same)
assert same

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# The resumed run no longer matches: the new pipeline's first iteration
# serves epoch 0's order, while the uninterrupted run saw the order of the
# dataset's third iteration in epoch 2. Both runs train correctly, on
# different sequences of batches. To make it exact again, make the order a
# function of the epoch: build the pipeline per epoch with
# `shuffle(..., seed=base_seed + epoch)` and call `fit(..., epochs=1)` once
# per epoch, or train from arrays with `fit(x, y, epochs=..., shuffle=True,
# seed=...)`, whose permutation of epoch *e* is drawn from the seed and *e*.
# ```
#
# ```{dropdown} Solution to exercise 3
# Each replica gets half of the 128 images of a step and cuts them into two
# {term}`micro-batches <micro-batch>` (the parts whose gradients are summed
# before one update); the collapsed cell below computes the effective batch
# and the updates an epoch makes (the images that do not fill a last batch
# are dropped by `drop_remainder=True`). Half as many updates as with
# batches of 64, each averaging twice as many examples:
# [the accumulation chapter](07_accumulation_tf2) discusses raising the
# learning rate to match.
# ```

# %% tags=["hide-cell"]
with strategy.scope():
    accumulating = SyncTrainer(digit_network(), strategy, accumulation_steps=2, progress=False,
                               optimizer=keras.optimizers.Adam(3e-3),
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
big_batches = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(128, drop_remainder=True)
one_epoch = accumulating.fit(big_batches, epochs=1)
print(f"micro-batch {one_epoch.micro_batch_size}, effective batch "
      f"{one_epoch.effective_batch_size}, updates in an epoch {len(one_epoch.loss)}, "
      f"images dropped {len(x_train) % 128}")
assert one_epoch.effective_batch_size == 128 and len(one_epoch.loss) == len(x_train) // 128
