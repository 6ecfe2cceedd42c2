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
# stands on its own.

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
import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np
import tensorflow as tf
from pargrad import tf1
from pargrad.book import show_lines, show_source
from pargrad.book.plots_synchronous import step_time_against_slowest, throughput_against_replicas
from pargrad.book.instruments import InstrumentedSyncTrainer
from pargrad.book.parabola import (fit_one_device, initial_weights, parabola_data, parabola_forward,
                                    parabola_model, squared_error, train_parabola)
from pargrad.scenario import Scenario
from pargrad.strategies import sync_strategy

devices = pargrad.logical_devices(5)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## Rounding: how equal is "equal to one device"?
#
# The chapter's runs again, in float64: the y = x² asker's 1-5-1 tanh network,
# 2000 steps of gradient descent with learning rate 0.01, on one device with
# the full batch of 50 and with `SyncTrainer` on 2 and 5
# {term}`replicas <replica>`, each taking an equal {term}`shard`. The
# reference takes Keras's float32 learning rate, 0.01 rounded to float32.

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
# In exact arithmetic the three runs compute the same numbers; the replicas
# add in another order than one device, so they agree only up to rounding.
# Each update can add an error of about one *unit roundoff* $u$, the
# relative spacing of floating-point numbers ($2^{-24} \approx 6\times10^{-8}$
# in float32, $2^{-53} \approx 10^{-16}$ in float64), which later updates
# stretch or shrink (by their Jacobian, the matrix of the update's
# derivatives by the weights). A run that settles into a minimum shrinks old
# errors, so the gaps grow at most about linearly with the steps; a
# diverging run stretches them exponentially, beyond any such tolerance.
# `pargrad.rounding_tolerance` allows $10 \times \text{steps} \times u$ for
# weights of size about 1: linear growth times a safety factor of 10 that is
# *empirical*, measured on this network, not a theorem, and used only for
# runs that converge:

# %%
tolerance = pargrad.rounding_tolerance("float64", 2000)
print(f"tolerance for 2000 float64 steps: {tolerance:.1e}")


def gap(weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference_weights))


for name, run in runs.items():
    print(f"{name:40s} final loss {run['loss'][-1]:.6f}   "
          f"weight gap to one device below {tolerance:.0e}")

# %% tags=["remove-cell"]
assert all(gap(run["weights"]) < tolerance for run in runs.values())

# %% [markdown]
# The weights agree to about twelve digits. How much of the tolerance did
# they use? Each gap in units of $\text{steps} \times u$ (the tolerance is 10
# of them; the digits depend on the machine's order of additions), checked
# to keep a margin of at least a factor of two:

# %% tags=["nbval-ignore-output"]
steps_times_u = 2000 * pargrad.unit_roundoff("float64")
for name, run in list(runs.items())[1:]:
    print(f"{name:40s} gap = {gap(run['weights']) / steps_times_u:.2f} x steps x u")

# %% tags=["remove-cell"]
assert max(gap(run["weights"]) for run in runs.values()) < tolerance / 2

# %% [markdown]
# Why float64? In float32 the gaps are a million times larger and depend on
# the machine: its CPU kernels, its threads, a GPU's order of finishing (the
# cell turns off recent NVIDIA GPUs' TF32 matrix products, with about
# $10^{-3}$ relative error). Your digits may differ; the tolerance holds:

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
# A float32 "equal within $10^{-5}$" would hold on one machine and fail on
# the next.

# %% [markdown]
# ## Inside `SyncTrainer`
#
# `pargrad.SyncTrainer` is the program of [Synchronous
# training](03_synchronous) plus what a real run needs. Replica $r$ gathers
# from host memory the $B/R$ rows that follow $r \cdot B/R$ in the batch (a
# garbage-collected `tf.data` distributed iterator can hang TensorFlow 2.21):

# %%
from pargrad.loop import fit_loop, train_epoch  # noqa: E402
from pargrad.sync import SyncTrainer  # noqa: E402

show_source(SyncTrainer._shard)

# %% [markdown]
# Every replica computes its gradients (`_gradients`, collapsed below), the
# loss divided by the *global* batch size, and `apply_gradients` all-reduces
# and updates; the line between stops training on a non-finite loss:

# %%
show_source(SyncTrainer._replica_step)

# %% tags=["hide-cell"]
show_source(SyncTrainer._gradients)

# %% [markdown]
# The trainer refuses a model built outside the strategy's scope and a batch
# that does not split evenly:

# %%
strategy = sync_strategy(4)
try:
    SyncTrainer(parabola_model(seed=0), strategy)
except ValueError as error:
    print(type(error).__name__, error)

with strategy.scope():
    model = parabola_model(seed=0)
try:
    SyncTrainer(model, strategy, progress=False).fit(*parabola_data(), steps=1)
except ValueError as error:
    print(type(error).__name__, error)

# %% [markdown]
# Around the step sits the loop of every trainer: `pargrad.data.EpochReader`
# says which batches come next, `pargrad.loop.fit_loop` calls Keras's
# callbacks around the epochs, and `pargrad.loop.train_epoch` runs the
# step's calls (`SyncTrainer.run_call`):

# %% tags=["hide-cell"]
show_source(fit_loop)

# %% tags=["hide-cell"]
show_source(train_epoch)

# %% [markdown]
# ## Which all-reduce TensorFlow runs
#
# An {term}`all-reduce` sums one value per replica and hands every replica
# the sum. On one machine's GPUs `MirroredStrategy` uses NVIDIA's NCCL
# (`tf.distribute.NcclAllReduce`: rings and trees over NVLink or PCIe).
# Between processes, `MultiWorkerMirroredStrategy`'s default,
# `CommunicationImplementation.AUTO`, does **not** pick NCCL on GPUs: in
# TensorFlow 2.21 it runs TensorFlow's own ring all-reduce over gRPC unless
# given `implementation=NCCL`. GPU workers that should use NCCL must ask
# (the cell only builds the option):

# %%
nccl_between_workers = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
# on GPU workers: tf.distribute.MultiWorkerMirroredStrategy(communication_options=nccl_between_workers)
print(nccl_between_workers.implementation)

# %% [markdown]
# For logical CPUs in one process, `pargrad.sync_strategy` picks
# `ReductionToOneDevice`: the asker's master, literally, cheap when all
# "devices" share one memory; unlike collective ops, it lets strategies with
# different numbers of replicas share one process, as the book needs.

# %% [markdown]
# ## What a straggler costs, timed
#
# A {term}`straggler` is a device slower than the others. The chapter's
# perceptron again, with a x1, x3 and x6 straggler: `Scenario` makes a
# replica compute its gradient several times inside the step, busy work
# rather than a sleep, since a slow device does not lend its core to the
# others.

# %% tags=["hide-input"]
from pargrad.book.instruments import measure, perceptron_data, perceptron_trainer

features, targets = perceptron_data()


trainers = {factor: perceptron_trainer(2, (1, 1 / factor)) for factor in (1, 3, 6)}
histories = {f"straggler x{factor}": measure(trainer) for factor, trainer in trainers.items()}

# %% [markdown]
# Is the x3 straggler slower, and is its update the one it would make
# anyway? One replica alone, so that nothing waits, timed with and without
# the straggler in interleaved rounds (a busy moment hits both); the cell
# checks that the straggler is clearly slower and the weights equal bit for
# bit:

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
difference = max(float(np.max(np.abs(a - b))) for a, b in zip(alone[1].model.get_weights(),
                                                              alone[3].model.get_weights()))
print("largest weight difference after the same steps:", difference)
same = difference == 0

# %% tags=["remove-cell"]
assert slowdown > 1.5  # about 3 on an idle machine; load compresses it, never below 1.5
assert same

# %% [markdown]
# The step time follows the slowest replica (its start plus its compute)
# closely, just above the diagonal ({numref}`fig-step-time-slowest`); the
# rest is the all-reduce and the update. A hidden cell checks, in
# interleaved rounds, that a slower straggler makes a longer step.

# %% mystnb={"figure": {"caption": "Step time against the time of the slowest replica (its start plus its compute), for every step of the runs with a x1, x3 and x6 straggler. Measured on two shared CPU cores.", "name": "fig-step-time-slowest"}} tags=["nbval-ignore-output"]
fig = step_time_against_slowest(histories)
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
# With 256 examples a replica, more replicas make a bigger global batch. If
# each replica had its own processor, the examples per second would grow in
# proportion (the dashed line of {numref}`fig-throughput`); here all logical
# devices share two CPU cores. Each count keeps its best of three
# interleaved rounds:

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
fig = throughput_against_replicas(replica_counts, rates)
print("examples per second:", [f"{rate:,.0f}" for rate in rates])
# No check on the curve's shape: how much a bigger step gains from spreading
# its fixed cost depends on the machine's load, and the text draws no
# conclusion from it (the chapter "Devices" checks what the cores bound).

# %% [markdown]
# A rising curve says more about the fixed cost of launching a step, spread
# over more examples, than about the devices: there are two cores however
# many logical devices we make. This page draws no conclusion from the shape
# ([Devices](02_devices) checks what the cores bound): logical devices show
# how synchronous training *behaves*, not how fast it can be.
#
# Two settings make each step cheaper; `SyncTrainer` leaves both off, which
# this page's timings need. `fit(..., steps_per_call=100)` runs 100 steps in
# one `tf.function` call, like Keras's `steps_per_execution`: still one
# all-reduce and one update a step, but one Python launch per 100. Use it
# when training for speed; keep 1 when each step must be timed or planned
# from Python (backup workers, in
# [Sync vs async in the same time](05_sync_vs_async)).
# `SyncTrainer(..., jit_compile=True)` compiles each replica's forward and
# backward pass with XLA, leaving the all-reduce and the update outside; the
# result equals the plain step up to float32 rounding. Use it when a step is
# many small operations, and measure first: `benchmarks/sync.py` times both
# against one device, Keras `fit` and a hand-written loop.

# %% [markdown]
# ## The answer in TensorFlow 1: one tower per device
#
# The asker wrote TensorFlow 1, where the answer was *in-graph replication*:
# one graph holds a {term}`tower`, a copy of the forward and backward pass,
# per device, placed with `tf.device`; every tower reads the same variables
# and gets its shard; the towers' gradients are averaged in the graph on the
# CPU, the question's "master"; and one `apply_gradients` applies the mean.
# One `session.run` runs all towers at once. The lines of
# `pargrad.tf1.multi_tower_step` that carry the idea:

# %%
v1 = tf.compat.v1
show_lines(tf1.multi_tower_step, "input_shards = tf.split", "train_step = optimizer.apply_gradients")

# %% [markdown]
# `tf.split` cuts the batch into one shard per device; each tower's loss and
# `compute_gradients` are created under `tf.device(device)`; under
# `tf.device(average_on)` `average_tower_gradients` averages the towers'
# gradients with `tf.add_n`, and one `apply_gradients` updates the shared
# variables (the whole source is collapsed below).

# %% tags=["hide-cell"]
show_source(tf1.multi_tower_step)

# %% [markdown]
# We run the asker's program on one device with the full batch and with 2
# and 5 towers, 2000 steps from the same initial weights, in float64 so that
# the differences in the order of additions stay far below the tolerance on
# any machine.

# %% tags=["hide-input"]


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
# The first step's trace shows the towers' operations on 2 and 5 different
# devices. The weights after 2000 steps:

# %% tags=["nbval-ignore-output"]
TOLERANCE = pargrad.rounding_tolerance("float64", 2000)
for towers, weights in tower_runs.items():
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, full_batch))
    print(f"{towers} towers vs the full batch after 2000 steps: largest weight gap "
          f"{gap:.1e} (tolerance {TOLERANCE:.0e})")
    assert gap < TOLERANCE  # the one visible check of the section

# %% [markdown]
# The towers compute the full batch's training to the last bits of float64:
# the mean of equal shards' means is the batch's mean, as in `SyncTrainer`.
#
# ### Between graphs: `SyncReplicasOptimizer`, and why it is gone
#
# Across machines, TensorFlow 1 used *between-graph replication*: each worker
# built its own graph, the variables lived on
# {term}`parameter servers <parameter server>`, and each worker wrapped its
# optimizer in
# `tf.compat.v1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=N)`
# {cite}`tfsyncreplicas`. A *chief* worker waited for $N$ gradients, applied
# their mean and released the workers through a queue of tokens; a gradient
# for an older step was dropped as stale, and extra workers were backup
# workers {cite}`chen2016revisiting`.
#
# It is deprecated ("For synchronous training, please use Distribution
# Strategies."): it needs graph-mode queues, accumulators and session hooks
# that eager TensorFlow 2 lacks, and it puts the parameter servers in the
# middle of every step, where an all-reduce between the workers needs no
# central link. TensorFlow 2 keeps it only under `tf.compat.v1`:

# %%
for where, module in (("tf.compat.v1.train", v1.train), ("tf.train", tf.train)):
    found = "present" if hasattr(module, "SyncReplicasOptimizer") else "absent"
    print(f"{where + '.SyncReplicasOptimizer:':42s} {found}")

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
# 1. Repeat the float64 comparison with 4000 steps (and
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
