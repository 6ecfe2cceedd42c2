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
# processes on several machines, and machines fail. TensorFlow offers both
# modes of the earlier chapters across processes:
# `MultiWorkerMirroredStrategy` (synchronous: every step all-reduces all
# workers' gradients) and `ParameterServerStrategy` (asynchronous: the
# parameters live on *{term}`parameter servers <parameter server>`*, which workers read and update on
# their own), the architecture of the first large systems
# {cite}`dean2012large,abadi2016tensorflow`.
#
# We start several processes on one machine, each with its own address and
# `TF_CONFIG`, talking over the network stack as machines would; on real
# machines only the addresses change, as the end shows.
#
# **In this chapter you will**
#
# - start local clusters of processes with `pargrad.LocalCluster` (workers
#   only, or a coordinator with workers and parameter servers), always stopped;
# - train the y = x² question's network synchronously in 2 and 3 worker
#   processes and get the weights of one process;
# - train it asynchronously with `ParameterServerStrategy`, its variables cut
#   into shards on two parameter servers, and measure a proxy of staleness;
# - kill a worker in both runs: the parameter-server run carries on with the
#   survivor, the synchronous run restarts from its last checkpoint; we
#   measure what was lost and how long recovery took;
# - see what changes on several machines (`TF_CONFIG`, ports, firewalls,
#   trust) and what does not (the code).

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
# We import `pargrad` first (it silences TensorFlow's start-up lines), split
# the CPU into three logical devices and seed everything.

# %%
import pargrad  # first: it imports TensorFlow quietly

import os
import shutil
import tempfile
import time

import keras
import numpy as np
from pargrad.book import show_source
from pargrad.book.plots_beyond_one_machine import parameter_server_updates, recovery_timeline
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
# `pargrad.LocalCluster` writes these with free ports, starts one Python
# process per task, runs the same importable function in each, keeps what
# they print (prefixed by the task) and return, and stops every process when
# its `with` block ends, however it ends (an exception, a time-out, Ctrl-C).
# Two layouts:
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
# replica per device on every worker (here one CPU device, so one replica a
# process). Every step, each replica computes the gradient of its shard of
# the batch, one all-reduce over the network sums them, and every worker
# applies the same update. The worker function is the `SyncTrainer` loop of
# [Synchronous training](03_synchronous) on 48 of the y = x² question's
# points, so that 2 and 3 workers split the batch evenly. The lines that
# carry the idea (the full function is collapsed below):

# %%
pargrad.book.show_lines(train_parabola_multiworker, "strategy = sync_strategy()",
                        "checkpoints.save(done, report)")

# %% tags=["hide-cell"]
show_source(train_parabola_multiworker)

# %% [markdown]
# We start clusters of 2 and 3 workers at once and meanwhile train the same
# 300 steps in this process, on one device and with `MirroredStrategy` on 3
# logical devices.

# %% [markdown]
# As in [Synchronous training](03_synchronous), the comparison runs in float64
# (the one-device reference at Keras's float32 learning rate); the workers
# also choose deterministic kernels (`deterministic=True`) so that the
# failure experiment below can compare runs bit for bit.

# %%
STEPS = 300
x, y = parabola_data(48, dtype="float64")
settings = {"steps": STEPS, "dtype": "float64", "deterministic": True}
with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as two, \
        LocalCluster(train_parabola_multiworker, workers=3, kwargs=settings, timeout=120) as three:
    one_loss, one_weights = fit_one_device(x, y, steps=STEPS,
                                                   learning_rate=float(np.float32(0.01)))
    in_process = train_parabola_multiworker(steps=STEPS, verbose=False, dtype="float64")
    runs = {"1 process, 3 replicas": in_process["weights"]}
    for cluster in (two, three):
        for index, result in enumerate(cluster.wait()):
            runs[f"worker {index} of {result['replicas']} processes"] = result["weights"]
print(two.log(role="worker", index=0, last=1))

# %%
def gap(weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, one_weights))

tolerance = pargrad.rounding_tolerance("float64", STEPS)
print(f"final loss on one device: {one_loss[-1]:.6f}")
for name, weights in runs.items():
    shown = "below 1e-14" if gap(weights) < 1e-14 else f"{gap(weights):.1e}"
    print(f"{name:25s} largest weight gap to one device: {shown} (tolerance {tolerance:.0e})")

# %% tags=["remove-cell"]
assert all(gap(weights) < tolerance for weights in runs.values())

# %% [markdown]
# Five processes, one result: every worker of both clusters holds the weights
# of one device, to floating-point rounding (the tolerance is what
# `pargrad.rounding_tolerance("float64", 300)` allows for 300 steps; the gaps
# stay far below it). Synchronous training is the same computation wherever
# the replicas live; only the time per step changes.

# %% [markdown]
# ## Asynchronous across processes: parameter servers
#
# `ParameterServerStrategy` splits the roles of [Asynchronous
# training](04_asynchronous) over processes:
#
# - the **parameter servers** hold the variables: a variable created in the
#   strategy's scope lives on one of them or, with a *variable partitioner*,
#   is cut along its first axis into shards on several;
# - the **workers** compute and hold no state;
# - the **coordinator** runs the training loop: it *schedules* functions
#   (closures) with a `ClusterCoordinator`, each run by whichever worker is
#   free: read the parameters, compute, write the update back. Nobody waits
#   for anybody.
#
# Our coordinator trains the y = x² network of the asynchronous chapter, from
# the same initial weights, with full-batch updates, and keeps a `version`
# counter on a parameter server. Each closure also writes its update's record
# (loss, worker, time) into a table on the parameter servers, at the row of
# its version, instead of returning it: a closure's return values wait on its
# worker until the coordinator fetches them, and a worker that dies in
# between would take them with it. The lines that carry the idea: the strategy,
# the variables created in its scope, the update each closure runs, and the
# loop that schedules the closures (the full function is collapsed below):

# %%
pargrad.book.show_lines(train_parameter_server, "strategy = parameter_server_strategy(shards)",
                        'records = tf.Variable(')

# %%
pargrad.book.show_lines(train_parameter_server, "with tf.GradientTape() as tape:",
                        "gradients = tape.gradient(loss, trainable)")

# %%
pargrad.book.show_lines(train_parameter_server, "applied = [s.assign_sub(rate * g)",
                        "written = records.scatter_update(")

# %%
pargrad.book.show_lines(train_parameter_server, "for done in range(0, updates, report_every):",
                        "kept = table[:, 5] == 1.0")

# %% tags=["hide-cell"]
show_source(train_parameter_server)

# %% [markdown]
# ### Why staleness is only a proxy here
#
# In [Asynchronous training](04_asynchronous) one lock ordered every read and
# update, so the number of updates between a worker's read and its own
# update was exact. Here there is no lock and no global version: a closure
# reads each shard in a separate remote call, and other updates can land
# between those reads. So we measure a **proxy**: each closure reads the
# `version` counter before reading the parameters and increments it after
# its update; the difference minus one counts the updates other workers
# finished in between. With two workers we expect 0 or 1, rarely more.
#
# Each worker and parameter server runs `pargrad.cluster.serve`. It avoids a
# trap: with the default thread pool, workers on a two-core machine can
# hang, because each closure holds an inter-op thread while it waits for the
# parameter servers; so the workers get `workers + 1` threads.

# %%
show_source(pargrad.cluster.serve)

# %% [markdown]
# We run 300 updates with 2 workers and 2 parameter servers and, for the
# next section, kill worker 1 with `SIGKILL` (as if its machine lost power)
# once the coordinator reports 150 updates.

# %%
UPDATES = 300
with LocalCluster(train_parameter_server, workers=2, parameter_servers=2,
                  kwargs={"updates": UPDATES, "report_every": 25}, timeout=120) as cluster:
    cluster.wait_for("updates 150", role="chief")
    killed_at = cluster.kill("worker", 1)
    killed_wall = time.time() - (time.monotonic() - killed_at)
    (ps_run,) = cluster.wait()
ps_log = cluster.log()
print("tasks:", ", ".join(f"{role} {index}" for role, index in cluster.roles))
for name, shapes, places in zip(["W1", "b1", "W2", "b2"], ps_run["shard_shapes"],
                                ps_run["shard_devices"]):
    shards = [" × ".join(map(str, shape)) + " on ps " + place.split("task:")[1].split("/")[0]
              for shape, place in zip(shapes, places)]
    print(f"{name}: {len(shards)} shard{'s' if len(shards) > 1 else ''}: {', '.join(shards)}")

# %% [markdown]
# `FixedShardsPartitioner(2)` cut `b1` (5 rows) into shards of 3 and 2
# rows and `W2` (5 × 1) likewise, on the two parameter servers; `W1` has a
# single row and `b2` a single number, so they stay whole.
#
# The staleness proxy of the updates made while both workers were alive:

# %% tags=["nbval-ignore-output"]
worker = np.array(ps_run["worker"])
started, finished = np.array(ps_run["started"]), np.array(ps_run["finished"])
staleness = np.array(ps_run["staleness"])
both = finished < killed_wall      # applied while both workers were alive
alone = started > killed_wall      # begun after the kill: worker 0 alone
counts = np.bincount(staleness[both])
by_worker = np.bincount(worker[both], minlength=2)
print(f"updates before the kill: {by_worker[0]} by worker 0, {by_worker[1]} by worker 1")
print("staleness proxy before the kill: "
      + ", ".join(f"{count} update{'s' if count > 1 else ''} at {value}"
                  for value, count in enumerate(counts) if count))
print(f"staleness proxy: mean {staleness[both].mean():.2f} before the kill, "
      f"largest {staleness[alone].max()} among the {alone.sum()} updates begun after it")

# %% tags=["remove-cell"]
assert staleness[both].max() >= 1            # two workers overlap
# One worker runs its closures one after another, so nothing else lands while
# one computes; <= 1 leaves room for a closure TensorFlow re-ran concurrently.
assert alone.sum() > 0 and staleness[alone].max() <= 1

# %% [markdown]
# With two workers, a good share of the updates had one other update land
# while they computed; the updates begun after the kill, with one worker
# left, had none or hardly any (the largest count is printed above). The loss follows that of one
# device closely, as the asynchronous chapter found for small staleness
# ({numref}`fig-ps-updates`):

# %% mystnb={"figure": {"caption": "Parameter-server training of the y = x\u00b2 network across processes: when each worker applied an update, with the moment one worker was killed, and the loss per update against that of one device.", "name": "fig-ps-updates"}}
reference_loss, _ = fit_one_device(*parabola_data(), steps=UPDATES, learning_rate=0.01)
fig = parameter_server_updates(ps_run, kill_time=killed_wall, reference_loss=reference_loss)

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
# It put those closures back in the queue and worker 0 ran them: every
# scheduled update was applied. TensorFlow documents this as
# *at-least-once*: a closure that had written part of its update when its
# worker died runs again in full, so `applied` can exceed `scheduled`.
# The records of the updates worker 1 finished before it died are on the
# parameter servers, so none is lost with it (one could be, if the worker
# died between counting its update and writing its record; the run counts
# such updates in `records_lost`).

# %% tags=["nbval-ignore-output"]
after = finished > killed_wall
recovery = finished[after].min() - killed_wall
print(f"updates scheduled {ps_run['scheduled']}, applied {ps_run['applied']} "
      f"(re-runs: {ps_run['applied'] - ps_run['scheduled']})")
print(f"update records kept {len(ps_run['loss'])}, lost {ps_run['records_lost']}")
print("workers that applied updates after the kill:",
      ", ".join(f"worker {index}" for index in sorted(set(worker[after].tolist()))))
print(f"time from the kill to the next applied update: {recovery * 1e3:.0f} ms "
      f"(median time between updates: {np.median(np.diff(np.sort(finished))) * 1e3:.1f} ms)")
rate_before = both.sum() / (killed_wall - finished.min())
rate_after = after.sum() / (finished.max() - killed_wall)
print(f"updates per second: {rate_before:.0f} with two workers, {rate_after:.0f} with one")

# %% tags=["remove-cell"]
assert ps_run["applied"] >= ps_run["scheduled"] == UPDATES
assert len(ps_run["loss"]) + ps_run["records_lost"] == ps_run["applied"]
assert ps_run["records_lost"] <= 1               # at most the closure worker 1 was running
assert list(ps_run["version"]) == sorted(set(ps_run["version"]))
assert set(worker[after].tolist()) == {0} and (worker[both] == 1).sum() > 0

# %% [markdown]
# The parameter-server run did not stop: losing a worker cost a few
# milliseconds, and worker 0 did all the work from then on. Throughput fell
# by far less than half (the two rates above): with a network this small,
# the coordinator dispatching closures sets the pace, not the workers. With
# a real model on separate machines, losing one of two workers would halve
# it until the worker is restarted; the coordinator keeps reconnecting and
# uses it again when it returns. Parameter servers are not protected this
# way: if one dies, the coordinator raises, and the job restarts from a
# checkpoint like a synchronous one.
#
# ### A worker dies in a synchronous run
#
# Under `MultiWorkerMirroredStrategy` every step needs every worker: the
# survivors' all-reduce fails, and the job must start again. A checkpoint
# saves the work: `train_parabola_multiworker` saves one every 150 steps with
# `tf.train.CheckpointManager` (model and optimizer, whose iteration counter
# is the step) and restores the latest at start. On a real cluster the
# checkpoint directory is on shared storage; here it is a temporary
# directory.
#
# We run 300 steps and kill worker 1 once worker 0 reports step 175. So that
# we can aim, every worker pauses a fifth of a second after each report of
# 25 steps, as if the steps took real time:

# %%
checkpoints = tempfile.mkdtemp(prefix="pargrad-checkpoints-")
settings = {"steps": STEPS, "dtype": "float64", "deterministic": True,
            "checkpoint_dir": checkpoints, "checkpoint_every": 150, "seconds_between_reports": 0.2}
started = time.monotonic()
with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as first:
    first.wait_for("step 175", index=0)    # worker 0's line: the figure follows worker 0
    killed_at = first.kill("worker", 1, expected=False)   # a crash, as far as the job knows
    try:
        first.wait()
    except ClusterError as error:
        detected_at = time.monotonic()
        # The message goes on with the worker's last log lines; its first line says what happened.
        print(type(error).__name__, str(error).splitlines()[0].removesuffix("; its last lines:"))
stopped_at = time.monotonic()

# %% tags=["remove-cell"]
import psutil


def survivors(cluster):
    """The cluster's processes still alive, and any child process of this kernel left behind."""
    alive = [pid for pid in cluster.pids if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    return alive + psutil.Process().children(recursive=True)


assert survivors(first) == []

# %% [markdown]
# The whole job stops: the survivor's next all-reduce fails, and the `with`
# block stops it (with `SIGKILL` after a second: this strategy's workers
# take `SIGTERM` as a preemption notice and ignore it). We start the job
# again with the same arguments, as a cluster manager would:

# %%
with LocalCluster(train_parabola_multiworker, workers=2, kwargs=settings, timeout=120) as second:
    resumed = second.wait()
print(second.log(index=0, last=4))
print("resumed from the checkpoint of step:",
      ", ".join(f"{result['resumed_at']} (worker {index})" for index, result in enumerate(resumed)))

# %% tags=["remove-cell"]
assert survivors(second) == []
assert [result["resumed_at"] for result in resumed] == [150, 150]
assert f"[worker 0] step {150 + 25}" in second.log()                # the first step after it
assert all(len(result["loss"]) == STEPS - 150 for result in resumed)  # only those were redone
assert sorted(os.listdir(checkpoints)) == [
    "checkpoint", "ckpt-150.data-00000-of-00001", "ckpt-150.index",
    f"ckpt-{STEPS}.data-00000-of-00001", f"ckpt-{STEPS}.index"]

# %% [markdown]
# The restarted workers found the checkpoint of step 150 and trained the
# remaining 150 steps. Their final weights are *exactly* those of the
# uninterrupted 2-worker run of the first section: restoring a checkpoint
# loses nothing but time.

# %%
uninterrupted = runs["worker 0 of 2 processes"]
difference = max(float(np.max(np.abs(a - b))) for a, b in zip(resumed[0]["weights"], uninterrupted))
print(f"largest weight difference from the uninterrupted run: {difference:g}")
shutil.rmtree(checkpoints)  # the checkpoints have served their purpose

# %% tags=["remove-cell"]
assert all(np.array_equal(a, b) for a, b in zip(resumed[0]["weights"], uninterrupted))

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
fig = recovery_timeline(before, after, killed_at - started, sorted(set(saved)))

# %% tags=["remove-cell"]
assert resumed_at in saved and resumed_at == 150
assert 0 < done_at_kill - resumed_at < 150

# %% [markdown]
# At most the steps since the last checkpoint are lost (here the 25 or so
# since step 150), and the restart costs a few seconds, nearly all of it
# starting Python and TensorFlow. Checkpointing more often loses fewer steps
# but spends more time writing, which takes seconds to minutes for large
# models: the interval is a trade-off. (`keras.callbacks.BackupAndRestore`
# does this for `fit`, which Keras 3 does not support under these
# strategies; see [Compatibility matrix](a2_compatibility).)
#
# ## From one machine to several
#
# Nothing in the worker functions knows it runs on 127.0.0.1. To run the
# 3-worker job on three machines, write one `TF_CONFIG` per machine with
# their addresses and start the same function on each; `pargrad.cluster`
# runs as a program for this:

# %%
hosts = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]}
for index in range(3):
    print(f"# on {hosts['worker'][index].split(':')[0]}:")
    print(f"TF_CONFIG='{tf_config(hosts, 'worker', index)}' \\\n"
          f"  python -m pargrad.cluster pargrad.book.multiworker:train_parabola_multiworker '{{\"steps\": 300}}'")

# %% [markdown]
# For `ParameterServerStrategy`, the workers and parameter servers run
# `python -m pargrad.cluster serve` with their own `TF_CONFIG`; the
# coordinator's names it `chief`.
#
# **What changes** on several machines:
#
# - **`TF_CONFIG` per host**: the same `cluster` everywhere, a different
#   `task` on each; the chief (worker 0, or the coordinator) writes the
#   checkpoints. Cluster managers (Kubernetes operators, Slurm scripts,
#   Vertex AI) write it for you.
# - **Ports and firewalls**: every task must reach every port in the cluster
#   spec; open them between the cluster's machines only.
# - **Trust**: the gRPC servers have no authentication or encryption and
#   listen on all interfaces; across machines, keep them on a private
#   network (a VPC, a VPN) that only the cluster reaches.
# - **Shared storage**: a restarted worker reads the chief's checkpoint, so
#   the checkpoint directory must be on storage every machine sees (a
#   network file system, a cloud bucket).
# - **Failures become normal**: training Llama 3 on 16,384 GPUs met 419
#   unexpected interruptions in 54 days, about one every three hours
#   {cite}`dubey2024llama3`; restarting from a checkpoint is part of every
#   job.
#
# **What does not change**: the worker functions, the strategies, the
# checkpoints and the numbers: 3 workers compute the weights of one device,
# as 3 processes or 3 machines.
#
# ## Summary
#
# - A TensorFlow cluster is a set of tasks that find each other through
#   `TF_CONFIG`; `pargrad.LocalCluster` starts one on 127.0.0.1, collects
#   every task's output and always stops every process.
# - `MultiWorkerMirroredStrategy` with 2 and 3 worker processes computed the
#   weights of one device: synchronous training does not depend on where the
#   replicas live.
# - `ParameterServerStrategy` keeps the variables, in shards, on parameter
#   servers; a `ClusterCoordinator` schedules closures that any free worker
#   runs. The shards are read one by one with no common version, so
#   staleness has only a proxy: mostly 0 or 1 with two workers.
# - When a worker dies, the coordinator re-runs its closures on the others
#   (at least once, possibly twice) and training goes on with less
#   throughput. A synchronous job stops; with `tf.train.CheckpointManager` it
#   restarts from the last checkpoint, loses only the steps since, and ends
#   with exactly the weights of an uninterrupted run.
# - Several machines change `TF_CONFIG`, ports, firewalls, storage and
#   trust, not the code. TensorFlow's gRPC servers have no authentication:
#   keep them on trusted networks.
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
# These exercises start clusters (many seconds each), so their solutions are
# written out; `tests/book/test_multiworker.py`, `tests/book/test_parameter_server.py`
# and `tests/test_cluster.py` run the same situations.
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
