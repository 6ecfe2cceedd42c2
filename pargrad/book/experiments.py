"""Methods x seeds: each method at the best setting of its own sweep, compared seed by seed.

Taught in the chapters "Asynchronous training" and "Sync vs async in the
same time"; the rules are stated on the page "How the book decides".  A
conclusion such as "4 asynchronous workers end lower than one" is a
statement about a distribution, not about one run.  This module fixes how
the book reaches one, before any run is made:

1. A :class:`Method` is a name, a function ``run(setting, seeds)`` that
   returns one *score* a seed (lower is better: a final loss, a time to a
   target; ``inf`` or ``nan`` for a run that diverged or never got there),
   and what to sweep: a grid of learning ``rates``, or a ``grid`` of
   several knobs (rate x momentum, rate x H).
2. :func:`sweep` runs every setting on the *tuning* seeds and takes the
   lowest median score.  Settings whose medians tie with it (exactly, or
   within the method's ``resolution``) form the *plateau*; the tie is broken
   by a finer criterion (the mean score over the tuning seeds, or the
   method's ``secondary`` score), never by the order of the grid.  A plateau
   that touches an end of the grid is "at the edge": the sweep raises.  The
   rates are then refined around the best until its neighbours lie within
   :data:`RATE_STEP`, so that the grid resolves the optimum.
3. :func:`run_experiment` runs every method at its own best setting on
   *other* seeds (so that picking the setting does not flatter it).
4. :func:`replicate` runs it all twice, on the page's seeds and on held-out
   seeds with their own tuning seeds, and :func:`compare` /
   :func:`replicated` apply :data:`RULE` to the two sets pooled: a
   Wilcoxon signed-rank test on the per-seed log-ratios, each set leaning
   the same way, and the effect size (the median per-seed ratio over the
   seeds that differ) at least :data:`FLOOR` from 1.  :func:`rule_power`
   simulates the rule; each verdict carries its power at a fifth at its own
   measured spread, which words an undecided one (:data:`UNDECIDED`), and
   :func:`holm` corrects the book's stated verdicts as one family.
6. :func:`last_quarter_mean` is the robust score of a loss curve that
   oscillates, and :func:`results_table` is the one table a chapter shows.

The runs themselves come from the caller: vectorised NumPy replicas of the
trainers (:mod:`pargrad.book.parabola_async`) where thousands of runs are
needed, the trainers themselves where a few are.
"""

import dataclasses
import functools
import html
import itertools
import math
import statistics
from typing import Callable, Mapping, Sequence

import numpy as np

from pargrad import checks

ALPHA = 0.04       # the test's level, two-sided: false "ahead" below 0.05 with a margin (rule_power)
MIN_SEEDS = 50     # the fewest paired seeds a verdict may rest on (two sets of 25 or more)
FLOOR = 0.02       # a lead whose ratio is within 2 % of 1 (0.98 to 1.02) is negligible
EFFECT = 1.25      # the effect the rule must see: a fifth either way (a ratio of 0.8 or 1.25)
MIN_POWER = 0.8    # "no difference shown" only where the rule sees EFFECT this often (rule_power)
RATE_STEP = 2 ** 0.25   # a sweep refines its rates until the best's neighbours are this close
UNDECIDED = (f"no difference is shown where the rule would see a ratio of {1 / EFFECT:g} "
             f"(or {EFFECT:g}) at least {MIN_POWER * 10:g} times in 10 at the comparison's own "
             f"spread and the median ratio lies between them; short of that power such a ratio "
             f"is a close call, and one beyond them too few seeds to tell, each given with its "
             f"interval.")
RULE = (f"A is ahead of B when, over at least {MIN_SEEDS} paired seeds (the page's and the "
        f"held-out ones, each set tuned on its own seeds), a two-sided Wilcoxon signed-rank "
        f"test on the per-seed log-ratios log(A / B) gives p < {ALPHA}, each seed set leans "
        f"the same way, and the median per-seed ratio A / B over the seeds that differ is "
        f"more than {FLOOR * 100:g} % away from 1 (within it, the difference is negligible). "
        f"Short of that, it is undecided: " + UNDECIDED)
NEGLIGIBLE = "negligible"
NO_DIFFERENCE = "no difference shown"
TOO_FEW = "too few seeds to tell"
CLOSE = "close call"


@dataclasses.dataclass(frozen=True)
class Method:
    """A way to train: ``run(setting, seeds)`` returns one score a seed (lower is better).

    Give one of:

    * ``rates``, the learning rates :func:`sweep` tries, in increasing
      order; ``run`` is called with one rate (a float);
    * ``grid``, a dict of knobs to their values, each in increasing order
      (``{"rate": [...], "momentum": [...]}``); ``run`` is called with a
      dict ``{knob: value}`` for every combination;
    * neither, for a fixed control, run as ``run(None, seeds)``.

    ``resolution``: medians closer than this tie (the step of a checkpoint
    grid where the score is a time; 0 ties only equal medians).
    ``secondary``: ``secondary(setting, seeds)`` returning one score a seed
    (the area under the loss curve, say) whose mean breaks ties; default,
    the mean of the scores themselves.  ``limits``: for a knob whose grid
    end is a natural limit (momentum 0, H = 1), ``{knob: (value, ...)}``:
    an optimum there is an answer, not a sign that the grid is too short.
    ``step``: :func:`sweep` adds rates (geometric midpoints, rounded to
    float32) around the best until its neighbours are at most this factor
    away (:data:`RATE_STEP`); ``None`` sweeps the grid as given (a stored
    measurement, which has no other rates).  Taught in the chapter
    "Asynchronous training".
    """

    name: str
    run: Callable[[object, np.ndarray], np.ndarray]
    rates: Sequence[float] = None
    grid: Mapping[str, Sequence[float]] = None
    resolution: float = 0.0
    secondary: Callable[[object, np.ndarray], np.ndarray] = None
    limits: Mapping[str, Sequence[float]] = None
    step: float = RATE_STEP

    def __post_init__(self):
        if not callable(self.run):
            raise TypeError(f"Method {self.name!r}: run must be a function run(rate, seeds) -> "
                            f"scores, got {self.run!r}.")
        if self.rates is not None and self.grid is not None:
            raise ValueError(f"Method {self.name!r}: give rates (one knob) or grid (several), "
                             "not both.")
        if self.rates is not None:
            rates = np.asarray(self.rates, float)
            if rates.ndim != 1 or len(rates) < 3 or not np.all(np.diff(rates) > 0):
                raise ValueError(f"Method {self.name!r}: rates must be at least 3 increasing "
                                 f"learning rates (the best must have a neighbour on each side), "
                                 f"got {self.rates!r}.")
        if self.grid is not None:
            _check_grid(self.name, self.grid, self.limits or {})
        if self.resolution != 0:
            checks.check_positive("resolution", self.resolution,
                                  advice="Pass 0 to tie only equal medians.")
        if self.step is not None and not (isinstance(self.step, (int, float))
                                          and 1 < self.step <= 2):
            raise ValueError(f"Method {self.name!r}: step must be a factor between 1 and 2 "
                             f"(neighbouring rates at most that far apart), or None for the "
                             f"grid as given; got {self.step!r}.")
        if self.secondary is not None and not callable(self.secondary):
            raise TypeError(f"Method {self.name!r}: secondary must be a function "
                            f"secondary(setting, seeds) -> scores, got {self.secondary!r}.")

    @property
    def axes(self):
        """The knobs swept and their values: ``{"rate": rates}`` for a 1-D grid, else ``grid``."""
        if self.grid is not None:
            return {knob: [float(v) for v in values] for knob, values in self.grid.items()}
        return None if self.rates is None else {"rate": [float(r) for r in self.rates]}

    def settings(self):
        """Every setting of the sweep, in grid order: floats (``rates``) or dicts (``grid``)."""
        if self.grid is None:
            return [float(rate) for rate in self.rates]
        axes = self.axes
        return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]

    def with_rates(self, rates):
        """This method with another rate axis (sorted, distinct): ``rates``, or ``grid["rate"]``."""
        rates = tuple(sorted({float(r) for r in rates}))
        if self.grid is None:
            return dataclasses.replace(self, rates=rates)
        if "rate" not in self.grid:
            raise ValueError(f"Method {self.name!r} has no rate knob to refine; its knobs are "
                             f"{sorted(self.grid)}.")
        return dataclasses.replace(self, grid={**self.grid, "rate": rates})


def _check_grid(name, grid, limits):
    """Refuse a grid whose knobs are not increasing values, or whose 2-value knob has no limit."""
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"Method {name!r}: grid must be a non-empty dict of knobs to values, "
                         f"got {grid!r}.")
    for knob, values in grid.items():
        values = np.asarray(values, float)
        if values.ndim != 1 or len(values) == 0 or not np.all(np.diff(values) > 0):
            raise ValueError(f"Method {name!r}: grid[{knob!r}] must be increasing values, "
                             f"got {grid[knob]!r}.")
        if len(values) == 2 and knob not in limits:
            raise ValueError(f"Method {name!r}: grid[{knob!r}] must have 1 value (fixed) or at "
                             f"least 3 (the best needs a neighbour on each side), got "
                             f"{grid[knob]!r}; or name a natural limit in limits.")
    unknown = set(limits) - set(grid)
    if unknown:
        raise ValueError(f"Method {name!r}: limits name knobs not in the grid: {sorted(unknown)}.")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A method's sweep: the settings, the ``medians`` of their scores, the ``best`` setting.

    ``rates`` holds the settings (rates, or dicts for a grid of knobs);
    ``plateau`` the settings whose median ties with the lowest (the best is
    one of them); ``tiebreak`` the secondary criterion of each setting of
    the plateau, the lowest of which was taken; ``added`` the rates the
    refinement (``Method.step``) added to the grid given.
    """

    method: str
    rates: object
    medians: np.ndarray
    scores: np.ndarray  # (settings, tuning seeds)
    best: object
    plateau: tuple = ()
    tiebreak: tuple = ()
    added: tuple = ()   # the rates the refinement added to the grid given


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A paired comparison of two methods' per-seed scores under :data:`RULE`."""

    first: str
    second: str
    wins: int      # seeds where ``first`` scored lower (better)
    losses: int    # seeds where ``second`` scored lower
    ties: int
    p_value: float  # two-sided signed-rank test on the per-seed log-ratios
    verdict: str   # "<first> ahead", "<second> ahead", NEGLIGIBLE, NO_DIFFERENCE, CLOSE, TOO_FEW
    effect: float = math.nan   # median of first / second over the seeds that differ
    floor: float = FLOOR
    lean: int = 0  # +1: the first's ranks weigh more (it leans ahead), -1: the second's, 0: even
    first_scores: tuple = dataclasses.field(default=(), repr=False, compare=False)
    second_scores: tuple = dataclasses.field(default=(), repr=False, compare=False)
    # what words an undecided verdict (UNDECIDED), not part of a verdict's identity:
    # the robust spread of the per-seed log-ratios (each set about its own median), the
    # rule's power at EFFECT at that spread and these seed sets, a 95 % bootstrap interval
    # of the median ratio, the gap between the sets' median log-ratios (the tuning shift),
    # and the seeds of each set pooled
    spread: float = dataclasses.field(default=math.nan, compare=False)
    power: float = dataclasses.field(default=math.nan, compare=False)
    interval: tuple = dataclasses.field(default=(math.nan, math.nan), compare=False)
    shift: float = dataclasses.field(default=math.nan, compare=False)
    set_sizes: tuple = dataclasses.field(default=(), compare=False)
    # the standard deviation, in log units, that the draw of tuning seeds adds to each set's
    # median log-ratio (measured over independent tuning draws; 0: not measured)
    tuning_sd: float = dataclasses.field(default=0.0, compare=False)

    @property
    def seeds(self):
        return self.wins + self.losses + self.ties

    @property
    def text(self):
        """The verdict as a page states it: a close call or too few seeds with its interval."""
        if self.verdict in (CLOSE, TOO_FEW):
            return f"{self.verdict} ({format_interval(self.interval)})"
        return self.verdict

    def __str__(self):
        return (f"{self.first} vs {self.second}: better in {self.wins} of {self.seeds} seeds, "
                f"worse in {self.losses}, tied in {self.ties}; median ratio "
                f"{format_ratio(self.effect)}, signed-rank {p_phrase(self.p_value)} "
                f"-> {self.text}")


def scores_as_array(scores, seeds):
    """``scores`` as a float array with one entry a seed; ``nan`` (a diverged run) becomes ``inf``."""
    scores = np.array(scores, dtype=float).reshape(-1)
    if len(scores) != len(seeds):
        raise ValueError(f"a method returned {len(scores)} scores for {len(seeds)} seeds; "
                         "run(rate, seeds) must return one score a seed.")
    scores[np.isnan(scores)] = np.inf
    return scores


def sweep(method, seeds):
    """Run ``method`` at every setting of its grid on ``seeds``; returns a :class:`Sweep`.

    The best is the lowest median; settings within ``method.resolution`` of
    it tie, and the tie goes to the lowest mean secondary score (see
    :class:`Method`), then to the middle of what still ties.  Then, with a
    ``method.step``, rates are added between the best and each neighbour
    farther than ``step`` away, and the best is found again, until the grid
    resolves the optimum.  Raises ``ValueError`` when no setting has a finite
    median, or when the plateau touches an end of any swept knob (not a
    declared limit): extend the grid.  Taught in the chapter "Asynchronous
    training".
    """
    if method.rates is None and method.grid is None:
        raise ValueError(f"Method {method.name!r} has no rates to sweep; give it rates=[...].")
    seeds = checks.check_seeds(seeds, distinct=True)
    given, done = method, {}
    for _ in range(64):
        settings = method.settings()
        for setting in settings:
            key = _key(setting)
            if key not in done:
                done[key] = scores_as_array(method.run(setting, seeds), seeds)
        scores = np.array([done[_key(setting)] for setting in settings])
        best, plateau, tiebreak, medians = _best(method, settings, scores, seeds)
        finer = _finer_rates(method, settings[best])
        if finer is None:
            break
        method = method.with_rates(finer)
    else:   # pragma: no cover - each pass halves a gap of at most a factor of the grid's range
        raise RuntimeError(f"{given.name}: the refinement of the rates did not settle.")
    rates = np.asarray(settings, float) if method.grid is None else settings
    added = tuple(sorted(set(method.axes["rate"]) - set(given.axes["rate"]))) \
        if method.step is not None and "rate" in method.axes else ()
    return Sweep(method.name, rates, medians, scores, settings[best],
                 tuple(settings[i] for i in plateau), tuple(float(t) for t in tiebreak), added)


def _key(setting):
    return setting if not isinstance(setting, dict) else tuple(sorted(setting.items()))


def _best(method, settings, scores, seeds):
    """The best setting's index, the plateau, its tie-break scores and every setting's median."""
    medians = np.median(scores, axis=1)
    if not np.isfinite(medians).any():
        raise ValueError(f"{method.name}: no setting of {_grid_text(method)} gives a finite "
                         "median score; try smaller rates.")
    plateau = np.flatnonzero(medians <= np.min(medians) + method.resolution)
    _refuse_an_edge(method, plateau)
    tiebreak = np.array([_secondary(method, settings[i], scores[i], seeds) for i in plateau])
    still_tied = plateau[tiebreak == np.min(tiebreak)] if np.isfinite(tiebreak).any() \
        else plateau
    return int(still_tied[len(still_tied) // 2]), plateau, tiebreak, medians


def _finer_rates(method, best):
    """The rate axis with midpoints where a neighbour of the best is more than ``step`` away."""
    axes = method.axes
    if method.step is None or "rate" not in axes or len(axes["rate"]) < 2:
        return None
    rates = axes["rate"]
    at = rates.index(best if method.grid is None else best["rate"])
    added = [midpoint(rates[at], rates[j]) for j in (at - 1, at + 1)
             if 0 <= j < len(rates) and max(rates[j], rates[at]) / min(rates[j], rates[at])
             > method.step * (1 + 1e-9)]
    added = [r for r in added if r not in rates]
    return None if not added else rates + added


def midpoint(a, b):
    """The geometric midpoint of two rates, rounded to the nearest float32 (exact in Keras)."""
    return float(np.float32(math.sqrt(a * b)))


def denser(method, best):
    """``method`` with its rates twice as dense around ``best``: the density check.

    Adds the geometric midpoint of each of the four gaps nearest the best
    rate (two on each side, where the grid has them) and sweeps that grid
    as given (``step=None``).  A verdict that changes when every method is
    swept on such a grid was decided by the grid, not by the methods.
    Taught on the page "How the book decides".
    """
    rates = method.axes["rate"]
    at = rates.index(best if method.grid is None else best["rate"])
    gaps = [(rates[j], rates[j + 1]) for j in range(max(0, at - 2), min(len(rates) - 1, at + 2))]
    return dataclasses.replace(method.with_rates(rates + [midpoint(a, b) for a, b in gaps]),
                               step=None)


def _secondary(method, setting, scores, seeds):
    """The tie-break of one setting: the mean secondary score, or the mean score (inf if one is)."""
    if method.secondary is not None:
        scores = scores_as_array(method.secondary(setting, seeds), seeds)
    return float(np.mean(scores))


def _refuse_an_edge(method, plateau):
    """Raise if a setting of the plateau sits at an end of a swept knob that is not a limit."""
    axes, limits = method.axes, method.limits or {}
    shape = [len(values) for values in axes.values()]
    for index in plateau:
        position = np.unravel_index(index, shape)
        for (knob, values), at in zip(axes.items(), position):
            if len(values) == 1 or values[at] in limits.get(knob, ()):
                continue
            if at in (0, len(values) - 1):
                side = "smaller" if at == 0 else "larger"
                one, many = ("rate", "rates") if method.grid is None else (
                    f"value of {knob}", f"values of {knob}")
                tied = "" if len(plateau) == 1 else (
                    f" (its median ties with the lowest"
                    f"{f' within {method.resolution:g}' if method.resolution else ''}: "
                    f"{len(plateau)} settings tie; or score at a finer resolution)")
                raise ValueError(f"{method.name}: the {'tied' if tied else 'best'} {one} "
                                 f"{values[at]:g} is at the edge of the grid {_grid_text(method)}"
                                 f"{tied}; add {side} {many} so that the optimum lies inside it.")


def _grid_text(method):
    axes = method.axes
    return str(axes["rate"]) if method.grid is None else str(axes)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Per-seed ``scores`` of every method at its ``rates`` (best swept, or None), and the sweeps."""

    seeds: np.ndarray
    scores: dict
    rates: dict
    sweeps: dict

    def compare(self, first, second, alpha=ALPHA, min_seeds=MIN_SEEDS, floor=FLOOR):
        """:func:`compare` of two of this experiment's methods."""
        return compare(self.scores[first], self.scores[second], first, second, alpha, min_seeds,
                       floor)


def run_experiment(methods, seeds, tuning_seeds=None, density=1):
    """Every method at the best setting of its own sweep, on ``seeds``; returns an :class:`Experiment`.

    Methods with a grid are swept on ``tuning_seeds`` (default: as many
    seeds again, following ``seeds``), then run on ``seeds``.  With
    ``density=2``, each method's rates are then swept again twice as dense
    around its optimum (:func:`denser`): the density check.  Taught in
    the chapters "Asynchronous training" and "Sync vs async in the same time".
    """
    density = checks.check_choice("density", density, (1, 2))
    seeds = checks.check_seeds(seeds, distinct=True)
    if tuning_seeds is None:
        tuning_seeds = np.arange(seeds.max() + 1, seeds.max() + 1 + len(seeds))
    tuning_seeds = checks.check_seeds(tuning_seeds, distinct=True)
    names = [method.name for method in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must differ, got {names}.")
    scores, rates, sweeps = {}, {}, {}
    for method in methods:
        if method.rates is not None or method.grid is not None:
            sweeps[method.name] = sweep(method, tuning_seeds)
            if density == 2 and "rate" in method.axes:
                sweeps[method.name] = sweep(denser(method.with_rates(
                    list(np.ravel(sweeps[method.name].rates)) if method.grid is None
                    else [s["rate"] for s in sweeps[method.name].rates]),
                    sweeps[method.name].best), tuning_seeds)
            rates[method.name] = sweeps[method.name].best
        else:
            rates[method.name] = None
        scores[method.name] = scores_as_array(method.run(rates[method.name], seeds), seeds)
    return Experiment(seeds, scores, rates, sweeps)


def paired_counts(first_scores, second_scores):
    """``(wins, losses, ties)``: seeds where the first scored lower, the second, neither.

    Lower is better; ``nan`` (a diverged run) counts as ``inf``, and two
    ``inf`` tie.
    """
    a, b = _paired(first_scores, second_scores)
    wins, losses = int(np.sum(a < b)), int(np.sum(b < a))
    return wins, losses, len(a) - wins - losses


def log_ratios(first_scores, second_scores):
    """Per seed, ``log(first / second)``: 0 for a tie, ``-inf`` where only the second diverged.

    With a negative score (a ratio means nothing there), the differences
    ``first - second`` instead.  Below 0: the first did better.
    """
    a, b = _paired(first_scores, second_scores)
    with np.errstate(divide="ignore", invalid="ignore"):
        if np.any(a < 0) or np.any(b < 0):
            return np.where(a == b, 0.0, a - b)
        return np.where(a == b, 0.0, np.log(a) - np.log(b))


def signed_rank_test(first_scores, second_scores):
    """Exact two-sided Wilcoxon signed-rank test on :func:`log_ratios`; ``(lean, p)``.

    Tied seeds are dropped; the others are ranked by the size of their
    log-ratio (equal sizes share their mean rank; a diverged run against a
    finished one is the largest).  ``lean`` is +1 when the seeds where the
    first did better carry more rank than the others, -1 the reverse, 0
    when they carry the same.  ``p`` is the exact probability, if each
    seed's sign were a fair coin, of rank sums at least this uneven.
    Taught on the page "How the book decides".
    """
    d = log_ratios(first_scores, second_scores)
    d = d[d != 0]
    if len(d) == 0:
        return 0, 1.0
    size = np.abs(d)
    order = np.argsort(size, kind="stable")
    ranks = np.empty(len(d))
    ranks[order] = np.arange(1, len(d) + 1)
    for value in np.unique(size):   # equal sizes share their mean rank
        ranks[size == value] = ranks[size == value].mean()
    doubled = np.rint(2 * ranks).astype(int)  # whole numbers: mean ranks are halves at worst
    better, worse = int(doubled[d < 0].sum()), int(doubled[d > 0].sum())
    counts = np.zeros(doubled.sum() + 1)      # the null distribution of one rank sum
    counts[0] = 1.0
    for r in doubled:                         # each seed's rank joins the sum or not, 1:1
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:len(counts) - r]
        counts = 0.5 * (counts + shifted)
    p = float(min(1.0, 2.0 * counts[:min(better, worse) + 1].sum()))
    return int(np.sign(better - worse)), p


def effect_size(first_scores, second_scores):
    """The median of the ratios first / second over the seeds where they differ.

    Below 1: the first does better on a typical seed where the two differ.
    Tied seeds do not enter (a lead on every seed that differs is never
    diluted by ties); with no seed differing, 1.  A diverged first against
    a finished second counts as ``inf``, the reverse as 0.  ``nan`` when a
    score is negative (a ratio means nothing there).  Taught on the page
    "How the book decides".
    """
    a, b = _paired(first_scores, second_scores)
    if np.any(a < 0) or np.any(b < 0):
        return math.nan
    differ = a != b
    if not differ.any():
        return 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.median(a[differ] / b[differ]))


def tuning_margin(spread, set_sizes, tuning_sd, alpha=ALPHA):
    """The median log-ratio a lead must pass when the tuning draw moves each set's median.

    ``z(1 - alpha/2) x sqrt(SE**2 + tuning_sd**2 / sets)``, with ``SE`` the
    seed standard error of the pooled median (1.2533 x ``spread`` /
    sqrt(seeds)) and ``tuning_sd`` the standard deviation the draw of tuning
    seeds adds to each set's median log-ratio: the part of a lead that the
    tuning alone could make.  0 without tuning noise (the signed-rank test
    then decides alone).  Taught on the page "How the book decides".
    """
    if not tuning_sd:
        return 0.0
    if not (math.isfinite(spread) and math.isfinite(tuning_sd)):
        return math.inf
    error = 1.2533 * spread / math.sqrt(sum(set_sizes))
    z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
    return z * math.sqrt(error ** 2 + tuning_sd ** 2 / len(set_sizes))


def _decide(first, second, p, lean, effect, leans, alpha, floor, power=math.nan, margin=0.0):
    """The verdict text of :data:`RULE` and :data:`UNDECIDED` from the test, effect, leans, power,
    and the :func:`tuning_margin` a lead must pass."""
    agreed = lean != 0 and all(each == lean for each in leans)
    within = not math.isnan(effect) and abs(effect - 1) <= floor * (1 + 1e-12)
    same_side = math.isnan(effect) or (effect < 1) == (lean > 0)
    if margin and not (effect > 0 and abs(math.log(effect)) > margin):
        agreed = False    # a lead the tuning alone could make: undecided
    if p < alpha and agreed and within:
        return NEGLIGIBLE
    if p < alpha and agreed and same_side:
        return f"{first} ahead" if lean > 0 else f"{second} ahead"
    if math.isnan(effect):   # differences, not ratios: no power at a ratio to quote
        return TOO_FEW if agreed and same_side else NO_DIFFERENCE
    close = 1 / EFFECT <= effect <= EFFECT
    if close and power >= MIN_POWER:
        return NO_DIFFERENCE
    return CLOSE if close else TOO_FEW


def robust_spread(log_ratios_by_set):
    """The spread of per-seed log-ratios: 1.4826 x their median distance from their set's median.

    One array a seed set; each set's seeds are measured about that set's
    own median, so that a shift between the sets (the tuning) does not
    count as seed noise.  Tied seeds (0) stay in; a diverged run (an
    infinite log-ratio) is one far seed.  ``inf`` when half the seeds or
    more are infinite.  Taught on the page "How the book decides".
    """
    gaps = []
    for d in log_ratios_by_set:
        d = np.asarray(d, float)
        finite = d[np.isfinite(d)]
        centre = np.median(finite) if len(finite) else 0.0
        gaps.append(np.where(np.isfinite(d), np.abs(d - centre), np.inf))
    gaps = np.concatenate(gaps) if gaps else np.array([])
    return float(1.4826 * np.median(gaps)) if len(gaps) else math.nan


def tuning_shift(log_ratios_by_set):
    """The largest gap between the seed sets' median log-ratios: how far the tuning moved them."""
    medians = [float(np.median(np.asarray(d, float))) for d in log_ratios_by_set]
    if len(medians) < 2 or not np.all(np.isfinite(medians)):
        return math.nan
    return max(medians) - min(medians)


def median_ratio_interval(first_scores, second_scores, level=0.95, resamples=2000, seed=0):
    """A bootstrap interval of :func:`effect_size`: the seeds that differ resampled ``resamples`` times.

    ``(low, high)``; ``(1, 1)`` when no seed differs, ``nan`` when a score
    is negative.  Taught on the page "How the book decides".
    """
    a, b = _paired(first_scores, second_scores)
    if np.any(a < 0) or np.any(b < 0):
        return (math.nan, math.nan)
    differ = a != b
    if not differ.any():
        return (1.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = a[differ] / b[differ]
    rng = np.random.default_rng(seed)
    medians = np.median(ratios[rng.integers(0, len(ratios), (resamples, len(ratios)))], axis=1)
    low, high = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return (float(low), float(high))


def format_interval(interval):
    """A ratio's interval for the page: "95 % interval 0.91 to 1.1"."""
    low, high = interval
    return f"95 % interval {format_ratio(low)} to {format_ratio(high)}"


def compare(first_scores, second_scores, first="A", second="B", alpha=ALPHA, min_seeds=MIN_SEEDS,
            floor=FLOOR, leans=None, set_sizes=None, tuning_sd=0.0):
    """The verdict of :data:`RULE` on two methods' paired per-seed scores; a :class:`Verdict`.

    ``leans`` lists each seed set's own lean (see :func:`signed_rank_test`)
    when the scores pool several sets (:func:`replicated` passes them), and
    ``set_sizes`` their seeds, in order.  An undecided comparison is worded
    by :data:`UNDECIDED`: its spread (:func:`robust_spread`) gives the
    rule's power at :data:`EFFECT` (:func:`rule_power`), which the verdict
    carries with the interval of its median ratio.  ``tuning_sd``: the
    standard deviation the draw of tuning seeds adds to each set's median
    log-ratio, which the power then includes, and which a lead must pass
    (:func:`tuning_margin`): without it, a lucky draw reads as evidence.
    Raises ``ValueError`` with fewer than ``min_seeds`` seeds: the rule's
    power (see :func:`rule_power`) needs them.  Taught in the chapter
    "Asynchronous training".
    """
    alpha = checks.check_share("alpha", alpha, strict=True)
    min_seeds = checks.check_whole_number("min_seeds", min_seeds)
    a, b = _paired(first_scores, second_scores)
    if len(a) < min_seeds:
        raise ValueError(f"a verdict needs at least {min_seeds} paired seeds, got {len(a)}; run "
                         "more seeds, or pool two seed sets, each tuned on its own seeds "
                         "(experiments.replicate).")
    floor = checks.check_share("floor", floor, advice="Pass 0.02 for a 2 % floor, 0 for none.")
    wins, losses, ties = paired_counts(a, b)
    lean, p = signed_rank_test(a, b)
    effect = effect_size(a, b)
    set_sizes = (len(a),) if set_sizes is None else tuple(int(n) for n in set_sizes)
    if sum(set_sizes) != len(a):
        raise ValueError(f"set_sizes {set_sizes} must add up to the {len(a)} paired seeds.")
    d = log_ratios(a, b)
    by_set = np.split(d, np.cumsum(set_sizes)[:-1])
    spread = math.nan if np.any(a < 0) or np.any(b < 0) else robust_spread(by_set)
    power = power_at(spread, set_sizes, alpha, floor, tuning_sd)
    verdict = _decide(first, second, p, lean, effect, [lean] if leans is None else leans,
                      alpha, floor, power, tuning_margin(spread, set_sizes, tuning_sd, alpha))
    return Verdict(first, second, wins, losses, ties, p, verdict, effect, floor, lean,
                   tuple(a), tuple(b), spread, power, median_ratio_interval(a, b),
                   tuning_shift(by_set), set_sizes, float(tuning_sd))


def power_at(spread, set_sizes, alpha=ALPHA, floor=FLOOR, tuning_sd=0.0, effect=1 / EFFECT,
             null="normal"):
    """:func:`rule_power` at ``effect`` (:data:`EFFECT`) for this spread, these seed sets and this
    tuning noise (cached); nan if unknown.  ``effect=1`` gives the false "ahead" rate."""
    if math.isnan(spread) or math.isnan(tuning_sd):
        return math.nan
    if not math.isfinite(spread) or not math.isfinite(tuning_sd):
        return 0.0 if effect != 1 else 1.0
    return _power_cached(round(max(spread, 1e-3), 3), tuple(set_sizes), alpha, floor,
                         round(tuning_sd, 3), effect, null)


@functools.lru_cache(maxsize=4096)
def _power_cached(spread, set_sizes, alpha, floor, tuning_sd, effect, null):
    return rule_power(effect, set_sizes, spread, runs=2000, seed=0, alpha=alpha, floor=floor,
                      null=null, tuning_sd=tuning_sd)


@dataclasses.dataclass(frozen=True)
class Replicated:
    """A verdict on two seed sets pooled: the ``page``'s, the ``held_out`` one's, and ``pooled``."""

    page: Verdict
    held_out: Verdict
    pooled: Verdict

    @property
    def verdict(self):
        return self.pooled.verdict

    @property
    def text(self):
        return self.pooled.text

    @property
    def first(self):
        return self.page.first

    @property
    def second(self):
        return self.page.second

    def __str__(self):
        return (f"{self.pooled} (page seeds {self.page.wins}-{self.page.losses}, held-out seeds "
                f"{self.held_out.wins}-{self.held_out.losses})")


def replicated(page, held_out, alpha=ALPHA, min_seeds=MIN_SEEDS, floor=FLOOR, tuning_sd=0.0):
    """The verdict of :data:`RULE` on two :class:`Verdict` of the same pair, pooled.

    Each set was tuned on its own seeds; the test runs over all their seeds
    together, and each set must lean the way the pooled test does.
    """
    if (page.first, page.second) != (held_out.first, held_out.second):
        raise ValueError(f"both verdicts must compare the same pair, got {page.first!r} vs "
                         f"{page.second!r} and {held_out.first!r} vs {held_out.second!r}.")
    if not page.first_scores or not held_out.first_scores:
        raise ValueError("replicated() needs verdicts made by experiments.compare (they carry "
                         "their per-seed scores).")
    pooled = compare(page.first_scores + held_out.first_scores,
                     page.second_scores + held_out.second_scores, page.first, page.second,
                     alpha, min_seeds, floor, leans=[page.lean, held_out.lean],
                     set_sizes=(page.seeds, held_out.seeds), tuning_sd=tuning_sd)
    return Replicated(page, held_out, pooled)


SPREAD = 0.5   # the spread (standard deviation) of the per-seed log-ratio rule_power assumes


@functools.lru_cache(maxsize=None)
def _rank_sum_tail(n):
    """P(W <= w) for w = 0 .. n(n+1)/2: the null distribution of one signed-rank sum of n seeds."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:len(counts) - r]
        counts = 0.5 * (counts + shifted)
    return np.cumsum(counts)


def _simulated_verdicts(d, set_sizes, alpha, floor, tuning_sd=0.0):
    """The rule on simulated log-ratios ``d`` (runs, seeds), no ties: +1 first ahead, -1 second, 0.

    With ``tuning_sd``, a lead must also pass each run's :func:`tuning_margin`."""
    def rank_sums(x):
        ranks = np.argsort(np.argsort(np.abs(x), axis=1), axis=1) + 1
        better = np.where(x < 0, ranks, 0).sum(axis=1)
        return better, x.shape[1] * (x.shape[1] + 1) // 2 - better
    better, worse = rank_sums(d)
    p = np.minimum(1.0, 2 * _rank_sum_tail(d.shape[1])[np.minimum(better, worse)])
    lean = np.sign(better - worse)
    agreed = lean != 0
    for part in np.split(d, np.cumsum(set_sizes)[:-1], axis=1):
        b, w = rank_sums(part)
        agreed &= np.sign(b - w) == lean
    effect = np.exp(np.median(d, axis=1))
    within = np.abs(effect - 1) <= floor * (1 + 1e-12)
    same_side = (effect < 1) == (lean > 0)
    if tuning_sd:
        parts = np.split(d, np.cumsum(set_sizes)[:-1], axis=1)
        gaps = np.concatenate([np.abs(x - np.median(x, axis=1, keepdims=True)) for x in parts],
                              axis=1)
        spread = 1.4826 * np.median(gaps, axis=1)
        error = 1.2533 * spread / np.sqrt(d.shape[1])
        z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
        margin = z * np.sqrt(error ** 2 + tuning_sd ** 2 / len(set_sizes))
        agreed &= np.abs(np.log(effect)) > margin
    return np.where((p < alpha) & agreed & same_side & ~within, lean, 0)


def rule_power(effect, seeds=(30, 30), spread=SPREAD, runs=2000, seed=0, alpha=ALPHA,
               floor=FLOOR, null="normal", tuning_sd=0.0):
    """How often :data:`RULE` says "ahead" when each seed's ratio is ``effect`` times noise.

    Simulates ``runs`` comparisons of seed sets of ``seeds`` paired seeds
    each (pooled as :func:`replicated` pools them), every seed's log-ratio
    drawn about ``log(effect)`` with robust spread ``spread``, and returns
    the share whose verdict is "ahead": the first ahead for ``effect < 1``
    (the rule's *power*), either ahead for ``effect == 1`` (its false
    "ahead" rate).  ``null="normal"`` draws normal noise; ``"skewed"``
    draws ``spread * (exp(z) - 1)`` (z standard normal), noise whose median
    is 0 but which is not symmetric: the signed-rank test asks about
    symmetry, so there it says "ahead" more often.  ``tuning_sd`` adds to
    each seed set one normal offset of that standard deviation, shared by
    its seeds: the tuning draw moving the whole set; a lead must then also
    pass its :func:`tuning_margin`, as :func:`compare` asks.  The simulation runs the
    rule itself, vectorised (exact signed-rank tails; continuous draws do
    not tie).  Each comparison's verdict uses its own measured spread
    (:func:`power_at`).  Taught on the page "How the book decides".
    """
    checks.check_positive("effect", effect)
    seeds = [checks.check_whole_number("seeds", n) for n in seeds]
    checks.check_positive("spread", spread)
    if not (isinstance(tuning_sd, (int, float)) and tuning_sd >= 0):
        raise ValueError(f"tuning_sd must be a standard deviation (0 or more), got {tuning_sd!r}.")
    null = checks.check_choice("null", null, ("normal", "skewed"))
    runs = checks.check_whole_number("runs", runs)
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.0, (runs, sum(seeds)))
    if null == "normal":
        noise = spread * z
    else:   # median 0, robust spread about ``spread``, a long right tail
        noise = spread * np.expm1(z)
    if tuning_sd:
        offsets = rng.normal(0.0, tuning_sd, (runs, len(seeds)))
        noise = noise + np.repeat(offsets, seeds, axis=1)
    said = _simulated_verdicts(math.log(effect) + noise, seeds, alpha, floor, tuning_sd)
    wanted = (said != 0) if effect == 1 else (said == (1 if effect < 1 else -1))
    return float(np.mean(wanted))


def holm(p_values):
    """Holm's step-down adjustment of ``p_values``: compare each adjusted p with the level.

    With m p-values sorted rising, the k-th is multiplied by m - k + 1 and
    the running maximum taken: any set of verdicts the adjusted values keep
    below ``ALPHA`` holds a false one with probability at most ``ALPHA``.
    Taught on the page "How the book decides".
    """
    p = np.asarray(p_values, float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return adjusted


FAMILY_FILE = "stated_verdicts.json"   # in pargrad/book/data, by tools/measure_stated_verdicts.py


def statement_key(page, *statement):
    """The registry's name of one stated verdict: "page | first | second | ..." (targets as %)."""
    parts = [f"{part:.0%}" if isinstance(part, float) else str(part) for part in statement]
    return " | ".join([page] + parts)


@functools.lru_cache(maxsize=None)
def _registry():
    import json
    import pathlib
    return json.loads((pathlib.Path(__file__).parent / "data" / FAMILY_FILE).read_text())


def stated_family():
    """The book's registry of stated verdicts: key -> (p-value, Holm-adjusted p-value)."""
    return {row["key"]: (row["p"], row["holm"]) for row in _registry()["verdicts"]}


def third_set_checks():
    """The stated verdicts also decided on a third seed set: key -> (its p-value, the method
    its seeds lean to, "" for neither)."""
    return {row["key"]: (row["third"]["p"], row["third"]["leader"])
            for row in _registry()["verdicts"] if "third" in row}


def corrected(verdict, key, alpha=ALPHA):
    """``verdict`` after Holm's correction over the book's stated verdicts (:func:`stated_family`)
    and its third seed set, where one was run (:func:`third_set_checks`).

    An "ahead" whose adjusted p-value is not below ``alpha``, or that a
    third seed set does not repeat (p below ``alpha``, leaning the same
    way), is undecided: a close call, or too few seeds to tell where its
    median ratio lies beyond :data:`EFFECT`.  Works on a :class:`Verdict`
    or a :class:`Replicated`; raises for a key the registry lacks.  Taught
    on the page "How the book decides".
    """
    family = stated_family()
    if key not in family:
        raise ValueError(f"{key!r} is not in the registry of stated verdicts; run "
                         f"tools/measure_stated_verdicts.py after adding it to its list.")
    pooled = verdict.pooled if isinstance(verdict, Replicated) else verdict
    third = third_set_checks().get(key)
    repeated = third is None or (third[0] < alpha and pooled.verdict == f"{third[1]} ahead")
    if not pooled.verdict.endswith(" ahead") or (family[key][1] < alpha and repeated):
        return verdict
    words = CLOSE if 1 / EFFECT <= pooled.effect <= EFFECT else TOO_FEW
    demoted = dataclasses.replace(pooled, verdict=words)
    return dataclasses.replace(verdict, pooled=demoted) if isinstance(verdict, Replicated) \
        else demoted


def family_phrase(key):
    """A stated verdict's p-value after Holm's correction, as prose quotes it: "adjusted p = 0.29"."""
    return f"adjusted {p_phrase(stated_family()[key][1])}"


@dataclasses.dataclass(frozen=True)
class Replication:
    """The same methods on the page's seeds and on held-out seeds: two :class:`Experiment`."""

    page: Experiment
    held_out: Experiment

    def compare(self, first, second, alpha=ALPHA, min_seeds=MIN_SEEDS, floor=FLOOR,
                tuning_sd=0.0):
        """The :class:`Replicated` verdict of two of the methods, over both seed sets."""
        return replicated(self.page.compare(first, second, alpha, 1, floor),
                          self.held_out.compare(first, second, alpha, 1, floor),
                          alpha, min_seeds, floor, tuning_sd)


def replicate(methods, seeds, tuning_seeds, held_out_seeds, held_out_tuning_seeds, density=1):
    """:func:`run_experiment` on the page's seeds and again on held-out seeds; a :class:`Replication`.

    The held-out run sweeps every method again on its own tuning seeds, so
    that a verdict resting on one lucky choice of setting does not
    replicate.  The four seed sets must not share a seed.  Taught on the
    page "How the book decides".
    """
    sets = [checks.check_seeds(s, distinct=True)
            for s in (seeds, tuning_seeds, held_out_seeds, held_out_tuning_seeds)]
    for (i, a), (j, b) in itertools.combinations(enumerate(sets), 2):
        if np.intersect1d(a, b).size:
            names = ["seeds", "tuning_seeds", "held_out_seeds", "held_out_tuning_seeds"]
            raise ValueError(f"{names[i]} and {names[j]} share the seeds "
                             f"{np.intersect1d(a, b).tolist()}; held-out seeds must be new.")
    return Replication(run_experiment(methods, sets[0], sets[1], density),
                       run_experiment(methods, sets[2], sets[3], density))


def last_quarter_mean(curves, axis=0, times=None, budget=None):
    """The mean of each curve over the last quarter of its points: one robust score a curve.

    ``curves`` holds one loss curve a seed along ``axis`` (time first by
    default: ``(points, seeds)``).  Where a run's final point oscillates
    (the outer momentum of DiLoCo), its last value depends on where the
    oscillation stands; the mean over the last quarter does not.  A curve
    with a non-finite point in its last quarter (it diverged) scores
    ``inf``.

    With ``times`` (when each point was reached, rising, the first at the
    start) and ``budget`` (the end of the run), the quarter is one of time,
    not of points: the loss a run holds at each moment of the last quarter
    of ``budget``, averaged over that time.  Runs that reach their points at
    different rates (a round of local SGD against one asynchronous update)
    are then scored over the same stretch of time.  Taught on the page "How
    the book decides".
    """
    curves = np.moveaxis(np.asarray(curves, float), axis, 0)
    if curves.ndim == 0 or len(curves) == 0:
        raise ValueError(f"curves must hold at least one point a curve, got shape "
                         f"{np.shape(curves)}.")
    if (times is None) != (budget is None):
        raise ValueError("pass times and budget together (a quarter of time), or neither "
                         "(a quarter of the points).")
    if times is None:
        tail = curves[len(curves) - max(1, len(curves) // 4):]
        with np.errstate(invalid="ignore"):
            means = np.mean(tail, axis=0)
        return np.where(np.all(np.isfinite(tail), axis=0), means, np.inf)
    times, start = np.asarray(times, float), 0.75 * float(budget)
    if times.shape != curves.shape[:1] or np.any(np.diff(times) < 0):
        raise ValueError(f"times must rise and hold one time a point ({len(curves)}), got "
                         f"{times.shape[0] if times.ndim else times!r} times; pass when each "
                         "point of the curves was reached.")
    if times[0] > start or times[-1] > budget:
        raise ValueError(f"the curves must start by {start:g} (three quarters of the budget) and "
                         f"end by the budget {budget:g}, got points from {times[0]:g} to "
                         f"{times[-1]:g}; include the starting point, drop points past the budget.")
    held = np.diff(np.clip(np.append(times, budget), start, budget))    # how long each point holds
    tail = curves[held > 0]
    with np.errstate(invalid="ignore"):
        means = np.tensordot(held[held > 0], tail, axes=1) / (budget - start)
    return np.where(np.all(np.isfinite(tail), axis=0), means, np.inf)


@dataclasses.dataclass(frozen=True)
class ResultsTable:
    """One results table: ``columns`` and ``rows`` of text; ``to_markdown()`` and a notebook view."""

    columns: tuple
    rows: tuple

    def to_markdown(self):
        """The table in Markdown (a pipe table)."""
        lines = ["| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in self.rows])

    def _repr_html_(self):
        cell = lambda tag, text: f"<{tag}>{html.escape(text)}</{tag}>"  # noqa: E731
        head = "".join(cell("th", c) for c in self.columns)
        body = "".join("<tr>" + "".join(cell("td", t) for t in row) + "</tr>" for row in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __str__(self):
        return self.to_markdown()


def results_table(result, reference, methods=None, family=None):
    """Per method: median score, ratio to ``reference``, wins out of N, verdict; a :class:`ResultsTable`.

    ``result`` is an :class:`Experiment` or a :class:`Replication`, whose
    columns then pool its two seed sets, as its verdicts do.  The ratio is
    :func:`effect_size` of the method against the reference.  ``methods``
    picks and orders the rows (default: every method).  ``family`` maps a
    method's name to its key in the registry of stated verdicts: its
    verdict is then the one after Holm's correction (:func:`corrected`).
    Taught on the page "How the book decides".
    """
    runs = [result.page, result.held_out] if isinstance(result, Replication) else [result]
    names = list(runs[0].scores) if methods is None else list(methods)
    for name in [reference] + names:
        checks.check_choice("method", name, list(runs[0].scores))
    rows = []
    for name in names:
        median = f"{np.median(np.concatenate([run.scores[name] for run in runs])):.3g}"
        if name == reference:
            rows.append((name, median, "1", "", "reference"))
            continue
        verdict = result.compare(name, reference)
        if family and name in family:
            verdict = corrected(verdict, family[name])
        pooled = verdict.pooled if isinstance(verdict, Replicated) else verdict
        rows.append((name, median, format_ratio(pooled.effect),
                     f"{pooled.wins} of {pooled.seeds}", pooled.text))
    columns = ("method", "median", f"ratio to {reference}", f"wins vs {reference}", "verdict")
    return ResultsTable(columns, tuple(rows))


def p_phrase(p):
    """A p-value as prose quotes it: "p = 0.0012", or "p < 1e-4"."""
    text = format_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def format_p(p):
    """A p-value for the page: two significant digits, or an upper bound below 1e-4."""
    return f"{p:.2g}" if p >= 1e-4 else "< 1e-4"


def format_ratio(ratio):
    """An effect size for the page: three significant digits (``nan`` as "n/a")."""
    return "n/a" if math.isnan(ratio) else f"{ratio:.3g}"


def _paired(first_scores, second_scores):
    """Two 1-d float arrays of the same length, ``nan`` (diverged) as ``inf``."""
    a, b = np.asarray(first_scores, float), np.asarray(second_scores, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores need two 1-d arrays of the same length, got shapes "
                         f"{a.shape} and {b.shape}.")
    return np.where(np.isnan(a), np.inf, a), np.where(np.isnan(b), np.inf, b)
