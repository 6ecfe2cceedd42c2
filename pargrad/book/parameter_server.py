"""Asynchronous training across processes: ParameterServerStrategy and ClusterCoordinator.

Taught in the chapter "Beyond one machine".  The parameters live on the
parameter servers, cut into shards; the workers only compute; a
*coordinator* process (task type ``chief``) holds the training loop.  It
*schedules* each update as a small function (a *closure*); whichever worker
is free runs it: it reads the latest parameters from the parameter servers,
computes the gradient of the y = x² question's loss on the full batch, and applies its
update to the parameter servers at once, without waiting for the other
workers.  It is the asynchronous trainer of the chapter "Asynchronous
training", across processes.

If a worker dies, the coordinator runs its unfinished closures again on
another worker; a closure may therefore run more than once (TensorFlow's
documented at-least-once behaviour).  :func:`train_parameter_server` runs on
the coordinator of a :class:`pargrad.LocalCluster` with
``parameter_servers >= 1``.
"""

import json
import os
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly
from pargrad.book.parabola import initial_weights, parabola_data
from pargrad.cluster import LocalCluster

tf = import_tensorflow_quietly()


def parameter_server_strategy(shards=None):
    """A ``ParameterServerStrategy`` for the cluster named by ``TF_CONFIG``.

    Variables are cut along their first axis into ``shards`` pieces (default:
    one a parameter server) with ``FixedShardsPartitioner``; a variable with
    fewer rows than shards gets one shard a row.  Call it in the coordinator
    (task type ``chief``).  Taught in the chapter "Beyond one machine".
    """
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    servers = len(config.get("cluster", {}).get("ps", []))
    if not servers or config.get("task", {}).get("type") != "chief":
        raise RuntimeError(
            "parameter_server_strategy() runs in the coordinator of a cluster with "
            "parameter servers: TF_CONFIG must name 'ps' tasks and this task must be "
            f"the 'chief'; got TF_CONFIG={os.environ.get('TF_CONFIG')!r}. Start it with "
            "pargrad.LocalCluster(target, workers=2, parameter_servers=1)."
        )
    shards = servers if shards is None else shards
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(shards)
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def _whole(variable):
    """The value of a (possibly sharded) variable, its shards joined."""
    shards = getattr(variable, "variables", None)
    if shards is not None and len(shards) > 1:
        return tf.concat([tf.convert_to_tensor(s) for s in shards], axis=0)
    return tf.convert_to_tensor(variable)


def _shards(variable):
    return list(getattr(variable, "variables", [variable]))


def train_parameter_server(updates=400, learning_rate=1e-2, seed=0, shards=None,
                           report_every=50, slow_worker=None, slow_seconds=0.0,
                           announce=False):
    """Train the y = x² question's network asynchronously with parameter servers.

    Runs in the coordinator of a :class:`pargrad.LocalCluster` with
    ``parameter_servers >= 1``.  The four weights of the 1-5-1 network start
    from :func:`pargrad.book.parabola.initial_weights` with ``seed`` and are created in the
    strategy's scope, so they live on the parameter servers, cut into
    ``shards`` pieces.  ``updates`` closures are scheduled; each runs on a
    free worker: read the parameters and a version counter, compute the
    full-batch gradient, ``w -= learning_rate * gradient`` on the parameter
    servers, increment the version counter (one atomic step that returns
    the value before: the update's *version*), and write the update's
    *record* (its loss, worker, staleness proxy and times) into row
    ``version`` of a table that also lives on the parameter servers.

    The records stay on the parameter servers, not on the worker that made
    them: a worker killed just after its closure finished takes nothing with
    it.  (A closure's return values live on its worker until the
    coordinator copies them; fetching them from a dead worker fails with
    ``0 derived errors ignored. [Op:Identity]`` and ends the run.)  A worker
    that dies between incrementing the counter and writing the record loses
    that one record; the update still counts in ``applied`` and in
    ``records_lost``.

    The *staleness proxy* of each update: the counter's value when the
    update was applied minus its value when the parameters were read, the
    number of updates that other closures applied in between.  It is a
    proxy because a closure reads the counter and the parameter shards as
    separate remote reads, not as one atomic snapshot.

    ``slow_worker`` (an index) sleeps ``slow_seconds`` in every closure it
    runs, to make a straggler.  Every ``report_every`` updates the coordinator
    prints ``updates N``; with ``announce=True`` every worker also prints
    ``applied V`` when its closure has written update ``V`` (to stage a
    failure right after one).  Returns a JSON-friendly dict: one entry per
    surviving record, in the order the updates were applied: ``version``,
    ``loss``, ``worker`` that ran it, ``staleness``, ``started`` (the
    ``time.time()`` clock when it read the counter) and ``finished`` (when it
    was applied); ``applied`` (the version counter
    at the end: updates applied, counting re-runs), ``records_lost``
    (``applied`` minus the records), ``scheduled``, the final ``weights``,
    ``shard_shapes`` and ``shard_devices`` of each weight, and ``seconds``.

    Taught in the chapter "Beyond one machine".

    Shown in the chapter "Beyond one machine".
    """
    strategy = parameter_server_strategy(shards)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    # Room for a re-run of every update (a closure re-runs only if its worker
    # dies); the version counter stops there with an error.
    capacity = 2 * int(updates) + 8
    with strategy.scope():
        variables = [tf.Variable(w, name=f"w{i}") for i, w in enumerate(initial_weights(seed))]
        version = tf.Variable(0, dtype=tf.int64, name="version")
        # One row an update, indexed by its version: loss, worker, staleness,
        # started, finished, written.
        records = tf.Variable(tf.zeros([capacity, 6], tf.float64), name="records")
    x, y = parabola_data()
    trainable = [s for v in variables for s in _shards(v)]
    rate = tf.constant(learning_rate, tf.float32)
    slow = -1 if slow_worker is None else int(slow_worker)

    @tf.function
    def update():
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            read = version.read_value()
        with tf.control_dependencies([read]):
            with tf.GradientTape() as tape:
                w1, b1, w2, b2 = [_whole(v) for v in variables]
                hidden = tf.tanh(tf.matmul(x, w1) + b1)
                prediction = tf.matmul(hidden, w2) + b2
                loss = tf.reduce_mean(tf.reduce_sum(tf.square(y - prediction), axis=1))
            gradients = tape.gradient(loss, trainable)
            if slow_seconds > 0:
                delay = tf.where(tf.equal(worker, slow), slow_seconds, 0.0)
                gradients = [tf.numpy_function(_sleep_then, [delay, g], g.dtype, stateful=True)
                             for g in gradients]
                gradients = [tf.ensure_shape(g, s.shape) for g, s in zip(gradients, trainable)]
        applied = [s.assign_sub(rate * g) for s, g in zip(trainable, gradients)]
        with tf.control_dependencies(applied):
            # Add one and return the value before, in one step: two workers'
            # `assign_add(1)` then read could both read the same version.
            this = tf.raw_ops.ResourceCountUpTo(resource=version.handle, limit=capacity,
                                                T=tf.int64)
        with tf.control_dependencies([this]):
            finished = tf.timestamp()
        record = tf.stack([tf.cast(loss, tf.float64), tf.cast(worker, tf.float64),
                           tf.cast(this - read, tf.float64), started, finished,
                           tf.constant(1.0, tf.float64)])
        written = records.scatter_update(tf.IndexedSlices(record[None], this[None]))
        if announce:
            with tf.control_dependencies([written]):
                tf.print("applied", this)

    started = time.time()
    for done in range(0, updates, report_every):
        chunk = min(report_every, updates - done)
        for _ in range(chunk):
            coordinator.schedule(update)
        coordinator.join()
        print(f"updates {done + chunk}", flush=True)
    seconds = time.time() - started
    applied = int(version.numpy())
    table = _whole(records).numpy()[:applied]
    kept = table[:, 5] == 1.0
    return {
        "version": np.flatnonzero(kept).astype(np.int64),
        "loss": table[kept, 0].astype(np.float32),
        "worker": table[kept, 1].astype(np.int64),
        "staleness": table[kept, 2].astype(np.int64),
        "started": table[kept, 3],
        "finished": table[kept, 4],
        "applied": applied,
        "records_lost": int(applied - kept.sum()),
        "scheduled": int(updates),
        "weights": [np.asarray(_whole(v).numpy()) for v in variables],
        "shard_shapes": [[list(s.shape) for s in _shards(v)] for v in variables],
        "shard_devices": [[s.device for s in _shards(v)] for v in variables],
        "seconds": seconds,
    }


def _sleep_then(delay, value):
    time.sleep(float(delay))
    return value


def kill_worker_after_its_update(updates=120, count=30, worker=1, timeout=180):
    """Kill ``worker`` with SIGKILL right after its ``count``-th update; return the run.

    Runs :func:`train_parameter_server` (``announce=True``) in a
    :class:`pargrad.LocalCluster` of 2 workers and 2 parameter servers on
    127.0.0.1, waits for the ``count``-th ``applied`` line of ``worker`` (a
    closure that has finished) and kills that worker at once: the race in
    which a finished closure's worker dies before the coordinator has its
    outputs.  The cluster is always stopped.  Returns ``(run, killed)``:
    the coordinator's result and the ``time.time()`` of the kill.
    ``tools/stress_clusters.py --parameter-server`` runs it many times.
    """
    with LocalCluster(train_parameter_server, workers=2, parameter_servers=2, timeout=timeout,
                      kwargs={"updates": updates, "report_every": 20, "announce": True}) as cluster:
        cluster.wait_for("applied", role="worker", index=worker, count=count, timeout=timeout)
        killed = cluster.kill("worker", worker)
        killed_wall = time.time() - (time.monotonic() - killed)
        (run,) = cluster.wait()
    return run, killed_wall
