"""Tuning inside the experiment: each seed set tuned on a pool of its own seeds, the draw resampled.

A method's setting is picked on tuning seeds, and a lucky pick moves every
seed of a set at once, which the signed-rank test would read as evidence.
So each method runs every setting of its grid on a *pool* of tuning seeds
(:func:`measure`); the pool and its draws (:func:`tuning_draws`) each pick a
setting (:func:`pick`); the set's test seeds run at every setting a draw
picked.  A :class:`TunedReplication` compares two methods with the tuning
noise in the rule's power (:func:`shift_in_errors`) and keeps an "ahead"
only where :data:`MIN_AGREEMENT` of the resampled draws repeat it.

Used by "Communicating rarely" and its deep dive, "Asynchronous training"
and "Stale gradients in depth"; taught on the page "How the book decides".
"""

import dataclasses

import numpy as np

from pargrad.book.experiments import (CLOSE, EFFECT, TOO_FEW, Experiment, Replication,
                                      log_ratios, robust_spread, scores_as_array)

DRAW_SIZE = 10        # the old tuning: disjoint draws of this many seeds from a pool
RESAMPLES = 20        # bootstrap draws of a pool (with replacement): the tuning's own noise
MAX_SHIFT = 0.5       # the tuning shift a verdict may carry, in seed standard errors
MIN_AGREEMENT = 0.95  # an "ahead" must hold on this share of the resampled tuning draws


def pick(scores, resolution=0.0):
    """The index of the best setting of a grid's per-seed ``scores`` (settings, seeds), as sweep picks.

    Lowest median (a diverged run counts as ``inf``; medians within
    ``resolution`` of it tie); a tie goes to the lowest mean, then to the
    middle of what still ties (:func:`pargrad.book.experiments.sweep` on the
    grid as given, which also refuses a best at the grid's edge).
    """
    scores = np.where(np.isnan(scores), np.inf, np.asarray(scores, float))
    medians = np.median(scores, axis=1)
    if not np.isfinite(medians).any():
        raise ValueError("no setting gives a finite median score; try smaller rates.")
    plateau = np.flatnonzero(medians <= np.min(medians) + resolution)
    means = np.mean(scores[plateau], axis=1)
    tied = plateau[means == np.min(means)] if np.isfinite(means).any() else plateau
    return int(tied[len(tied) // 2])


def tuning_draws(pool_size, resamples=RESAMPLES, draw_size=DRAW_SIZE, seed=0):
    """The tuning draws of a pool, as index arrays: ``{"pool": all, "disjoint": [...], "bootstrap": [...]}``.

    ``disjoint``: the pool cut into draws of ``draw_size`` seeds (the old
    tuning's size); ``bootstrap``: ``resamples`` draws of the pool's size
    with replacement, which measure how far a tuning on the whole pool moves.
    """
    rng = np.random.default_rng(seed)
    return {"pool": np.arange(pool_size),
            "disjoint": [np.arange(i, i + draw_size)
                         for i in range(0, pool_size - draw_size + 1, draw_size)],
            "bootstrap": [rng.integers(0, pool_size, pool_size) for _ in range(resamples)]}


def measure(method, test_seeds, pool):
    """One method's grid on a tuning ``pool`` and its ``test_seeds`` at every draw's best; a dict.

    ``settings``: the method's grid (``Method.settings()``); ``scores``:
    every setting on the pool's seeds; ``picked``: the best of the pool and
    of each draw (:func:`tuning_draws`, :func:`pick`); ``test``: the test
    seeds' scores at each setting a draw picked, keyed by its index.  A
    diverged run is stored as -1 (JSON has no infinity).  A ``method.run``
    with a ``single`` attribute runs one setting at a time through it.
    """
    settings = method.settings()
    scores = np.array([scores_as_array(method.run(s, pool), pool) for s in settings])
    draws = tuning_draws(len(pool))
    picked = {"pool": pick(scores),
              "disjoint": [pick(scores[:, d]) for d in draws["disjoint"]],
              "bootstrap": [pick(scores[:, d]) for d in draws["bootstrap"]]}
    run = getattr(method.run, "single", method.run)
    chosen = sorted({picked["pool"], *picked["disjoint"], *picked["bootstrap"]})
    test = {str(i): scores_as_array(run(settings[i], test_seeds), test_seeds) for i in chosen}
    finite = lambda a: np.where(np.isfinite(a), a, -1.0).tolist()  # noqa: E731
    return {"settings": settings, "scores": [finite(row) for row in scores], "picked": picked,
            "test": {i: finite(v) for i, v in test.items()}}


def stored(name):
    """The stored tuning runs ``pargrad/book/data/<name>.json`` (a tool's :func:`measure` dicts)."""
    import importlib.resources
    import json

    return json.loads(importlib.resources.files("pargrad.book").joinpath(
        "data", f"{name}.json").read_text())


def kept(values):
    """Stored scores as an array, a diverged run (stored as -1) as ``inf``."""
    values = np.asarray(values, float)
    return np.where(values < 0, np.inf, values)


def experiment(measured, test_seeds, draw="pool"):
    """The methods of ``measured`` ({name: :func:`measure`'s dict}) at one draw's best: an ``Experiment``.

    ``draw``: ``"pool"`` (tuned on the whole pool), or ``("disjoint", i)`` /
    ``("bootstrap", i)``.  Runs nothing.
    """
    scores, rates = {}, {}
    for name, method in measured.items():
        index = method["picked"]["pool"] if draw == "pool" else method["picked"][draw[0]][draw[1]]
        scores[name], rates[name] = kept(method["test"][str(index)]), method["settings"][index]
    return Experiment(np.asarray(test_seeds), scores, rates, {})


def shift_in_errors(measured, test_seeds, first, second, kind="bootstrap"):
    """How far the tuning draw moves a comparison: SD of its median log-ratio over the draws / its SE.

    Over the draws of ``kind`` (``"bootstrap"``: the pool resampled;
    ``"disjoint"``: the old draws of 10), the standard deviation of the
    median per-seed log-ratio on the set's test seeds, divided by the seed
    standard error of that median (1.2533 x robust spread / sqrt(seeds)).
    Returns ``(shift in standard errors, SD in log units)``.
    """
    count = len(measured[first]["picked"][kind])
    medians = []
    for i in range(count):
        run = experiment(measured, test_seeds, (kind, i))
        medians.append(np.median(log_ratios(run.scores[first], run.scores[second])))
    pooled = experiment(measured, test_seeds)
    d = log_ratios(pooled.scores[first], pooled.scores[second])
    error = 1.2533 * robust_spread([d]) / np.sqrt(len(d))
    sd = float(np.std(medians, ddof=1)) if np.all(np.isfinite(medians)) else np.inf
    return (sd / error if error > 0 else np.inf), sd


@dataclasses.dataclass(frozen=True)
class TunedReplication(Replication):
    """A :class:`pargrad.book.experiments.Replication` of two seed sets, each tuned on its own pool,
    which knows its tuning draws (``measured``: one {name: :func:`measure`'s dict} a set;
    ``test_seeds``: each set's): ``compare`` includes their noise in the power."""

    measured: tuple = dataclasses.field(default=(), repr=False, compare=False)
    test_seeds: tuple = dataclasses.field(default=(), repr=False, compare=False)

    def tuning_sd(self, first, second):
        """The larger standard deviation the bootstrap tuning draws give the two sets' medians."""
        return max(shift_in_errors(measured, seeds, first, second)[1]
                   for measured, seeds in zip(self.measured, self.test_seeds))

    def draw_agreement(self, first, second):
        """The share of the bootstrap tuning draws (the i-th of each set paired) whose verdict,
        without the tuning noise, is the pools' verdict: the tuning draw resampled in the test."""
        said = Replication.compare(self, first, second).verdict
        count = len(self.measured[0][first]["picked"]["bootstrap"])
        same = [Replication(*(experiment(measured, seeds, ("bootstrap", i))
                              for measured, seeds in zip(self.measured, self.test_seeds)))
                .compare(first, second).verdict == said for i in range(count)]
        return float(np.mean(same))

    def compare(self, first, second, *args, **kwargs):
        """The verdict with the tuning noise in its power; an "ahead" that fewer than
        :data:`MIN_AGREEMENT` of the resampled tuning draws repeat is undecided."""
        kwargs.setdefault("tuning_sd", self.tuning_sd(first, second))
        result = super().compare(first, second, *args, **kwargs)
        pooled = result.pooled
        if not pooled.verdict.endswith(" ahead") or \
                self.draw_agreement(first, second) >= MIN_AGREEMENT:
            return result
        words = CLOSE if 1 / EFFECT <= pooled.effect <= EFFECT else TOO_FEW
        return dataclasses.replace(result, pooled=dataclasses.replace(pooled, verdict=words))


def replication(measured, test_seeds, page=None, held_out=None):
    """Two seed sets, each at the best of its own pool: a :class:`TunedReplication`.

    ``measured``: one {name: :func:`measure`'s dict} a set, page first;
    ``test_seeds``: each set's test seeds.  ``page`` and ``held_out``
    replace the pools' experiments (the same settings scored another way);
    by default they are read from ``measured``.  Runs nothing.
    """
    measured, test_seeds = tuple(measured), tuple(np.asarray(s) for s in test_seeds)
    if len(measured) != 2 or len(test_seeds) != 2:
        raise ValueError(f"a tuned replication needs two seed sets (page, held-out), got "
                         f"{len(measured)} measured and {len(test_seeds)} test seed sets.")
    runs = [experiment(m, s) for m, s in zip(measured, test_seeds)]
    return TunedReplication(runs[0] if page is None else page,
                            runs[1] if held_out is None else held_out, measured, test_seeds)
