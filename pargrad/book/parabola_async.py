"""The y = x² network trained asynchronously, in NumPy, for many initial weights at once.

Taught in the chapter "Asynchronous training".  A conclusion about
asynchronous training needs many runs (initial weights x learning rates x
methods); :class:`pargrad.asynchronous.AsyncTrainer` makes one at a time.
This module replays what its virtual clock does (``mode="scheduled"``) in
float64 NumPy, vectorised over seeds:

* :func:`pargrad.scenario.virtual_schedule` is the order of reads and
  applies of the trainer's scheduled mode, from the trainer's own clock:
  which worker applies the ``t``-th update and which version of the
  parameters it read (it depends on the speeds and the delays, never on
  the parameters); :func:`sequential_schedule` is the zero-staleness control;
* :func:`train` applies the updates of a schedule to the 1-5-1 ``tanh``
  network of the y = x² question, each worker computing its gradient on its
  shard ``x[worker::workers]`` at the parameters it read, for every seed's
  initial weights (:func:`pargrad.book.parabola.initial_weights`) side by side.

The chapter and ``tests/test_parabola_async.py`` check it against the
trainer: same schedule, same losses up to float32 rounding.
"""

import numpy as np

from pargrad.checks import check_whole_number
from pargrad.scenario import Scenario, virtual_schedule


def sequential_schedule(workers, updates):
    """One worker taking the shards ``x[i::workers]`` in turn, every gradient fresh.

    The zero-staleness control of the chapter "Asynchronous training":
    update ``t`` uses shard ``t % workers`` and reads version ``t``.
    """
    workers = check_whole_number("workers", workers)
    t = np.arange(check_whole_number("updates", updates))
    return {"worker": t % workers, "read_version": t, "time": t + 1.0}


def stacked_weights(seeds, hidden=5):
    """The initial weights of every seed, float64, stacked: ``(W1, b1, W2, b2)`` with a seed axis first."""
    from pargrad.book.parabola import initial_weights

    weights = [initial_weights(int(seed), hidden, dtype="float64") for seed in seeds]
    return tuple(np.stack([w[i] for w in weights]) for i in range(4))


def _forward(weights, x):
    w1, b1, w2, b2 = weights  # (S,1,H), (S,H), (S,H,1), (S,1)
    hidden = np.tanh(x[np.newaxis, :, :] @ w1 + b1[:, np.newaxis, :])  # (S, N, H)
    return hidden, (hidden @ w2)[:, :, 0] + b2  # (S, N)


def full_loss(weights, x, y):
    """The y = x² question's loss on all points, one value a seed (``inf`` where it overflowed)."""
    with np.errstate(all="ignore"):
        _, prediction = _forward(weights, x)
        loss = np.mean((prediction - y[np.newaxis, :, 0]) ** 2, axis=1)
    return np.where(np.isfinite(loss), loss, np.inf)


def _gradients(weights, x, y, share):
    """d loss / d weights for each seed; ``share`` (S, N) weights each example (1 / shard size)."""
    w1, b1, w2, b2 = weights
    hidden, prediction = _forward(weights, x)
    residual = 2.0 * share * (prediction - y[np.newaxis, :, 0])           # (S, N)
    d_w2 = np.einsum("sn,snh->sh", residual, hidden)[:, :, np.newaxis]
    d_b2 = residual.sum(axis=1, keepdims=True)
    d_z = residual[:, :, np.newaxis] * w2[:, np.newaxis, :, 0] * (1.0 - hidden**2)  # (S, N, H)
    d_w1 = np.einsum("n,snh->sh", x[:, 0], d_z)[:, np.newaxis, :]
    d_b1 = d_z.sum(axis=1)
    return d_w1, d_b1, d_w2, d_b2


def train(weights, x, y, workers, schedule, learning_rate, staleness_aware=False, momentum=0.0,
          record_loss=False, delay_compensation=None):
    """Apply a schedule's updates to every seed's network; float64, vectorised over seeds.

    ``weights`` come from :func:`stacked_weights`; ``schedule`` from
    :func:`pargrad.scenario.virtual_schedule` or :func:`sequential_schedule` (arrays of one
    entry an update, or of shape ``(updates, seeds)`` for a schedule a seed).
    Update ``t`` is worker ``schedule["worker"][t]``'s full-shard gradient at
    the parameters of version ``schedule["read_version"][t]``, times
    ``learning_rate`` (divided by staleness + 1 with ``staleness_aware``,
    staleness = ``t - read_version``), with Keras SGD's ``momentum``.  With
    ``delay_compensation=λ`` the gradient ``g`` is replaced by DC-ASGD's
    ``g + λ·g·g·(w_now − w_read)`` (Zheng et al. 2017, constant λ), as
    ``AsyncTrainer(delay_compensation=λ)`` applies it; ``λ`` may be one
    number or one a seed.
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
    updates = len(worker_of)
    if np.any(read_of > np.arange(updates)[:, np.newaxis]) or np.any(read_of < 0):
        raise ValueError("a schedule's read_version must lie between 0 and the update's index.")
    base_rate = np.broadcast_to(np.asarray(learning_rate, np.float64), (seeds,))
    compensation = (None if delay_compensation is None else
                    np.broadcast_to(np.asarray(delay_compensation, np.float64), (seeds,)))
    shares = np.zeros((workers, len(x)))
    for worker in range(workers):
        shares[worker, worker::workers] = 1.0 / len(range(worker, len(x), workers))
    history = [tuple(np.array(w, np.float64) for w in weights)]
    velocity = [np.zeros_like(w) for w in history[0]]
    losses = []
    everyone = np.arange(seeds)
    with np.errstate(all="ignore"):
        for t in range(updates):
            # each seed's read: the version its schedule says (a gather over seeds)
            read = tuple(np.stack([history[v][i][s] for s, v in zip(everyone, read_of[t])])
                         if read_of[t].min() != read_of[t].max() else history[read_of[t, 0]][i]
                         for i in range(4))
            grads = _gradients(read, x, y, shares[worker_of[t]])
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


def per_seed(values, like):
    """One value a seed, ``(seeds,)``, shaped to multiply an array ``like`` with a seed axis first."""
    return values.reshape((len(values),) + (1,) * (like.ndim - 1))


def mean_rate(schedule, learning_rate, staleness_aware):
    """The mean learning rate of a schedule's updates: what a 'same mean step' control must use."""
    staleness = np.arange(len(schedule["worker"])) - np.asarray(schedule["read_version"])
    if staleness.ndim > 1:
        raise ValueError("mean_rate takes one schedule for all seeds.")
    return float(np.mean(learning_rate / (staleness + 1.0))) if staleness_aware else float(
        learning_rate)


def largest_stable_rate(weights, x, y, workers, updates=400, low=1e-3, high=2.0, halvings=14):
    """Each seed's largest learning rate at which ``workers`` equal workers end below their start.

    Bisection on a log scale between ``low`` and ``high`` (``halvings``
    times, vectorised over seeds): a rate is *stable* when the loss on all
    points after ``updates`` updates is below the loss at the initial
    weights.  Returns one rate a seed.  Taught in the chapter "Asynchronous training".
    """
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low!r}, high={high!r}.")
    start = full_loss(weights, x, y)
    schedule = virtual_schedule(Scenario.equal(workers), updates)
    seeds = len(start)
    low, high = np.full(seeds, float(low)), np.full(seeds, float(high))
    for _ in range(halvings):
        middle = np.sqrt(low * high)
        stable = train(weights, x, y, workers, schedule, middle) < start
        low, high = np.where(stable, middle, low), np.where(stable, high, middle)
    return low


def final_losses(workers, learning_rate, seeds, updates=400, speeds=None, staleness_aware=False,
                 momentum=0.0, sequential=False, delay_compensation=None):
    """Loss on all 50 points of the y = x² question after ``updates`` updates, one a seed.

    ``workers`` asynchronous workers on the virtual clock with ``speeds``
    (default: equal, no delays), or with ``sequential=True`` one worker
    taking their shards in turn with fresh gradients (the zero-staleness
    control, with Keras SGD's ``momentum``); ``delay_compensation`` as in
    :func:`train`.  Each seed's run starts from
    :func:`pargrad.book.parabola.initial_weights` of that seed.  Taught in
    the chapter "Asynchronous training".
    """
    from pargrad.book.parabola import parabola_data

    x, y = parabola_data(dtype="float64")
    schedule = (sequential_schedule(workers, updates) if sequential else
                virtual_schedule(Scenario(speeds or (1.0,) * workers), updates))
    return train(stacked_weights(seeds), x, y, workers, schedule, learning_rate,
                 staleness_aware=staleness_aware, momentum=momentum,
                 delay_compensation=delay_compensation)
