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

import dataclasses

import numpy as np

from pargrad.book import experiments, replay, tuning
from pargrad.checks import check_choice, check_positive, check_seeds, check_whole_number
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


# ----------------------------------------------------------------------------
# Sweeps that resolve a second knob (DC-ASGD's λ)
# ----------------------------------------------------------------------------

def remembered(run):
    """``run(setting, seeds)``, each setting and seed set run once: refined sweeps repeat settings.

    A sweep that refines a knob in several passes, and the density check
    that sweeps again, ask for the same settings many times; the replays
    are deterministic, so their scores can be kept.
    """
    scores = {}

    def run_once(setting, seeds):
        key = (tuple(sorted(setting.items())) if isinstance(setting, dict) else setting,
               tuple(int(seed) for seed in seeds))
        if key not in scores:
            scores[key] = np.asarray(run(setting, seeds), float)
        return scores[key].copy()

    return run_once


def _between(low, high):
    """The value between two of a knob's values: the geometric midpoint, half of ``high`` above 0."""
    return experiments.midpoint(low, high) if low > 0 else float(np.float32(high / 2))


def resolve_knob(method, seeds, knob, step=experiments.RATE_STEP):
    """``method`` with its grid of ``knob`` refined around the best; ``(method, sweep)``.

    :func:`pargrad.book.experiments.sweep` refines the learning rate only.
    For another knob of a grid (DC-ASGD's λ), this sweeps, adds the
    geometric midpoint between the best value and each neighbour farther
    than ``step`` away, and sweeps again, until the best's neighbours are
    within ``step`` (a best at a declared limit, λ = 0, is an answer).
    Taught in the chapter "Stale gradients in depth".
    """
    limits = (method.limits or {}).get(knob, ())
    for _ in range(32):
        swept = experiments.sweep(method, seeds)
        values = [float(v) for v in method.grid[knob]]
        at = values.index(swept.best[knob])
        if values[at] in limits:
            return method, swept
        added = [_between(min(values[at], values[j]), max(values[at], values[j]))
                 for j in (at - 1, at + 1) if 0 <= j < len(values)
                 and (min(values[at], values[j]) == 0
                      or max(values[at], values[j]) / min(values[at], values[j])
                      > step * (1 + 1e-9))]
        added = [value for value in added if value not in values]
        if not added:
            return method, swept
        method = dataclasses.replace(method, grid={**method.grid, knob: sorted(values + added)})
    raise RuntimeError(f"{method.name}: the refinement of {knob} did not settle.")  # pragma: no cover


def denser_knob(method, best, knob):
    """``method`` with ``knob``'s values twice as dense around ``best``: midpoints of the four nearest gaps."""
    values = [float(v) for v in method.grid[knob]]
    at = values.index(best[knob])
    gaps = [(values[j], values[j + 1]) for j in range(max(0, at - 2), min(len(values) - 1, at + 2))]
    return dataclasses.replace(method, grid={**method.grid, knob: sorted(
        set(values) | {_between(low, high) for low, high in gaps})})


def replicate_resolved(methods, seeds, tuning_seeds, held_out_seeds, held_out_tuning_seeds,
                       knobs=None, density=1, step=experiments.RATE_STEP):
    """:func:`pargrad.book.experiments.replicate`, with ``knobs`` (``{method name: knob}``) resolved.

    On each seed set, each method named in ``knobs`` first has that knob
    refined on the set's own tuning seeds (:func:`resolve_knob`; with
    ``density=2`` then made twice as dense around its best, as the density
    check does for the rate); then every method is run as
    :func:`pargrad.book.experiments.run_experiment` runs it.  Taught in the
    chapter "Stale gradients in depth".
    """
    knobs = knobs or {}
    sets = [check_seeds(s, distinct=True)
            for s in (seeds, tuning_seeds, held_out_seeds, held_out_tuning_seeds)]
    if len(np.unique(np.concatenate(sets))) != sum(len(s) for s in sets):
        raise ValueError("the four seed sets must not share a seed; held-out seeds must be new.")
    runs = []
    for seeds, pool in ((seeds, tuning_seeds), (held_out_seeds, held_out_tuning_seeds)):
        resolved = []
        for method in methods:
            if method.name in knobs:
                method, swept = resolve_knob(method, pool, knobs[method.name], step)
                if density == 2:
                    method = denser_knob(method, swept.best, knobs[method.name])
            resolved.append(method)
        runs.append(experiments.run_experiment(resolved, seeds, pool, density))
    return experiments.Replication(*runs)


# ----------------------------------------------------------------------------
# The remedies for staleness, as methods of the harness
# ----------------------------------------------------------------------------

UNEVEN = (1.0, 1.0, 1.0, 0.1)    # four workers, one ten times slower: uneven staleness
REMEDY_RATES = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.4, 0.6)
DC_RATES = (0.02, 0.03, 0.05, 0.07, 0.1)    # DC-ASGD's rates, around the constant's optimum
LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)   # 0: plain asynchronous SGD
LAMBDA_STEP = 2 ** 0.5   # λ is refined until the best's neighbours are this factor away
REMEDY_TUNING = 40       # tuning seeds a set: 20 give ragged medians near the rates' cliff


def remedy_methods(speeds=UNEVEN, updates=400):
    """The tuned constant rate, the staleness-aware rule and DC-ASGD (rate x λ), as Methods.

    Four asynchronous workers with ``speeds``; each method's runs are
    remembered (:func:`remembered`), so that a refined or denser sweep does
    not repeat them.  DC-ASGD's λ is a second knob: sweep it with
    :func:`replicate_resolved` and ``knobs=REMEDY_KNOBS``.  Taught in the
    chapter "Stale gradients in depth".
    """
    speeds = tuple(speeds)
    workers = len(speeds)

    def run(rate, seeds, **options):
        return final_losses(workers, rate, seeds, updates, speeds=speeds, **options)

    return [experiments.Method("best constant rate", remembered(run), REMEDY_RATES),
            experiments.Method("rate / (staleness + 1)", remembered(
                lambda rate, seeds: run(rate, seeds, staleness_aware=True)), REMEDY_RATES),
            experiments.Method("DC-ASGD", remembered(
                lambda setting, seeds: run(setting["rate"], seeds,
                                           delay_compensation=setting["λ"])),
                grid={"rate": DC_RATES, "λ": LAMBDAS}, limits={"λ": (0.0,)})]


REMEDY_KNOBS = {"DC-ASGD": "λ"}


# ----------------------------------------------------------------------------
# Tuning inside the experiment (pargrad.book.tuning): the workers of "Asynchronous
# training" and the remedies of "Stale gradients in depth", each seed set tuned on a
# pool of 40 seeds of its own, on fine grids, the pool resampled
# ----------------------------------------------------------------------------

def geometric(low, count, step=experiments.RATE_STEP):
    """``count`` values from ``low`` up, each ``step`` times the one before (to 4 digits)."""
    return tuple(float(f"{low * step ** k:.4g}") for k in range(count))


WORKERS = (2, 4, 8)                      # the asynchronous workers "Asynchronous training" runs
UPDATES = 400                            # the updates of every tuned run
# the fine grids, {density: grid}: rates 2^(1/4) apart (the refined sweep's step), λ sqrt(2)
# apart; density 2 (the density check) halves each step over the same range
WORKER_RATES = {1: geometric(0.01, 23), 2: geometric(0.01, 45, 2 ** 0.125)}   # 0.01 to 0.45
TUNED_REMEDY_RATES = {1: geometric(0.01, 25), 2: geometric(0.01, 49, 2 ** 0.125)}  # to 0.64
TUNED_DC_GRID = {d: {"rate": geometric(0.02, 10 * d + 1, 2 ** (0.25 / d)),  # 0.02 to 0.11
                     "λ": (0.0, *geometric(0.01, 20 * d + 1, 2 ** (0.5 / d)))}  # 0, 0.01 to 10.2
                 for d in (1, 2)}
# each seed set: (test seeds, tuning pool); no seed is in two sets
TUNED_SETS = {"page": (np.arange(0, 100), np.arange(100, 140)),
              "held_out": (np.arange(1000, 1100), np.arange(1100, 1140)),
              "third": (np.arange(2000, 2100), np.arange(2100, 2140))}
DENSE_SETS = ("page", "held_out")        # the density check's sets
TUNED = "stale_gradients_tuned"          # pargrad/book/data/<TUNED>.json


def worker_methods(updates=UPDATES, density=1):
    """One worker, and n asynchronous workers with their zero-staleness control, as Methods.

    For n in :data:`WORKERS`: ``"n async workers"`` (equal workers, the
    trainer's scheduled mode) and ``"n shards in turn"`` (one worker taking
    the same n shards in turn, every gradient fresh), on
    :data:`WORKER_RATES` at ``density``.  Taught in the chapter "Asynchronous training".
    """
    def method(name, n, sequential=False):
        return experiments.Method(name, lambda rate, seeds: final_losses(
            n, rate, seeds, updates, sequential=sequential), WORKER_RATES[density])

    return [method("1 worker", 1)] + [
        made for n in WORKERS for made in (method(f"{n} shards in turn", n, sequential=True),
                                           method(f"{n} async workers", n))]


def tuned_methods(group, density=1):
    """The methods of a tuned ``group``: ``"workers"`` (:func:`worker_methods`) or
    ``"remedies"`` (:func:`remedy_methods` on the fine grids :data:`TUNED_REMEDY_RATES` and
    :data:`TUNED_DC_GRID`), at ``density`` 1 or 2 (the density check: every step halved)."""
    group = check_choice("group", group, ("workers", "remedies"))
    density = check_choice("density", density, (1, 2))
    if group == "workers":
        return worker_methods(density=density)
    plain, rule, dc = remedy_methods()
    return [plain.with_rates(TUNED_REMEDY_RATES[density]),
            rule.with_rates(TUNED_REMEDY_RATES[density]),
            dataclasses.replace(dc, grid=TUNED_DC_GRID[density])]


def measure_tuned(seed_set, group, name, density=1):
    """One method of a ``group`` on a seed set's pool and test seeds: :func:`pargrad.book.tuning.measure`.

    What ``tools/measure_tuned_stale_gradients.py`` stores.
    """
    test_seeds, pool = TUNED_SETS[check_choice("seed_set", seed_set, TUNED_SETS)]
    methods = {m.name: m for m in tuned_methods(group, density)}
    return tuning.measure(methods[check_choice("name", name, list(methods))], test_seeds, pool)


def stored_tuned():
    """The stored tuning pools and draws (``pargrad/book/data/stale_gradients_tuned.json``)."""
    return tuning.stored(TUNED)


def tuned_replication(group, stored=None, seed_sets=("page", "held_out"), density=1):
    """A group on two seed sets, each method at the best of its set's pool of 40 tuning seeds.

    A :class:`pargrad.book.tuning.TunedReplication` on 100 test seeds a set;
    reads the stored runs (:func:`stored_tuned`; ``density=2``: the density
    check's grids), runs nothing.  Taught in the chapters "Asynchronous
    training" and "Stale gradients in depth".
    """
    stored = stored_tuned() if stored is None else stored
    sets = stored["sets"] if check_choice("density", density, (1, 2)) == 1 else stored["dense"]
    return tuning.replication([sets[which][group] for which in seed_sets],
                              [TUNED_SETS[which][0] for which in seed_sets])
