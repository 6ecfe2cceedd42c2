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
# - see text 1's synchronous mode as code: `pargrad.SyncTrainer`, a custom
#   training loop on `tf.distribute.MirroredStrategy`;
# - take all-reduce apart with a picture drawn by running the ring algorithm;
# - answer text 3: its $y = x^2$ network, trained with its batch of 50 split
#   over 2 and 5 devices and over two operating-system processes
#   (`MultiWorkerMirroredStrategy`), ends with the *same* weights as one
#   device with the full batch;
# - measure the price: a timeline of every replica in every step, a
#   straggler that makes the others wait, and throughput against the number
#   of devices.
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
from pargrad import plots
from pargrad.cluster import LocalCluster
from pargrad.sync import SyncTrainer, ring_all_reduce, sync_strategy, train_parabola

devices = pargrad.logical_devices(5)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## Synchronous mode
#
# Text 1 describes one synchronous iteration: all devices read the same
# parameters, each computes gradients on different data, the gradients are
# averaged, and one update is applied; every iteration waits for the slowest
# device. Why does that compute the same as one device on the whole batch?
# The loss of a batch of $B$ examples is a mean, and a mean splits into
# pieces:
#
# $$\nabla \frac{1}{B}\sum_{i=1}^{B} \ell_i
#   = \sum_{r=1}^{R} \nabla \Big(\frac{1}{B}\sum_{i \in \text{shard } r} \ell_i\Big).$$
#
# So replica $r$ scales its shard's loss by the *global* batch size $B$ (not by
# its shard's size, `tf.nn.compute_average_loss` does exactly this), and the
# *sum* of the replicas' gradients is the full-batch gradient. Summing over
# replicas, and handing the sum back to every replica, is an **all-reduce**.
#
# First each replica takes its shard. The data sit in memory on the host, and
# replica $r$ gathers the $B/R$ rows that follow $r \cdot B/R$ in the batch
# (the batch starts where the previous one ended, wrapping around the data):

# %%
pargrad.show_source(SyncTrainer._shard)

# %% [markdown]
# Then comes the part of `pargrad.SyncTrainer` that runs on every replica; the
# optimizer's `apply_gradients` performs the one all-reduce and the update.
# With `record_times=True` the `tf.timestamp()` lines record when the replica
# started, finished its gradients and had its update, for the timelines later
# on:

# %%
pargrad.show_source(SyncTrainer._replica_step)

# %% [markdown]
# The trainer wants the model's variables created inside the strategy's
# scope, so that every replica holds a mirrored copy; it refuses a model built
# anywhere else, and a batch that does not split evenly:

# %%
strategy = sync_strategy(4)
try:
    SyncTrainer(pargrad.parabola_model(seed=0), strategy)
except ValueError as error:
    print(type(error).__name__, error)

with strategy.scope():
    model = pargrad.parabola_model(seed=0)
x, y = pargrad.parabola_data()
try:
    SyncTrainer(model, strategy, progress=False).fit(x, y, steps=1)
except ValueError as error:
    print(type(error).__name__, error)

# %% [markdown]
# ## All-reduce
#
# Text 3 imagines a *master*: the workers send their gradients to it, it
# averages them and sends back the result. That is one way to all-reduce, and
# its weakness is the master's link: with $R$ replicas it receives $R$
# gradients each step. The **ring all-reduce** {cite}`sergeev2018horovod`
# spreads the work: each replica cuts its gradient into $R$ chunks; in $R - 1$
# *reduce-scatter* steps every replica passes one chunk to its neighbour, who
# adds it to its own; then every chunk is complete on one replica, and in
# $R - 1$ *all-gather* steps the finished chunks travel around the ring once
# more. Each replica sends $2(R-1)/R$ of its gradient in total, almost the same
# whatever $R$ is.
#
# `pargrad.sync.ring_all_reduce` runs the algorithm in NumPy. Four replicas
# hold the gradients `[1 2 3 4]`, `[10 20 30 40]`, ...; each cell shows a
# replica's current value of a chunk, darker when it holds more replicas'
# contributions (white: the complete sum):

# %%
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
# Which algorithm TensorFlow uses depends on where the replicas are. On
# several GPUs of one machine `MirroredStrategy` uses NVIDIA's NCCL (rings and
# trees over NVLink or PCIe). Between processes `MultiWorkerMirroredStrategy`
# uses TensorFlow's collective ops, a ring over gRPC. For logical CPUs in one
# process, `pargrad.sync_strategy` picks `ReductionToOneDevice`: text 3's
# master, literally, and cheap when all "devices" share one memory. (It also
# sidesteps a limit of TensorFlow's default, collective ops: two strategies in
# one process with different numbers of replicas collide on the same
# collective keys, and this chapter builds several.)
#
# ## Text 3, answered
#
# Text 3 asks to split its batch of 50 points over workers, compute gradients
# in parallel, average them on a master and apply them. We run it four ways,
# all from the same initial weights (`pargrad.initial_weights(seed=0)`), 2000
# steps of gradient descent with learning rate 0.01:
#
# 1. one device, the full batch of 50 (`pargrad.fit_one_device`, chapter "The
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
cluster = LocalCluster(train_parabola, workers=2, kwargs={"steps": 2000}, timeout=240)
cluster.start()
print(cluster.roles)

# %% [markdown]
# Meanwhile, in this process: one device, then 2 and 5 replicas. Each
# replica of `train_parabola` gets a contiguous slice of the 50 points.
# (`SyncTrainer` shows a progress bar during long runs; here it is off so that
# the stored page is the same from run to run. `steps_per_call=100` runs 100
# steps in one `tf.function` call: each is still one all-reduce and one
# update.)

# %%
pargrad.show_source(train_parabola)

# %%
reference_loss, reference_weights = pargrad.fit_one_device(x, y, steps=2000, learning_rate=0.01,
                                                           seed=0)
runs = {"1 device, batch 50": {"loss": reference_loss, "weights": reference_weights}}
for replicas in (2, 5):
    runs[f"{replicas} replicas x {50 // replicas} points"] = train_parabola(replicas, steps=2000)

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

# %%
def gap(weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference_weights))

for name, run in runs.items():
    print(f"{name:40s} final loss {run['loss'][-1]:.5f}   "
          f"weights agree within 1e-5: {gap(run['weights']) < 1e-5}")
assert all(gap(run["weights"]) < 1e-5 for run in runs.values())

# %% [markdown]
# All five weight sets agree within $10^{-5}$ after 2000 steps; the remaining
# differences are floating-point rounding, because the sums are added in a
# different order. The loss curves lie on top of each other:

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.4))
for (name, run), style in zip(runs.items(), ["-", "--", ":", "-.", (0, (1, 4))]):
    ax.plot(np.arange(1, 2001), run["loss"], linestyle=style, label=name)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.set_title("Text 3's network, one device and split four ways")
ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# So the answer to text 3 is: yes, and you do not need to write the master.
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
# data, and two replicas with 256 examples each. `stragglers={1: 3}` makes replica 1 three times slower: after
# computing its gradient it sleeps twice as long as it computed, inside the
# step, like a device that is slower or busy with something else. (A sleep
# rather than repeated work, so that the straggler does not also take the
# other replica's core.)

# %%
rng = np.random.default_rng(0)
features = rng.standard_normal((4096, 64)).astype(np.float32)
targets = rng.standard_normal((4096, 1)).astype(np.float32)


def perceptron_trainer(replicas, stragglers=None):
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
    return SyncTrainer(model, strategy, stragglers=stragglers, record_times=True, progress=False)


def measure(trainer, steps=20):
    batch = 256 * trainer.replicas
    trainer.fit(features, targets, steps=2, batch_size=batch)          # trace first
    return trainer.fit(features, targets, steps=steps, batch_size=batch)


histories = {f"straggler x{factor}": measure(perceptron_trainer(2, {1: factor}))
             for factor in (1, 3, 6)}

# %% [markdown]
# Here are four consecutive steps with the x3 straggler. Each row is a
# replica; blue is its forward and backward pass, orange the straggler's, and
# red the time between its gradient and its update: the all-reduce, which
# cannot finish before the slowest replica has contributed. Gray is the time
# before the replica starts: launching the step from Python, handing the
# replica its input, and, on this machine, waiting for a free core (each
# replica's matrix products already use both cores, so the runtime tends to
# run the replicas one after the other). The dotted lines end the steps.

# %% tags=["nbval-ignore-output"]
slow = histories["straggler x3"]
fig = plots.device_timeline(slow, steps=range(4))
print(f"median compute (ms): {np.round(np.median(slow.compute, axis=0) * 1e3, 2)}")
print(f"median wait    (ms): {np.round(np.median(slow.wait, axis=0) * 1e3, 2)}")
assert np.median(slow.compute[:, 1]) > np.median(slow.compute[:, 0])
assert np.median(slow.wait[:, 0]) > np.median(slow.wait[:, 1])

# %% [markdown]
# Replica 0 spends its red time idle, waiting for replica 1. Over
# every step of the three runs, the step time follows the slowest replica
# (its start plus its compute) closely, just above the diagonal: the rest is
# the all-reduce and the update.

# %% tags=["nbval-ignore-output"]
fig = plots.step_time_against_slowest(histories)
for name, history in histories.items():
    slowest = (history.launch + history.compute).max(axis=1)
    print(f"{name}: median step {np.median(history.step_time) * 1e3:.2f} ms, "
          f"slowest replica {np.median(slowest) * 1e3:.2f} ms")
    assert (history.step_time >= slowest).all()
assert (np.median(histories["straggler x6"].step_time)
        > np.median(histories["straggler x1"].step_time))

# %% [markdown]
# This is the weakness text 1 names, and the reason asynchronous training
# was attractive: a synchronous step is as slow as its slowest device.
# Chen et al. {cite}`chen2016revisiting` kept synchronous training and
# removed the tail instead: add a few *backup workers* and apply each update
# with the first $N$ of $N + b$ gradients, dropping the stragglers'.
#
# ## Throughput against the number of devices
#
# With 256 examples a replica, more replicas means a bigger global batch per
# step. On a machine where each replica has its own processor, the examples
# per second would grow in proportion (the dashed line). Here all the logical
# devices share the same two CPU cores:

# %% tags=["nbval-ignore-output"]
replica_counts = [1, 2, 4, 5]
rates = []
for replicas in replica_counts:
    history = measure(perceptron_trainer(replicas), steps=20)
    rates.append(history.effective_batch_size / np.median(history.step_time))
fig = plots.throughput_against_replicas(replica_counts, rates)
print("examples per second:", [f"{rate:,.0f}" for rate in rates])
assert all(rate > 0 for rate in rates)

# %% [markdown]
# The measured curve may rise a little (a bigger step spreads the fixed cost
# of launching it over more examples), but it
# stays far below the dashed line: however many logical devices we make,
# there are two cores, and every extra replica adds a shard to compute on
# them and a contribution to the all-reduce. Logical devices show how
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
# The answer to text 3 claims that synchronous training was mostly abandoned
# for asynchronous training. That was a fair reading of the early 2010s: the
# parameter-server systems of Dean et al. {cite}`dean2012large` and Hogwild!
# {cite}`niu2011hogwild` trained asynchronously to avoid waiting for stragglers.
# It has not held since. Chen et al. {cite}`chen2016revisiting` showed that
# synchronous training with backup workers converged faster and to better
# accuracy than asynchronous training; Goyal et al.
# {cite}`goyal2017accurate` made large synchronous batches work; the
# time-to-accuracy entries of DAWNBench {cite}`coleman2017dawnbench,coleman2019analysis`
# were dominated by synchronous all-reduce training; and all-reduce is what
# `MirroredStrategy`, Horovod {cite}`sergeev2018horovod` and PyTorch's
# DistributedDataParallel do today. The chapter "Sync vs async in the same
# time" measures both against the wall clock.
#
# ## Summary
#
# - Synchronous data parallelism: every replica reads the same parameters,
#   computes the gradient of its shard with the loss scaled by the *global*
#   batch size, one all-reduce sums the gradients, one update is applied.
# - It computes what one device computes on the whole batch: text 3's network
#   on 1, 2 and 5 devices and in two processes ends with the same weights
#   within $10^{-5}$ after 2000 steps.
# - A ring all-reduce sends about twice the gradient's size per replica,
#   however many replicas there are; TensorFlow picks NCCL on GPUs,
#   collective rings between processes.
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
# 1. Train text 3's network with `SyncTrainer` on 3 logical devices. What
#    does the trainer say, and which batch sizes would work? Change
#    `pargrad.parabola_data(n=...)` so that 3 replicas work, and check the
#    result against `pargrad.fit_one_device` on the same data.
# 2. Replace `tf.nn.compute_average_loss` in your own copy of the replica
#    step with a plain mean over the replica's shard. By what factor does the
#    update change with 5 replicas? Which learning rate would undo it?
# 3. Run `SyncTrainer(..., accumulation_steps=5)` on 2 replicas with the full
#    batch of 50. What are the micro-batch and the effective batch, and are
#    the weights still those of one device?
# 4. Make two replicas stragglers instead of one, with factors 2 and 4. Which
#    one sets the step time? Draw the timeline.
# 5. Start a `LocalCluster` of two workers and kill one of them with
#    `os.kill(cluster.pids[1], signal.SIGKILL)` while it trains. What does
#    `wait` raise, and which processes are left afterwards
#    (`psutil.Process().children()`)?
# 6. Implement backup workers {cite}`chen2016revisiting` on paper: with 4
#    replicas and one backup, which gradients would you average, and how
#    would the update differ from the full-batch one?
