"""The ring all-reduce: its steps in NumPy, and the bytes each replica sends.

Taught in the chapter "Synchronous training", which draws every step of
:func:`ring_all_reduce` and checks its result against TensorFlow's
all-reduce.  :func:`ring_bytes` is what each replica sends in it, the bytes
:class:`pargrad.LocalSGDTrainer` records every round (the chapter
"Communicating rarely").  Its time is priced in :mod:`pargrad.cost`
(:func:`pargrad.cost.ring_all_reduce_time`), beside the tree, the
hierarchical ring and the parameter servers, by the one alpha-beta formula
they share (the chapter "What communication costs").
"""

import numpy as np

from pargrad import cost
from pargrad.checks import check_whole_number


def ring_all_reduce(vectors):
    """Sum ``vectors`` (one row per replica) with the ring algorithm, in NumPy.

    Each of the n replicas cuts its vector into n chunks.  In n - 1
    *reduce-scatter* steps every replica sends one chunk to its right
    neighbour, which adds it to its own; afterwards replica r holds the full
    sum of chunk (r + 1) mod n.  In n - 1 *all-gather* steps the finished
    chunks travel once more around the ring.  Each replica sends
    2 (n - 1) / n of its vector in total, however many replicas there are.

    Returns ``(result, states, sent)``: the final (n, length) array (every
    row the sum), the array after each of the 2 (n - 1) steps, and for each
    step the list of ``(sender, receiver, chunk)`` transfers.  Taught in the
    chapter "Synchronous training".
    """
    data = np.array(vectors, dtype=np.float64, copy=True)
    if data.ndim != 2 or len(data) < 2:
        raise ValueError(f"vectors must be a 2-D array with one row per replica (at least 2 rows), "
                         f"got shape {data.shape}; pass numpy.stack of the replicas' vectors.")
    n, length = data.shape
    if length % n:
        raise ValueError(f"each vector's length must be a multiple of the replicas ({n}), got "
                         f"{length}; pad the vectors with zeros to a multiple of {n}.")
    chunk = length // n
    piece = lambda c: slice(c * chunk, (c + 1) * chunk)  # noqa: E731
    states, sent = [data.copy()], []
    for step in range(2 * (n - 1)):
        transfers = []
        outgoing = data.copy()            # every replica sends at the same time
        for sender in range(n):
            receiver = (sender + 1) % n
            if step < n - 1:              # reduce-scatter: add the incoming chunk
                c = (sender - step) % n
                data[receiver, piece(c)] += outgoing[sender, piece(c)]
            else:                         # all-gather: overwrite with the finished chunk
                c = (sender + 1 - (step - (n - 1))) % n
                data[receiver, piece(c)] = outgoing[sender, piece(c)]
            transfers.append((sender, receiver, c))
        states.append(data.copy())
        sent.append(transfers)
    return data, states, sent


def ring_bytes(parameter_bytes, replicas):
    """Bytes each replica sends (and receives) in a ring all-reduce of ``parameter_bytes``.

    ``2 (R - 1) / R x parameter_bytes`` (0 for one replica): in the
    ``2 (R - 1)`` steps of :func:`ring_all_reduce` each replica sends one
    chunk of ``1 / R`` of the vector, the traffic of
    :func:`pargrad.cost.ring_pattern`.  Taught in the chapter
    "Communicating rarely".
    """
    return cost.ring_pattern(replicas).traffic * float(parameter_bytes)


def sharded_step_bytes(parameter_bytes, replicas, *, gathers=1, reductions=1):
    """Bytes each replica sends a step when the gradients are reduce-scattered ``reductions``
    times and the parameters all-gathered ``gathers`` times: ``(gathers + reductions) / 2 x``
    :func:`ring_bytes`.

    A reduce-scatter and an all-gather are each half of a ring all-reduce
    (``(R - 1) / R`` of the bytes).  ``gathers=1``: an all-reduce's bytes
    (ZeRO stages 0, 1 and 2); ``gathers=2``: ZeRO stage 3 (and
    :class:`pargrad.ShardedTrainer`'s), which gathers each layer for the
    forward and again for the backward pass, 1.5 x an all-reduce;
    ``reductions`` > 1 where each micro-batch's gradient is reduce-scattered
    (stages 2 and 3 with accumulation).  The one formula of the history
    (:class:`pargrad.sharded.ShardedHistory`), :func:`pargrad.memory.zero_bytes_sent`
    and the chapter "When the model does not fit", which teaches it.
    """
    gathers = check_whole_number("gathers", gathers, 1)
    reductions = check_whole_number("reductions", reductions, 1)
    return (gathers + reductions) / 2 * ring_bytes(parameter_bytes, replicas)
