"""Methods x seeds: each method at the best rate of its own sweep, compared seed by seed.

Taught in the chapters "Asynchronous training" and "Sync vs async in the
same time".  A conclusion such as "4 asynchronous workers end lower than
one" is a statement about a distribution, not about one run.  This module
fixes how the book reaches one, before any run is made:

1. A :class:`Method` is a name, a function ``run(rate, seeds)`` that returns
   one *score* a seed (lower is better: a final loss, a time to a target;
   ``inf`` or ``nan`` for a run that diverged or never got there), and the
   grid of learning rates to sweep.
2. :func:`sweep` runs every rate of the grid on the *tuning* seeds and picks
   the rate with the lowest median score; it raises when that rate is the
   first or the last of the grid (the optimum must lie inside it).
3. :func:`run_experiment` then runs every method at its own best rate on
   *other* seeds (so that picking the rate does not flatter it) and returns
   the per-seed scores.
4. :func:`compare` applies the rule stated in :data:`RULE`: an exact
   two-sided sign test over the paired seeds (the same seed gives both
   methods the same initial weights, data order and delays).

The runs themselves come from the caller: vectorised NumPy replicas of the
trainers (:mod:`pargrad.book.parabola_async`) where thousands of runs are
needed, the trainers themselves where a few are.
"""

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from pargrad.checks import check_share, check_whole_number

ALPHA = 0.05      # the sign test's level
MIN_SEEDS = 20    # the fewest paired seeds a verdict may rest on
RULE = (f"A is ahead of B when, over at least {MIN_SEEDS} paired seeds, A scores better than B "
        f"in more seeds than B does better than A, and an exact two-sided sign test over the "
        f"seeds that differ gives p < {ALPHA}; otherwise no difference is shown.")


@dataclasses.dataclass(frozen=True)
class Method:
    """A way to train: ``run(rate, seeds)`` returns one score a seed (lower is better).

    ``rates`` is the grid :func:`sweep` tries, in increasing order.  A
    method without a rate to tune (a fixed control) passes ``rates=None``
    and is run as ``run(None, seeds)``.
    """

    name: str
    run: Callable[[float, np.ndarray], np.ndarray]
    rates: Sequence[float] = None

    def __post_init__(self):
        if not callable(self.run):
            raise TypeError(f"Method {self.name!r}: run must be a function run(rate, seeds) -> "
                            f"scores, got {self.run!r}.")
        if self.rates is not None:
            rates = np.asarray(self.rates, float)
            if rates.ndim != 1 or len(rates) < 3 or not np.all(np.diff(rates) > 0):
                raise ValueError(f"Method {self.name!r}: rates must be at least 3 increasing "
                                 f"learning rates (the best must have a neighbour on each side), "
                                 f"got {self.rates!r}.")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A method's sweep: the ``rates``, the ``medians`` of the scores and the ``best`` rate."""

    method: str
    rates: np.ndarray
    medians: np.ndarray
    scores: np.ndarray  # (rates, tuning seeds)
    best: float


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A paired comparison of two methods' per-seed scores under :data:`RULE`."""

    first: str
    second: str
    wins: int      # seeds where ``first`` scored lower (better)
    losses: int    # seeds where ``second`` scored lower
    ties: int
    p_value: float
    verdict: str   # "<first> ahead", "<second> ahead" or "no difference shown"

    @property
    def seeds(self):
        return self.wins + self.losses + self.ties

    def __str__(self):
        return (f"{self.first} vs {self.second}: better in {self.wins} of {self.seeds} seeds, "
                f"worse in {self.losses}, tied in {self.ties}; sign test p = "
                f"{format_p(self.p_value)} -> {self.verdict}")


def scores_as_array(scores, seeds):
    """``scores`` as a float array with one entry a seed; ``nan`` (a diverged run) becomes ``inf``."""
    scores = np.array(scores, dtype=float).reshape(-1)
    if len(scores) != len(seeds):
        raise ValueError(f"a method returned {len(scores)} scores for {len(seeds)} seeds; "
                         "run(rate, seeds) must return one score a seed.")
    scores[np.isnan(scores)] = np.inf
    return scores


def sweep(method, seeds):
    """Run ``method`` at every rate of its grid on ``seeds``; the best is the lowest median.

    Raises ``ValueError`` when the best rate is the smallest or the largest
    of the grid, or when no rate gives a finite median: widen the grid.
    Returns a :class:`Sweep`.  Taught in the chapter "Asynchronous training".
    """
    if method.rates is None:
        raise ValueError(f"Method {method.name!r} has no rates to sweep; give it rates=[...].")
    seeds = _seeds(seeds)
    rates = np.asarray(method.rates, float)
    scores = np.array([scores_as_array(method.run(float(rate), seeds), seeds) for rate in rates])
    medians = np.median(scores, axis=1)
    if not np.isfinite(medians).any():
        raise ValueError(f"{method.name}: no rate of {list(rates)} gives a finite median score; "
                         "try smaller rates.")
    best = int(np.argmin(medians))
    if best in (0, len(rates) - 1):
        side = "smaller" if best == 0 else "larger"
        raise ValueError(f"{method.name}: the best rate {rates[best]:g} is at the edge of the grid "
                         f"{list(rates)}; add {side} rates so that the optimum lies inside it.")
    return Sweep(method.name, rates, medians, scores, float(rates[best]))


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Per-seed ``scores`` of every method at its ``rates`` (best swept, or None), and the sweeps."""

    seeds: np.ndarray
    scores: dict
    rates: dict
    sweeps: dict

    def compare(self, first, second, alpha=ALPHA, min_seeds=MIN_SEEDS):
        """:func:`compare` of two of this experiment's methods."""
        return compare(self.scores[first], self.scores[second], first, second, alpha, min_seeds)


def run_experiment(methods, seeds, tuning_seeds=None):
    """Every method at the best rate of its own sweep, on ``seeds``; returns an :class:`Experiment`.

    Methods with a grid of rates are swept on ``tuning_seeds`` (default: as
    many seeds again, following ``seeds``), then run on ``seeds``.  Taught in
    the chapters "Asynchronous training" and "Sync vs async in the same time".
    """
    seeds = _seeds(seeds)
    if tuning_seeds is None:
        tuning_seeds = np.arange(seeds.max() + 1, seeds.max() + 1 + len(seeds))
    tuning_seeds = _seeds(tuning_seeds)
    names = [method.name for method in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must differ, got {names}.")
    scores, rates, sweeps = {}, {}, {}
    for method in methods:
        if method.rates is not None:
            sweeps[method.name] = sweep(method, tuning_seeds)
            rates[method.name] = sweeps[method.name].best
        else:
            rates[method.name] = None
        scores[method.name] = scores_as_array(method.run(rates[method.name], seeds), seeds)
    return Experiment(seeds, scores, rates, sweeps)


def sign_test(first_scores, second_scores):
    """Exact two-sided sign test of paired scores (lower is better; ties are dropped).

    Returns ``(wins, losses, ties, p)``: seeds where the first scored lower,
    where the second did, where they were equal (two ``inf`` are equal), and
    the probability, if neither were better, of a split at least as uneven.
    """
    a, b = np.asarray(first_scores, float), np.asarray(second_scores, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores need two 1-d arrays of the same length, got shapes "
                         f"{a.shape} and {b.shape}.")
    a, b = np.where(np.isnan(a), np.inf, a), np.where(np.isnan(b), np.inf, b)
    wins, losses = int(np.sum(a < b)), int(np.sum(b < a))
    ties = len(a) - wins - losses
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return wins, losses, ties, 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return wins, losses, ties, float(min(1.0, 2.0 * tail))


def compare(first_scores, second_scores, first="A", second="B", alpha=ALPHA, min_seeds=MIN_SEEDS):
    """The verdict of :data:`RULE` on two methods' paired per-seed scores; a :class:`Verdict`.

    Raises ``ValueError`` with fewer than ``min_seeds`` seeds: no verdict
    rests on a handful of runs.  Taught in the chapter "Asynchronous training".
    """
    alpha = check_share("alpha", alpha, strict=True)
    min_seeds = check_whole_number("min_seeds", min_seeds)
    if len(np.asarray(first_scores).reshape(-1)) < min_seeds:
        raise ValueError(f"a verdict needs at least {min_seeds} paired seeds, got "
                         f"{len(np.asarray(first_scores).reshape(-1))}; run more seeds.")
    wins, losses, ties, p = sign_test(first_scores, second_scores)
    if p < alpha and wins != losses:
        verdict = f"{first} ahead" if wins > losses else f"{second} ahead"
    else:
        verdict = "no difference shown"
    return Verdict(first, second, wins, losses, ties, p, verdict)


def format_p(p):
    """A p-value for the page: two significant digits, or an upper bound below 1e-4."""
    return f"{p:.2g}" if p >= 1e-4 else "< 1e-4"


def _seeds(seeds):
    seeds = np.asarray(seeds)
    if seeds.ndim != 1 or len(seeds) == 0:
        raise ValueError(f"seeds must be a non-empty list of whole numbers, got {seeds!r}.")
    for seed in seeds.tolist():  # Python numbers: the message shows -1, not np.int64(-1)
        check_whole_number("each of seeds", seed, minimum=0)
    if len(np.unique(seeds)) != len(seeds):
        raise ValueError("seeds must differ from each other: a repeated seed counts one run twice.")
    return seeds
