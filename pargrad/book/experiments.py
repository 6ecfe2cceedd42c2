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
   that touches an end of the grid is "at the edge": the sweep raises.
3. :func:`run_experiment` runs every method at its own best setting on
   *other* seeds (so that picking the setting does not flatter it).
4. :func:`compare` applies :data:`RULE`: an exact two-sided sign test over
   the paired seeds, with the effect size (the median of the per-seed
   ratios) beside it; a lead below :data:`FLOOR` is "negligible".
5. :func:`replicate` runs it all twice, on the page's seeds and on held-out
   seeds with their own tuning seeds; a verdict stands only if both agree
   (:data:`REPLICATION_RULE`), else it is "not shown".
6. :func:`last_quarter_mean` is the robust score of a loss curve that
   oscillates, and :func:`results_table` is the one table a chapter shows.

The runs themselves come from the caller: vectorised NumPy replicas of the
trainers (:mod:`pargrad.book.parabola_async`) where thousands of runs are
needed, the trainers themselves where a few are.
"""

import dataclasses
import html
import itertools
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from pargrad import checks

ALPHA = 0.05      # the sign test's level
MIN_SEEDS = 20    # the fewest paired seeds a verdict may rest on
FLOOR = 0.02      # a lead whose median per-seed ratio is within 2 % of 1 is negligible
RULE = (f"A is ahead of B when, over at least {MIN_SEEDS} paired seeds, A scores better than B "
        f"in more seeds than B does better than A, an exact two-sided sign test over the "
        f"seeds that differ gives p < {ALPHA}, and the median of the per-seed ratios A / B "
        f"is more than {FLOOR * 100:g} % away from 1 (closer, the difference is negligible); "
        f"otherwise no difference is shown.")
REPLICATION_RULE = ("A verdict stands only if it holds both on the page's seeds and on held-out "
                    "seeds, each set with its own tuning seeds and its own sweep; a lead both "
                    "sets show the same way, but below the floor on one or both, is negligible; "
                    "anything else is not shown.")
NOT_SHOWN = "not shown"
NEGLIGIBLE = "negligible"
NO_DIFFERENCE = "no difference shown"


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
    Taught in the chapter "Asynchronous training".
    """

    name: str
    run: Callable[[object, np.ndarray], np.ndarray]
    rates: Sequence[float] = None
    grid: Mapping[str, Sequence[float]] = None
    resolution: float = 0.0
    secondary: Callable[[object, np.ndarray], np.ndarray] = None
    limits: Mapping[str, Sequence[float]] = None

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
    the plateau, the lowest of which was taken.
    """

    method: str
    rates: object
    medians: np.ndarray
    scores: np.ndarray  # (settings, tuning seeds)
    best: object
    plateau: tuple = ()
    tiebreak: tuple = ()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A paired comparison of two methods' per-seed scores under :data:`RULE`."""

    first: str
    second: str
    wins: int      # seeds where ``first`` scored lower (better)
    losses: int    # seeds where ``second`` scored lower
    ties: int
    p_value: float
    verdict: str   # "<first> ahead", "<second> ahead", "negligible" or "no difference shown"
    effect: float = math.nan   # median over the seeds of first / second
    floor: float = FLOOR

    @property
    def seeds(self):
        return self.wins + self.losses + self.ties

    def __str__(self):
        return (f"{self.first} vs {self.second}: better in {self.wins} of {self.seeds} seeds, "
                f"worse in {self.losses}, tied in {self.ties}; sign test p = "
                f"{format_p(self.p_value)}, median ratio {format_ratio(self.effect)} "
                f"-> {self.verdict}")


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
    :class:`Method`), then to the middle of what still ties.  Raises
    ``ValueError`` when no setting has a finite median, or when the plateau
    touches an end of any swept knob (not a declared limit): extend the
    grid.  Taught in the chapter "Asynchronous training".
    """
    if method.rates is None and method.grid is None:
        raise ValueError(f"Method {method.name!r} has no rates to sweep; give it rates=[...].")
    seeds = checks.check_seeds(seeds, distinct=True)
    settings = method.settings()
    scores = np.array([scores_as_array(method.run(setting, seeds), seeds)
                       for setting in settings])
    medians = np.median(scores, axis=1)
    if not np.isfinite(medians).any():
        raise ValueError(f"{method.name}: no setting of {_grid_text(method)} gives a finite "
                         "median score; try smaller rates.")
    plateau = np.flatnonzero(medians <= np.min(medians) + method.resolution)
    _refuse_an_edge(method, plateau)
    tiebreak = np.array([_secondary(method, settings[i], scores[i], seeds) for i in plateau])
    still_tied = plateau[tiebreak == np.min(tiebreak)] if np.isfinite(tiebreak).any() \
        else plateau
    best = int(still_tied[len(still_tied) // 2])
    rates = np.asarray(settings, float) if method.grid is None else settings
    return Sweep(method.name, rates, medians, scores, settings[best],
                 tuple(settings[i] for i in plateau), tuple(float(t) for t in tiebreak))


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


def run_experiment(methods, seeds, tuning_seeds=None):
    """Every method at the best setting of its own sweep, on ``seeds``; returns an :class:`Experiment`.

    Methods with a grid are swept on ``tuning_seeds`` (default: as many
    seeds again, following ``seeds``), then run on ``seeds``.  Taught in
    the chapters "Asynchronous training" and "Sync vs async in the same time".
    """
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
    a, b = _paired(first_scores, second_scores)
    wins, losses = int(np.sum(a < b)), int(np.sum(b < a))
    ties = len(a) - wins - losses
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return wins, losses, ties, 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return wins, losses, ties, float(min(1.0, 2.0 * tail))


def effect_size(first_scores, second_scores):
    """The median over the paired seeds of the ratio first / second (below 1: the first is better).

    A seed where both score the same (two ``inf`` included) counts as 1; a
    diverged first against a finished second as ``inf``, the reverse as 0.
    The median of per-seed ratios, not the ratio of the medians: it pairs
    the seeds as the sign test does, it is below 1 exactly when the first
    does better on most seeds, and one wild seed cannot move it.  ``nan``
    when a score is negative (a ratio means nothing there).  Taught on the
    page "How the book decides".
    """
    a, b = _paired(first_scores, second_scores)
    if np.any(a < 0) or np.any(b < 0):
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(a == b, 1.0, a / b)
    return float(np.median(ratios))


def compare(first_scores, second_scores, first="A", second="B", alpha=ALPHA, min_seeds=MIN_SEEDS,
            floor=FLOOR):
    """The verdict of :data:`RULE` on two methods' paired per-seed scores; a :class:`Verdict`.

    A significant lead whose :func:`effect_size` lies within ``floor`` of 1
    (between ``1 / (1 + floor)`` and ``1 + floor``) is ``"negligible"``;
    with a ``nan`` effect (negative scores) the floor cannot apply.  Raises
    ``ValueError`` with fewer than ``min_seeds`` seeds: no verdict rests on
    a handful of runs.  Taught in the chapter "Asynchronous training".
    """
    alpha = checks.check_share("alpha", alpha, strict=True)
    min_seeds = checks.check_whole_number("min_seeds", min_seeds)
    count = len(np.asarray(first_scores).reshape(-1))
    if count < min_seeds:
        raise ValueError(f"a verdict needs at least {min_seeds} paired seeds, got {count}; "
                         "run more seeds.")
    floor = checks.check_share("floor", floor, advice="Pass 0.02 for a 2 % floor, 0 for none.")
    wins, losses, ties, p = sign_test(first_scores, second_scores)
    effect = effect_size(first_scores, second_scores)
    if not (p < alpha and wins != losses):
        verdict = NO_DIFFERENCE
    elif 1 / (1 + floor) < effect < 1 + floor:
        verdict = NEGLIGIBLE
    else:
        verdict = f"{first} ahead" if wins > losses else f"{second} ahead"
    return Verdict(first, second, wins, losses, ties, p, verdict, effect, floor)


@dataclasses.dataclass(frozen=True)
class Replicated:
    """A verdict under :data:`REPLICATION_RULE`: the ``page`` seeds' and the ``held_out`` seeds'."""

    page: Verdict
    held_out: Verdict
    verdict: str   # "<first> ahead", "<second> ahead", "negligible" or "not shown"

    @property
    def first(self):
        return self.page.first

    @property
    def second(self):
        return self.page.second

    def __str__(self):
        return (f"{self.first} vs {self.second}: {self.verdict} (page seeds: {self.page.wins}-"
                f"{self.page.losses}, ratio {format_ratio(self.page.effect)}, "
                f"{self.page.verdict}; held-out seeds: {self.held_out.wins}-"
                f"{self.held_out.losses}, ratio {format_ratio(self.held_out.effect)}, "
                f"{self.held_out.verdict})")


def replicated(page, held_out):
    """Combine two :class:`Verdict` of the same pair into a :class:`Replicated`.

    ``"<X> ahead"`` if both say it; ``"negligible"`` if both are
    significant the same way and at least one is negligible, or both are
    negligible; anything else is ``"not shown"``.
    """
    if (page.first, page.second) != (held_out.first, held_out.second):
        raise ValueError(f"both verdicts must compare the same pair, got {page.first!r} vs "
                         f"{page.second!r} and {held_out.first!r} vs {held_out.second!r}.")
    verdicts = {page.verdict, held_out.verdict}
    if len(verdicts) == 1 and page.verdict != NO_DIFFERENCE:
        return Replicated(page, held_out, page.verdict)
    same_way = np.sign(page.wins - page.losses) == np.sign(held_out.wins - held_out.losses)
    if NEGLIGIBLE in verdicts and NO_DIFFERENCE not in verdicts and same_way:
        return Replicated(page, held_out, NEGLIGIBLE)
    return Replicated(page, held_out, NOT_SHOWN)


@dataclasses.dataclass(frozen=True)
class Replication:
    """The same methods on the page's seeds and on held-out seeds: two :class:`Experiment`."""

    page: Experiment
    held_out: Experiment

    def compare(self, first, second, alpha=ALPHA, min_seeds=MIN_SEEDS, floor=FLOOR):
        """The :class:`Replicated` verdict of two of the methods."""
        return replicated(self.page.compare(first, second, alpha, min_seeds, floor),
                          self.held_out.compare(first, second, alpha, min_seeds, floor))


def replicate(methods, seeds, tuning_seeds, held_out_seeds, held_out_tuning_seeds):
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
    return Replication(run_experiment(methods, sets[0], sets[1]),
                       run_experiment(methods, sets[2], sets[3]))


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


def results_table(result, reference, methods=None):
    """Per method: median score, ratio to ``reference``, wins out of N, verdict; a :class:`ResultsTable`.

    ``result`` is an :class:`Experiment` (verdicts by :data:`RULE`) or a
    :class:`Replication` (verdicts by :data:`REPLICATION_RULE`, and the
    ratio and wins on both seed sets, page first).  The ratio is
    :func:`effect_size` of the method against the reference.  ``methods``
    picks and orders the rows (default: every method).  Taught on the page
    "How the book decides".
    """
    runs = [result.page, result.held_out] if isinstance(result, Replication) else [result]
    names = list(runs[0].scores) if methods is None else list(methods)
    for name in [reference] + names:
        checks.check_choice("method", name, list(runs[0].scores))
    rows = []
    for name in names:
        if name == reference:
            rows.append((name, _median_text(runs[0], name), "1", "", "reference"))
            continue
        verdicts = [run.compare(name, reference) for run in runs]
        verdict = verdicts[0].verdict if len(runs) == 1 else replicated(*verdicts).verdict
        rows.append((name, _median_text(runs[0], name),
                     " · ".join(format_ratio(v.effect) for v in verdicts),
                     " · ".join(f"{v.wins} of {v.seeds}" for v in verdicts), verdict))
    columns = ("method", "median", f"ratio to {reference}", f"wins vs {reference}", "verdict")
    return ResultsTable(columns, tuple(rows))


def _median_text(experiment, name):
    return f"{np.median(experiment.scores[name]):.3g}"


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
