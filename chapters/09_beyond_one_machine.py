# %% [markdown]
# # Beyond one machine
#
# ```{admonition} Takeaway
# Across processes and machines, the code stays the same: synchronous
# training with `MultiWorkerMirroredStrategy` gives the weights of one
# device, and `ParameterServerStrategy` trains asynchronously and survives a
# dead worker. What changes is `TF_CONFIG`, ports, shared storage, and
# trust: TensorFlow's gRPC servers have no authentication.
# ```
#
# So far every device lived in one Python process. Real clusters are several
# processes on several machines, and machines fail. TensorFlow offers the
# two modes of the earlier chapters across processes:
# `MultiWorkerMirroredStrategy` (synchronous: every step all-reduces the
# gradients of all workers) and `ParameterServerStrategy` (asynchronous: the
# parameters live on *{term}`parameter servers <parameter server>`*, workers read and update them on
# their own), the architecture of the first large systems
# {cite}`dean2012large,abadi2016tensorflow`.
#
# We cannot rent a data centre for a notebook, but we can start several
# operating-system processes on one machine, each with its own address and
# its own `TF_CONFIG`, and talk between them over the network stack exactly
# as between machines. Only the addresses change when the processes move to
# real machines; we show that at the end.
#
# **In this chapter you will**
#
# - start local clusters of processes with `pargrad.LocalCluster`: workers
#   only, or a coordinator with workers and parameter servers, always stopped;
# - train the y = x² question's network synchronously in 2 and 3 worker processes and get
#   the same weights as in one process;
# - train it asynchronously with `ParameterServerStrategy` and a
#   `ClusterCoordinator`, with the variables cut into shards on two
#   parameter servers, and measure a proxy of staleness;
# - kill a worker in the middle of both runs: the coordinator moves the
#   parameter-server work to the surviving worker, and the synchronous run
#   restarts from its last checkpoint; we measure what was lost and how long
#   recovery took;
# - see what changes on several machines (`TF_CONFIG`, ports, firewalls,
#   trust) and what does not (the code).

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

# %% [markdown]
# We import `pargrad` first (it silences TensorFlow's start-up lines), split
# the CPU into three logical devices for the runs in this process, and seed
# everything.

# %%
import pargrad  # first: it imports TensorFlow quietly

import shutil
import tempfile
import time

import keras
import numpy as np
from pargrad.book import plots, show_source
from pargrad.book.parabola import fit_one_device, parabola_data
from pargrad.cluster import ClusterError, LocalCluster, tf_config
from pargrad.book.multiworker import train_parabola_multiworker
from pargrad.book.parameter_server import train_parameter_server

devices = pargrad.logical_devices(3)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## A cluster of processes
#
# Every task of a TensorFlow cluster finds the others through the environment
# variable `TF_CONFIG`: the same `cluster` (every task's address, by job)
# for all, and its own `task` (job and index). For two workers on this
# machine:

# %%
spec = {"worker": ["127.0.0.1:20000", "127.0.0.1:20001"]}
print(tf_config(spec, "worker", 0))
print(tf_config(spec, "worker", 1))

# %% [markdown]
# `pargrad.LocalCluster` writes these for us, with ports that are free right
# now, starts one Python process per task, runs the same importable function
# in each, keeps every line they print with the task as a prefix, hands back
# what they return, and stops every process when its `with` block ends:
# normally, on an exception, on a time-out or on Ctrl-C. Two layouts:
#
# - `LocalCluster(f, workers=3)`: three workers, each running `f`
#   (`MultiWorkerMirroredStrategy`);
# - `LocalCluster(f, workers=2, parameter_servers=2)`: a coordinator
#   (TensorFlow calls its job `chief`) running `f`, and two workers and two
#   parameter servers that only serve (`ParameterServerStrategy`).
#
# ```{warning}
# Every worker and parameter server runs a TensorFlow gRPC server. These
# servers listen on **all** network interfaces, even though `TF_CONFIG`
# names 127.0.0.1, and they have **no authentication and no encryption**:
# anyone who can reach the port can run code in them. Run clusters only on
# machines and networks you trust, and stop them when you are done (the
# `with` block does).
# ```
#
# Bad layouts fail before any process starts:

# %%
for bad in ({"workers": 0}, {"workers": 2, "parameter_servers": -1}, {"workers": 2, "ports": [1]}):
    try:
        LocalCluster(train_parabola_multiworker, **bad)
    except ValueError as error:
        print(type(error).__name__, error)

# %% [markdown]
# ## Synchronous across processes
#
# `MultiWorkerMirroredStrategy` is `MirroredStrategy` across processes: one
# replica per device on every worker (our workers have one CPU device each,
# so here that is one replica a process). Every step, every replica computes
# the gradient of its shard of the
# batch, one all-reduce over the network sums them, and every worker applies
# the same update. The worker function is the `SyncTrainer` loop of
# [Synchronous training](03_synchronous), on 48 of the y = x² question's points so that 2 and 3
# workers split the batch evenly. These are the lines that carry the idea:
# the strategy, the model built in its scope, the trainer, and the loop
# (the checkpoints, for later, are two lines; the full function, with its
# reporting and checks, is collapsed below):

# %%
pargrad.book.show_lines(train_parabola_multiworker, "strategy = sync_strategy()",
                        "checkpoints.save(done, report)")

# %% tags=["hide-cell"]
show_source(train_parabola_multiworker)

# %% [markdown]
# We start a cluster of 2 workers and one of 3 at the same time (TensorFlow
# takes a few seconds to start in each process), and meanwhile train the same
# 300 steps in this process: on one device, and with `MirroredStrategy` on 3
# logical devices.

# %% [markdown]
# As in [Synchronous training](03_synchronous), the comparison runs in float64
# so that no machine's rounding can blur it, with the one-device reference
# at Keras's float32 learning rate; the worker processes also choose
# deterministic kernels (`deterministic=True`, which matters on GPUs) so that
# the failure experiment below can compare runs bit for bit.

# %%
STEPS = 300
x, y = parabola_data(48, dtype="float64")
settings = {"steps": STEPS, "dtype": "float64", "deterministic": True}
with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as two, \
        LocalCluster(train_parabola_multiworker, workers=3, kwargs=settings, timeout=120) as three:
    one_loss, one_weights = fit_one_device(x, y, steps=STEPS,
                                                   learning_rate=float(np.float32(0.01)))
    in_process = train_parabola_multiworker(steps=STEPS, verbose=False, dtype="float64")
    runs = {"1 device": one_weights, "1 process, 3 replicas": in_process["weights"]}
    for cluster in (two, three):
        for index, result in enumerate(cluster.wait()):
            runs[f"worker {index} of {result['replicas']} processes"] = result["weights"]
print(two.log(role="worker", index=0, last=1))

# %%
def gap(weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, one_weights))

tolerance = pargrad.rounding_tolerance("float64", STEPS)
print(f"final loss on one device: {one_loss[-1]:.6f}; tolerance {tolerance:.0e}")
for name, weights in runs.items():
    print(f"{name:28s} weights agree with one device within the tolerance: "
          f"{gap(weights) < tolerance}")

# %% tags=["remove-cell"]
assert all(gap(weights) < tolerance for weights in runs.values())

# %% [markdown]
# Five processes, one result: every worker of both clusters holds the weights
# of one device, to floating-point rounding. Synchronous training is the same
# computation wherever the replicas live; only the time per step changes.

# %% [markdown]
# ## Asynchronous across processes: parameter servers
#
# `ParameterServerStrategy` splits the roles of [Asynchronous
# training](04_asynchronous) over processes:
#
# - the **parameter servers** hold the variables. A variable created in the
#   strategy's scope lives on one of them, or, with a *variable partitioner*,
#   is cut along its first axis into shards on several;
# - the **workers** compute. They hold no state of their own;
# - the **coordinator** runs the training loop. It *schedules* functions
#   (closures) with a `ClusterCoordinator`; each runs on whichever worker is
#   free: read the parameters from the parameter servers, compute, write the
#   update back. Nobody waits for anybody.
#
# Our coordinator function trains the y = x² network (the model of the
# asynchronous chapter, from the same initial weights) with full-batch
# updates. Besides the weights, it keeps a `version` counter on a parameter
# server. The lines that carry the idea: the strategy and its coordinator,
# the variables created in its scope (so they live on the parameter
# servers), the update each closure runs, and the loop that schedules the
# closures (the straggler's sleep and the records of each update are in the
# full function, collapsed below):

# %%
pargrad.book.show_lines(train_parameter_server, "strategy = parameter_server_strategy(shards)",
                        'version = tf.Variable(0')

# %%
pargrad.book.show_lines(train_parameter_server, "with tf.GradientTape() as tape:",
                        "gradients = tape.gradient(loss, trainable)")

# %%
pargrad.book.show_lines(train_parameter_server, "applied = [s.assign_sub(rate * g)",
                        "after = version.assign_add(1)")

# %%
pargrad.book.show_lines(train_parameter_server, "for done in range(0, updates, report_every):",
                        "results.extend(r.fetch() for r in chunk)")

# %% tags=["hide-cell"]
show_source(train_parameter_server)

# %% [markdown]
# ### Why staleness is only a proxy here
#
# In [Asynchronous training](04_asynchronous) one lock ordered every read and
# every update, so the number of updates between a worker's read and its
# update was exact. Here there is no such lock and no global version of the
# parameters: a closure reads each shard from its parameter server in a
# separate remote call, and other updates can land on one shard between two
# of those reads. So the chapter measures a **proxy**: each closure reads the
# `version` counter before it reads the parameters and increments it after
# its own update; the difference minus one counts the updates that other
# workers finished in between. Two workers can overlap, so we expect 0 or 1,
# rarely more.
#
# Each worker and parameter server runs `pargrad.cluster.serve`. One trap is
# built in: with the default thread pool, workers of `ParameterServerStrategy`
# on a two-core machine can hang, because each closure holds an inter-op
# thread while it waits for the parameter servers; the workers get
# `workers + 1` threads.

# %%
show_source(pargrad.cluster.serve)

# %% [markdown]
# We run 300 updates with 2 workers and 2 parameter servers. And, for the
# next section, we kill worker 1 with `SIGKILL` (as if its machine lost
# power) once the coordinator reports 150 updates.

# %%
UPDATES = 300
with LocalCluster(train_parameter_server, workers=2, parameter_servers=2,
                  kwargs={"updates": UPDATES, "report_every": 25}, timeout=120) as cluster:
    cluster.wait_for("updates 150", role="chief")
    killed_at = cluster.kill("worker", 1)
    killed_wall = time.time() - (time.monotonic() - killed_at)
    (ps_run,) = cluster.wait()
ps_log = cluster.log()
print("tasks:", cluster.roles)
print("shards of W1, b1, W2, b2:", ps_run["shard_shapes"])
print("their parameter servers:",
      [[device.split("/")[1] + "/" + device.split("/")[3] for device in devices]
       for devices in ps_run["shard_devices"]])

# %% [markdown]
# `FixedShardsPartitioner(2)` cut `b1` (5 rows) into shards of 3 and 2
# rows and `W2` (5 × 1) likewise, on the two parameter servers; `W1` has a
# single row and `b2` a single number, so they stay whole.
#
# The staleness proxy of the updates made while both workers were alive:

# %% tags=["nbval-ignore-output"]
worker = np.array(ps_run["worker"])
finished = np.array(ps_run["finished"])
staleness = np.array(ps_run["staleness"])
both = finished < killed_wall
counts = np.bincount(staleness[both])
print("updates by worker 0, worker 1 before the kill:", np.bincount(worker[both], minlength=2))
print("staleness proxy: value -> updates", dict(enumerate(counts.tolist())))
print(f"mean {staleness[both].mean():.2f}; after the kill (one worker): max {staleness[~both].max()}")

# %% tags=["remove-cell"]
assert staleness[both].max() >= 1            # two workers overlap
assert staleness[~both].max() <= 1           # one worker left: hardly any overlap

# %% [markdown]
# With two workers, a good share of the updates had one other
# update land while they computed; after the kill, with one worker left, the
# updates are almost never stale (the few exceptions are closures that were
# already running when the worker died). The loss follows that of one
# device closely, as the asynchronous chapter found for small staleness
# ({numref}`fig-ps-updates`):

# %% mystnb={"figure": {"caption": "Parameter-server training of the y = x\u00b2 network across processes: when each worker applied an update, with the moment one worker was killed, and the loss per update against that of one device.", "name": "fig-ps-updates"}}
reference_loss, _ = fit_one_device(*parabola_data(), steps=UPDATES, learning_rate=0.01)
fig = plots.parameter_server_updates(ps_run, kill_time=killed_wall, reference_loss=reference_loss)

# %% tags=["nbval-ignore-output"]
print(f"final loss: parameter servers {ps_run['loss'][-1]:.3f}, one device {reference_loss[-1]:.3f}")

# %% tags=["remove-cell"]
assert abs(ps_run["loss"][-1] - reference_loss[-1]) < 0.02 * reference_loss[-1]  # "closely": 2%

# %% [markdown]
# ## Surviving failures
#
# ### A worker dies under the parameter servers
#
# The coordinator noticed the dead worker when its closures failed with
# `UnavailableError`:

# %% tags=["nbval-ignore-output"]
print("\n".join(line for line in ps_log.splitlines() if "failed with" in line))

# %% [markdown]
# It put those closures back in the queue, and worker 0 ran them. Nothing was
# lost: every scheduled update was applied. TensorFlow documents this as
# *at-least-once*: a closure that had already written part of its update
# when its worker died runs again in full, so `applied` can exceed
# `scheduled` by the number of such re-runs.

# %% tags=["nbval-ignore-output"]
after = finished > killed_wall
recovery = finished[after].min() - killed_wall
print(f"updates scheduled {ps_run['scheduled']}, applied {ps_run['applied']} "
      f"(re-runs: {ps_run['applied'] - ps_run['scheduled']})")
print("workers that applied updates after the kill:", sorted(set(worker[after].tolist())))
print(f"time from the kill to the next applied update: {recovery * 1e3:.0f} ms "
      f"(median time between updates: {np.median(np.diff(np.sort(finished))) * 1e3:.1f} ms)")
rate_before = both.sum() / (killed_wall - finished.min())
rate_after = after.sum() / (finished.max() - killed_wall)
print(f"updates per second: {rate_before:.0f} with two workers, {rate_after:.0f} with one")

# %% tags=["remove-cell"]
assert ps_run["applied"] >= ps_run["scheduled"] == UPDATES
assert set(worker[after].tolist()) == {0}

# %% [markdown]
# The parameter-server run did not stop: the loss of one worker cost a few
# milliseconds, and from then on worker 0 did all the work. Here the
# throughput fell, but by far less than half (the two rates printed above):
# with a network this small, the coordinator dispatching closures sets the
# pace, not the workers
# computing them. With a real model on separate machines, losing one of two
# workers would halve it, until someone restarts the worker: the coordinator
# keeps trying to reconnect and uses it again when it comes back. The parameter servers themselves are not protected this way: if one
# dies, the coordinator raises, and the job restarts from a checkpoint, like
# a synchronous one.
#
# ### A worker dies in a synchronous run
#
# Under `MultiWorkerMirroredStrategy` every step needs every worker, so the
# step in flight cannot finish: the surviving workers' all-reduce fails, and
# the job must be started again. What saves the work is a checkpoint:
# `train_parabola_multiworker` saves one every 150 steps with
# `tf.train.CheckpointManager` (model and optimizer; the optimizer's
# iteration counter is the step), and restores the latest one at start. On
# a real cluster the checkpoint directory is shared storage that every worker
# can read; here it is a temporary directory.
#
# We run 300 steps and kill worker 1 once a worker reports step 175. The
# tiny network would finish all 300 steps before we could aim, so every
# worker pauses a fifth of a second after each report of 25 steps, as if the
# steps took real time:

# %%
checkpoints = tempfile.mkdtemp(prefix="pargrad-checkpoints-")
settings = {"steps": STEPS, "dtype": "float64", "deterministic": True,
            "checkpoint_dir": checkpoints, "checkpoint_every": 150, "seconds_between_reports": 0.2}
started = time.monotonic()
with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as first:
    first.wait_for("step 175")
    killed_at = first.kill("worker", 1, expected=False)   # a crash, as far as the job knows
    try:
        first.wait()
    except ClusterError as error:
        detected_at = time.monotonic()
        print(type(error).__name__, str(error).splitlines()[0])
stopped_at = time.monotonic()

# %% [markdown]
# The whole job stops: the surviving worker's next all-reduce fails too, and
# the `with` block stops it (a worker of this strategy ignores `SIGTERM`,
# which TensorFlow takes as a preemption notice, so after a second it gets
# `SIGKILL`). We start the job again with the same arguments, as a cluster
# manager would:

# %%
with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as second:
    resumed = second.wait()
print(second.log(index=0, last=4))
print("resumed at step:", [result["resumed_at"] for result in resumed])

# %% [markdown]
# The restarted workers found the checkpoint of step 150 and trained the
# remaining 150 steps. Their final weights are *exactly* those of the
# uninterrupted 2-worker run of the first section: restoring a checkpoint
# loses nothing but time.

# %%
uninterrupted = runs["worker 0 of 2 processes"]
print("same weights as without the failure:",
      all(np.array_equal(a, b) for a, b in zip(resumed[0]["weights"], uninterrupted)))
shutil.rmtree(checkpoints)  # the checkpoints have served their purpose

# %% [markdown]
# What did the failure cost? The steps done after the last checkpoint, and
# the time from the kill until the restarted job made progress again
# ({numref}`fig-recovery`):

# %% mystnb={"figure": {"caption": "Steps done against wall-clock time for the synchronous run that lost a worker and for its restart from the last checkpoint; the marks show the checkpoints and the kill.", "name": "fig-recovery"}} tags=["nbval-ignore-output"]
def steps_seen(cluster):
    """(seconds, step) of worker 0's progress lines, since the first run started."""
    return [(t - started, int(line.split()[1]))
            for (role, index, line), t in zip(cluster.lines, cluster.line_times)
            if index == 0 and line.startswith("step ")]

before = steps_seen(first)
done_at_kill = max(step for t, step in before if t <= killed_at - started)
saved = [int(line.split()[1]) for _, _, line in first.lines if line.startswith("checkpoint")]
resumed_at = resumed[0]["resumed_at"]
after = steps_seen(second)
back_at = min(t for t, step in after) + started
print(f"steps done at the kill: {done_at_kill}; last checkpoint: {resumed_at}; "
      f"steps lost: {done_at_kill - resumed_at}")
print(f"after the kill: failure detected {detected_at - killed_at:.2f} s, "
      f"job stopped {stopped_at - killed_at:.1f} s, first new step {back_at - killed_at:.1f} s")
fig = plots.recovery_timeline(before, after, killed_at - started, sorted(set(saved)))

# %% tags=["remove-cell"]
assert resumed_at in saved and resumed_at == 150
assert 0 < done_at_kill - resumed_at < 150

# %% [markdown]
# At most the steps since the last checkpoint are lost (here the 25 or so
# since step 150), and the restart costs a few seconds, nearly all of it
# starting Python and TensorFlow in the new processes. Checkpointing more
# often loses fewer steps and spends more time writing; on real jobs with
# large models, writing a checkpoint takes seconds to minutes, so the
# interval is a trade-off. (`keras.callbacks.BackupAndRestore` does this for
# `fit`, which Keras 3 does not support under these strategies; see the
# appendix [Compatibility matrix](a2_compatibility).)
#
# ## From one machine to several
#
# Nothing in the worker functions knows it runs on 127.0.0.1. To run the
# 3-worker job of this chapter on three machines, write one `TF_CONFIG` per
# machine with the machines' addresses, and start the same function on each.
# `pargrad.cluster` can be run as a program for exactly this:

# %%
hosts = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]}
for index in range(3):
    print(f"# on {hosts['worker'][index].split(':')[0]}:")
    print(f"TF_CONFIG='{tf_config(hosts, 'worker', index)}' \\\n"
          f"  python -m pargrad.cluster pargrad.book.multiworker:train_parabola_multiworker '{{\"steps\": 300}}'")

# %% [markdown]
# For `ParameterServerStrategy`, the workers and parameter servers run
# `python -m pargrad.cluster serve` with their own `TF_CONFIG`, and the
# coordinator's `TF_CONFIG` names itself as `chief`.
#
# **What changes** on several machines:
#
# - **`TF_CONFIG` per host**: the same `cluster` everywhere, a different
#   `task` on each; the chief (worker 0, or the coordinator) writes the
#   checkpoints. Cluster managers (Kubernetes operators, Slurm scripts,
#   Vertex AI) write it for you.
# - **Ports and firewalls**: every task must reach every port in the cluster
#   spec. Open them between the cluster's machines only.
# - **The trust model**: the gRPC servers have no authentication and no
#   encryption and listen on all interfaces. On one machine we relied on
#   nobody else reaching the ports; across machines, use a private network
#   (a VPC, a VPN) that only the cluster can reach.
# - **Shared storage**: a restarted worker must read the checkpoint the
#   chief wrote, so the checkpoint directory must be on storage that every
#   machine sees (a network file system, a cloud bucket).
# - **Failures become normal**: training Llama 3 on 16,384 GPUs met 419
#   unexpected interruptions in 54 days, about one every three hours
#   {cite}`dubey2024llama3`; the restart-from-checkpoint of the previous
#   section becomes part of every job.
#
# **What does not change**: the worker functions, the strategies, the
# checkpoints, and the numbers: the 3 workers compute the weights of one
# device, whether they are 3 processes or 3 machines.
#
# ## Summary
#
# - A TensorFlow cluster is a set of tasks that find each other through
#   `TF_CONFIG`; `pargrad.LocalCluster` starts one on 127.0.0.1 with free
#   ports, collects every task's output, and always stops every process.
# - `MultiWorkerMirroredStrategy` with 2 and 3 worker processes computed the
#   weights of one device: synchronous training does not depend on where the
#   replicas live.
# - `ParameterServerStrategy` keeps the variables, cut into shards, on
#   parameter servers; a `ClusterCoordinator` schedules closures that any free
#   worker runs. Staleness cannot be read off exactly, because the shards are
#   read one by one with no common version; a version counter gives a proxy:
#   mostly 0 or 1 with two workers.
# - When a worker dies, the coordinator re-runs its closures on the other
#   workers (at least once, possibly twice) and training goes on, with less
#   throughput. A synchronous job stops instead; with a
#   `tf.train.CheckpointManager` it restarts from the last checkpoint, loses
#   only the steps since, and ends with exactly the weights of an
#   uninterrupted run.
# - Moving to several machines changes `TF_CONFIG`, ports, firewalls, storage
#   and the trust model, not the code. TensorFlow's gRPC servers have no
#   authentication: keep them on trusted networks.
#
# ## Exercises
#
# 1. Start `LocalCluster(train_parabola_multiworker, workers=4)` with
#    `kwargs={"steps": 300, "points": 50}`. What does each worker raise, and
#    which numbers of points work for 4 workers?
#
#    *Hint:* each worker runs `SyncTrainer`, which checks that the global
#    batch splits evenly over the replicas.
# 2. Run `train_parameter_server` with 3 workers and 1 parameter server
#    (`parameter_servers=1`). How does the staleness proxy change, and where do
#    the variables live now?
#
#    *Hint:* the staleness proxy counts the updates of *other* workers that
#    land while one computes.
# 3. Kill a *parameter server* instead of a worker in the parameter-server
#    run. What does the coordinator raise? What would you need to resume?
#
#    *Hint:* the parameter servers hold the only copy of the variables.
# 4. In the synchronous failure experiment, save a checkpoint every 50 steps.
#    How many steps are lost now, and how much longer does the run take?
#    Where is the break-even for a checkpoint that takes a second to write?
#
#    *Hint:* with failures every $T$ seconds and a checkpoint every $\tau$
#    seconds, you lose about $\tau/2$ per failure and spend the writing time
#    every $\tau$.
# 5. Start the cluster by hand: in two terminals, set `TF_CONFIG` for worker 0
#    and worker 1 on 127.0.0.1 and run
#    `python -m pargrad.cluster pargrad.book.multiworker:train_parabola_multiworker`.
#    What happens while only one of them is running?
#
#    *Hint:* `MultiWorkerMirroredStrategy` needs every worker for its first
#    collective operation.
#
# ### Solutions
#
# These exercises start clusters of processes, which takes many seconds each,
# so their solutions are written out rather than run here; the tests in
# `tests/test_multiworker.py`, `tests/test_parameter_server.py` and
# `tests/test_cluster.py` run the same situations.
#
# ```{dropdown} Solution to exercise 1
# Every worker raises `ValueError` from `SyncTrainer`: 50 examples do not
# split over 4 replicas, and the message names batch sizes that do (multiples
# of 4, such as 48 or 52). `LocalCluster.wait` raises `ClusterError` for the
# first worker that exits with the error, and stops the others.
# ```
#
# ```{dropdown} Solution to exercise 2
# With three workers, more updates land while one worker computes, so the
# proxy takes larger values more often (up to 2 when both other workers
# finish in between). With one parameter server every variable lives whole
# on `/job:ps/replica:0/task:0`: there is nothing to shard over.
# ```
#
# ```{dropdown} Solution to exercise 3
# The coordinator's closures fail, and `ClusterCoordinator` raises an error
# (an `UnavailableError` or a `PSUnavailableError`, depending on the version)
# instead of rescheduling: a closure can move to another worker, but the
# variables on the dead parameter server are gone. To resume, the
# coordinator must have saved checkpoints of the variables, and the job must
# restart with a new parameter server and restore them.
# ```
#
# ```{dropdown} Solution to exercise 4
# With a checkpoint every 50 steps at most 50 steps are lost, 25 on average
# instead of about 75; the run writes three times as many checkpoints.
# Per failure you save about half the difference in interval; each extra
# checkpoint costs its writing time. With steps of a few milliseconds, as
# here, a checkpoint that takes a second costs far more than the steps it saves;
# it pays off only when the steps lost (interval / 2 × step time × failure
# rate) exceed the writing time per interval.
# ```
#
# ```{dropdown} Solution to exercise 5
# The first worker starts its server and waits: `MultiWorkerMirroredStrategy`
# blocks at its first collective operation until every worker in
# `TF_CONFIG` has joined. When the second starts, both train, and they end with the same
# weights as the cluster run.
# ```
