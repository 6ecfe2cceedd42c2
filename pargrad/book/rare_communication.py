"""Communicating rarely, replayed: local SGD and DiLoCo on the y = x² network, for many seeds at once.

Taught in the chapter "Communicating rarely".  :class:`pargrad.LocalSGDTrainer`
runs one seed at a time on logical devices; a conclusion needs many seeds
and a swept learning rate for every method.  This module replays, in
float64 NumPy and vectorised over seeds, exactly what the trainer computes
on the chapter's problem:

* the y = x² question's 1-5-1 ``tanh`` network
  (:func:`pargrad.book.parabola.initial_weights` of each seed) on
  :data:`POINTS` evenly spaced points in a shuffled order
  (:func:`problem_data`), split into :data:`REPLICAS` contiguous shards as
  the trainer cuts a full batch: each replica gets a random quarter of the
  points (:func:`sorted_shards` gives each its own quarter of the x range
  instead, for the chapter's exercise on data that differ by replica);
* every round, each replica takes ``H`` full-shard steps of plain SGD from
  the shared parameters, the replicas' changes are averaged, and the outer
  step applies the average: :data:`AVERAGE` (SGD of rate 1: local SGD,
  model averaging) or :data:`NESTEROV` (DiLoCo's SGD with Nesterov
  momentum, rate 0.7 and momentum 0.9 as in Douillard et al. 2023).

:func:`final_losses` scores runs by their loss on all points after a
budget of local steps; :func:`losses_in_time` after a budget of virtual
time, charged as :class:`pargrad.LocalSGDHistory` charges it; and
:func:`async_losses_in_time` replays asynchronous SGD on the same shards and
the same clock with :mod:`pargrad.book.parabola_async`.  The chapter checks
the replay against the trainer on one seed.
"""

import dataclasses

import numpy as np

from pargrad import cost
from pargrad.book import parabola_async
from pargrad.book.parabola import parabola_data, parabola_model

POINTS = 48          # divides evenly over 1, 2, 3, 4, 6 and 8 replicas
REPLICAS = 4
HIDDEN = 5
AVERAGE = "average"
NESTEROV = "nesterov"
OUTERS = (AVERAGE, NESTEROV)
# DiLoCo's outer step (Douillard et al. 2023), as Keras keeps it: in float32.
OUTER_RATE = float(np.float32(0.7))
OUTER_MOMENTUM = float(np.float32(0.9))
PARAMETERS = HIDDEN + HIDDEN + HIDDEN + 1       # W1, b1, W2, b2 of the 1-5-1 network
PARAMETER_BYTES = 8 * PARAMETERS                # float64


# The chapter's experiments: the same settings for the chapter, its tool and its tests.
UPDATES = 1024                                  # local steps a replica, for every H
DIAL = (1, 4, 16, 64, 256)
GRID = tuple(2.0**k for k in range(-8, 0))      # powers of two: exact in Keras's float32 rate
TEST_SEEDS, TUNING_SEEDS = np.arange(20), np.arange(20, 40)
STEP_SECONDS = 1e-3                             # modelled compute of one local step (assumed)
FAST = cost.Link(5e-6, 600e9 / 2, "NVLink-class, inside a box")     # as the chapter on costs
SLOW = cost.Link(30e-3, 1e9 / 8, "between data centres")            # assumed orders of magnitude
SPEEDS = (1.0, 1.0, 1.0, 1 / 3)                 # one worker of four 3 times slower
LOCAL_STEPS = 16                                # H of local SGD and DiLoCo in the uneven race
SYNC_STEPS_IN_BUDGET = 256                      # the race's time: this many synchronous steps
STORED = "rare_communication_sweeps"


def problem_data(shuffled=True):
    """The chapter's data: :data:`POINTS` evenly spaced x in [-2, 2] and y = x², float64 columns.

    Shuffled once (a fixed permutation, seed 0), as a data loader would, so
    that the contiguous shards the trainer cuts are random subsets of the
    points; ``shuffled=False`` keeps them sorted by x, so that each shard is
    one stretch of the x range.
    """
    x, y = parabola_data(POINTS, dtype="float64")
    if not shuffled:
        return x, y
    order = np.random.default_rng(0).permutation(POINTS)
    return x[order], y[order]


# ----------------------------------------------------------------------------
# The replay
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class State:
    """Shared parameters ``weights`` (W1, b1, W2, b2, a seed axis first) and the outer ``buffer``.

    ``buffer`` is the outer optimizer's momentum (zeros for plain averaging):
    what must be handed over, with the weights, when the set of workers changes.
    """

    weights: tuple
    buffer: tuple


def start(seeds):
    """Every seed's initial state: :func:`pargrad.book.parabola.initial_weights`, a zero buffer."""
    weights = parabola_async.stacked_weights(_checked_seeds(seeds), HIDDEN)
    return State(weights, tuple(np.zeros_like(w) for w in weights))


def shards(x, y, replicas):
    """``x`` and ``y`` cut into ``replicas`` equal contiguous shards, shapes ``(replicas, n / replicas)``.

    The rows each replica of :class:`pargrad.LocalSGDTrainer` reads when the
    batch is the whole data set.
    """
    replicas = _whole(replicas, "replicas")
    if len(x) % replicas:
        raise ValueError(f"{len(x)} points do not split evenly over {replicas} replicas; pass a "
                         f"divisor of {len(x)}.")
    return np.reshape(x, (replicas, -1)), np.reshape(y, (replicas, -1))


def _replica_gradients(weights, xs, ys):
    """Each seed's and replica's gradient of its shard's mean squared error; weights ``(B, R, ...)``."""
    w1, b1, w2, b2 = weights
    hidden = np.tanh(xs[None, :, :, None] * w1[:, :, 0, None, :] + b1[:, :, None, :])  # (B,R,m,H)
    prediction = np.einsum("brmh,brh->brm", hidden, w2[..., 0]) + b2
    residual = 2.0 * (prediction - ys[None]) / xs.shape[1]                           # (B,R,m)
    d_z = residual[..., None] * w2[:, :, None, :, 0] * (1.0 - hidden**2)
    return (np.einsum("rm,brmh->brh", xs, d_z)[:, :, None, :], d_z.sum(axis=2),
            np.einsum("brm,brmh->brh", residual, hidden)[..., None], residual.sum(axis=2)[..., None])


def train_rounds(state, rate, local_steps, rounds, outer=AVERAGE, replicas=REPLICAS, data=None,
                 outer_rate=OUTER_RATE, outer_momentum=OUTER_MOMENTUM):
    """``rounds`` rounds of local SGD or DiLoCo from ``state``; returns ``(state, losses)``.

    Each round: every replica takes ``local_steps`` steps of SGD at ``rate``
    (one number, or one a seed) on its contiguous shard of ``data`` (default
    :func:`problem_data`), from the shared weights; the mean change is
    applied by the ``outer`` step (:data:`AVERAGE` or :data:`NESTEROV`).
    ``losses[k]`` is the loss on all points of the shared weights after
    round ``k``, one a seed (``inf`` where a run overflowed).  float64,
    vectorised over seeds.  Taught in the chapter "Communicating rarely".
    """
    if outer not in OUTERS:
        raise ValueError(f"outer must be one of {OUTERS}, got {outer!r}.")
    local_steps, rounds = _whole(local_steps, "local_steps"), _whole(rounds, "rounds", minimum=0)
    x, y = problem_data() if data is None else data
    xs, ys = shards(x[:, 0], y[:, 0], replicas)
    seeds = state.weights[0].shape[0]
    rate = np.broadcast_to(np.asarray(rate, np.float64), (seeds,))
    lr, mu = (1.0, 0.0) if outer == AVERAGE else (outer_rate, outer_momentum)
    weights, buffer, losses = state.weights, state.buffer, []
    with np.errstate(all="ignore"):
        for _ in range(rounds):
            mine = [np.repeat(w[:, None], replicas, axis=1) for w in weights]
            for _ in range(local_steps):
                grads = _replica_gradients(mine, xs, ys)
                mine = [w - rate.reshape((seeds,) + (1,) * (w.ndim - 1)) * g
                        for w, g in zip(mine, grads)]
            delta = [np.mean(w[:, None] - m, axis=1) for w, m in zip(weights, mine)]
            buffer = tuple(mu * b + d for b, d in zip(buffer, delta))
            weights = tuple(w - lr * (d + mu * b) for w, d, b in zip(weights, delta, buffer))
            losses.append(parabola_async.full_loss(weights, x, y))
    return State(weights, buffer), np.array(losses).reshape(rounds, seeds)


def final_losses(rate, seeds, local_steps, updates, outer=AVERAGE, replicas=REPLICAS):
    """Loss on all points after ``updates`` local steps a replica (``updates / H`` rounds), one a seed.

    The score of the chapter's comparisons at equal updates.  Taught in the
    chapter "Communicating rarely".
    """
    local_steps = _whole(local_steps, "local_steps")
    if _whole(updates, "updates") % local_steps:
        raise ValueError(f"updates ({updates}) must be a multiple of local_steps ({local_steps}).")
    _, losses = train_rounds(start(seeds), rate, local_steps, updates // local_steps, outer,
                             replicas)
    return losses[-1]


def loss_curves(rate, seeds, local_steps, updates, outer=AVERAGE, replicas=REPLICAS):
    """Loss on all points after every round, ``(updates / H, seeds)``: the curves of the dial."""
    _, losses = train_rounds(start(seeds), rate, local_steps, updates // local_steps, outer,
                             replicas)
    return losses


class GridRunner:
    """``run(rate, seeds)`` for :class:`pargrad.book.experiments.Method` that runs a whole grid at once.

    ``score(rates, seeds)`` must take one rate a run (arrays of the same
    length) and return one score a run.  The first call for a set of seeds
    runs every rate of ``rates`` on them in one vectorised batch (the replay
    costs little more for 9 x 20 runs than for 20) and keeps the scores;
    later calls for a rate of the grid read them.  Taught in the chapter
    "Communicating rarely".
    """

    def __init__(self, score, rates):
        if not callable(score):
            raise TypeError(f"score must be a function score(rates, seeds), got {score!r}.")
        self.score, self.rates = score, [float(r) for r in rates]
        self._scores = {}

    def __call__(self, rate, seeds):
        seeds = _checked_seeds(seeds)
        key = tuple(int(s) for s in seeds)
        if key not in self._scores:
            rates = np.repeat(self.rates, len(seeds))
            scores = self.score(rates, np.tile(seeds, len(self.rates)))
            self._scores[key] = dict(zip(self.rates, np.reshape(scores, (len(self.rates), -1))))
        if float(rate) in self._scores[key]:
            return self._scores[key][float(rate)]
        return self.single(rate, seeds)

    def single(self, rate, seeds):
        """The scores of one rate on ``seeds``, without running the rest of the grid."""
        seeds = _checked_seeds(seeds)
        return self.score(np.full(len(seeds), float(rate)), seeds)


# ----------------------------------------------------------------------------
# The same virtual time
# ----------------------------------------------------------------------------

def round_seconds(local_steps, link, step_seconds, slowest=1.0, replicas=REPLICAS,
                  parameter_bytes=PARAMETER_BYTES):
    """A round's virtual time: H slow steps, then a ring all-reduce of the parameters on ``link``.

    What :meth:`pargrad.LocalSGDHistory.clock_on` charges a round.
    """
    return (local_steps * step_seconds * slowest
            + cost.ring_all_reduce_time(parameter_bytes, replicas, link))


def losses_in_time(rate, seeds, local_steps, budget, link, step_seconds, slowest=1.0,
                   outer=AVERAGE, replicas=REPLICAS):
    """Loss on all points after the rounds that end within ``budget`` virtual seconds, one a seed.

    Every round waits for the slowest replica (``slowest`` times
    ``step_seconds`` a step) and pays one all-reduce on ``link``
    (:func:`round_seconds`); ``local_steps = 1`` with :data:`AVERAGE` is
    synchronous SGD.  Taught in the chapter "Communicating rarely".
    """
    rounds = int(budget // round_seconds(local_steps, link, step_seconds, slowest, replicas))
    if rounds < 1:
        raise ValueError(f"a budget of {budget} s does not fit one round; give more time.")
    _, losses = train_rounds(start(seeds), rate, local_steps, rounds, outer, replicas)
    return losses[-1]


def async_seconds_per_update(link, step_seconds, speed, parameter_bytes=PARAMETER_BYTES):
    """One asynchronous worker's update: its step, then its push and pull (two messages) on ``link``."""
    return step_seconds / speed + 2 * cost.message_time(parameter_bytes, link)


def async_losses_in_time(rate, seeds, budget, link, step_seconds, speeds, data=None):
    """Asynchronous SGD on the same shards and clock: loss on all points at ``budget``, one a seed.

    Each worker repeats: read the parameters, one full-shard gradient step
    (``step_seconds / speed``), push it and pull the parameters (two messages
    on ``link``).  The order of updates is
    :func:`pargrad.book.parabola_async.virtual_schedule` (the virtual
    clock of :class:`pargrad.AsyncTrainer`) with those per-update times; the
    updates are applied by :func:`pargrad.book.parabola_async.train`, whose
    worker ``w`` reads rows ``w::workers``: the data are interleaved first so
    that these are the contiguous shards the other methods use.  Taught in
    the chapter "Communicating rarely".
    """
    x, y = problem_data() if data is None else data
    workers = len(speeds)
    seconds = [async_seconds_per_update(link, step_seconds, s) for s in speeds]
    updates = int(budget / min(seconds)) * workers + workers
    schedule = parabola_async.virtual_schedule([1.0 / s for s in seconds], updates)
    done = int(np.sum(schedule["time"] <= budget))
    if done < 1:
        raise ValueError(f"a budget of {budget} s does not fit one update; give more time.")
    schedule = {key: value[:done] for key, value in schedule.items()}
    interleave = lambda a: np.reshape(a, (workers, -1)).T.reshape(-1, 1)   # noqa: E731
    weights = parabola_async.stacked_weights(_checked_seeds(seeds), HIDDEN)
    return parabola_async.train(weights, interleave(x[:, 0]), interleave(y[:, 0]), workers,
                                schedule, rate)


# ----------------------------------------------------------------------------
# The chapter's experiments as methods of the harness, and their stored sweeps
# ----------------------------------------------------------------------------

def method_name(outer, local_steps):
    """``"local SGD, H=4"`` or ``"DiLoCo, H=4"``."""
    return f"{'local SGD' if outer == AVERAGE else 'DiLoCo'}, H={local_steps}"


def dial_methods():
    """Every setting of the dial (both outer steps, every H of :data:`DIAL`) as harness methods.

    The score is the loss on all points after :data:`UPDATES` local steps a
    replica.  Taught in the chapter "Communicating rarely".
    """
    from pargrad.book.experiments import Method

    def method(outer, steps):
        score = lambda rates, seeds: final_losses(rates, seeds, steps, UPDATES, outer)  # noqa: E731
        return Method(method_name(outer, steps), GridRunner(score, GRID), GRID)

    return [method(outer, steps) for outer in OUTERS for steps in DIAL]


def race_budget(link):
    """The uneven race's virtual time on ``link``: what synchronous SGD needs for 256 steps."""
    return SYNC_STEPS_IN_BUDGET * round_seconds(1, link, STEP_SECONDS, 1 / min(SPEEDS))


def uneven_methods(link):
    """Synchronous, asynchronous, local SGD and DiLoCo with one slow worker, in the same time.

    Each scores the loss on all points at :func:`race_budget` of ``link``.
    Taught in the chapter "Communicating rarely".
    """
    from pargrad.book.experiments import Method

    budget, slowest = race_budget(link), 1 / min(SPEEDS)

    def rounds_method(name, steps, outer):
        score = lambda rates, seeds: losses_in_time(  # noqa: E731
            rates, seeds, steps, budget, link, STEP_SECONDS, slowest, outer)
        return Method(name, GridRunner(score, GRID), GRID)

    asynchronous = lambda rates, seeds: async_losses_in_time(  # noqa: E731
        rates, seeds, budget, link, STEP_SECONDS, SPEEDS)
    return [rounds_method("sync", 1, AVERAGE),
            Method("async", GridRunner(asynchronous, GRID), GRID),
            rounds_method(method_name(AVERAGE, LOCAL_STEPS), LOCAL_STEPS, AVERAGE),
            rounds_method(method_name(NESTEROV, LOCAL_STEPS), LOCAL_STEPS, NESTEROV)]


def experiment_sets():
    """The chapter's sets of methods by name: ``"dial"``, and the race on each link."""
    return {"dial": dial_methods(), f"race, {FAST.name}": uneven_methods(FAST),
            f"race, {SLOW.name}": uneven_methods(SLOW)}


def measure_sweeps():
    """Sweep every method of :func:`experiment_sets` on :data:`TUNING_SEEDS`; a dict for JSON.

    What ``tools/measure_rare_communication.py`` stores (a minute of
    NumPy), so that the chapter only runs the test seeds.
    """
    from pargrad.book.experiments import sweep

    stored = {"grid": list(GRID), "tuning_seeds": TUNING_SEEDS.tolist(), "updates": UPDATES,
              "sets": {}}
    for set_name, methods in experiment_sets().items():
        stored["sets"][set_name] = {}
        for method in methods:
            result = sweep(method, TUNING_SEEDS)
            stored["sets"][set_name][method.name] = {
                "medians": result.medians.tolist(), "best": result.best,
                "scores": np.where(np.isfinite(result.scores), result.scores, -1.0).tolist()}
    return stored


def stored_sweeps():
    """The sweeps shipped with the package (``pargrad/book/data/rare_communication_sweeps.json``)."""
    import importlib.resources
    import json

    return json.loads(importlib.resources.files("pargrad.book").joinpath(
        "data", f"{STORED}.json").read_text())


def experiment_at_stored_rates(set_name, seeds=TEST_SEEDS, stored=None):
    """Run a set's methods on ``seeds`` at the best rates of the stored sweep: an ``Experiment``.

    Checks that every stored best rate lies inside the grid (the sweep's
    rule) before running.  Taught in the chapter "Communicating rarely".
    """
    from pargrad.book.experiments import Experiment, Sweep, scores_as_array

    stored = stored_sweeps() if stored is None else stored
    if set_name not in stored["sets"]:
        raise ValueError(f"set_name must be one of {list(stored['sets'])}, got {set_name!r}.")
    seeds = _checked_seeds(seeds)
    grid = np.asarray(stored["grid"])
    scores, rates, sweeps = {}, {}, {}
    for method in experiment_sets()[set_name]:
        kept = stored["sets"][set_name][method.name]
        best = kept["best"]
        if best in (grid[0], grid[-1]):
            raise ValueError(f"{method.name}: the stored best rate {best} is at the edge of the "
                             "grid; widen the grid and measure again.")
        tuning = np.asarray(kept["scores"], float)
        sweeps[method.name] = Sweep(method.name, grid, np.asarray(kept["medians"]),
                                    np.where(tuning < 0, np.inf, tuning), best)
        rates[method.name] = best
        run = getattr(method.run, "single", method.run)      # only the best rate, not the grid
        scores[method.name] = scores_as_array(run(best, seeds), seeds)
    return Experiment(seeds, scores, rates, sweeps)


# ----------------------------------------------------------------------------
# Workers that leave and join: one phase a cluster
# ----------------------------------------------------------------------------

def outer_optimizer(outer):
    """The Keras outer optimizer of ``outer``: SGD(1.0), or DiLoCo's SGD(0.7, momentum 0.9, Nesterov)."""
    import keras

    if outer == AVERAGE:
        return keras.optimizers.SGD(1.0)
    if outer == NESTEROV:
        return keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    raise ValueError(f"outer must be one of {OUTERS}, got {outer!r}.")


def train_phase(rounds, local_steps, learning_rate, weights=None, velocity=None, seed=0,
                outer=NESTEROV):
    """Run in every worker of a :class:`pargrad.LocalCluster`: ``rounds`` rounds of DiLoCo, handed over.

    Builds the y = x² network of ``seed`` in float64 under
    :func:`pargrad.sync_strategy` (one replica a worker process), sets the
    shared ``weights`` and the outer optimizer's momentum ``velocity`` that
    the previous phase handed over (if any), trains ``rounds`` rounds of
    :class:`pargrad.LocalSGDTrainer` on :func:`problem_data` (full batch,
    inner SGD at ``learning_rate``), and returns what the next phase needs:
    ``weights``, ``velocity`` (Keras's momentum ``v``, with ``v = -rate x``
    the replay's buffer), ``replicas`` and ``loss`` (on all points, at the
    end).  A phase with fewer workers is a worker that left; with more, one
    that joined.  Taught in the chapter "Communicating rarely".
    """
    import pargrad
    from pargrad.local_sgd import LocalSGDTrainer

    strategy = pargrad.sync_strategy()
    with strategy.scope():
        model = parabola_model(seed=seed, hidden=HIDDEN, dtype="float64")
        if weights is not None:
            model.set_weights([np.asarray(w, np.float64) for w in weights])
        outer_step = outer_optimizer(outer)
    trainer = LocalSGDTrainer(model, strategy, local_steps, learning_rate=learning_rate,
                              outer_optimizer=outer_step)
    momentums = list(getattr(trainer.outer_optimizer, "momentums", []) or [])
    if velocity is not None:
        if len(momentums) != len(velocity):
            raise ValueError(f"velocity needs {len(momentums)} arrays (the outer optimizer's "
                             f"momentum, one a weight), got {len(velocity)}.")
        with strategy.scope():
            for variable, value in zip(momentums, velocity):
                variable.assign(np.asarray(value, np.float64))
    x, y = problem_data()
    trainer.fit(x, y, rounds=rounds, batch_size=len(x))
    return {"weights": model.get_weights(), "velocity": [np.asarray(v.numpy()) for v in momentums],
            "replicas": trainer.replicas, "loss": trainer.evaluate(x, y)}


def replay_phases(phases, learning_rate, local_steps, seed=0, outer=NESTEROV):
    """The replay of :func:`train_phase`'s handovers: ``phases`` is a list of ``(workers, rounds)``.

    Returns the :class:`State` at the end (one seed) and the loss on all
    points after every phase.  Taught in the chapter "Communicating rarely".
    """
    state, losses = start([seed]), []
    for workers, rounds in phases:
        state, curve = train_rounds(state, learning_rate, local_steps, rounds, outer, workers)
        losses.append(float(curve[-1, 0]))
    return state, losses


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------

def _whole(value, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}.")
    return int(value)


def _checked_seeds(seeds):
    seeds = np.asarray(seeds)
    if seeds.ndim != 1 or len(seeds) == 0 or seeds.dtype.kind not in "iu":
        raise ValueError(f"seeds must be a non-empty list of whole numbers, got {seeds!r}.")
    return seeds


# ----------------------------------------------------------------------------
# Figures (one function a figure, each returning it)
# ----------------------------------------------------------------------------

def dial_figure(curves, histories, fast, slow, step_seconds):
    """The dial: loss against updates, bytes sent, and modelled time on a ``fast`` and a ``slow`` link.

    ``curves[H]`` is a dict of loss curves (one value a round, for example
    the median over seeds), one per outer step; ``histories[H]`` the
    :class:`pargrad.LocalSGDHistory` of a trainer run with that ``H``,
    which gives every axis: its updates, its bytes (summed over rounds) and
    its clock charged on each link (:meth:`~pargrad.LocalSGDHistory.clock_on`).
    Taught in the chapter "Communicating rarely".
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey=True)
    colours = plt.cm.viridis(np.linspace(0, 0.85, len(curves)))
    styles = {AVERAGE: "--", NESTEROV: "-"}
    for colour, (steps, by_outer) in zip(colours, curves.items()):
        history = histories[steps]
        axes_x = [history.updates, np.cumsum(history.bytes_sent),
                  history.clock_on(fast, step_seconds), history.clock_on(slow, step_seconds)]
        for outer, curve in by_outer.items():
            label = f"H = {steps}, {'local SGD' if outer == AVERAGE else 'DiLoCo'}"
            for ax, xs in zip(axes.flat, axes_x):
                ax.plot(xs, curve, styles[outer], color=colour, label=label)
    titles = ["(a) against local steps a replica", "(b) against bytes each replica sent",
              f"(c) against modelled time: {fast.name}", f"(d) against modelled time: {slow.name}"]
    labels = ["local steps a replica", "bytes sent a replica", "seconds", "seconds"]
    for ax, title, label in zip(axes.flat, titles, labels):
        ax.set(title=title, xlabel=label, xscale="log", yscale="log")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("loss on all points (median over seeds)")
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def seeds_figure(experiments, titles):
    """Per-seed final losses of every method, one panel an experiment (a strip of dots a method).

    ``experiments``: :class:`pargrad.book.experiments.Experiment` objects;
    a line joins each method's median.  Taught in the chapter "Communicating rarely".
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(experiments), figsize=(5 * len(experiments), 3.8),
                             squeeze=False)
    for ax, experiment, title in zip(axes[0], experiments, titles):
        names = list(experiment.scores)
        for i, name in enumerate(names):
            scores = np.asarray(experiment.scores[name])
            jitter = np.linspace(-0.15, 0.15, len(scores))
            ax.plot(i + jitter, scores, "o", ms=3, alpha=0.6)
            ax.plot([i - 0.25, i + 0.25], [np.median(scores)] * 2, "k-", lw=2)
        ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=8)
        ax.set(yscale="log", title=title, ylabel="loss on all points at the end")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
