"""The chapter "Asynchronous training"'s runs of the y = x² network, for many initial weights at once.

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
* :func:`pargrad.book.replay.train_async` applies the updates of a schedule
  to the 1-5-1 ``tanh`` network of the y = x² question, each worker
  computing its gradient on its shard ``x[worker::workers]`` at the
  parameters it read, for every seed's initial weights side by side;
* :func:`final_losses` and :func:`largest_stable_rate` are the chapter's
  measurements on them.

The chapter and ``tests/book/test_parabola_async.py`` check it against the
trainer: same schedule, same losses up to float32 rounding.
"""

import numpy as np

from pargrad.book import replay
from pargrad.checks import check_positive, check_whole_number
from pargrad.scenario import Scenario, virtual_schedule
from pargrad.book.parabola import parabola_data


def sequential_schedule(workers, updates):
    """One worker taking the shards ``x[i::workers]`` in turn, every gradient fresh.

    The zero-staleness control of the chapter "Asynchronous training":
    update ``t`` uses shard ``t % workers`` and reads version ``t``.
    """
    workers = check_whole_number("workers", workers)
    t = np.arange(check_whole_number("updates", updates))
    return {"worker": t % workers, "read_version": t, "time": t + 1.0}


def mean_rate(schedule, learning_rate, staleness_aware):
    """The mean learning rate of a schedule's updates: what a 'same mean step' control must use."""
    read = np.asarray(schedule["read_version"])
    if read.ndim > 1:
        raise ValueError(f"schedule must be one schedule for all seeds (one entry an update), got "
                         f"arrays of shape {read.shape}; pass one seed's schedule.")
    staleness = np.arange(len(read)) - read
    return float(np.mean(learning_rate / (staleness + 1.0))) if staleness_aware else float(
        learning_rate)


def largest_stable_rate(weights, x, y, workers, updates=400, low=1e-3, high=2.0, halvings=14):
    """Each seed's largest learning rate at which ``workers`` equal workers end below their start.

    Bisection on a log scale between ``low`` and ``high`` (``halvings``
    times, vectorised over seeds): a rate is *stable* when the loss on all
    points after ``updates`` updates is below the loss at the initial
    weights.  Returns one rate a seed.  Taught in the chapter "Asynchronous training".
    """
    low, high = check_positive("low", low), check_positive("high", high)
    if high <= low:
        raise ValueError(f"high must be above low ({low!r}), got {high!r}; pass a wider range.")
    workers = check_whole_number("workers", workers)
    start = replay.full_loss(weights, x, y)
    schedule = virtual_schedule(Scenario.equal(workers), updates)
    seeds = len(start)
    low, high = np.full(seeds, float(low)), np.full(seeds, float(high))
    for _ in range(halvings):
        middle = np.sqrt(low * high)
        stable = replay.train_async(weights, x, y, workers, schedule, middle) < start
        low, high = np.where(stable, middle, low), np.where(stable, high, middle)
    return low


def final_losses(workers, learning_rate, seeds, updates=400, speeds=None, staleness_aware=False,
                 momentum=0.0, sequential=False, delay_compensation=None):
    """Loss on all 50 points of the y = x² question after ``updates`` updates, one a seed.

    ``workers`` asynchronous workers on the virtual clock with ``speeds``
    (default: equal, no delays), or with ``sequential=True`` one worker
    taking their shards in turn with fresh gradients (the zero-staleness
    control, with Keras SGD's ``momentum``); ``delay_compensation`` as in
    :func:`pargrad.book.replay.train_async`.  Each seed's run starts from
    :func:`pargrad.book.parabola.initial_weights` of that seed.  Taught in
    the chapter "Asynchronous training".
    """
    x, y = parabola_data(dtype="float64")
    schedule = (sequential_schedule(workers, updates) if sequential else
                virtual_schedule(Scenario(speeds or (1.0,) * workers), updates))
    return replay.train_async(replay.stacked_weights(seeds), x, y, workers, schedule,
                              learning_rate, staleness_aware=staleness_aware, momentum=momentum,
                              delay_compensation=delay_compensation)
