# %% [markdown]
# # Synchronous training
#
# ```{admonition} Takeaway
# :class: tip
# Yes, several devices can train one model and compute exactly what one
# device computes on the whole batch: each replica scales its shard's loss by
# the *global* batch size, one all-reduce sums the gradients, one update is
# applied everywhere. You do not write the master: `MirroredStrategy` does it.
# The price: every step waits for the slowest device.
# ```
#
# The y = x² asker ([Where this book starts](00_sources)) wants to split a
# batch of 50 points over several workers, compute the gradients in
# parallel, and have a master average them and apply the result. Does that
# train the same network as one device? **Yes, and you do not need to write
# the master**: `MirroredStrategy` runs one copy of the model per device and
# sums their gradients with an all-reduce, and the result is the full-batch
# computation, to the last digits of float64. The first program below is all
# of it, ready to copy.
#
# **In this chapter you will** write a synchronous training loop with
# `MirroredStrategy` and `strategy.run`; explain why the loss is divided by
# the global batch size; use `pargrad.SyncTrainer`; say what a ring
# all-reduce sends; and see on a timeline why a straggler slows every step.
# You need the chapters [The training loop](01_training_loop) and
# [Devices](02_devices).

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
# We import `pargrad` first, split the CPU into five logical devices before
# TensorFlow starts ([Devices](02_devices)), and fix the seeds.

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np
import tensorflow as tf
from pargrad.book.plots_synchronous import device_timeline, ring_all_reduce_steps, sync_async_timelines
from pargrad.cluster import LocalCluster
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
# Part II compares two ways for several devices to train one model; keep
# this picture in mind ({numref}`fig-sync-async-timelines`).

# %% mystnb={"figure": {"caption": "Two devices, device 1 slower, on a fixed schedule (a drawing, not a measurement). Top, synchronous: both devices compute a gradient on the same weights (w0, then w1), the fast one waits (hatched) for the slow one, and one all-reduce and one update (red) end every step. Bottom, asynchronous: each device reads the weights (\u25bc), computes and applies its update on its own and never waits, but an update computed on weights that the other device has changed since the read (orange) is stale: it is applied one update behind.", "name": "fig-sync-async-timelines"}}
fig = sync_async_timelines()

# %% [markdown]
# ## The answer as a program
#
# In synchronous data-parallel training every device reads the *same*
# parameters and computes the gradient of its share of the batch; the
# gradients are summed and *one* update is applied everywhere. Why is that
# the full-batch computation? The loss of a batch of $B$ examples is a mean,
# and a mean splits into pieces:
#
# $$\nabla \frac{1}{B}\sum_{i=1}^{B} \ell_i
#   = \sum_{r=1}^{R} \nabla \Big(\frac{1}{B}\sum_{i \in \text{shard } r} \ell_i\Big).$$
#
# Each device holds a {term}`replica`, a full copy of the model; replica $r$
# of $R$ computes the gradient of its {term}`shard`, its share of the batch.
# If each replica scales its shard's loss by the *global* batch size $B$, not
# by its shard's size (`tf.nn.compute_average_loss` does), the *sum* of the
# replicas' gradients is the full-batch gradient. An {term}`all-reduce` sums
# one value per replica and hands every replica the sum.
# `tf.distribute.MirroredStrategy` ({term}`MirroredStrategy`) runs one
# replica per device of one machine and all-reduces their gradients.
#
# Here it is for the asker's network, a program you can copy whole; its
# last lines train one device on the full batch and print the difference.
# Variables made in `strategy.scope()` are mirrored on both devices;
# `experimental_distribute_values_from_function` hands each replica its rows;
# `strategy.run` runs `replica_step` on every replica; and its one
# `apply_gradients` sums the replicas' gradients (the all-reduce) and applies
# the same update everywhere.

# %% tags=["program"]
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # set before TensorFlow starts: no start-up logs

import keras
import numpy as np
import tensorflow as tf

# Two logical CPUs, split before TensorFlow makes its devices; a process splits them once
# (this page split the CPU into 5 at its start: there the call fails and the first 2 serve).
try:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:  # the devices exist already
    pass
devices = [device.name for device in tf.config.list_logical_devices("CPU")[:2]]
strategy = tf.distribute.MirroredStrategy(  # one memory: the sum is taken on one device
    devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
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

single, single_optimizer = new_model(), keras.optimizers.SGD(learning_rate=1e-2)  # the check
for _ in range(300):  # one device, the full batch of 50
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(single(x) - y))
    single_optimizer.apply_gradients(zip(tape.gradient(loss, single.trainable_variables),
                                          single.trainable_variables))
moved = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), new_model().get_weights()))
gap = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), single.get_weights()))
print(f"{R} replicas, 300 steps: weights moved {moved:.2f}; "
      f"largest weight gap to one device {'below 1e-14' if gap < 1e-14 else f'{gap:.1e}'}")

# %% tags=["remove-cell"]
import pargrad  # noqa: E402  (the page's check; the program above does not need pargrad)

assert moved > 0.01 and R == 2
assert gap < pargrad.rounding_tolerance("float64", 300)

# %% [markdown]
# The gap is float64 rounding: replicas add the gradients in another order
# than one device ([Synchronous training in depth](d1_synchronous_in_depth)
# measures it). `pargrad.SyncTrainer`, used from here on, is this program
# plus what a real run needs: shards cut from any batch, accumulation of
# micro-batches, instruments that show stragglers, and errors that say what
# to pass instead ([its code, walked
# through](d1_synchronous_in_depth.ipynb#inside-synctrainer)).
#
# ## The y = x² question, four ways
#
# The asker's network, all runs from the same initial weights
# (`pargrad.book.parabola.initial_weights(seed=0)`), 2000 steps of gradient
# descent with learning rate 0.01, in float64:
#
# 1. one device, the full batch of 50 (`pargrad.book.parabola.fit_one_device`,
#    chapter [The training loop](01_training_loop));
# 2. `SyncTrainer` on 2 logical devices, 25 points each;
# 3. `SyncTrainer` on 5 logical devices, 10 points each;
# 4. two operating-system processes with `MultiWorkerMirroredStrategy`, 25
#    points each.
#
# The processes are slow to start, so we start them first.
# `pargrad.LocalCluster` gives each its `TF_CONFIG` (both on 127.0.0.1, free
# ports) and stops them all however the run ends.
#
# ```{warning}
# TensorFlow's gRPC servers listen on **all** network interfaces, whatever
# `TF_CONFIG` names, and have **no authentication**. Run clusters only on
# machines and networks you trust, and stop them when you are done.
# ```

# %%
cluster = LocalCluster(train_parabola, workers=2, kwargs={"steps": 2000, "dtype": "float64"},
                       timeout=240)
cluster.start()
print(cluster.roles)

# %% [markdown]
# Meanwhile, in this process: one device, then 2 and 5 replicas, each
# taking a contiguous slice of the 50 points (`steps_per_call=100` runs 100
# steps, each one all-reduce and one update, in one `tf.function` call).

# %%
show_source(train_parabola)

# %% [markdown]
# Keras keeps a learning rate in float32 whatever the model's dtype, so the
# one-device reference takes 0.01 rounded to float32 (it differs from 0.01 in
# the ninth digit, enough to show in float64).

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
# soon as one fails); `stop` ends both whatever happened:

# %%
try:
    workers = cluster.wait()
finally:
    cluster.stop()
for index, result in enumerate(workers):
    runs[f"process {index} of 2 (MultiWorkerMirrored)"] = result
print("replicas per worker run:", [result["replicas"] for result in workers])

# %% [markdown]
# In exact arithmetic all five runs compute the same numbers. A computer
# rounds every addition, and replicas add in another order than one device,
# so the runs agree within `pargrad.rounding_tolerance("float64", 2000)`
# (float32 agrees only to last digits that differ between machines; the deep
# dive measures both):

# %% tags=["remove-input"]
tolerance = pargrad.rounding_tolerance("float64", 2000)


def gap(weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference_weights))


for name, run in runs.items():
    print(f"{name:40s} final loss {run['loss'][-1]:.6f}   largest weight gap to one device: "
          f"below {tolerance:.0e}")
assert all(gap(run["weights"]) < tolerance for run in runs.values())

# %% [markdown]
# The loss curves lie on top of each other ({numref}`fig-sync-loss-curves`):

# %% mystnb={"figure": {"caption": "The y = x\u00b2 question's network, trained on one device with the full batch, on 2 and 5 logical devices, and in two processes: the loss curves coincide.", "name": "fig-sync-loss-curves"}}
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.4))
run_colors = ["black", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]  # none of the others'
for (name, run), style, color in zip(runs.items(), ["-", "--", ":", "-.", (0, (1, 4))], run_colors):
    ax.plot(np.arange(1, 2001), run["loss"], linestyle=style, color=color, label=name)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.set_title("The y = x² network, one device and split four ways")
ax.legend(fontsize=9)
fig.tight_layout()

# %% [markdown]
# So the answer to the y = x² question is: yes, and you do not need to write
# the master. Scale each shard's loss by the global batch size and let the
# strategy all-reduce.
#
# ## All-reduce
#
# The asker imagines a *master* that receives the workers' gradients,
# averages them and sends back the result. That is one way to all-reduce;
# its weakness is the master's link, which receives $R$ gradients each step.
# The **{term}`ring all-reduce`** {cite}`patarasuk2009bandwidth`, which
# Horovod {cite}`sergeev2018horovod` brought to deep learning, spreads the
# work: each replica cuts its gradient into $R$ chunks; in $R - 1$
# *reduce-scatter* steps every replica passes one chunk to its neighbour, who
# adds it to its own, until every chunk is complete on one replica; in
# $R - 1$ *all-gather* steps the finished chunks travel around the ring once
# more. Each replica sends $2(R-1)/R$ of its gradient, almost the same
# whatever $R$ is ({numref}`fig-ring-all-reduce`).
#
# `pargrad.allreduce.ring_all_reduce` runs it in NumPy. Four replicas hold
# the gradients `[1 2 3 4]`, `[10 20 30 40]`, ...; a cell is darker the more
# replicas' contributions it holds:

# %% mystnb={"figure": {"caption": "A ring all-reduce of four replicas, step by step. Rows are replicas, columns chunks of the gradient; each cell shows the replica's current value of the chunk, darker green when it holds more replicas' contributions, darkest (with a white, bold number) when it holds the complete sum; a purple frame marks the chunk a replica sends in that step.", "name": "fig-ring-all-reduce"}}
gradients = np.array([[1, 2, 3, 4]]) * np.array([[1], [10], [100], [1000]])
result, states, sent = ring_all_reduce(gradients)
_, counts, _ = ring_all_reduce(np.ones_like(gradients))
fig = ring_all_reduce_steps(states, sent, counts)
print(result)

# %% [markdown]
# Every replica ends with the sum, the same that TensorFlow's all-reduce
# returns for the same rows:

# %%
strategy = sync_strategy(4)
values = strategy.experimental_distribute_values_from_function(
    lambda context: tf.constant(gradients[context.replica_id_in_sync_group], tf.float32))
reduced = strategy.run(
    lambda v: tf.distribute.get_replica_context().all_reduce("SUM", v), args=(values,))
tf_result = np.stack([t.numpy() for t in strategy.experimental_local_results(reduced)])
print(tf_result)
print("largest difference from the ring's result:", np.max(np.abs(tf_result - result)))

# %% tags=["remove-cell"]
assert np.array_equal(tf_result, result)

# %% [markdown]
# TensorFlow's algorithm depends on the strategy and on where the replicas
# are: NCCL's rings and trees on one machine's GPUs, its own ring collectives
# between processes, and, for this book's logical CPUs,
# `ReductionToOneDevice`: the asker's master, literally, cheap when all
# "devices" share one memory ([Synchronous training in
# depth](d1_synchronous_in_depth) has the details).
#
# ## What it costs: waiting
#
# A step ends only when *every* replica has contributed its gradient. A
# {term}`straggler` is a device slower than the others. To see one we need a
# model whose computation shows next to the overheads: a small multilayer
# perceptron on random data, two replicas of 256 examples each, and
# `scenario=Scenario((1, 1 / 3))` (the replicas' speeds), which makes replica
# 1 three times slower: it computes its gradient twice more inside the step
# and applies the first, like a device that needs three times as long for
# the same work. `pargrad.book.instruments.InstrumentedSyncTrainer`,
# the book's instrument, wraps `tf.timestamp()` lines and the straggler's
# extra passes around the two lines of `SyncTrainer._replica_step` (both
# collapsed below).

# %% tags=["hide-cell"]
show_source(InstrumentedSyncTrainer._replica_step)

# %% tags=["hide-input"]
from pargrad.book.instruments import measure, perceptron_trainer

slow = measure(perceptron_trainer(2, (1, 1 / 3)))

# %% [markdown]
# {numref}`fig-sync-timeline` shows four consecutive steps with the x3
# straggler. Tan is the time before a replica starts: launching the step
# from Python, handing the replica its input, waiting for a free core.

# %% mystnb={"figure": {"caption": "Four synchronous steps of two replicas, replica 1 a x3 straggler. Blue: forward and backward passes (cross-hatched: the straggler's); red, as in the first figure: from a replica's gradient to its update (the all-reduce, waiting for the slowest); tan: before the replica starts. Dotted lines end the steps. Measured on two shared CPU cores: the lengths vary from run to run.", "name": "fig-sync-timeline"}} tags=["nbval-ignore-output"]
fig = device_timeline(slow, steps=range(4))
print(f"median compute (ms): {np.round(np.median(slow.compute, axis=0) * 1e3, 2)}")
print(f"median wait    (ms): {np.round(np.median(slow.wait, axis=0) * 1e3, 2)}")

# %% tags=["remove-cell"]
# "replica 0 waits for replica 1": the fast replica waits longer than the straggler,
# and the straggler computes longer (robust under load: compared within each step)
assert np.median(slow.wait[:, 0] - slow.wait[:, 1]) > 0
assert np.median(slow.compute[:, 1] - slow.compute[:, 0]) > 0

# %% [markdown]
# Replica 0 spends its red time idle, waiting for replica 1: a synchronous
# step is as slow as its slowest device. The stale-gradient article names
# this weakness, and it made asynchronous training attractive. Chen et al.
# {cite}`chen2016revisiting` kept synchronous training and cut the tail
# instead: add a few {term}`backup workers <backup worker>` and apply each
# update with the first $N$ of $N + b$ gradients. The deep dive times
# stragglers of several speeds, the throughput against the number of
# devices, and two settings that make a step cheaper (`steps_per_call` and
# XLA's `jit_compile`).
#
# On real GPUs, scaling is good when a step's computation is large next to
# its all-reduce: Goyal et al. {cite}`goyal2017accurate` trained ResNet-50
# on ImageNet synchronously on 256 GPUs in one hour, with about 90% scaling
# efficiency relative to 8.
#
# Was synchronous training "mostly abandoned", as the answer to the y = x²
# question claims? No: [Sync vs async in the same time](05_sync_vs_async)
# tells that history and measures both modes against the clock.
#
# ## From TensorFlow 1 to TensorFlow 2
#
# The asker wrote TensorFlow 1, where the answer was one {term}`tower` per
# device in one graph, the towers' gradients averaged and one
# `apply_gradients` (the deep dive runs them). Which TF1 construct became
# which TF2 one:
#
# | TensorFlow 1 | TensorFlow 2 | in this book |
# | --- | --- | --- |
# | `tf.placeholder` and `feed_dict` | function arguments, `tf.data` | [The training loop](01_training_loop) |
# | `Session.run(train_step)` | calling a `tf.function` | [The training loop](01_training_loop) |
# | `optimizer.compute_gradients(loss)` | `tf.GradientTape` and `tape.gradient` | [The training loop](01_training_loop) |
# | one tower per GPU under `tf.device`, gradients averaged in the graph | `MirroredStrategy` and `strategy.run`; the optimizer all-reduces | this chapter, `SyncTrainer` |
# | `SyncReplicasOptimizer` with parameter servers | `MultiWorkerMirroredStrategy` (all-reduce between workers) | [Beyond one machine](09_beyond_one_machine) |
# | asynchronous training with `replica_device_setter` | `ParameterServerStrategy` with a `ClusterCoordinator` | [Beyond one machine](09_beyond_one_machine) |
# | `tf.train.ClusterSpec` and `tf.train.Server` per task | `TF_CONFIG` and a cluster resolver | [Beyond one machine](09_beyond_one_machine) |
# | accumulator variables, `zero_ops`, `accum_ops` | `GradientAccumulator`, Keras's `gradient_accumulation_steps` | [Accumulating gradients in TF1 graphs](06_accumulation_tf1) and [Accumulation in TF2 and across replicas](07_accumulation_tf2) |
#
# ```{admonition} Further reading: TensorFlow's own guides
# :class: seealso
#
# - [Distributed training with TensorFlow](https://www.tensorflow.org/guide/distributed_training): the `tf.distribute` strategies,
#   synchronous (`MirroredStrategy`, `MultiWorkerMirroredStrategy`,
#   `TPUStrategy`) and asynchronous (`ParameterServerStrategy`).
# - [Custom training with tf.distribute.Strategy](https://www.tensorflow.org/tutorials/distribute/custom_training): a custom loop with `MirroredStrategy`,
#   the pattern of `SyncTrainer`, `tf.nn.compute_average_loss` included.
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
#   network on 1, 2 and 5 devices and in two processes ends with the same
#   weights after 2000 steps, within float64 rounding. `MirroredStrategy`
#   and `strategy.run` are the master, in one cell of plain TensorFlow that
#   a reader copies.
# - `pargrad.SyncTrainer` is that program with shards from any batch,
#   accumulation, instruments and errors that say what to pass instead.
# - A ring all-reduce sends about twice the gradient's size per replica,
#   however many replicas there are.
# - Every step waits for the slowest replica; backup workers remove that
#   tail.
# - In TensorFlow 1 the same answer was one tower per device in one graph.
#
# ## Exercises
#
# 1. Train the y = x² network with `SyncTrainer` on 3 logical devices. What
#    does the trainer say, and which batch sizes would work? Change
#    `pargrad.book.parabola.parabola_data(n=...)` so that 3 replicas work, and
#    check the result against `pargrad.book.parabola.fit_one_device`.
#
#    *Hint:* the global batch must split into equal shards; $50 = 2 \cdot 5^2$.
# 2. In your own copy of the replica step, replace
#    `tf.nn.compute_average_loss` with a plain mean over the shard. By what
#    factor does the update change with 5 replicas? Which learning rate
#    undoes it?
#
#    *Hint:* a shard's mean divides by its 10 examples, not by the batch's 50,
#    and the all-reduce *sums* the replicas' gradients.
# 3. Run `SyncTrainer(..., accumulation_steps=5)` on 2 replicas with the full
#    batch of 50. What are the {term}`micro-batch` and the
#    {term}`effective batch`, and are the weights still those of one device?
#
#    *Hint:* each replica's shard is cut into `accumulation_steps`
#    micro-batches; `fit` returns a history with `effective_batch_size`.
# 4. Make two replicas stragglers, with factors 2 and 4. Which one sets the
#    step time? Draw the timeline.
#
#    *Hint:* `perceptron_trainer(3, (1, 1 / 2, 1 / 4))`, then `measure` and
#    `device_timeline`.
# 5. Start a `LocalCluster` of two workers and kill one with
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
# ```{dropdown} Solution to exercise 1
# The trainer refuses 50 points on 3 replicas and says which batch sizes
# split evenly; 48 points do, and 3 replicas of 16 points then train like one
# device, within float32 rounding (the page checks it over 200 steps in a
# hidden cell).
# ```
#
# ```{dropdown} Solution to exercise 2
# Each replica's plain mean is $B/(B/R) = R$ times its share of the batch
# mean, and the all-reduce adds the $R$ replicas' gradients, so the update is
# $R = 5$ times too large: a learning rate of $0.01 / 5$ undoes it. The page
# checks, in a hidden cell, that the sum of the five shard-mean gradients is
# five times the full-batch gradient.
# ```
#
# ```{dropdown} Solution to exercise 3
# Each replica gets 25 points and cuts them into 5 micro-batches of 5; the
# effective batch is $5 \cdot 5 \cdot 2 = 50$, and the weights are still one
# device's within float32 rounding (checked in a hidden cell).
# ```
#
# ```{dropdown} Solution to exercise 4
# The x4 replica sets the step time: the step follows the slowest replica (the
# deep dive's figure of step time against the slowest replica), and in the
# timeline both other replicas show red waiting time in every step, the x2
# replica less than the x1 replica.
# ```
#
# ```{dropdown} Solution to exercise 5
# `wait` raises `pargrad.ClusterError`: "worker 1 exited with signal
# SIGKILL", followed by its last lines. The surviving worker is stuck in an
# all-reduce that will never complete; `stop`, in the `finally` block, ends
# it, and `psutil.Process().children()` is empty afterwards. The test
# `tests/test_cluster.py` checks exactly this on every run.
# ```
#
# ```{dropdown} Solution to exercise 6
# Five workers each compute the gradient of a fifth of the batch; the update
# averages the first four to arrive and drops the last. It is the mean
# gradient of four fifths of the batch, a different four fifths in every step
# depending on who is slow. It is an unbiased (but noisier) estimate of the
# full-batch gradient only if *who* is slow does not depend on the data: a
# random worker late in each step. With a persistent straggler on a fixed
# shard, that shard's examples are dropped in every step, and the update is
# biased toward the other four shards' loss, not equal to the full-batch
# gradient even on average. (Reshuffling the shards among workers every epoch
# removes the bias.) In exchange, no step waits for the slowest worker. The
# chapter [Sync vs async in the same time](05_sync_vs_async) runs it.
# ```

# %% tags=["remove-cell"]
x, y = parabola_data()  # float32, as the exercises use
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
print(f"3 replicas x 16 points vs one device after 200 steps: weight gap below "
      f"{rounding:.0e} (float32 rounding)")
assert gap3 < rounding


# %% tags=["remove-cell"]
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


# %% tags=["remove-cell"]
strategy2 = sync_strategy(2)
with strategy2.scope():
    model2 = parabola_model(seed=0)
history2 = SyncTrainer(model2, strategy2, accumulation_steps=5, progress=False).fit(
    x, y, steps=200, steps_per_call=100)
_, one_device50 = fit_one_device(x, y, steps=200, learning_rate=0.01, seed=0)
gap2 = max(float(np.max(np.abs(a - b))) for a, b in zip(model2.get_weights(), one_device50))
print("effective batch:", history2.effective_batch_size)
print(f"2 replicas x 5 micro-batches vs one device after 200 steps: weight gap below "
      f"{rounding:.0e} (float32 rounding)")
assert history2.effective_batch_size == 50 and gap2 < rounding
