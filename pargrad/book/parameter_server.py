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
                           report_every=50, slow_worker=None, slow_seconds=0.0):
    """Train the y = x² question's network asynchronously with parameter servers.

    Runs in the coordinator of a :class:`pargrad.LocalCluster` with
    ``parameter_servers >= 1``.  The four weights of the 1-5-1 network start
    from :func:`pargrad.book.parabola.initial_weights` with ``seed`` and are created in the
    strategy's scope, so they live on the parameter servers, cut into
    ``shards`` pieces.  ``updates`` closures are scheduled; each runs on a
    free worker: read the parameters and a version counter, compute the
    full-batch gradient, ``w -= learning_rate * gradient`` on the parameter
    servers, and increment the version counter.

    The *staleness proxy* of each update: the counter's value when the
    update was applied minus its value when the parameters were read, the
    number of updates that other closures applied in between.  It is a
    proxy because a closure reads the counter and the parameter shards as
    separate remote reads, not as one atomic snapshot.

    ``slow_worker`` (an index) sleeps ``slow_seconds`` in every closure it
    runs, to make a straggler.  Every ``report_every`` updates the coordinator
    prints ``updates N``.  Returns a JSON-friendly dict: ``loss`` per update
    (in the order they finished), ``worker`` that ran each, ``staleness``,
    ``finished`` (``time.time()`` when each was applied),
    ``applied`` (the version counter at the end: updates applied, counting
    re-runs), ``scheduled``, the final ``weights``, ``shard_shapes`` and
    ``shard_devices`` of each variable, and ``seconds``.

    Taught in the chapter "Beyond one machine".

    Shown in the chapter "Beyond one machine".
    """
    from pargrad.book.parabola import initial_weights, parabola_data

    strategy = parameter_server_strategy(shards)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        variables = [tf.Variable(w, name=f"w{i}") for i, w in enumerate(initial_weights(seed))]
        version = tf.Variable(0, dtype=tf.int64, name="version")
    x, y = parabola_data()
    trainable = [s for v in variables for s in _shards(v)]
    rate = tf.constant(learning_rate, tf.float32)
    slow = -1 if slow_worker is None else int(slow_worker)

    @tf.function
    def update():
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
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
            after = version.assign_add(1)
        with tf.control_dependencies([after]):
            finished = tf.timestamp()
        return loss, tf.cast(worker, tf.int64), after - 1 - read, finished

    started = time.time()
    results = []
    for done in range(0, updates, report_every):
        chunk = [coordinator.schedule(update) for _ in range(min(report_every, updates - done))]
        coordinator.join()
        results.extend(r.fetch() for r in chunk)
        print(f"updates {done + len(chunk)}", flush=True)
    seconds = time.time() - started
    loss, worker, staleness, finished = (np.array(column) for column in zip(*results))
    return {
        "loss": loss.astype(np.float32),
        "worker": worker.astype(np.int64),
        "staleness": staleness.astype(np.int64),
        "finished": finished.astype(np.float64),
        "applied": int(version.numpy()),
        "scheduled": int(updates),
        "weights": [np.asarray(_whole(v).numpy()) for v in variables],
        "shard_shapes": [[list(s.shape) for s in _shards(v)] for v in variables],
        "shard_devices": [[s.device for s in _shards(v)] for v in variables],
        "seconds": seconds,
    }


def _sleep_then(delay, value):
    time.sleep(float(delay))
    return value
