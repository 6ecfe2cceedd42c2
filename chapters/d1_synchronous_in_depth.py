# %% [markdown]
# # Synchronous training in depth
#
# ```{admonition} Takeaway
# :class: tip
# Optional reading behind [Synchronous training](03_synchronous): how close
# "equal to one device" is in floating point, and why the book checks it in
# float64; which all-reduce TensorFlow picks; what a straggler costs, timed;
# and the asker's TensorFlow 1 answer, one tower per device, run.
# ```
#
# **In this chapter you will** measure how far several replicas are from
# one device in float64 and float32, learn which all-reduce TensorFlow runs
# where, time a straggler, and run the TensorFlow 1 towers. Each section
# stands on its own; the page repeats the few definitions it needs from the
# chapter.

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
import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np
import tensorflow as tf
from pargrad import tf1
from pargrad.book import plots, show_lines, show_source
from pargrad.book.instruments import InstrumentedSyncTrainer
from pargrad.book.parabola import (fit_one_device, initial_weights, parabola_data, parabola_forward,
                                    squared_error, train_parabola)
from pargrad.scenario import Scenario
from pargrad.strategies import sync_strategy

devices = pargrad.logical_devices(5)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## Rounding: how equal is "equal to one device"?
#
# The chapter trains the y = x² asker's network (50 points, a 1-5-1 tanh
# network) for 2000 steps of gradient descent with learning rate 0.01 on one
# device with the full batch, and with `SyncTrainer` on 2 and 5
# {term}`replicas <replica>`, each replica taking an equal {term}`shard` of
# the batch. We repeat the runs here in float64. Keras keeps a learning
# rate in float32 whatever the model's dtype, so the one-device reference
# takes the same number, 0.01 rounded to float32 (it differs from 0.01 in the
# ninth digit, enough to show up in a float64 comparison).

# %%
x, y = parabola_data()
x64, y64 = parabola_data(dtype="float64")
keras_rate = float(np.float32(0.01))
reference_loss, reference_weights = fit_one_device(x64, y64, steps=2000,
                                                   learning_rate=keras_rate, seed=0)
runs = {"1 device, batch 50": {"loss": reference_loss, "weights": reference_weights}}
for replicas in (2, 5):
    runs[f"{replicas} replicas x {50 // replicas} points"] = train_parabola(
        replicas, steps=2000, dtype="float64")

# %% [markdown]
# In exact arithmetic all three runs compute the same numbers: the shards'
# gradients, scaled by the global batch and summed, *are* the full-batch
# gradient. A computer rounds every addition, and the replicas add in
# another order than one device does, so the runs can only agree up to
# rounding. How far is that? Each of the 2000 updates can add an error of
# about one *unit roundoff* $u$ (the relative spacing of floating-point
# numbers: $2^{-24} \approx 6\times10^{-8}$ in float32, $2^{-53} \approx
# 10^{-16}$ in float64). Errors do not simply add up: each one is carried
# through every later update, stretched or shrunk by the training dynamics
# (their Jacobian: the matrix of the update's derivatives by the weights). Gradient descent that settles into a minimum shrinks old
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

# %% tags=["remove-cell"]
assert all(gap(run["weights"]) < tolerance for run in runs.values())

# %% [markdown]
# All three weight sets agree to about twelve digits after 2000 steps. How
# much of the tolerance did they use? The gaps depend on the machine's order
# of additions, so this cell's numbers differ from machine to machine; it
# prints each gap in units of $\text{steps} \times u$ (the tolerance is
# 10 of them) and checks that the margin is at least a factor of two:

# %% tags=["nbval-ignore-output"]
steps_times_u = 2000 * pargrad.unit_roundoff("float64")
for name, run in list(runs.items())[1:]:
    print(f"{name:40s} gap = {gap(run['weights']) / steps_times_u:.2f} x steps x u")

# %% tags=["remove-cell"]
assert max(gap(run["weights"]) for run in runs.values()) < tolerance / 2

# %% [markdown]
# Why float64? In float32 the same comparison gives gaps a million times larger,
# and their exact size depends on the machine: on which CPU kernels
# (AVX-512 or not), how many threads, and, on a GPU, on the order in which
# its threads finish. Here are the float32 gaps as this page computed
# them (yours may differ in every digit; the tolerance holds on all). On
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
    assert gap32 < float32_tolerance  # the one visible check of the section

# %% [markdown]
# A claim such as "equal within $10^{-5}$" in float32 would hold on one
# machine and fail on the next; in float64 the point is unmistakable on any
# of them.

# %% [markdown]
# ## Which all-reduce TensorFlow runs
#
# An {term}`all-reduce` sums one value per replica and hands every replica
# the sum. Which algorithm TensorFlow uses depends on the strategy and on where the
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
# the book builds several.)

# %% [markdown]
# ## What a straggler costs, timed
#
# A {term}`straggler` is a device slower than the others. The chapter's
# instrumented perceptron again: a 64-256-256-1 network on random data, 256
# examples a replica, and `Scenario` speeds that make a replica compute its
# gradient several times over, inside the step (busy work rather than a
# sleep: a slow device does not lend its core to the others). Runs with a x1,
# x3 and x6 straggler:

# %% tags=["hide-input"]
from pargrad.book.instruments import measure, perceptron_data, perceptron_trainer

features, targets = perceptron_data()


trainers = {factor: perceptron_trainer(2, (1, 1 / factor)) for factor in (1, 3, 6)}
histories = {f"straggler x{factor}": measure(trainer) for factor, trainer in trainers.items()}

# %% [markdown]
# Is the x3 straggler three times slower, and is its update the one it would
# make anyway? One replica alone, so that nothing waits: the median time from
# its input to its gradients, with and without the straggler, measured in
# interleaved rounds (a busy moment of the machine hits both), then the two
# trainers' weights after the same steps. The ratio depends on the machine and
# its load, so the cell checks only that the straggler is clearly slower; the
# weights must be equal bit for bit.

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
same = all(np.array_equal(a, b) for a, b in zip(alone[1].model.get_weights(),
                                                 alone[3].model.get_weights()))
print("the same weights after the same steps, bit for bit:", same)

# %% tags=["remove-cell"]
assert slowdown > 1.5  # about 3 on an idle machine; load compresses it, never below 1.5
assert same

# %% [markdown]
# Over every step of the three runs, the step time follows the slowest
# replica (its start plus its compute) closely, just above the diagonal
# ({numref}`fig-step-time-slowest`): the rest is the all-reduce and the
# update. A slower straggler makes a longer step (the cell compares them in
# interleaved rounds, so that a busy moment cannot favour one).

# %% mystnb={"figure": {"caption": "Step time against the time of the slowest replica (its start plus its compute), for every step of the runs with a x1, x3 and x6 straggler. Measured on two shared CPU cores.", "name": "fig-step-time-slowest"}} tags=["nbval-ignore-output"]
fig = plots.step_time_against_slowest(histories)
for name, history in histories.items():
    slowest = (history.launch + history.compute).max(axis=1)
    print(f"{name}: median step {np.median(history.step_time) * 1e3:.2f} ms, "
          f"slowest replica {np.median(slowest) * 1e3:.2f} ms")

# %% tags=["remove-cell"]
for name, history in histories.items():
    slowest = (history.launch + history.compute).max(axis=1)
    # "follows the slowest replica closely": the rest (all-reduce, update) is the smaller part
    assert np.median(history.step_time - slowest) < 0.75 * np.median(history.step_time)
# A slower straggler makes a longer step: compared in interleaved rounds, so
# that a moment when the machine was busy cannot favour one of them.
best = {factor: np.inf for factor in trainers}
for _ in range(3):
    for factor, trainer in trainers.items():
        history = trainer.fit(features, targets, steps=10, batch_size=512)
        best[factor] = min(best[factor], np.median(history.step_time))
assert best[6] > best[1]

# %% [markdown]
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
# [Devices](02_devices) checks what the cores bound). It is not a speed-up from the
# devices: however many logical devices we make, there are two cores, and
# every extra replica adds a shard to compute on them and a contribution to
# the all-reduce. Logical devices show how
# synchronous training *behaves* (the equal results, the waiting), not how
# fast it can be.
#
# Two settings can make each step cheaper; by default `SyncTrainer` leaves
# both off, which is what this page's timings need. `fit(...,
# steps_per_call=100)` runs 100 steps in one `tf.function` call, as Keras's
# `steps_per_execution` does: each step is still one all-reduce and one
# update, with the same numbers, but Python launches the graph once per 100
# updates. Turn it on whenever you train for speed; keep 1 when each step
# must be timed from Python or planned before it runs (backup workers, in
# [Sync vs async in the same time](05_sync_vs_async)). `SyncTrainer(..., jit_compile=True)` compiles each replica's
# forward and backward pass with XLA; the all-reduce and the update stay
# outside, since XLA compiles for one device and the all-reduce spans all of
# them. The result equals the plain step up to float32 rounding (the tests
# check it). Turn it on when a step is many small operations, as with tiny
# models on a GPU, and measure first: `benchmarks/sync.py` times both against
# the same step on one device without any strategy, Keras `fit` and a
# hand-written loop on your machine.

# %% [markdown]
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
    assert gap < TOLERANCE  # the one visible check of the section

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
# ## Summary
#
# - Several replicas equal one device only up to rounding: in float64 the
#   gaps stay far below `pargrad.rounding_tolerance` (10 × steps × unit
#   roundoff, an empirical margin for converging runs); in float32 they are
#   a million times larger and depend on the machine.
# - `MirroredStrategy` uses NCCL on one machine's GPUs;
#   `MultiWorkerMirroredStrategy` runs TensorFlow's ring collectives between
#   processes unless given `CommunicationOptions(implementation=NCCL)`.
# - The step time follows the slowest replica; logical CPU devices share
#   their cores, so they show behaviour, not speed-ups.
# - TensorFlow 1's towers compute the full batch's training to the last bits
#   of float64; `SyncReplicasOptimizer` gave way to `tf.distribute`.
#
# ## Exercises
#
# 1. Repeat the float64 comparison with 4000 steps instead of 2000 (and
#    `pargrad.rounding_tolerance("float64", 4000)`). Do the gaps, in units of
#    $\text{steps} \times u$, stay about where they were?
#
#    *Hint:* the run converges, so old rounding errors shrink.
# 2. Replace the straggler's busy work with `time.sleep` of the same length
#    (in your own subclass). Why would the fast replica's compute look
#    shorter on two shared cores?
#
#    *Hint:* who uses the core while the straggler sleeps?
#
# ```{dropdown} Solution to exercise 1
# Yes, roughly: gradient descent that settles into a minimum shrinks old
# errors, so the gaps grow at most about linearly with the steps and their
# ratio to $\text{steps} \times u$ stays of the same size, far below the
# tolerance's 10. A diverging run would behave differently, which is why the
# book uses the tolerance only for runs that converge.
# ```
#
# ```{dropdown} Solution to exercise 2
# A sleeping straggler lends its core to the other replica, which then runs
# alone and finishes sooner than it would next to a busy device; the
# timeline would flatter synchronous training. A real slow device keeps its
# own processor busy, which busy work imitates.
# ```
