"""Timing communication against the message size: the measurements behind the alpha-beta fits.

Taught in the chapter "What communication costs".  Book instrumentation: each
function times one kind of communication for a list of payload sizes and
returns the fastest of a few repeats for each size (the slower repeats
include time in which the machine's cores ran something else).

* :func:`time_all_reduce`: an all-reduce (sum) of one float32 tensor per
  replica under a ``tf.distribute`` strategy, in this process;
* :func:`time_all_reduce_in_worker`: the same in every worker of a
  :class:`pargrad.LocalCluster` (``MultiWorkerMirroredStrategy`` over gRPC);
* :func:`time_packing`: many small tensors all-reduced one by one, or packed
  into one message (``CommunicationOptions.bytes_per_pack``);
* :func:`time_parameter_server_in_coordinator`: one worker pulls a
  variable from a parameter server and pushes an update of the same size
  (``ParameterServerStrategy``), run by the coordinator of a cluster.
"""

import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly
from pargrad.strategies import sync_strategy

tf = import_tensorflow_quietly()

FLOAT32_BYTES = 4
# A handful of payloads from one float (4 bytes) to 4 Mi floats (16 MiB): every
# size costs a trace and a warm-up call, and in a cluster several processes.
DEFAULT_SIZES = [4, 2 ** 10, 2 ** 16, 2 ** 20, 2 ** 24]


def _elements(nbytes):
    if nbytes % FLOAT32_BYTES or nbytes <= 0:
        raise ValueError(f"nbytes must be a positive multiple of 4 bytes (a whole float32 tensor), "
                         f"got {nbytes!r}; pass for example {FLOAT32_BYTES * max(1, nbytes // 4)}.")
    return nbytes // FLOAT32_BYTES


def _fastest(run, repeats):
    """Seconds of the fastest of ``repeats`` calls of ``run`` (after one warm-up call)."""
    run()  # traces the function and sets up the collective the first time
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _all_reduce_runner(strategy, tensors_per_replica, options=None):
    """A function that all-reduces one list of tensors on every replica and waits for the result."""

    @tf.function
    def all_reduce():
        def replica_part():
            # Filling the tensors costs a memset, small next to sending them.
            tensors = [tf.ones([n], tf.float32) for n in tensors_per_replica]
            return tf.distribute.get_replica_context().all_reduce("SUM", tensors, options=options)
        return strategy.run(replica_part)

    def run():
        reduced = all_reduce()
        # Fetch one number of the first local result: the call has then finished.
        return strategy.experimental_local_results(reduced)[0][0][0].numpy()

    return run


def time_all_reduce(strategy, sizes=DEFAULT_SIZES, repeats=5):
    """Seconds for an all-reduce of each payload size in ``sizes`` (bytes), under ``strategy``.

    Every replica contributes one float32 tensor of that many bytes; the
    time is from the call until the summed result is back, the fastest of
    ``repeats``.  Returns a list of floats, one a size.  Taught in the
    chapter "What communication costs".
    """
    return [_fastest(_all_reduce_runner(strategy, [_elements(n)]), repeats) for n in sizes]


def time_packing(strategy, tensors=64, tensor_bytes=1024, repeats=5):
    """Seconds to all-reduce ``tensors`` small tensors separately and packed into one message.

    ``CommunicationOptions(bytes_per_pack=tensor_bytes)`` makes each tensor
    its own pack (its own all-reduce); ``bytes_per_pack=0`` packs all of them
    into one (TensorFlow concatenates a pack and all-reduces it once).
    Returns ``{"separate": seconds, "packed": seconds, "one_tensor": seconds}``,
    the last for one tensor of ``tensor_bytes`` alone.  Taught in the
    chapter "What communication costs".
    """
    one = _elements(tensor_bytes)
    options = tf.distribute.experimental.CommunicationOptions
    return {
        "separate": _fastest(_all_reduce_runner(
            strategy, [one] * tensors, options(bytes_per_pack=tensor_bytes)), repeats),
        "packed": _fastest(_all_reduce_runner(
            strategy, [one] * tensors, options(bytes_per_pack=0)), repeats),
        "one_tensor": _fastest(_all_reduce_runner(strategy, [one]), repeats),
    }


def time_all_reduce_in_worker(sizes=DEFAULT_SIZES, repeats=3, packing_tensors=0,
                              packing_tensor_bytes=1024):
    """Run :func:`time_all_reduce` in one worker of a cluster (``MultiWorkerMirroredStrategy``).

    The target of a :class:`pargrad.LocalCluster` of workers: every worker
    runs it, and the all-reduces need all of them.  With
    ``packing_tensors > 0`` it also runs :func:`time_packing`.  Returns
    ``{"seconds": [...], "replicas": R, "packing": {...} or None}``.
    Taught in the chapter "What communication costs".
    """
    strategy = sync_strategy()  # TF_CONFIG names the workers: MultiWorkerMirroredStrategy
    seconds = time_all_reduce(strategy, sizes, repeats)
    packing = None
    if packing_tensors:
        packing = time_packing(strategy, packing_tensors, packing_tensor_bytes, repeats)
    return {"seconds": seconds, "replicas": strategy.num_replicas_in_sync, "packing": packing}


def time_parameter_server_in_coordinator(sizes=DEFAULT_SIZES, repeats=3):
    """Seconds for one worker to pull a variable of each size from a parameter server and push
    an update of the same size back.

    The target of a :class:`pargrad.LocalCluster` with ``workers=1,
    parameter_servers=1``; it runs in the coordinator.  For each size a
    float32 variable of that many bytes is created on the parameter server
    (one shard, no partitioner); a scheduled function reads it on the
    worker (pull: n bytes from the server), scales it there, and subtracts
    the result from the variable (push: n bytes to the server).  The time is
    from scheduling the function until its result is back, one function at
    a time, so it also holds the coordinator's round trip to the worker.
    Returns ``{"seconds": [...]}``.  Taught in the chapter "What
    communication costs".
    Shown in the chapter "What communication costs".
    """
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    seconds = []
    for nbytes in sizes:
        with strategy.scope():
            variable = tf.Variable(tf.ones([_elements(nbytes)], tf.float32))

        @tf.function
        def pull_and_push():
            pulled = tf.identity(variable)         # on the worker: the value came from the server
            update = pulled * 1e-6                 # "the gradient", computed on the worker
            variable.assign_sub(update)            # sent back and applied on the server
            return update[0]

        seconds.append(_fastest(lambda: coordinator.schedule(pull_and_push).fetch(), repeats))
    return {"seconds": seconds}


def sizes_in_bytes(sizes=DEFAULT_SIZES):
    """``sizes`` as a float array (bytes), for fitting and plotting."""
    return np.asarray(sizes, dtype=float)
