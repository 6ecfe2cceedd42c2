# %% [markdown]
# # Stale gradients in depth
#
# ```{admonition} Takeaway
# A gradient $\tau$ updates old converges on a parabola only while
# $\eta\lambda < 2\sin(\pi/(2(2\tau+1)))$; a network's stable rate
# shrinks alike. The staleness-aware rate and delay
# compensation (DC-ASGD) keep a too-high rate stable, but tuned, with one
# slow worker of four, neither beats a tuned constant rate: DC-ASGD ends
# within {glue:text}`floor:.0f` % of it, the staleness-aware rule is a
# close call.
# ```
#
# The evidence behind [Asynchronous training](04_asynchronous).
# **In this chapter you will** find the trainer's update and its NumPy
# replica, derive the delay bound and check it against runs, test the
# momentum explanation, tune the two remedies on two seed sets, and count
# lost updates. Verdicts follow [How the book decides](a0_methods).

# %% tags=["colab", "hide-input"]
# On Colab: install pargrad and what its chapters need. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad[book] @ git+{REPOSITORY}@main"],
        check=True,
    )

# %% tags=["hide-input"]
import pargrad  # first: it imports TensorFlow quietly

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from IPython.display import Markdown, display
from pargrad import AsyncTrainer, Scenario
from pargrad.book import delay, experiments, glue, parabola_async, replay, show_source
from pargrad.book.plots_asynchronous import paired_scores, stability_bound, stale_gradient
from pargrad.book.lost_updates import lost_updates
from pargrad.book.parabola import parabola_data, parabola_model, squared_error
from pargrad.scenario import virtual_schedule  # AsyncTrainer's own virtual clock, as arrays

devices = pargrad.logical_devices(8)
keras.utils.set_random_seed(0)
x, y = parabola_data()
x64, y64 = parabola_data(dtype="float64")
UPDATES = 400
SEEDS, HELD_OUT = np.arange(30), np.arange(1000, 1030)   # the fixed-rate runs' two seed sets
glue("seeds", len(SEEDS))
glue("updates", UPDATES)
glue("floor", 100 * experiments.FLOOR)  # the rule's floor: "negligible" within 2 %


def short(value):
    """A score for printing: three significant digits, or "> 1000" for a run that blew up."""
    return f"{value:.3g}" if value < 1000 else "> 1000"


def verdict_line(verdict):
    """A verdict over both seed sets, as a sentence (the page "How the book decides" shows how p is found)."""
    page, held_out, both = verdict.page, verdict.held_out, verdict.pooled
    return (f"{both.first} ended lower than {both.second} on {page.wins} of {page.seeds} of "
            f"the page's seeds and {held_out.wins} of {held_out.seeds} held-out ones; median "
            f"ratio {short(both.effect)}; verdict over both sets: {both.text}")


def replica_final_loss(workers, rate, seeds=(0,), **options):
    """Loss on all 50 points after UPDATES updates, one a seed, from the NumPy replica."""
    return parabola_async.final_losses(workers, rate, seeds, UPDATES, **options)


def full_loss(weights):
    """The loss of the y = x² network with these weights on all 50 points."""
    model = parabola_model(seed=0)
    model.set_weights(weights)
    return float(squared_error(y, model(x)))

# %% [markdown]
# ## The trainer's update
#
# Reads and updates happen under a lock, each in one piece. Applying records
# the staleness and, on request, divides the rate by `staleness + 1` or
# corrects the stale gradient:

# %%
show_source(AsyncTrainer._apply)

# %% [markdown]
# With real threads (`mode="free-running"`) the staleness changes from run to
# run; the next cell checks what must hold whatever it is:

# %% tags=["hide-input", "nbval-ignore-output"]
trainer = AsyncTrainer(parabola_model(seed=0), squared_error, devices[:2],
                       learning_rate=0.01, progress=False)
free = trainer.fit(x, y, steps=300, mode="free-running")
print("staleness histogram with 2 threads:", np.bincount(free.staleness))
print(f"{len(free.loss)} updates applied, version counter {trainer.version}")
assert trainer.version == len(free.loss) == 300
assert free.staleness.max() >= 1

# %% [markdown]
# For speed with real threads on a CPU, `benchmarks/async.py` sets one
# intra-op thread (see {term}`inter-op threads`) and
# `AsyncTrainer(..., jit_compile=True)` ({term}`jit_compile`); otherwise one
# worker alone already spreads over both cores.
#
# ## The replica, checked against the trainer
#
# The many-seed runs come from `pargrad.book.parabola_async`: the trainer's
# virtual clock and updates in float64 NumPy, for all seeds at once. It must
# end at the trainer's losses within float32 rounding
# (`pargrad.rounding_tolerance("float32", UPDATES)` relative to the loss):

# %% tags=["hide-input"]
def trainer_final_loss(workers, rate, speeds=None, **options):
    """One AsyncTrainer run from seed 0's weights; its loss on all 50 points at the end."""
    trainer = AsyncTrainer(parabola_model(seed=0), squared_error, devices[:workers],
                           learning_rate=rate, progress=False, stop_on_non_finite=False,
                           **options)
    trainer.fit(x, y, steps=UPDATES, scenario=Scenario(speeds or (1.0,) * workers))
    return full_loss(trainer.get_weights())


UNEVEN = list(parabola_async.UNEVEN)  # four workers, one ten times slower
checks = {"4 workers, rate 0.03": (dict(workers=4, rate=0.03), {}),
          "8 workers, rate 0.1, staleness-aware": (dict(workers=8, rate=0.1),
                                                   dict(staleness_aware=True)),
          "uneven, rate 0.05, DC-ASGD λ = 0.3": (dict(workers=4, rate=0.05, speeds=UNEVEN),
                                                  dict(delay_compensation=0.3))}
for name, (run, options) in checks.items():
    trained = trainer_final_loss(**run, **options)
    replayed = float(replica_final_loss(run["workers"], run["rate"], speeds=run.get("speeds"),
                                        **options)[0])
    tolerance = pargrad.rounding_tolerance("float32", UPDATES, scale=replayed)
    print(f"{name}: replica {replayed:.4f}, the float32 trainer within {tolerance:.1e} of it")
    assert abs(replayed - trained) <= tolerance

# %% [markdown]
# ## At fixed rates, over the seeds
#
# For seed 0 the chapter's single runs showed 4 workers ending below one
# worker at rate 0.03. Over the seeds, at rates 0.03 and 0.1:

# %% tags=["hide-input"]
per_rate = {rate: {n: replica_final_loss(n, rate, SEEDS) for n in (1, 4, 8)}
            for rate in (0.03, 0.1)}
held_out_rate = {rate: {n: replica_final_loss(n, rate, HELD_OUT) for n in (1, 4, 8)}
                 for rate in (0.03, 0.1)}


def pooled(first, second, held_first, held_second, names):
    """The verdict of both seed sets pooled (the page's and the held-out ones) on two runs."""
    return experiments.replicated(experiments.compare(first, second, *names, min_seeds=1),
                                  experiments.compare(held_first, held_second, *names,
                                                      min_seeds=1))


fixed_rate = {}
for rate, losses in per_rate.items():
    for n in (4, 8):
        verdict = pooled(losses[n], losses[1], held_out_rate[rate][n], held_out_rate[rate][1],
                         (f"{n} workers", "1 worker"))
        fixed_rate[rate, n] = verdict
        print(f"rate {rate}: {verdict_line(verdict)}")
        assert verdict.verdict == "1 worker ahead" and verdict.page.wins < 10, verdict
        assert n == 4 and rate == 0.03 or np.all(losses[n] > losses[1])  # else on every seed
four_vs_one = fixed_rate[0.03, 4]
glue("four-below-one", four_vs_one.page.wins)
figure = paired_scores({
    "rate 0.03": ("4 workers", per_rate[0.03][4], "1 worker", per_rate[0.03][1]),
    "rate 0.03, 8 workers": ("8 workers", per_rate[0.03][8], "1 worker", per_rate[0.03][1]),
})
glue("four-vs-one-figure", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} four-vs-one-figure
# :name: fig-four-vs-one
#
# Final loss of the y = x² network after the same number of updates, one dot
# an initial weight (seed): asynchronous workers (vertical) against one worker
# (horizontal) at the same rate. Below the dotted diagonal, the asynchronous
# workers ended lower.
# ```
#
# At rate 0.03 ({numref}`fig-four-vs-one`) 4 stale workers end below one
# fresh worker on only {glue:text}`four-below-one` of the page's {glue:text}`seeds`
# seeds, seed 0 among them; at the larger rate, and with 8 workers, on none
# of them. Over both seed sets one worker is ahead in all four comparisons.
# The tuning behind the chapter's table, on both seed sets: each method's
# best rate on its set's pool of tuning seeds, and the rates the pool's
# resampled draws pick:

# %%
stored = parabola_async.stored_tuned()["sets"]
for name, which in (("page", "page"), ("held-out", "held_out")):
    for method in ("1 worker", "2 async workers", "4 async workers", "8 async workers"):
        kept = stored[which]["workers"][method]
        rates = kept["settings"]
        drawn = sorted({rates[i] for i in kept["picked"]["bootstrap"]})
        print(f"{name} seeds, {method}: best rate {rates[kept['picked']['pool']]:.3g}; the "
              f"resampled pools pick {', '.join(f'{r:.3g}' for r in drawn)}")

# %% [markdown]
# ## The stale pair: one synchronous step at twice the rate
#
# In the chapter's figure ([Asynchronous training](04_asynchronous.ipynb#the-stale-gradient-drawn-from-a-run))
# the two workers' halves of the data are mirror images, so each gradient at
# $w_0$ is $a\,(w_0 - w^*)$ (curvature $a$, minimum $w^*$), and the pair moves $w$ by
# $2\eta a\,(w_0 - w^*)$: it *is* one synchronous step at twice the rate,
# the {term}`linear scaling rule`'s rate for a batch twice as large. The
# same runs in float64 NumPy, swept over $\eta a$:

# %% tags=["hide-input"]
PAIR_START, W_STAR = 3.0, 0.5
pair_x = x64[:, 0]
pair_halves = [pair_x[worker::2] for worker in range(2)]  # the trainer's deal
pair_curvature = 2 * float(np.mean(pair_x**2))


def half_gradient(w, worker):
    """d/dw of mean((w x - x / 2)^2) over one worker's half, at w."""
    return 2 * float(np.mean(pair_halves[worker] ** 2)) * (w - W_STAR)


def pair_runs(rate, start=PAIR_START):
    """(stale, fresh, synchronous at rate, synchronous at 2 x rate) paths of w."""
    g0, g1 = half_gradient(start, 0), half_gradient(start, 1)
    fresh_first = start - rate * g0
    return ([start, fresh_first, fresh_first - rate * g1],
            [start, fresh_first, fresh_first - rate * half_gradient(fresh_first, 1)],
            [start, start - rate * (g0 + g1) / 2], [start, start - 2 * rate * (g0 + g1) / 2])


products = np.round(np.arange(0.02, 1.3, 0.02), 2)
pair_sweep = {"step_times_curvature": products}
runs_at = [pair_runs(product / pair_curvature) for product in products]
for i, key in enumerate(("async", "fresh", "sync", "sync_double")):
    pair_sweep[key] = np.array([abs(runs[i][-1] - W_STAR) / (PAIR_START - W_STAR)
                                for runs in runs_at])
both_hold = products[(pair_sweep["async"] > pair_sweep["fresh"])
                     & (pair_sweep["async"] <= pair_sweep["sync"])]
print(f"the stale pair and one step at twice the rate end at most "
      f"{np.max(np.abs(pair_sweep['async'] - pair_sweep['sync_double'])):.0e} apart")
print(f"staleness costs per update, yet the pair beats one step at the same rate, for "
      f"eta*a from {both_hold.min():.2f} to {both_hold.max():.2f}")
pair_loss = lambda w: float(np.mean((w * pair_x - pair_x / 2) ** 2))  # noqa: E731
pair_grid = np.linspace(-0.5, 3.5, 161)
FIGURE_ETA_A = 0.6  # the chapter's STEP_TIMES_CURVATURE
stale_pair, fresh_pair, sync_pair, sync_double_pair = pair_runs(FIGURE_ETA_A / pair_curvature)
figure = stale_gradient(pair_grid, [pair_loss(w) for w in pair_grid], stale_pair,
                        fresh_pair, sync_pair, sweep=pair_sweep,
                        sync_double_path=sync_double_pair)
glue("stale-pair-figure", figure, display=False)
plt.close(figure)

# %% tags=["remove-cell"]
assert np.allclose(np.sort(pair_halves[0] ** 2), np.sort(pair_halves[1] ** 2), rtol=1e-15)  # mirrors
assert np.allclose(pair_sweep["async"], pair_sweep["sync_double"], rtol=0, atol=1e-12)
assert abs(both_hold.min() - (2 - np.sqrt(2))) <= 0.03 and abs(both_hold.max() - 2 / 3) <= 0.03

# %% [markdown]
# ```{glue:figure} stale-pair-figure
# :name: fig-stale-pair
#
# The chapter's figure, at its rate, plus: (c) dashed, one step at
# $2\eta$, landing where the stale pair does; (d) the distance to the
# minimum after each run, relative to the start, for every $\eta a$, shaded
# where the stale pair loses to the fresh one yet beats the step at $\eta$.
# ```
#
# The band runs from $2 - \sqrt 2$, where $|1 - 2\eta a|$ passes
# $(1 - \eta a)^2$, to $2/3$, where it passes $1 - \eta a$.

# %% [markdown]
# ## Why the best rate shrinks: a gradient from τ updates ago
#
# With $n$ equal workers every update after the first round was computed from
# the parameters of $\tau = n - 1$ updates earlier. On a parabola with
# curvature $\lambda$ and its minimum at 0, that is the recursion
#
# $$w_{t+1} = w_t - \eta\lambda\, w_{t-\tau}.$$
#
# Try $w_t = z^t$: it solves the recursion when
# $z^{\tau+1} - z^\tau + \eta\lambda = 0$, and the run converges while all
# $\tau + 1$ roots lie inside the unit circle. At $\eta\lambda = 0$ they are
# $1$ and $0$; as $\eta\lambda$ grows, the first root to leave crosses the
# circle at some $z = e^{i\theta}$, where $\eta\lambda = z^\tau(1 - z)$ must
# be real and positive. Since $1 - e^{i\theta} = 2\sin(\theta/2)\,
# e^{i(\theta - \pi)/2}$, the angle of $z^\tau(1 - z)$ is
# $\tau\theta + (\theta - \pi)/2$, which is 0 when $\theta = \pi / (2\tau + 1)$,
# and then $\eta\lambda = 2\sin(\theta / 2)$. So the delayed recursion
# converges exactly when
#
# $$\eta\lambda < 2 \sin\!\left(\frac{\pi}{2(2\tau + 1)}\right),$$
#
# which is 2 for fresh gradients (the familiar $\eta < 2/\lambda$) and
# roughly $\pi / (2\tau + 1)$ for larger $\tau$. `pargrad.book.delay` holds
# the bound and the recursion:

# %% tags=["hide-input"]
show_source(delay.stable_rate_bound)
for tau in (0, 1, 3, 7):
    print(f"tau = {tau}: eta * lambda < {delay.stable_rate_bound(tau):.4f}")
glue("bound-3", delay.stable_rate_bound(3))
glue("bound-7", delay.stable_rate_bound(7))

# %% [markdown]
# The trainer must obey it. With the chapter's one-parameter model and each
# example repeated $n$ times (so the deal `x[i::n]` hands every worker the
# whole parabola), $n$ equal workers run this recursion with $\tau = n - 1$.
# We run `AsyncTrainer` a fifth below and a fifth above the bound and compare
# it with the float64 recursion:

# %% tags=["hide-input"]
START = 3.0
targets = 0.5 * x
curvature = 2 * float(np.mean(x**2))


def one_parameter_model(w):
    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([np.array([[w]], np.float32)])
    return model


def mean_squared_error(y, predictions):
    return tf.reduce_mean(tf.square(y - predictions))


def trainer_on_parabola(workers, rate_times_curvature, updates=120):
    """w after each update of `workers` equal AsyncTrainer workers, all on the whole parabola."""
    repeated_x, repeated_y = np.repeat(x, workers, axis=0), np.repeat(targets, workers, axis=0)
    run = AsyncTrainer(one_parameter_model(START), mean_squared_error, devices[:workers],
                       learning_rate=rate_times_curvature / curvature, progress=False,
                       stop_on_non_finite=False)
    path = [START]
    run.fit(repeated_x, repeated_y, steps=updates,
            on_update=lambda record: path.append(float(run.get_weights()[0][0, 0])))
    return np.array(path) - 0.5  # distance to the minimum w* = 0.5


measured = {}
for workers in (2, 4, 8):
    tau = workers - 1
    for factor in (0.8, 1.2):
        product = factor * delay.stable_rate_bound(tau)
        path = trainer_on_parabola(workers, product)
        exact = delay.delayed_gradient_path(product, tau, START - 0.5, len(path) - 1)
        scale = np.abs(exact).max()
        assert np.abs(path - exact).max() <= pargrad.rounding_tolerance("float32", len(path), scale)
        growth = delay.growth_per_update(path, tau)
        measured.setdefault(tau, []).append((product, growth))
        print(f"tau = {tau}, eta*lambda = {factor} x bound: |w - w*| grows by {growth:.4f} "
              f"per update -> {'diverges' if growth > 1 else 'converges'}")
        assert (growth < 1) == (factor < 1)

# %% [markdown]
# The y = x² network has no single curvature, but the bound predicts that
# its largest stable rate shrinks by $\text{bound}(n - 1) / \text{bound}(0)$.
# Per seed, bisection finds the largest rate at which $n$ equal workers end
# {glue:text}`updates` updates below their starting loss, divided by one
# worker's. Mitliagkas et al. {cite}`mitliagkas2016asynchrony` showed that
# asynchrony with *random*, queue-like delays acts on average like
# {term}`momentum` $\mu = 1 - 1/n$ at rate $\eta/n$; if that explained these
# runs, the largest stable rate would *grow*, to $2n - 1$ times one worker's
# (heavy-ball momentum is stable up to $(\eta/n)\lambda < 2(1 + \mu)$). On
# both seed sets:

# %% tags=["hide-input"]
stable_ratios, deviations = {}, []
for name, seeds in (("page", SEEDS), ("held-out", HELD_OUT)):
    weights = replay.stacked_weights(seeds)
    largest = {n: parabola_async.largest_stable_rate(weights, x64, y64, n, UPDATES)
               for n in (1, 2, 4, 8)}
    for n in (2, 4, 8):
        ratios = largest[n] / largest[1]
        predicted = delay.stable_rate_bound(n - 1) / delay.stable_rate_bound(0)
        deviations.append(abs(np.median(ratios) / predicted - 1))
        print(f"{name:8s} {n} workers: largest stable rate / one worker's, median "
              f"{np.median(ratios):.2f}, below 1 on {np.sum(ratios < 1)} of {len(ratios)} seeds; "
              f"the bound's ratio {predicted:.3f}; momentum's {2 * n - 1}")
        assert np.all(ratios < 1)
        if name == "page":
            stable_ratios[n] = ratios
print(f"the median ratio lies within {100 * min(deviations):.0f}–{100 * max(deviations):.0f} % "
      "of the bound's")
assert max(deviations) < 0.2
glue("bound-low", 100 * min(deviations))
glue("bound-high", 100 * max(deviations))

# %% tags=["remove-cell"]
# The agreement depends on the initial weights: the same check from Keras's default (Glorot) ones
FRESH = np.arange(3000, 3030)  # a seed set no other verdict of the book uses


def glorot_deviations(seeds):
    """Per n = 2, 4, 8: how far the median stable-rate ratio lies from the bound's, from Glorot weights."""
    glorot = replay.stacked_glorot_weights(seeds)
    one = parabola_async.largest_stable_rate(glorot, x64, y64, 1, UPDATES)
    return [abs(np.median(parabola_async.largest_stable_rate(glorot, x64, y64, n, UPDATES) / one)
                / (delay.stable_rate_bound(n - 1) / delay.stable_rate_bound(0)) - 1)
            for n in (2, 4, 8)]


glorot_page, glorot_fresh = glorot_deviations(SEEDS), glorot_deviations(FRESH)
assert max(glorot_page) > max(deviations), (glorot_page, deviations)
glue("bound-glorot-fresh", 100 * max(glorot_fresh))
glue("bound-glorot", 100 * max(glorot_page))

# %% [markdown]
# For 2, 4 and 8 workers, on both seed sets, the median ratio lies within
# {glue:text}`bound-low:.0f`–{glue:text}`bound-high:.0f` % of the bound's
# for these initial weights (from Keras's default Glorot ones, up to
# {glue:text}`bound-glorot:.0f` % on the page's seeds and
# {glue:text}`bound-glorot-fresh:.0f` % on a fresh set of 30, and further
# on other fresh sets), and on every seed the largest stable rate
# shrinks, where momentum would make it grow. A control at rate 0.1: one
# worker taking the same shares in turn with momentum $1 - 1/n$ at rate
# $\eta / n$, which the equivalence says behaves like the asynchronous
# workers:

# %% tags=["hide-input"]
MOMENTUM_RATE = 0.1
for n in (4, 8):
    control, held_out_control = (replica_final_loss(n, MOMENTUM_RATE / n, seeds,
                                                    momentum=1 - 1 / n, sequential=True)
                                 for seeds in (SEEDS, HELD_OUT))
    verdict = pooled(control, per_rate[MOMENTUM_RATE][n], held_out_control,
                     held_out_rate[MOMENTUM_RATE][n], (f"momentum control (n = {n})",
                                                       f"{n} async workers"))
    print(f"rate {MOMENTUM_RATE}: median final loss on the page's seeds: 1 worker "
          f"{np.median(per_rate[MOMENTUM_RATE][1]):.4f}, momentum control (n = {n}) "
          f"{np.median(control):.4f}")
    print("   ", verdict_line(verdict))
    assert verdict.verdict == f"momentum control (n = {n}) ahead" and verdict.pooled.losses == 0
    assert np.all(control < 2 * per_rate[MOMENTUM_RATE][1])  # close to one worker

figure = stability_bound(delay.stable_rate_bound, np.linspace(0.05, 2.4, 200),
                         {tau: [delay.growth_per_update(
                             delay.delayed_gradient_path(c, tau, 1.0, 120), tau)
                             for c in np.linspace(0.05, 2.4, 200)] for tau in (1, 3, 7)},
                         measured, stable_ratios)
glue("stability-figure", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} stability-figure
# :name: fig-stability-bound
#
# The delayed-gradient bound against measured runs. (a) On a parabola: the
# growth of the distance to the minimum per update, from the float64
# recursion (lines) and `AsyncTrainer` runs (dots), against the rate times
# the curvature; dotted: the bound for each staleness. (b) On the y = x²
# network: the largest stable rate of $n$ equal workers over one worker's,
# one dot a seed, against the bound's ratio (solid) and what momentum
# $1 - 1/n$ would allow (dashed).
# ```
#
# On every seed of these two sets the momentum control ends within a factor
# of two of one worker (on a fresh set a few seeds go past it), while 4
# asynchronous workers bounce and 8 diverge ({numref}`fig-stability-bound`):
# the delay explains these runs, momentum does not. The equivalence holds in
# expectation over random delays; here every update has the same staleness
# $n - 1$, the fixed delay of the recursion.

# %% [markdown]
# ## The staleness-aware rate: a guard, not a gain
#
# The {term}`staleness-aware rate` of Zhang et al. {cite}`zhang2016staleness`
# divides each update's rate by its staleness plus one. With equal workers
# that is the constant $\eta / n$; it can only do more when staleness is
# *uneven*: here four workers, one ten times slower. The plain constant rate
# and the rule's base rate, each tuned inside the experiment as in
# [Asynchronous training](04_asynchronous) (the best of a grid $2^{1/4}$
# apart on a pool of {glue:text}`remedy-pool` tuning seeds a set, the pool
# resampled), on two sets of {glue:text}`remedy-seeds` seeds:

# %% tags=["hide-input"]
uneven_schedule = virtual_schedule(Scenario(UNEVEN), UPDATES)
staleness = np.arange(UPDATES) - uneven_schedule["read_version"]
slow = uneven_schedule["worker"] == 3
print(f"mean staleness: fast workers {staleness[~slow].mean():.1f}, slow worker "
      f"{staleness[slow].mean():.1f}")
plain, rule, dc = parabola_async.tuned_methods("remedies")
remedies = parabola_async.tuned_replication("remedies")
for name, run in (("page", remedies.page), ("held-out", remedies.held_out)):
    print(f"{name} seeds: best constant rate {run.rates[plain.name]:.3g}, best base rate of the "
          f"rule {run.rates[rule.name]:.3g}")
best_verdict = remedies.compare(plain.name, rule.name)
print(verdict_line(best_verdict))
glue("remedy-seeds", len(remedies.page.seeds))
glue("remedy-pool", len(parabola_async.TUNED_SETS["page"][1]))
glue("tuned-rule-verdict", best_verdict.text)
glue("tuned-rule-page", f"{best_verdict.page.wins}-{best_verdict.page.losses}")
glue("tuned-rule-held-out", f"{best_verdict.held_out.wins}-{best_verdict.held_out.losses}")
glue("tuned-rule-ratio", best_verdict.pooled.effect)
glue("tuned-rule-power", f"{best_verdict.pooled.power:.0%}")
glue("rule-rate-page", f"{remedies.page.rates[rule.name]:.3g}")
glue("rule-rate-held-out", f"{remedies.held_out.rates[rule.name]:.3g}")

# %% tags=["remove-cell"]
assert best_verdict.verdict != "best constant rate ahead", best_verdict
# undecided, and the rule could not have seen a fifth through the tuning's noise: the
# takeaway says "close call"
assert best_verdict.verdict == experiments.CLOSE, best_verdict
# the two sets lean opposite ways: the prose says so
assert best_verdict.page.lean != best_verdict.held_out.lean, best_verdict
assert remedies.page.rates[rule.name] != remedies.held_out.rates[rule.name]

# %% [markdown]
# Then the rule at two fixed base rates against the plain base rate and
# against a constant rate with *the same mean step* (the mean of the rule's
# rates), on both seed sets:

# %% tags=["hide-input"]
def matched(base, seeds):
    """(rule at base, constant with the same mean step, constant at base): final losses."""
    mean_step = parabola_async.mean_rate(uneven_schedule, base, staleness_aware=True)
    assert abs(np.mean(base / (staleness + 1)) - mean_step) < 1e-12  # the mean really matched
    return (replica_final_loss(4, base, seeds, speeds=UNEVEN, staleness_aware=True),
            replica_final_loss(4, mean_step, seeds, speeds=UNEVEN),
            replica_final_loss(4, base, seeds, speeds=UNEVEN)), mean_step


matched_verdicts, at_base_verdicts = {}, {}
for base in (0.1, 0.2):
    verdicts, at_base = [], []
    for seeds in (SEEDS, HELD_OUT):
        (by_rule, same_mean, same_base), mean_step = matched(base, seeds)
        verdicts.append(experiments.compare(by_rule, same_mean, f"{base} / (staleness + 1)",
                                            f"constant {mean_step:.4f} (same mean step)",
                                            min_seeds=1))
        at_base.append(experiments.compare(by_rule, same_base, f"{base} / (staleness + 1)",
                                           f"constant {base}", min_seeds=1))
    matched_verdicts[base] = experiments.replicated(*verdicts)
    at_base_verdicts[base] = experiments.replicated(*at_base)
    print(verdict_line(at_base_verdicts[base]))
    print(verdict_line(matched_verdicts[base]))
(_, _, at_02), _ = matched(0.2, SEEDS)
start_loss = replay.full_loss(replay.stacked_weights(SEEDS), x64, y64)
print(f"constant 0.2 ends above its starting loss on {np.sum(~(at_02 < start_loss))} "
      f"of {len(SEEDS)} seeds")
glue("matched-verdict-low", matched_verdicts[0.1].text)
glue("matched-verdict-high", matched_verdicts[0.2].text)
glue("matched-ratio-low", matched_verdicts[0.1].pooled.effect)

# %% tags=["remove-cell"]
for base in (0.1, 0.2):
    assert at_base_verdicts[base].verdict == f"{base} / (staleness + 1) ahead", at_base_verdicts
    assert matched_verdicts[base].verdict in (experiments.NO_DIFFERENCE, experiments.NEGLIGIBLE,
                                              experiments.CLOSE), matched_verdicts

# %% [markdown]
# What the two seed sets say:
#
# - **Tuned, neither is ahead:** the verdict over both sets is
#   "{glue:text}`tuned-rule-verdict`". The constant ends lower on
#   {glue:text}`tuned-rule-page` of the page's seeds (wins-losses) and
#   {glue:text}`tuned-rule-held-out` of the held-out ones: the two sets lean
#   opposite ways (median ratio {glue:text}`tuned-rule-ratio:.2f` over both;
#   a difference of a fifth would have shown only
#   {glue:text}`tuned-rule-power` of the time, the tuning's noise included).
#   The rule's best base rate is
#   {glue:text}`rule-rate-page` on the page's pool and
#   {glue:text}`rule-rate-held-out` on the held-out one. Both best rates sit
#   just below a cliff where runs start to bounce, so which method wins a set
#   depends on how close its tuning lands to that cliff.
# - **At a fixed base rate, the rule is a guard.** It ends below the plain
#   constant at that rate on most seeds of both sets; at the larger one the
#   plain rate diverges (the line above counts the seeds), the rule does not.
# - **Against the same mean step,** the rule's lead is
#   "{glue:text}`matched-verdict-low`" at base 0.1 (median ratio
#   {glue:text}`matched-ratio-low:.3f` over both sets, within {glue:text}`floor:.0f` % of 1) and
#   "{glue:text}`matched-verdict-high`" at base 0.2: damping the slow worker's
#   old news buys little that a smaller constant step does not.
#
# ## Delay compensation: correcting the stale gradient
#
# A third remedy repairs the gradient. A worker computed
# $g = \nabla L(w_\text{read})$, applied at $w_\text{now}$; to first order the
# gradient there is $g + H\,(w_\text{now} - w_\text{read})$, with $H$ the
# {term}`Hessian`, which nobody can afford for a large network.
# Delay-compensated asynchronous SGD (DC-ASGD) {cite}`zheng2017asynchronous`
# replaces $H$ by the diagonal of $g g^\top$ (for a cross-entropy loss, on
# average an approximation of the Hessian) scaled by a number $\lambda$:
#
# $$ \tilde g = g + \lambda\, g \odot g \odot (w_\text{now} - w_\text{read}). $$
#
# `AsyncTrainer(delay_compensation=λ)` implements this constant-$\lambda$
# version (DC-ASGD-c; the paper's adaptive DC-ASGD-a worked better there):

# %%
show_source(pargrad.asynchronous.delay_compensated)

# %% [markdown]
# The rate and $\lambda$ are tuned together, on the same seeds and pools,
# over a grid of rates $2^{1/4}$ apart and values of $\lambda$ $\sqrt 2$
# apart from {glue:text}`dc-lambda-low` to {glue:text}`dc-lambda-high`
# (and 0, plain asynchronous SGD). DC-ASGD at its best then meets the two
# methods above at theirs:

# %% tags=["hide-input"]
for name, run in (("page", remedies.page), ("held-out", remedies.held_out)):
    best = run.rates[dc.name]
    print(f"{name} seeds: DC-ASGD's best λ = {best['λ']:.3g} at rate {best['rate']:.3g}; best "
          f"constant rate {run.rates[plain.name]:.3g}")
display(Markdown(experiments.results_table(remedies, plain.name).to_markdown()))
dc_vs_constant = remedies.compare(dc.name, plain.name)
dc_vs_rule = remedies.compare(dc.name, rule.name)
print(verdict_line(dc_vs_constant))
print(verdict_line(dc_vs_rule))
picked = [run.rates[dc.name]["λ"] for run in (remedies.page, remedies.held_out)]
lambdas = [value for value in dc.grid["λ"] if value > 0]
glue("dc-lambda-low", f"{min(lambdas):.2g}")
glue("dc-lambda-high", f"{max(lambdas):.3g}")
glue("dc-lambda-page", f"{picked[0]:.2g}")
glue("dc-lambda-held-out", f"{picked[1]:.2g}")
glue("dc-vs-constant", dc_vs_constant.text)
glue("dc-vs-rule", dc_vs_rule.text)
glue("dc-ratio", dc_vs_constant.pooled.effect)
glue("dc-rule-ratio", dc_vs_rule.pooled.effect)

# %% tags=["remove-cell"]
# re-decided with the tuning inside the experiment: "negligible" (a consistent lead within
# 2 %) on the old tuning; now no set of draws repeats a lead, and the rule would see a fifth
assert dc_vs_constant.verdict == experiments.NO_DIFFERENCE, dc_vs_constant
assert abs(dc_vs_constant.pooled.effect - 1) <= experiments.FLOOR, dc_vs_constant
assert dc_vs_rule.verdict in (experiments.NO_DIFFERENCE, experiments.CLOSE), dc_vs_rule
assert dc_vs_rule.page.lean != dc_vs_rule.held_out.lean, dc_vs_rule
assert picked[0] == picked[1] > 0, picked   # the prose: both pools pick the same λ

# %% [markdown]
# Both pools pick $\lambda$ = {glue:text}`dc-lambda-page`, at the constant's
# own best rate. Against the best constant rate the verdict over both sets is
# "{glue:text}`dc-vs-constant`": a median per-seed ratio of
# {glue:text}`dc-ratio:.3f`, well within the {glue:text}`floor:.0f` % floor,
# where a difference of a fifth would have shown. Against the staleness-aware rule it is
# "{glue:text}`dc-vs-rule`" (median ratio {glue:text}`dc-rule-ratio:.2f`):
# the two seed sets lean opposite ways, as they do for the constant against
# the rule.
#
# Is the correction a guard too? The runs ending above their starting loss,
# at three rates above the best constant one:

# %% tags=["hide-input"]
above_start = {}
for rate in (0.14, 0.2, 0.3):
    runs = {"plain": replica_final_loss(4, rate, SEEDS, speeds=UNEVEN),
            **{f"λ = {strength:g}": replica_final_loss(4, rate, SEEDS, speeds=UNEVEN,
                                                       delay_compensation=strength)
               for strength in (0.1, 0.3, 1.0, 3.0)},
            "rate / (staleness + 1)": replica_final_loss(4, rate, SEEDS, speeds=UNEVEN,
                                                         staleness_aware=True)}
    above_start[rate] = {name: int(np.sum(~(losses < start_loss))) for name, losses in runs.items()}
    print(f"rate {rate}: runs ending above their start, of {len(SEEDS)}: "
          + ", ".join(f"{name} {count}" for name, count in above_start[rate].items()))
assert above_start[0.14]["plain"] > 0 and above_start[0.14]["λ = 0.3"] == 0
assert above_start[0.2]["plain"] == len(SEEDS) > 10 * above_start[0.2]["λ = 0.3"]
assert above_start[0.2]["λ = 1"] > len(SEEDS) / 4 and above_start[0.2]["λ = 3"] == len(SEEDS)
assert all(count > len(SEEDS) / 2 for name, count in above_start[0.3].items() if "λ" in name)
assert above_start[0.3]["rate / (staleness + 1)"] == 0

# %% [markdown]
# **A guard too, a narrow one.** At rate 0.14 some plain runs end above
# their start and none with $\lambda = 0.3$; at 0.2 every plain run fails and
# almost none with $\lambda = 0.3$, while $\lambda = 1$ and 3 fail often; at
# 0.3 every $\lambda$ fails on most seeds, and the staleness-aware rule keeps
# every run stable at all three rates. The correction pulls back a stale step
# that overshoots; too large a $\lambda$ overcorrects.
#
# **Where the paper differs.** On ResNets for CIFAR-10 and ImageNet, DC-ASGD
# beat synchronous and plain asynchronous SGD {cite}`zheng2017asynchronous`.
# Here compensation helps where plain asynchronous SGD breaks, but once the
# rate is tuned it stays within {glue:text}`floor:.0f` % of the constant rate. On our squared error $g g^\top$ does not
# estimate the Hessian (near the minimum the gradient vanishes, the curvature
# does not), and we implement the constant $\lambda$: the verdict is about
# this problem.
#
# ## Lost updates, in detail
#
# Keras 3's variables implement `assign_add` as a separate read and write,
# which two threads can interleave:

# %%
show_source(keras.Variable.assign_add)

# %% [markdown]
# `pargrad.book.lost_updates` lets two threads add 1 to a variable 2000
# times each and counts what is missing (a different count each run):

# %% tags=["hide-input", "nbval-ignore-output"]
lost = lost_updates(keras.Variable(0.0), threads=2, increments=2000)
print(f"Keras variable: {lost} of 4000 additions lost")
assert lost > 0

# %% [markdown]
# A native `tf.Variable` adds in one kernel, `AssignAddVariableOp`, run under
# the variable's lock, so the read and the write cannot be torn apart:

# %%
print("tf.Variable: lost", lost_updates(tf.Variable(0.0), threads=2, increments=2000))

# %% tags=["remove-cell"]
# Exercise 1's answer: four equal workers, DC-ASGD tuned over rate and λ, on both seed sets
EQUAL = [1.0] * 4
equal_plain, _, equal_dc = parabola_async.remedy_methods(EQUAL)
equal = parabola_async.replicate_resolved(
    [equal_plain, equal_dc], SEEDS, np.arange(100, 140), HELD_OUT, np.arange(1100, 1140),
    parabola_async.REMEDY_KNOBS, step=parabola_async.LAMBDA_STEP)
equal_lambdas = [run.rates[equal_dc.name]["λ"] for run in (equal.page, equal.held_out)]
equal_verdict = equal.compare(equal_dc.name, equal_plain.name)
assert equal_lambdas[0] != equal_lambdas[1]  # the choice of λ does not replicate
assert equal_verdict.verdict != "DC-ASGD ahead", equal_verdict
glue("equal-lambda-page", f"{equal_lambdas[0]:.2g}")
glue("equal-lambda-held-out", f"{equal_lambdas[1]:.2g}")
glue("equal-verdict", equal_verdict.verdict)
glue("equal-ratio", equal_verdict.pooled.effect)

# %% [markdown]
# `AsyncTrainer` is safe twice over: native `tf.Variable`s, and each update
# applied under one lock. Hogwild! {cite}`niu2011hogwild` drops the lock: on
# sparse problems, where each update touches few parameters, collisions cost
# less than waiting. In a dense network, where every update touches every
# parameter, a lock is the safe default.
#
# ## Summary
#
# - A gradient $\tau$ updates old converges on a parabola only while
#   $\eta\lambda < 2\sin(\pi / (2(2\tau + 1)))$; the trainer follows it,
#   and the y = x² network's largest stable rate shrinks by about the bound's
#   factor on both seed sets, where the momentum equivalence predicts growth.
# - The staleness-aware rate keeps a too-high rate stable; tuned, it is
#   neither ahead of nor behind a tuned constant rate (the seed sets lean
#   opposite ways), and against the same mean step it stays within {glue:text}`floor:.0f` %.
# - DC-ASGD is a narrower guard; tuned over rate and $\lambda$ it is within
#   {glue:text}`floor:.0f` % of the tuned constant rate (no difference shown), and neither it nor the
#   staleness-aware rule is ahead of the other.
# - Keras 3's `assign_add` loses updates under threads; `tf.Variable`'s does
#   not.
#
# ## Exercises
#
# 1. Repeat the delay-compensation comparison with four *equal* workers
#    (`[1.0] * 4` for `UNEVEN`), every update of staleness 3, the case the
#    correction's Taylor step describes best. Does DC-ASGD at its best get
#    ahead of the best constant rate?
#
#    *Hint:* make the methods take the speeds as an argument.
# 2. Run `lost_updates` with 1, 2 and 4 threads on a Keras variable. Why is
#    nothing lost with one? Wrap `assign_add` in a `threading.Lock` and check
#    that four lose nothing.
#
# ```{dropdown} Solution to exercise 1
# No. The joint sweep picks $\lambda$ =
# {glue:text}`equal-lambda-page` on the page's tuning seeds and
# {glue:text}`equal-lambda-held-out` on the held-out ones: the choice does not
# replicate. Against the best constant rate the replicated verdict is
# "{glue:text}`equal-verdict`" (median ratio {glue:text}`equal-ratio:.3f`
# over both sets): no tuned gain here either. (With equal workers the staleness-aware rate is
# the constant $\eta / 4$ after the first few updates, so its verdict against
# the plain rate depends on the rate grid's spacing more than on staleness.)
# ```
#
# ```{dropdown} Solution to exercise 2
# With one thread every `assign` reads the value the previous one wrote, so
# nothing is lost. With two or four threads, two of them can read the same
# old value and both write old + 1: one increment disappears. Holding a
# `threading.Lock` around each `assign_add` makes read and write one step,
# and four threads lose nothing.
# ```
