"""The book's network in float64 NumPy, and the replays that train it for many seeds at once.

The trainers run one seed at a time; a conclusion needs many seeds, and a
swept learning rate for every method.  This module is the book's evidence
engine: the y = x² question's 1-5-1 ``tanh`` network written once, forward
and backward, vectorised over leading axes (a seed axis first, then
whatever a replay needs, such as a replica axis), and the replays that
train it exactly as the trainers do:

* :func:`forward`, :func:`full_loss` and :func:`gradients`: the network,
  its loss and its backpropagation (``tests/book/test_replay.py`` checks the
  gradient against ``tf.GradientTape`` on
  :func:`pargrad.book.parabola.parabola_model` and against finite
  differences);
* :func:`train_async`: asynchronous SGD replayed on a schedule of reads and
  applies (what :class:`pargrad.AsyncTrainer`'s virtual clock decides),
  taught in the chapter "Asynchronous training";
* :func:`train_rounds` and :func:`replay_phases`: local SGD and DiLoCo
  replayed round by round (what :class:`pargrad.LocalSGDTrainer` computes),
  also across workers that leave and join, taught in the chapter
  "Communicating rarely".

Weights are tuples ``(W1, b1, W2, b2)`` of shapes ``(..., 1, H)``,
``(..., H)``, ``(..., H, 1)`` and ``(..., 1)``, Keras's order with the
leading axes first; a run that overflows scores ``inf``.
"""

import dataclasses

import numpy as np

from pargrad.checks import check_choice, check_seeds, check_whole_number
from pargrad.book.parabola import initial_weights

AVERAGE = "average"       # outer SGD of rate 1: local SGD, model averaging
NESTEROV = "nesterov"     # DiLoCo's outer SGD with Nesterov momentum
OUTERS = (AVERAGE, NESTEROV)
# DiLoCo's outer step (Douillard et al. 2023), as Keras keeps it: in float32.
OUTER_RATE = float(np.float32(0.7))
OUTER_MOMENTUM = float(np.float32(0.9))


# ----------------------------------------------------------------------------
# The network, forward and backward
# ----------------------------------------------------------------------------

def stacked_weights(seeds, hidden=5):
    """The initial weights of every seed, float64, stacked: ``(W1, b1, W2, b2)`` with a seed axis first.

    Each seed's are :func:`pargrad.book.parabola.initial_weights`, what the
    trainers start from.
    """
    weights = [initial_weights(int(seed), hidden, dtype="float64") for seed in check_seeds(seeds)]
    return tuple(np.stack([w[i] for w in weights]) for i in range(4))


def stacked_glorot_weights(seeds, hidden=5):
    """Keras's default initial weights instead, stacked as :func:`stacked_weights` stacks the book's.

    Glorot uniform kernels (limit ``sqrt(6 / (fan_in + fan_out))``, drawn
    from ``numpy.random.default_rng(seed)``) and zero biases, float64: the
    delay bound's agreement depends on the initial weights.  Taught in the
    chapter "Stale gradients in depth".
    """
    limit = np.sqrt(6.0 / (1 + hidden))  # both layers: fan_in + fan_out = 1 + hidden
    weights = []
    for seed in check_seeds(seeds):
        rng = np.random.default_rng(int(seed))
        weights.append((rng.uniform(-limit, limit, (1, hidden)), np.zeros(hidden),
                        rng.uniform(-limit, limit, (hidden, 1)), np.zeros(1)))
    return tuple(np.stack([w[i] for w in weights]) for i in range(4))


def forward(weights, x):
    """The network on examples ``x`` of shape ``(..., n)``: ``(hidden, prediction)``.

    ``hidden`` is ``tanh(x W1 + b1)``, shape ``(..., n, H)``; ``prediction``
    is ``hidden W2 + b2``, shape ``(..., n)``.  ``x`` broadcasts against the
    weights' leading axes (one data set for every seed, or one a replica).
    """
    w1, b1, w2, b2 = weights
    hidden = np.tanh(x[..., :, np.newaxis] * w1[..., 0, np.newaxis, :] + b1[..., np.newaxis, :])
    # matmul (not einsum): the sum over H in the order the stored chapter outputs were made with
    return hidden, (hidden @ w2)[..., 0] + b2


def full_loss(weights, x, y):
    """The loss on all points of the data's columns ``x``, ``y`` ``(n, 1)``, one value a seed.

    The mean squared error of the y = x² question; ``inf`` where a run overflowed.
    """
    with np.errstate(all="ignore"):
        _, prediction = forward(weights, np.asarray(x)[:, 0])
        loss = np.mean((prediction - np.asarray(y)[:, 0]) ** 2, axis=-1)
    return np.where(np.isfinite(loss), loss, np.inf)


def gradients(weights, x, y, share=None):
    """The gradient of the squared error, backpropagated by hand: ``(dW1, db1, dW2, db2)``.

    ``x`` and ``y`` are ``(..., n)``, broadcasting against the weights'
    leading axes; each example's squared error is weighted by ``share``
    (``(..., n)``, for example 1 / shard size on a worker's shard and 0
    elsewhere), or by ``1 / n`` (the mean) when ``share`` is None.  The
    gradients have the weights' shapes.
    """
    w1, b1, w2, b2 = weights
    hidden, prediction = forward(weights, x)
    residual = 2.0 * (prediction - y)                         # d loss / d prediction
    residual = residual / x.shape[-1] if share is None else residual * share
    d_w2 = np.einsum("...n,...nh->...h", residual, hidden)[..., np.newaxis]
    d_b2 = residual.sum(axis=-1)[..., np.newaxis]
    d_z = residual[..., np.newaxis] * w2[..., np.newaxis, :, 0] * (1.0 - hidden**2)
    d_w1 = np.einsum("...n,...nh->...h", x, d_z)[..., np.newaxis, :]
    return d_w1, d_z.sum(axis=-2), d_w2, d_b2


def per_seed(values, like):
    """One value a seed, ``(seeds,)``, shaped to multiply an array ``like`` with a seed axis first."""
    return values.reshape((len(values),) + (1,) * (like.ndim - 1))


# ----------------------------------------------------------------------------
# Asynchronous SGD, replayed on a schedule
# ----------------------------------------------------------------------------

def train_async(weights, x, y, workers, schedule, learning_rate, staleness_aware=False,
                momentum=0.0, record_loss=False, delay_compensation=None):
    """Apply a schedule's updates to every seed's network; float64, vectorised over seeds.

    ``weights`` come from :func:`stacked_weights`; ``x``, ``y`` are the
    data's columns ``(n, 1)``; ``schedule`` from
    :func:`pargrad.scenario.virtual_schedule` or
    :func:`pargrad.book.parabola_async.sequential_schedule` (arrays of one
    entry an update, or of shape ``(updates, seeds)`` for a schedule a seed).
    Update ``t`` is worker ``schedule["worker"][t]``'s gradient on its shard
    ``x[worker::workers]`` at the parameters of version
    ``schedule["read_version"][t]``, times ``learning_rate`` (divided by
    staleness + 1 with ``staleness_aware``, staleness = ``t - read_version``),
    with Keras SGD's ``momentum``.  With ``delay_compensation=λ`` the
    gradient ``g`` is replaced by DC-ASGD's ``g + λ·g·g·(w_now − w_read)``
    (Zheng et al. 2017, constant λ), as ``AsyncTrainer(delay_compensation=λ)``
    applies it; ``λ`` may be one number or one a seed.
    Returns the loss on all points after the last update, one a seed
    (``inf`` for a run that overflowed), and with ``record_loss`` also the
    loss on all points after each update, ``(updates, seeds)``.
    Taught in the chapter "Asynchronous training".
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    seeds = weights[0].shape[0]
    worker_of = np.broadcast_to(np.asarray(schedule["worker"]).reshape(len(schedule["worker"]), -1),
                                (len(schedule["worker"]), seeds))
    read_of = np.broadcast_to(np.asarray(schedule["read_version"]).reshape(len(worker_of), -1),
                              worker_of.shape)
    if np.any(read_of > np.arange(len(worker_of))[:, np.newaxis]) or np.any(read_of < 0):
        raise ValueError("a schedule's read_version must lie between 0 and the update's index; "
                         "pass a schedule from pargrad.scenario.virtual_schedule.")
    base_rate = np.broadcast_to(np.asarray(learning_rate, np.float64), (seeds,))
    compensation = (None if delay_compensation is None else
                    np.broadcast_to(np.asarray(delay_compensation, np.float64), (seeds,)))
    shares = _shard_shares(workers, len(x))
    history = [tuple(np.array(w, np.float64) for w in weights)]
    velocity = [np.zeros_like(w) for w in history[0]]
    losses = []
    with np.errstate(all="ignore"):
        for t in range(len(worker_of)):
            read = _read(history, read_of[t])
            grads = gradients(read, x[:, 0], y[:, 0], shares[worker_of[t]])
            if compensation is not None:  # DC-ASGD: g + λ g g (w_now - w_read), element by element
                grads = tuple(g + per_seed(compensation, g) * g * g * (now - was)
                              for g, now, was in zip(grads, history[-1], read))
            rate = base_rate / (t - read_of[t] + 1.0) if staleness_aware else base_rate
            velocity = [momentum * v - per_seed(rate, g) * g for v, g in zip(velocity, grads)]
            history.append(tuple(w + v for w, v in zip(history[-1], velocity)))
            if record_loss:
                losses.append(full_loss(history[-1], x, y))
    final = full_loss(history[-1], x, y)
    return (final, np.array(losses)) if record_loss else final


def _shard_shares(workers, n):
    """``(workers, n)``: 1 / shard size on worker ``w``'s examples ``w::workers``, 0 elsewhere."""
    shares = np.zeros((workers, n))
    for worker in range(workers):
        shares[worker, worker::workers] = 1.0 / len(range(worker, n, workers))
    return shares


def _read(history, versions):
    """Each seed's parameters at the version it read (a gather over seeds when they differ)."""
    if versions.min() == versions.max():
        return history[versions[0]]
    return tuple(np.stack([history[v][i][s] for s, v in enumerate(versions)]) for i in range(4))


# ----------------------------------------------------------------------------
# Local SGD and DiLoCo, replayed round by round
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class State:
    """Shared parameters ``weights`` (W1, b1, W2, b2, a seed axis first) and the outer ``buffer``.

    ``buffer`` is the outer optimizer's momentum (zeros for plain averaging):
    what must be handed over, with the weights, when the set of workers changes.
    """

    weights: tuple
    buffer: tuple


def start(seeds, hidden=5):
    """Every seed's initial :class:`State`: :func:`stacked_weights`, a zero buffer."""
    weights = stacked_weights(seeds, hidden)
    return State(weights, tuple(np.zeros_like(w) for w in weights))


def shards(x, y, replicas):
    """``x`` and ``y`` cut into ``replicas`` equal contiguous shards, shapes ``(replicas, n / replicas)``.

    The rows each replica of :class:`pargrad.LocalSGDTrainer` reads when the
    batch is the whole data set.
    """
    replicas = check_whole_number("replicas", replicas)
    if len(x) % replicas:
        raise ValueError(f"{len(x)} points do not split evenly over {replicas} replicas; pass a "
                         f"divisor of {len(x)}.")
    return np.reshape(x, (replicas, -1)), np.reshape(y, (replicas, -1))


def train_rounds(state, data, replicas, rate, local_steps, rounds, outer=AVERAGE,
                 outer_rate=OUTER_RATE, outer_momentum=OUTER_MOMENTUM):
    """``rounds`` rounds of local SGD or DiLoCo from ``state``; returns ``(state, losses)``.

    Each round: every one of ``replicas`` replicas takes ``local_steps``
    steps of SGD at ``rate`` (one number, or one a seed) on its contiguous
    shard of ``data`` (the columns ``x``, ``y``), from the shared weights;
    the mean change is applied by the ``outer`` step (:data:`AVERAGE` or
    :data:`NESTEROV`).  ``losses[k]`` is the loss on all points of the
    shared weights after round ``k``, one a seed (``inf`` where a run
    overflowed).  float64, vectorised over seeds and replicas.  Taught in
    the chapter "Communicating rarely".
    """
    check_choice("outer", outer, OUTERS)
    local_steps = check_whole_number("local_steps", local_steps)
    rounds = check_whole_number("rounds", rounds, minimum=0)
    x, y = data
    xs, ys = shards(x[:, 0], y[:, 0], replicas)
    seeds = state.weights[0].shape[0]
    rate = np.broadcast_to(np.asarray(rate, np.float64), (seeds,))
    lr, mu = (1.0, 0.0) if outer == AVERAGE else (outer_rate, outer_momentum)
    weights, buffer, losses = state.weights, state.buffer, []
    with np.errstate(all="ignore"):
        for _ in range(rounds):
            mine = [np.repeat(w[:, np.newaxis], replicas, axis=1) for w in weights]
            for _ in range(local_steps):
                mine = [w - per_seed(rate, w) * g for w, g in zip(mine, gradients(mine, xs, ys))]
            delta = [np.mean(w[:, np.newaxis] - m, axis=1) for w, m in zip(weights, mine)]
            buffer = tuple(mu * b + d for b, d in zip(buffer, delta))
            weights = tuple(w - lr * (d + mu * b) for w, d, b in zip(weights, delta, buffer))
            losses.append(full_loss(weights, x, y))
    return State(weights, buffer), np.array(losses).reshape(rounds, seeds)


def replay_phases(phases, data, learning_rate, local_steps, seed=0, outer=NESTEROV, hidden=5,
                  outer_rate=OUTER_RATE, outer_momentum=OUTER_MOMENTUM):
    """Rounds of DiLoCo on a changing set of workers, handing over weights and momentum.

    ``phases`` is a list of ``(workers, rounds)``: a phase with fewer
    workers is a worker that left, with more one that joined.  The replay of
    :func:`pargrad.book.rare_communication.train_phase`'s handovers, with
    DiLoCo's ``outer_rate`` and ``outer_momentum`` (default: the paper's).
    Returns the :class:`State` at the end (one seed) and the loss on all
    points after every phase.  Taught in the chapter "Communicating rarely".
    """
    state, losses = start([seed], hidden), []
    for workers, rounds in phases:
        state, curve = train_rounds(state, data, workers, learning_rate, local_steps, rounds, outer,
                                    outer_rate, outer_momentum)
        losses.append(float(curve[-1, 0]))
    return state, losses
