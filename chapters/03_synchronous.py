# %% [markdown]
# # Synchronous training
#
# In synchronous data-parallel training every device reads the *same*
# parameters, computes the gradient of its own share of the batch, the
# gradients are averaged, and *one* update is applied everywhere. It is the
# one-device loop of the first chapter with the batch cut into pieces, and it
# can be made to compute exactly what the one-device loop computes.
#
# **In this chapter you will**
#
# - see the stale-gradient article's synchronous mode as code:
#   `pargrad.SyncTrainer`, a custom training loop on
#   `tf.distribute.MirroredStrategy`;
# - take all-reduce apart with a picture drawn by running the ring algorithm;
# - answer the y = x² question: its network, trained with its batch of 50 split
#   over 2 and 5 devices and over two operating-system processes
#   (`MultiWorkerMirroredStrategy`), ends with the *same* weights as one
#   device with the full batch;
# - measure the price: a timeline of every replica in every step, a
#   straggler that makes the others wait, and throughput against the number
#   of devices;
# - answer it again in the asker's TensorFlow 1: one tower per device,
#   gradients averaged in the graph, and see which TF1 construct became which
#   TF2 one.
#
# Runs in under a minute on two CPU cores; no GPU needed.

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
# We import `pargrad` first, split the CPU into five logical devices before
# TensorFlow starts (chapter "Devices"), and fix the seeds.

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np
import tensorflow as tf
from pargrad.book import plots
from pargrad.cluster import LocalCluster
from pargrad.loop import fit_loop, train_epoch
from pargrad.scenario import Scenario
from pargrad.book.instruments import InstrumentedSyncTrainer
from pargrad.book import show_source
from pargrad.book.parabola import (fit_one_device, initial_weights, parabola_data, parabola_forward,
                                    parabola_model, squared_error, train_parabola)
from pargrad.allreduce import ring_all_reduce
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

devices = pargrad.logical_devices(5)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# Part II compares two ways for several devices to train one model; the
# picture below is the one to keep in mind through it
# ({numref}`fig-sync-async-timelines`).

# %% mystnb={"figure": {"caption": "Two devices, device 1 slower, on a fixed schedule (a drawing, not a measurement). Top, synchronous: both devices compute a gradient on the same weights (w0, then w1), the fast one waits (hatched) for the slow one, and one all-reduce and one update (red) end every step. Bottom, asynchronous: each device reads the weights (\u25bc), computes and applies its update on its own and never waits, but an update computed on weights that the other device has changed since the read (orange) is stale: it is applied one update behind.", "name": "fig-sync-async-timelines"}}
fig = plots.sync_async_timelines()

# %% [markdown]
# ## Synchronous mode
#
# The stale-gradient article ([Where this book starts](00_sources))
# describes one synchronous iteration: all devices read the same
# parameters, each computes gradients on different data, the gradients are
# averaged, and one update is applied; every iteration waits for the slowest
# device. Why does that compute the same as one device on the whole batch?
# The loss of a batch of $B$ examples is a mean, and a mean splits into
# pieces:
#
# $$\nabla \frac{1}{B}\sum_{i=1}^{B} \ell_i
#   = \sum_{r=1}^{R} \nabla \Big(\frac{1}{B}\sum_{i \in \text{shard } r} \ell_i\Big).$$
#
# Each device holds a {term}`replica`: a full copy of the model that computes
# the gradient of its share of the batch, its *shard*; replica $r$ of $R$
# works on shard $r$. So replica $r$ scales its shard's loss by the *global*
# batch size $B$ (not by
# its shard's size, `tf.nn.compute_average_loss` does exactly this), and the
# *sum* of the replicas' gradients is the full-batch gradient. Summing over
# replicas, and handing the sum back to every replica, is an
# **{term}`all-reduce`**. `tf.distribute.MirroredStrategy` ({term}`MirroredStrategy`)
# is TensorFlow's way to run one replica per device of one machine and
# all-reduce their gradients.
#
# Here is all of it for the y = x² asker's network, as a program you can copy
# (it imports from `pargrad` only the logical devices, which must exist
# before TensorFlow starts). `MirroredStrategy` puts one replica on each of two
# devices; the model and optimizer made in `strategy.scope()` hold mirrored
# variables; `experimental_distribute_values_from_function` hands replica $r$
# its rows of the batch; `strategy.run` runs `replica_step` on every replica,
# whose loss is its shard's summed squared error divided by the *global* batch
# (`tf.nn.compute_average_loss`), and whose one `apply_gradients` sums the
# replicas' gradients (the all-reduce) and applies the same update everywhere.

# %%
import keras
import numpy as np
import tensorflow as tf
from pargrad import logical_devices  # the one pargrad import: it splits the CPU before TF starts

strategy = tf.distribute.MirroredStrategy(  # 2 of the chapter's 5; yours: logical_devices(2)
    logical_devices(5)[:2], cross_device_ops=tf.distribute.ReductionToOneDevice())  # 1 chip
x = np.linspace(-2.0, 2.0, 50)[:, None]  # the asker's 50 points, in float64
y = x**2
B, R = len(x), strategy.num_replicas_in_sync  # the global batch (50) and the replicas (2)


def new_model():  # the 1-5-1 tanh network in float64, the same weights at every call
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((1,), dtype="float64"),
                             keras.layers.Dense(5, "tanh", dtype="float64"),
                             keras.layers.Dense(1, dtype="float64")])


def shard(context):  # runs once per replica: replica r takes rows r*B/R to (r+1)*B/R
    r = context.replica_id_in_sync_group
    return x[r * B // R:(r + 1) * B // R], y[r * B // R:(r + 1) * B // R]


def replica_step(x_shard, y_shard):  # runs on every replica, on its own shard
    with tf.GradientTape() as tape:
        errors = tf.square(model(x_shard) - y_shard)[:, 0]
        loss = tf.nn.compute_average_loss(errors, global_batch_size=B)  # sum / 50, not / 25
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # all-reduce, one update


with strategy.scope():  # variables made here are mirrored, one copy per device
    model, optimizer = new_model(), keras.optimizers.SGD(learning_rate=1e-2)
shards = strategy.experimental_distribute_values_from_function(shard)  # per-replica data
step = tf.function(lambda: strategy.run(replica_step, args=shards))
for _ in range(300):
    step()

# %% [markdown]
# The same network on one device with the full batch, trained as long: the
# weights agree within float64 rounding (`pargrad.rounding_tolerance`, which
# the section on rounding below explains).

# %%
single, single_optimizer = new_model(), keras.optimizers.SGD(learning_rate=1e-2)


@tf.function
def single_step():  # one device, the full batch of 50
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(single(x) - y))
    gradients = tape.gradient(loss, single.trainable_variables)
    single_optimizer.apply_gradients(zip(gradients, single.trainable_variables))


def largest_gap(first, second):
    """The largest difference between two models' weights."""
    return max(np.max(np.abs(a - b)) for a, b in zip(first.get_weights(), second.get_weights()))


for _ in range(300):
    single_step()
copy_tolerance = pargrad.rounding_tolerance("float64", 300)
print(f"trained: the weights moved from the start: {largest_gap(model, new_model()) > 0.01}")
print(f"2 replicas vs 1 device after 300 steps, weight gap < tolerance ({copy_tolerance:.0e}): "
      f"{largest_gap(model, single) < copy_tolerance}")

# %% [markdown]
# `pargrad.SyncTrainer`, which the rest of this chapter takes apart, is this
# program with what a real training run needs around it: shards cut from any
# batch without `tf.data`'s distributed iterators (a garbage-collected one can
# hang TensorFlow 2.21), accumulation of several micro-batches per step, the
# instruments that show stragglers, and errors that say what to pass instead.
#
# First each replica takes its shard. The data sit in memory on the host, and
# replica $r$ gathers the $B/R$ rows that follow $r \cdot B/R$ in the batch
# (the batch starts where the previous one ended, wrapping around the data):

# %%
show_source(SyncTrainer._shard)

# %% [markdown]
# Then comes the part of `pargrad.SyncTrainer` that runs on every replica: its
# gradients, computed with the loss divided by the *global* batch size, and the
# optimizer's `apply_gradients`, which performs the one all-reduce and the
# update. The line between them stops training, before the update, if any
# replica's loss is NaN or infinite (the chapter "Your own model" shows it
# at work):

# %%
show_source(SyncTrainer._replica_step)

# %% [markdown]
# `_replica_gradients` is, with one micro-batch a replica (the chapter
# "Accumulation in TF2 and across replicas" sums several), this forward and backward pass.
# The three lines after the loss matter for models other than this
# chapter's, and change nothing here: the model's regularization losses
# (none here), the loss scaling of mixed precision (none here) and the
# updates of Keras metrics (none here); the chapter "Your own model" uses
# them:

# %%
show_source(SyncTrainer._gradients)

# %% [markdown]
# The trainer wants the model's variables created inside the strategy's
# scope, so that every replica holds a mirrored copy; it refuses a model built
# anywhere else, and a batch that does not split evenly:

# %%
strategy = sync_strategy(4)
try:
    SyncTrainer(parabola_model(seed=0), strategy)
except ValueError as error:
    print(type(error).__name__, error)

with strategy.scope():
    model = parabola_model(seed=0)
x, y = parabola_data()
try:
    SyncTrainer(model, strategy, progress=False).fit(x, y, steps=1)
except ValueError as error:
    print(type(error).__name__, error)

# %% [markdown]
# The step is the idea; around it sits the loop that Keras's `fit` runs too,
# the same for every trainer of the book, and it changes nothing in the
# step. In one sitting: `SyncTrainer.fit` checks the data and hands them to
# `pargrad.data.EpochReader`, which says which batches come next (in order,
# or the epoch's shuffled order) and keeps the position a checkpoint saves;
# `pargrad.loop.fit_loop` calls Keras's callbacks in Keras's order around
# the epochs; and one epoch, `pargrad.loop.train_epoch`, is a `for` loop
# over the calls of the step, each run by the trainer (`SyncTrainer.run_call`)
# between two batch callbacks, that tells the reader what ran and records
# the losses (both collapsed below). Every strategy trainer of the book
# hands its calls to this one loop:

# %% tags=["hide-cell"]
show_source(fit_loop)

# %% tags=["hide-cell"]
show_source(train_epoch)

# %% [markdown]
# ## All-reduce
#
# The y = x² question imagines a *master*: the workers send their gradients to it, it
# averages them and sends back the result. That is one way to all-reduce, and
# its weakness is the master's link: with $R$ replicas it receives $R$
# gradients each step. The **ring all-reduce** {cite}`patarasuk2009bandwidth`
# (the algorithm Horovod {cite}`sergeev2018horovod` brought to deep learning)
# spreads the work: each replica cuts its gradient into $R$ chunks; in $R - 1$
# *reduce-scatter* steps every replica passes one chunk to its neighbour, who
# adds it to its own; then every chunk is complete on one replica, and in
# $R - 1$ *all-gather* steps the finished chunks travel around the ring once
# more. Each replica sends $2(R-1)/R$ of its gradient in total, almost the same
# whatever $R$ is. {numref}`fig-ring-all-reduce` shows every step.
#
# `pargrad.allreduce.ring_all_reduce` runs the algorithm in NumPy. Four replicas
# hold the gradients `[1 2 3 4]`, `[10 20 30 40]`, ...; each cell shows a
# replica's current value of a chunk, darker when it holds more replicas'
# contributions (the darkest blue, with a white number: the complete sum):

# %% mystnb={"figure": {"caption": "A ring all-reduce of four replicas, step by step. Rows are replicas, columns chunks of the gradient; each cell shows the replica's current value of the chunk, darker blue when it holds more replicas' contributions, darkest (with a white, bold number) when it holds the complete sum.", "name": "fig-ring-all-reduce"}}
gradients = np.array([[1, 2, 3, 4]]) * np.array([[1], [10], [100], [1000]])
result, states, sent = ring_all_reduce(gradients)
_, counts, _ = ring_all_reduce(np.ones_like(gradients))
fig = plots.ring_all_reduce_steps(states, sent, counts)
print(result)

# %% [markdown]
# Every replica ends with the sum, the same that TensorFlow's all-reduce
# returns when four replicas of a `MirroredStrategy` contribute the same rows:

# %%
values = strategy.experimental_distribute_values_from_function(
    lambda context: tf.constant(gradients[context.replica_id_in_sync_group], tf.float32))
reduced = strategy.run(
    lambda v: tf.distribute.get_replica_context().all_reduce("SUM", v), args=(values,))
tf_result = np.stack([t.numpy() for t in strategy.experimental_local_results(reduced)])
print(tf_result)
assert np.array_equal(tf_result, result)

# %% [markdown]
# Which algorithm TensorFlow uses depends on the strategy and on where the
# replicas are. On several GPUs of one machine `MirroredStrategy` uses
# NVIDIA's NCCL by default (`tf.distribute.NcclAllReduce`: rings and trees
# over NVLink or PCIe). Between processes `MultiWorkerMirroredStrategy` uses
# TensorFlow's collective ops, and its default,
# `CommunicationImplementation.AUTO`, does **not** pick NCCL on GPUs: in
# TensorFlow 2.21 the strategy switches the runtime's NCCL collectives on
# (the `collective_nccl` flag of its session config) only for
# `implementation=NCCL`, and the "auto" hint it passes otherwise runs
# TensorFlow's own ring all-reduce, over gRPC between the workers, on GPUs
# as on CPUs. Workers with GPUs that should use NCCL must ask for it (the
# cell only builds the option; it is harmless on a CPU):

# %%
nccl_between_workers = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
# on GPU workers: tf.distribute.MultiWorkerMirroredStrategy(communication_options=nccl_between_workers)
print(nccl_between_workers.implementation)

# %% [markdown]
# For logical CPUs in one process, `pargrad.sync_strategy` picks
# `ReductionToOneDevice`: the y = x² question's master, literally, and cheap
# when all "devices" share one memory. (It also sidesteps a limit of
# TensorFlow's default, collective ops: two strategies in one process with
# different numbers of replicas collide on the same collective keys, and
# this chapter builds several.)
#
# ## The y = x² question, answered
#
# The y = x² question asks to split its batch of 50 points over workers, compute gradients
# in parallel, average them on a master and apply them. We run it four ways,
# all from the same initial weights (`pargrad.book.parabola.initial_weights(seed=0)`), 2000
# steps of gradient descent with learning rate 0.01, this time in float64
# (why, in a moment):
#
# 1. one device, the full batch of 50 (`pargrad.book.parabola.fit_one_device`, chapter "The
#    training loop");
# 2. `SyncTrainer` on 2 logical devices, 25 points each;
# 3. `SyncTrainer` on 5 logical devices, 10 points each;
# 4. two operating-system processes with `MultiWorkerMirroredStrategy`, 25
#    points each.
#
# The two processes take several seconds to start TensorFlow and find each
# other, so we start them first and collect them after the other runs.
# `pargrad.LocalCluster` gives each process its own `TF_CONFIG` naming both on
# 127.0.0.1 with free ports, keeps every line they print (prefixed with their
# role), and stops them all when we are done, or when anything fails, times
# out or is interrupted.
#
# ```{warning}
# TensorFlow's gRPC servers listen on **all** network interfaces, even though
# `TF_CONFIG` names 127.0.0.1, and they have **no authentication**: anyone
# who can reach the port can talk to them. Run clusters only on machines and
# networks you trust, and stop them when you are done.
# ```

# %%
cluster = LocalCluster(train_parabola, workers=2, kwargs={"steps": 2000, "dtype": "float64"},
                       timeout=240)
cluster.start()
print(cluster.roles)

# %% [markdown]
# Meanwhile, in this process: one device, then 2 and 5 replicas. Each
# replica of `train_parabola` gets a contiguous slice of the 50 points.
# (`progress=False` switches off the progress bar that `SyncTrainer` shows
# during long runs. `steps_per_call=100` runs 100
# steps in one `tf.function` call: each is still one all-reduce and one
# update.)

# %%
show_source(train_parabola)

# %% [markdown]
# One detail first: Keras keeps a learning rate in float32 whatever the
# model's dtype, so the one-device reference takes the same number, 0.01
# rounded to float32 (it differs from 0.01 in the ninth digit, enough to
# show up in a float64 comparison).

# %%
x64, y64 = parabola_data(dtype="float64")
keras_rate = float(np.float32(0.01))
reference_loss, reference_weights = fit_one_device(x64, y64, steps=2000,
                                                           learning_rate=keras_rate, seed=0)
runs = {"1 device, batch 50": {"loss": reference_loss, "weights": reference_weights}}
for replicas in (2, 5):
    runs[f"{replicas} replicas x {50 // replicas} points"] = train_parabola(
        replicas, steps=2000, dtype="float64")

# %% [markdown]
# Now the two processes. `wait` returns each worker's result (or raises as
# soon as one fails); `stop` ends both processes whatever happened:

# %%
try:
    workers = cluster.wait()
finally:
    cluster.stop()
for index, result in enumerate(workers):
    runs[f"process {index} of 2 (MultiWorkerMirrored)"] = result
print("replicas per worker run:", [result["replicas"] for result in workers])

# %% [markdown]
# In exact arithmetic all five runs compute the same numbers: the shards'
# gradients, scaled by the global batch and summed, *are* the full-batch
# gradient. A computer rounds every addition, and the replicas add in
# another order than one device does, so the runs can only agree up to
# rounding. How far is that? Each of the 2000 updates can add an error of
# about one *unit roundoff* $u$ (the relative spacing of floating-point
# numbers: $2^{-24} \approx 6\times10^{-8}$ in float32, $2^{-53} \approx
# 10^{-16}$ in float64). Errors do not simply add up: each one is carried
# through every later update, stretched or shrunk by the training dynamics
# (their Jacobian). Gradient descent that settles into a minimum shrinks old
# errors, and then the gaps grow at most about linearly with the steps; a
# diverging or chaotic run stretches them exponentially, and then no
# tolerance proportional to the steps holds (the update at which a
# diverging run overflows moves from machine to machine, which is why this
# book never prints it). `pargrad.rounding_tolerance` allows
# $10 \times \text{steps} \times u$ for weights of size about 1: linear
# growth, times a safety factor of 10 that is *empirical*, not a theorem. It
# rests on measurements of this converging network, whose gaps stay at a
# fraction of $\text{steps} \times u$ (the margins are printed below), and it
# is used in this book only for runs that converge:

# %%
tolerance = pargrad.rounding_tolerance("float64", 2000)
print(f"tolerance for 2000 float64 steps: {tolerance:.1e}")


def gap(weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference_weights))


for name, run in runs.items():
    print(f"{name:40s} final loss {run['loss'][-1]:.6f}   "
          f"weights agree within the tolerance: {gap(run['weights']) < tolerance}")
assert all(gap(run["weights"]) < tolerance for run in runs.values())

# %% [markdown]
# All five weight sets agree to about twelve digits after 2000 steps. How
# much of the tolerance did they use? The gaps depend on the machine's order
# of additions, so this cell's numbers differ from machine to machine; it
# prints each gap in units of $\text{steps} \times u$ (the tolerance is
# 10 of them) and checks that the margin is at least a factor of two:

# %% tags=["nbval-ignore-output"]
steps_times_u = 2000 * pargrad.unit_roundoff("float64")
for name, run in list(runs.items())[1:]:
    print(f"{name:40s} gap = {gap(run['weights']) / steps_times_u:.2f} x steps x u")
assert max(gap(run["weights"]) for run in runs.values()) < tolerance / 2

# %% [markdown]
# Why float64? In float32 the same comparison gives gaps a million times larger,
# and their exact size depends on the machine: on which CPU kernels
# (AVX-512 or not), how many threads, and, on a GPU, on the order in which
# its threads finish. Here are the float32 gaps on the machine that ran this
# page (yours may differ in every digit; the tolerance holds on all). On
# recent NVIDIA GPUs TensorFlow would compute float32 matrix products in
# TF32, with about $10^{-3}$ relative error, far beyond float32 rounding, so
# the cell turns TF32 off first (it changes nothing on a CPU):

# %% tags=["nbval-ignore-output"]
tf.config.experimental.enable_tensor_float_32_execution(False)
float32_tolerance = pargrad.rounding_tolerance("float32", 2000)
_, weights32 = fit_one_device(x, y, steps=2000, learning_rate=0.01, seed=0)
for replicas in (2, 5):
    result = train_parabola(replicas, steps=2000)
    gap32 = max(float(np.max(np.abs(a - b))) for a, b in zip(result["weights"], weights32))
    print(f"float32, {replicas} replicas: weight gap {gap32:.1e} "
          f"(tolerance {float32_tolerance:.1e})")
    assert gap32 < float32_tolerance

# %% [markdown]
# A claim such as "equal within $10^{-5}$" in float32 would hold on one
# machine and fail on the next; in float64 the point is unmistakable on any
# of them. The loss curves lie on top of each other
# ({numref}`fig-sync-loss-curves`):

# %% mystnb={"figure": {"caption": "The y = x\u00b2 question's network, trained on one device with the full batch, on 2 and 5 logical devices, and in two processes: the loss curves coincide.", "name": "fig-sync-loss-curves"}}
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.4))
for (name, run), style in zip(runs.items(), ["-", "--", ":", "-.", (0, (1, 4))]):
    ax.plot(np.arange(1, 2001), run["loss"], linestyle=style, label=name)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.set_title("The y = x² network, one device and split four ways")
ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# So the answer to the y = x² question is: yes, and you do not need to write the master.
# Split the batch, scale each shard's loss by the global batch size, and let
# the strategy all-reduce; the result is the full-batch computation. The
# processes printed nothing; if they had, `cluster.log()` would show every
# line with its role in front, such as `[worker 1] ...`.
#
# ## What it costs: waiting
#
# Equal results have a price: a step ends only when *every* replica has
# contributed its gradient. To see it we need a model whose computation is
# visible next to the overheads, a small multilayer perceptron on random
# data, and two replicas with 256 examples each. A {term}`straggler` is a
# device slower than the others; `scenario=Scenario((1, 1 / 3))` (the replicas' speeds) makes replica 1 three times slower: after
# computing its gradient it computes it twice more, inside the step, and
# applies the first, like a device that needs three times as long for the
# same work. Busy work rather than a sleep: a slow device does not lend its
# core to the others, and a sleeping straggler would (here two replicas share
# two cores). Stragglers and the timelines below are the book's
# instruments, not part of the lesson's step: `pargrad.book.instruments.InstrumentedSyncTrainer`
# wraps `tf.timestamp()` lines (when the replica started, finished its
# gradients and had its update) and the straggler's extra passes
# (`_straggler_work`) around the same two lines as
# `SyncTrainer._replica_step` (collapsed below).

# %% tags=["hide-cell"]
show_source(InstrumentedSyncTrainer._replica_step)

# %%
rng = np.random.default_rng(0)
features = rng.standard_normal((4096, 64)).astype(np.float32)
targets = rng.standard_normal((4096, 1)).astype(np.float32)


def perceptron_trainer(replicas, speeds=None):
    """A 64-256-256-1 perceptron under SyncTrainer on ``replicas`` devices."""
    strategy = sync_strategy(replicas)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ])
    scenario = None if speeds is None else Scenario(speeds)
    return InstrumentedSyncTrainer(model, strategy, scenario=scenario, record_times=True,
                                   progress=False)


def measure(trainer, steps=20):
    batch = 256 * trainer.replicas
    trainer.fit(features, targets, steps=2, batch_size=batch)          # trace first
    return trainer.fit(features, targets, steps=steps, batch_size=batch)


trainers = {factor: perceptron_trainer(2, (1, 1 / factor)) for factor in (1, 3, 6)}
histories = {f"straggler x{factor}": measure(trainer) for factor, trainer in trainers.items()}

# %% [markdown]
# Is the x3 straggler three times slower, and is its update the one it would
# make anyway? One replica alone, so that nothing waits: the median time from
# its input to its gradients, with and without the straggler, measured in
# interleaved rounds (a busy moment of the machine hits both), then the two
# trainers' weights after the same steps. The ratio depends on the machine,
# so the cell checks a range around 3; the weights must be equal bit for bit.

# %% tags=["nbval-ignore-output"]
alone = {factor: perceptron_trainer(1, (1 / factor,)) for factor in (1, 3)}
compute = {factor: [] for factor in alone}
for trainer in alone.values():
    trainer.fit(features, targets, steps=2, batch_size=256)           # trace first
for _ in range(3):
    for factor, trainer in alone.items():
        compute[factor] += list(trainer.fit(features, targets, steps=10, batch_size=256).compute[:, 0])
slowdown = np.median(compute[3]) / np.median(compute[1])
print(f"one replica, median compute: {np.median(compute[1]) * 1e3:.2f} ms, with the x3 "
      f"straggler {np.median(compute[3]) * 1e3:.2f} ms: {slowdown:.1f} times as long")
assert 2.0 < slowdown < 4.5
same = all(np.array_equal(a, b) for a, b in zip(alone[1].model.get_weights(),
                                                 alone[3].model.get_weights()))
print("the same weights after the same steps, bit for bit:", same)
assert same

# %% [markdown]
# {numref}`fig-sync-timeline` shows four consecutive steps with the x3 straggler. Each row is a
# replica; blue is its forward and backward pass, orange the straggler's, and
# red the time between its gradient and its update: the all-reduce, which
# cannot finish before the slowest replica has contributed. Gray is the time
# before the replica starts: launching the step from Python, handing the
# replica its input, and, on this machine, waiting for a free core (each
# replica's matrix products already use both cores, so the runtime tends to
# run the replicas one after the other). The dotted lines end the steps.

# %% mystnb={"figure": {"caption": "Four synchronous steps of two replicas, replica 1 a x3 straggler. Blue and orange: forward and backward passes; red: from a replica's gradient to its update (the all-reduce, waiting for the slowest); gray: before the replica starts. Dotted lines end the steps.", "name": "fig-sync-timeline"}} tags=["nbval-ignore-output"]
slow = histories["straggler x3"]
fig = plots.device_timeline(slow, steps=range(4))
print(f"median compute (ms): {np.round(np.median(slow.compute, axis=0) * 1e3, 2)}")
print(f"median wait    (ms): {np.round(np.median(slow.wait, axis=0) * 1e3, 2)}")
# "replica 0 waits for replica 1": its wait covers most of the straggler's extra compute
extra = np.median(slow.compute[:, 1] - slow.compute[:, 0])
assert np.median(slow.wait[:, 0]) > 0.5 * extra

# %% [markdown]
# Replica 0 spends its red time idle, waiting for replica 1. Over
# every step of the three runs, the step time follows the slowest replica
# (its start plus its compute) closely, just above the diagonal
# ({numref}`fig-step-time-slowest`): the rest is
# the all-reduce and the update.

# %% mystnb={"figure": {"caption": "Step time against the time of the slowest replica (its start plus its compute), for every step of the runs with a x1, x3 and x6 straggler.", "name": "fig-step-time-slowest"}} tags=["nbval-ignore-output"]
fig = plots.step_time_against_slowest(histories)
for name, history in histories.items():
    slowest = (history.launch + history.compute).max(axis=1)
    print(f"{name}: median step {np.median(history.step_time) * 1e3:.2f} ms, "
          f"slowest replica {np.median(slowest) * 1e3:.2f} ms")
    # "follows the slowest replica closely": the rest (all-reduce, update) is a small part
    assert np.median(history.step_time - slowest) < 0.5 * np.median(history.step_time)
# A slower straggler makes a longer step: compared in interleaved rounds, so
# that a moment when the machine was busy cannot favour one of them.
best = {factor: np.inf for factor in trainers}
for _ in range(3):
    for factor, trainer in trainers.items():
        history = trainer.fit(features, targets, steps=10, batch_size=512)
        best[factor] = min(best[factor], np.median(history.step_time))
assert best[6] > best[1]

# %% [markdown]
# This is the weakness the stale-gradient article names, and the reason asynchronous training
# was attractive: a synchronous step is as slow as its slowest device.
# Chen et al. {cite}`chen2016revisiting` kept synchronous training and
# removed the tail instead: add a few *backup workers* and apply each update
# with the first $N$ of $N + b$ gradients, dropping the stragglers'.
#
# ## Throughput against the number of devices
#
# With 256 examples a replica, more replicas means a bigger global batch per
# step. On a machine where each replica has its own processor, the examples
# per second would grow in proportion (the dashed line of
# {numref}`fig-throughput`). Here all the logical
# devices share the same two CPU cores. Each count is measured in three
# interleaved rounds and keeps its best, so that a moment when the machine
# was busy cannot favour one count:

# %% mystnb={"figure": {"caption": "Examples per second of synchronous training against the number of logical devices, 256 examples per replica; the dashed line is perfect scaling.", "name": "fig-throughput"}} tags=["nbval-ignore-output"]
replica_counts = [1, 2, 4, 5]
throughput_trainers = {replicas: perceptron_trainer(replicas) for replicas in replica_counts}
best_rate = dict.fromkeys(replica_counts, 0.0)
for _ in range(3):  # interleaved rounds, each count's best: a busy moment cannot favour one count
    for replicas, trainer in throughput_trainers.items():
        history = measure(trainer, steps=20)
        best_rate[replicas] = max(best_rate[replicas],
                                  history.effective_batch_size / np.median(history.step_time))
rates = [best_rate[replicas] for replicas in replica_counts]
fig = plots.throughput_against_replicas(replica_counts, rates)
print("examples per second:", [f"{rate:,.0f}" for rate in rates])
# No check on the curve's shape: how much a bigger step gains from spreading
# its fixed cost depends on the machine's load, and the text draws no
# conclusion from it (the chapter "Devices" checks what the cores bound).

# %% [markdown]
# The measured curve may rise: a bigger step spreads the fixed cost of
# launching it over more examples, and on a busy machine that cost can
# dominate, so the rise says more about the cost per step than about the
# devices (this page draws no conclusion from its shape; the chapter
# "Devices" checks what the cores bound). It is not a speed-up from the
# devices: however many logical devices we make, there are two cores, and
# every extra replica adds a shard to compute on them and a contribution to
# the all-reduce. Logical devices show how
# synchronous training *behaves* (the equal results, the waiting), not how
# fast it can be.
#
# Two settings can make each step cheaper; by default `SyncTrainer` leaves
# both off, which is what this chapter's timings need. `fit(...,
# steps_per_call=100)` runs 100 steps in one `tf.function` call, as Keras's
# `steps_per_execution` does: each step is still one all-reduce and one
# update, with the same numbers, but Python launches the graph once per 100
# updates. Turn it on whenever you train for speed; keep 1 when each step
# must be timed from Python or planned before it runs (backup workers, next
# chapter). `SyncTrainer(..., jit_compile=True)` compiles each replica's
# forward and backward pass with XLA; the all-reduce and the update stay
# outside, since XLA compiles for one device and the all-reduce spans all of
# them. The result equals the plain step up to float32 rounding (the tests
# check it). Turn it on when a step is many small operations, as with tiny
# models on a GPU, and measure first: `benchmarks/sync.py` times both against
# the same step on one device without any strategy, Keras `fit` and a
# hand-written loop on your machine.
#
# On real GPUs each replica brings its own compute. With the per-replica batch
# fixed, the compute time per step stays the same, and what grows is the
# all-reduce: with the ring, each GPU sends about twice the model's size per
# step whatever the number of GPUs, so scaling is good when the computation
# per step is large next to the gradient's size. Goyal et al.
# {cite}`goyal2017accurate` trained ResNet-50 on ImageNet synchronously on 256
# GPUs with about 90% scaling efficiency relative to 8, in one hour, by growing
# the learning rate with the batch and warming it up.
#
# ## Was synchronous training "mostly abandoned"?
#
# The answer to the y = x² question claims that synchronous training was mostly abandoned
# for asynchronous training. That was a fair reading of the early 2010s: the
# {term}`parameter server` systems of Dean et al. {cite}`dean2012large` (processes
# that hold the parameters while workers send them updates) and Hogwild!
# {cite}`niu2011hogwild` trained asynchronously to avoid waiting for stragglers.
# It has not held since. Chen et al. {cite}`chen2016revisiting` showed that
# synchronous training with backup workers converged faster and to better
# accuracy than asynchronous training; Goyal et al.
# {cite}`goyal2017accurate` made large synchronous batches work; the
# time-to-accuracy entries of DAWNBench {cite}`coleman2017dawnbench,coleman2019analysis`
# were dominated by synchronous all-reduce training; and all-reduce is what
# `MirroredStrategy`, Horovod {cite}`sergeev2018horovod` and PyTorch's
# DistributedDataParallel do today. The chapter "Sync vs async in the same
# time" measures both against the wall clock. Inside one data centre the
# verdict stands; between data centres, or wherever the network is slow,
# training went back to communicating rarely, not asynchronously: every
# worker takes many steps on its own copy and the copies are averaged now and
# then (local SGD {cite}`lin2020dont`, DiLoCo {cite}`douillard2023diloco`).
# The chapter {doc}`11_communicating_rarely` runs that dial.
#
# ## The answer in TensorFlow 1: one tower per device
#
# The asker of the y = x² question wrote TensorFlow 1: placeholders, a
# `Session`, `compute_gradients` and `apply_gradients`. In TensorFlow 1 the
# answer was *in-graph replication*. One graph holds one copy of the forward
# and backward pass per device, a {term}`tower`, placed with `tf.device`;
# every tower reads the same variables and gets its shard of the batch; the
# towers' gradients are averaged in the graph, on the CPU, the "master" of the
# question; and one `apply_gradients` applies the mean. One `session.run`
# runs all towers, and TensorFlow runs them at the same time when they are on
# different devices. `pargrad.tf1.multi_tower_step` builds this; these are the
# lines that carry the idea:

# %%
from pargrad import tf1
from pargrad.book import show_lines

v1 = tf.compat.v1
show_lines(tf1.multi_tower_step, "input_shards = tf.split", "train_step = optimizer.apply_gradients")

# %% [markdown]
# `tf.split` cuts the batch into one shard per device. In the loop, each
# tower's loss and `compute_gradients` are created under `tf.device(device)`,
# so its forward and backward pass run there. Under `tf.device(average_on)`
# (the CPU by default) `average_tower_gradients` adds the towers' gradients of
# each variable with `tf.add_n` and divides by the number of towers, and one
# `apply_gradients` updates the shared variables. The rest of the function
# checks its arguments; the whole source is in the collapsed cell below.

# %% tags=["hide-cell"]
show_source(tf1.multi_tower_step)

# %% [markdown]
# We run the asker's program three ways: as written, on one device with the
# full batch, and with 2 and 5 towers on our logical devices, 2000 steps of
# gradient descent from the same initial weights. This time the variables and
# data are float64: float32 sums depend on the order in which they are added,
# which differs between one device and several towers and between CPUs, while
# float64 carries about 16 significant digits against float32's 7, so the
# rounding differences stay far below a tolerance of $10^{-12}$ on any
# machine.

# %%
x64, y64 = x.astype(np.float64), y.astype(np.float64)


def tf1_parabola(towers=None, steps=2000):
    """The y = x² question's TF1 program in float64; returns the final weights and the
    devices its ops ran on. ``towers=None``: one device, the full batch."""
    graph = tf.Graph()
    with graph.as_default():
        xs = v1.placeholder(tf.float64, [50, 1])
        ys = v1.placeholder(tf.float64, [50, 1])
        variables = [tf.Variable(w.astype(np.float64)) for w in initial_weights(seed=0)]
        optimizer = v1.train.GradientDescentOptimizer(0.01)

        def tower_loss(x_shard, y_shard):
            return squared_error(y_shard, parabola_forward(x_shard, variables))

        if towers is None:
            train_step = optimizer.minimize(tower_loss(xs, ys))
        else:
            train_step = tf1.multi_tower_step(tower_loss, optimizer, xs, ys,
                                              devices[:towers]).train_step
        init = v1.global_variables_initializer()
    trace = v1.RunMetadata()
    with v1.Session(graph=graph) as session:
        session.run(init)
        session.run(train_step, {xs: x64, ys: y64}, run_metadata=trace,
                    options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE))
        for _ in range(steps - 1):
            session.run(train_step, {xs: x64, ys: y64})
        ran_on = sorted({stats.device.split("/")[-1] for stats in trace.step_stats.dev_stats})
        return session.run(variables), ran_on


full_batch, ran_on = tf1_parabola()
print(f"one device, full batch: ops ran on {ran_on}")
tower_runs = {}
for towers in (2, 5):
    tower_runs[towers], ran_on = tf1_parabola(towers)
    print(f"{towers} towers:             ops ran on {ran_on}")

# %% [markdown]
# The trace of the first step confirms that the towers' operations ran on 2
# and 5 different devices. And the weights after 2000 steps:

# %% tags=["nbval-ignore-output"]
TOLERANCE = pargrad.rounding_tolerance("float64", 2000)
for towers, weights in tower_runs.items():
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, full_batch))
    print(f"{towers} towers vs the full batch after 2000 steps: largest weight gap "
          f"{gap:.1e} (tolerance {TOLERANCE:.0e})")
    assert gap < TOLERANCE

# %% [markdown]
# The towers compute the full batch's training to the last bits of float64
# (the gap printed above depends on the CPU; the cell checks it against the
# tolerance). It is the same mathematics as `SyncTrainer`'s: the mean of equal
# shards' means is the batch's mean.
#
# ### Between graphs: `SyncReplicasOptimizer`, and why it is gone
#
# Towers in one graph need one process that sees every device. Across
# machines, TensorFlow 1 used *between-graph replication*: every worker
# process built its own graph, the variables lived on {term}`parameter
# servers <parameter server>` (`tf.compat.v1.train.replica_device_setter`), and
# each worker wrapped its optimizer in
# `tf.compat.v1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=N)`
# {cite}`tfsyncreplicas`. Its `apply_gradients` pushed the worker's gradients
# into one accumulator per variable on the parameter servers instead of
# applying them; the *chief* worker waited until $N$ gradients had arrived,
# applied their mean in one update, and released the workers through a queue
# of tokens; a gradient computed for an older step was dropped as stale. With
# more workers than `replicas_to_aggregate`, the extra ones were backup
# workers: the first $N$ gradients made the update {cite}`chen2016revisiting`.
#
# Its documentation now says: "This class is deprecated. For synchronous
# training, please use Distribution Strategies." It is built from graph-mode
# pieces (queues, accumulators, a chief that runs session hooks) that eager
# TensorFlow 2 does not have, and it puts the parameter servers in the middle
# of every step, where an all-reduce between the workers does the same job
# without a central link. TensorFlow 2 keeps it only under `tf.compat.v1`:

# %%
print("tf.compat.v1.train.SyncReplicasOptimizer:", hasattr(v1.train, "SyncReplicasOptimizer"))
print("tf.train.SyncReplicasOptimizer:          ", hasattr(tf.train, "SyncReplicasOptimizer"))

# %% [markdown]
# ### From TensorFlow 1 to TensorFlow 2
#
# | TensorFlow 1 | TensorFlow 2 | in this book |
# | --- | --- | --- |
# | `tf.placeholder` and `feed_dict` | function arguments, `tf.data` | chapter "The training loop" |
# | `Session.run(train_step)` | calling a `tf.function` | chapter "The training loop" |
# | `optimizer.compute_gradients(loss)` | `tf.GradientTape` and `tape.gradient` | chapter "The training loop" |
# | one tower per GPU under `tf.device`, gradients averaged in the graph | `MirroredStrategy` and `strategy.run`; the optimizer all-reduces | this chapter, `SyncTrainer` |
# | `SyncReplicasOptimizer` with parameter servers | `MultiWorkerMirroredStrategy` (all-reduce between workers) | chapter "Beyond one machine" |
# | asynchronous training with `replica_device_setter` | `ParameterServerStrategy` with a `ClusterCoordinator` | chapter "Beyond one machine" |
# | `tf.train.ClusterSpec` and `tf.train.Server` per task | `TF_CONFIG` and a cluster resolver | chapter "Beyond one machine" |
# | accumulator variables, `zero_ops`, `accum_ops` | `GradientAccumulator`, Keras's `gradient_accumulation_steps` | chapters "Accumulating gradients in TF1 graphs" and "Accumulation in TF2 and across replicas" |
#
# ```{admonition} Further reading: TensorFlow's own guides
# :class: seealso
#
# The answer to the y = x² question says that TensorFlow's official
# documentation has examples of both modes. Today they are:
#
# - [Distributed training with TensorFlow](https://www.tensorflow.org/guide/distributed_training): the overview of `tf.distribute` strategies,
#   synchronous (`MirroredStrategy`, `MultiWorkerMirroredStrategy`,
#   `TPUStrategy`) and asynchronous (`ParameterServerStrategy`).
# - [Custom training with tf.distribute.Strategy](https://www.tensorflow.org/tutorials/distribute/custom_training): a custom training loop with `MirroredStrategy`,
#   the pattern of `SyncTrainer`, including `tf.nn.compute_average_loss`.
# - [Multi-worker training with Keras](https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras) and
#   [Custom training loop with Keras and MultiWorkerMirroredStrategy](https://www.tensorflow.org/tutorials/distribute/multi_worker_with_ctl): synchronous training across processes with
#   `TF_CONFIG`.
# - [Parameter server training with ParameterServerStrategy](https://www.tensorflow.org/tutorials/distribute/parameter_server_training): asynchronous training with parameter servers
#   and a coordinator.
# ```
#
# ## Summary
#
# - Synchronous data parallelism: every replica reads the same parameters,
#   computes the gradient of its shard with the loss scaled by the *global*
#   batch size, one all-reduce sums the gradients, one update is applied.
# - It computes what one device computes on the whole batch: the y = x²
#   question's network on 1, 2 and 5 devices and in two processes ends with
#   the same weights after 2000 steps, to about twelve digits in float64; in
#   float32 only within rounding (`pargrad.rounding_tolerance`), whose last
#   digits depend on the machine.
# - In TensorFlow 1 the same answer is one tower per device in one graph,
#   gradients averaged in the graph and one `apply_gradients`
#   (`pargrad.tf1.multi_tower_step`), equal to the full batch in float64;
#   `SyncReplicasOptimizer`, its between-graph cousin, gave way to
#   `tf.distribute` strategies.
# - A ring all-reduce sends about twice the gradient's size per replica,
#   however many replicas there are. `MirroredStrategy` uses NCCL on a
#   machine's GPUs; `MultiWorkerMirroredStrategy` runs TensorFlow's ring
#   collectives between processes, on GPUs too, unless given
#   `CommunicationOptions(implementation=NCCL)`.
# - Every step waits for the slowest replica: the others' time shows up as
#   waiting in the all-reduce, and the step time follows the slowest replica.
# - Logical CPU devices share their cores, so they show behaviour, not
#   speed-ups; on real GPUs scaling depends on computation per step against
#   gradient size.
# - `pargrad.LocalCluster` starts processes with their own `TF_CONFIG` and
#   always stops them; TensorFlow's gRPC servers listen on all interfaces with
#   no authentication, so use them only on trusted networks.
#
# ## Exercises
#
# 1. Train the y = x² question's network with `SyncTrainer` on 3 logical
#    devices. What does the trainer say, and which batch sizes would work?
#    Change `pargrad.book.parabola.parabola_data(n=...)` so that 3 replicas work, and check
#    the result against `pargrad.book.parabola.fit_one_device` on the same data.
#
#    *Hint:* the global batch must split into equal shards; $50 = 2 \cdot 5^2$.
# 2. Replace `tf.nn.compute_average_loss` in your own copy of the replica
#    step with a plain mean over the replica's shard. By what factor does the
#    update change with 5 replicas? Which learning rate would undo it?
#
#    *Hint:* a shard's mean divides by its 10 examples, not by the batch's 50,
#    and the all-reduce *sums* the replicas' gradients.
# 3. Run `SyncTrainer(..., accumulation_steps=5)` on 2 replicas with the full
#    batch of 50. What are the micro-batch and the effective batch, and are
#    the weights still those of one device?
#
#    *Hint:* each replica's shard is cut into `accumulation_steps`
#    micro-batches; `fit` returns a history with `effective_batch_size`.
# 4. Make two replicas stragglers instead of one, with factors 2 and 4. Which
#    one sets the step time? Draw the timeline.
#
#    *Hint:* `perceptron_trainer(3, (1, 1 / 2, 1 / 4))`, then `measure` and
#    `plots.device_timeline`.
# 5. Start a `LocalCluster` of two workers and kill one of them with
#    `os.kill(cluster.pids[1], signal.SIGKILL)` while it trains. What does
#    `wait` raise, and which processes are left afterwards
#    (`psutil.Process().children()`)?
#
#    *Hint:* `wait` raises as soon as one process ends badly; `stop` runs in
#    the `finally` block.
# 6. Implement backup workers {cite}`chen2016revisiting` on paper: with 4
#    replicas and one backup, which gradients would you average, and how
#    would the update differ from the full-batch one?
#
#    *Hint:* five workers compute, four gradients are used: which examples
#    does the update miss?
#
# ### Solutions
#
# **Exercise 1.** The trainer refuses 50 points on 3 replicas and says which
# batch sizes split evenly; 48 points do, and 3 replicas of 16 points then
# train exactly like one device (200 steps here, to keep it quick):

# %% tags=["hide-cell"]
strategy3 = sync_strategy(3)
with strategy3.scope():
    model3 = parabola_model(seed=0)
try:
    SyncTrainer(model3, strategy3, progress=False).fit(x, y, steps=1)
except ValueError as error:
    print(type(error).__name__, error)
x48, y48 = parabola_data(n=48)
SyncTrainer(model3, strategy3, progress=False).fit(x48, y48, steps=200, steps_per_call=100)
_, one_device48 = fit_one_device(x48, y48, steps=200, learning_rate=0.01, seed=0)
gap3 = max(float(np.max(np.abs(a - b))) for a, b in zip(model3.get_weights(), one_device48))
rounding = pargrad.rounding_tolerance("float32", 200)
print(f"3 replicas x 16 points vs one device after 200 steps, within rounding: {gap3 < rounding}")
assert gap3 < rounding

# %% [markdown]
# **Exercise 2.** Each replica's plain mean is $B/(B/R) = R$ times its share
# of the batch mean, and the all-reduce adds the $R$ replicas' gradients, so
# the update is $R = 5$ times too large: a learning rate of $0.01 / 5$ undoes
# it. Measured on the gradients themselves:

# %% tags=["hide-cell"]
solution_variables = [tf.Variable(w) for w in initial_weights(seed=0)]


def mean_loss_gradient(x_part, y_part):
    with tf.GradientTape() as tape:
        loss = squared_error(y_part, parabola_forward(x_part, solution_variables))
    return tape.gradient(loss, solution_variables)


full_gradient = mean_loss_gradient(x, y)
shard_gradients = [mean_loss_gradient(xs, ys) for xs, ys in zip(np.split(x, 5), np.split(y, 5))]
summed = [tf.add_n(list(parts)) for parts in zip(*shard_gradients)]
ratio = (np.linalg.norm(np.concatenate([tf.reshape(g, [-1]) for g in summed]))
         / np.linalg.norm(np.concatenate([tf.reshape(g, [-1]) for g in full_gradient])))
print(f"sum of 5 shard-mean gradients / full-batch gradient: {ratio:.4f}")
assert abs(ratio - 5) < 1e-4

# %% [markdown]
# **Exercise 3.** Each replica gets 25 points and cuts them into 5
# micro-batches of 5; the effective batch is $5 \cdot 5 \cdot 2 = 50$, and the
# weights are still one device's:

# %% tags=["hide-cell"]
strategy2 = sync_strategy(2)
with strategy2.scope():
    model2 = parabola_model(seed=0)
history2 = SyncTrainer(model2, strategy2, accumulation_steps=5, progress=False).fit(
    x, y, steps=200, steps_per_call=100)
_, one_device50 = fit_one_device(x, y, steps=200, learning_rate=0.01, seed=0)
gap2 = max(float(np.max(np.abs(a - b))) for a, b in zip(model2.get_weights(), one_device50))
print("effective batch:", history2.effective_batch_size)
print(f"2 replicas x 5 micro-batches vs one device after 200 steps, within rounding: "
      f"{gap2 < rounding}")
assert history2.effective_batch_size == 50 and gap2 < rounding

# %% [markdown]
# **Exercise 4.** The x4 replica sets the step time: the step follows the
# slowest replica, as in {numref}`fig-step-time-slowest`, and in the timeline
# both other replicas show red waiting time in every step, the x2 replica
# less than the x1 replica.
#
# **Exercise 5.** `wait` raises `pargrad.ClusterError`: "worker 1 exited with
# signal SIGKILL", followed by its last lines. The surviving worker is stuck
# in an all-reduce that will never complete; `stop`, in the `finally` block,
# ends it, and `psutil.Process().children()` is empty afterwards. The test
# `tests/test_cluster.py` checks exactly this on every run.
#
# **Exercise 6.** Five workers each compute the gradient of a fifth of the
# batch; the update averages the first four to arrive and drops the last. It
# is the mean gradient of four fifths of the batch, a different four fifths
# in every step depending on who is slow. It is an unbiased (but noisier)
# estimate of the full-batch gradient only if *who* is slow does not depend
# on the data: a random worker late in each step. With a persistent
# straggler on a fixed shard, that shard's examples are dropped in every
# step, and the update is biased toward the other four shards' loss, not
# equal to the full-batch gradient even on average. (Reshuffling the shards
# among workers every epoch removes the bias.) In exchange, no step waits
# for the slowest worker. The chapter "Sync vs async in the same time" runs it.
