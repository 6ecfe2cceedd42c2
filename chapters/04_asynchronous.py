# %% [markdown]
# # Asynchronous training
#
# ```{admonition} Takeaway
# Asynchronous workers never wait for each other, so their gradients are
# *stale*: computed for parameters that have moved since. Per update that
# costs: each at its best learning rate, 2, 4 and 8 workers end higher than
# one worker, on both seed sets. Per second it can pay, because nobody waits
# for the slowest device.
# ```
#
# In [Synchronous training](03_synchronous) every device waited for the
# others at every step. *Asynchronous* data-parallel training, the mode of the
# first large-scale systems {cite}`dean2012large`, does not coordinate them:
# every device runs the single-device training loop on its own data, on shared
# parameters. The test problem is the y = x² question of
# [The training loop](01_training_loop), a 1-5-1 `tanh` network; the picture
# is the stale-gradient article's, from [Where this book starts](00_sources).
#
# ## Is asynchronous worse?
#
# **Per update, yes; per second, not necessarily.** Between a worker's read
# of the parameters and its update, the others apply theirs, so its gradient
# points downhill from a place the parameters have left. Given the same
# number of updates, each at the best learning rate of its own sweep, one
# worker ends lower than 2, 4 and 8 asynchronous workers on both seed sets
# (the table in [Over many initial weights](#over-many-initial-weights)),
# though not on every seed; the more workers, the smaller the stable rate.
# Part of the gap is fewer examples per worker, not staleness.
#
# Per second, $n$ asynchronous workers make $n$ updates in the time one makes
# one, and none waits for a slow device. Which effect wins in the same
# wall-clock time: [Sync vs async in the same time](05_sync_vs_async).
#
# **In this chapter you will** see the loop in a dozen lines of NumPy and in
# `pargrad.AsyncTrainer`, draw the stale-gradient picture from a real run,
# measure staleness, and compare asynchronous workers with one worker over
# many initial weights. The delay bound, the remedies' sweeps and lost updates
# in detail are on the optional page
# [Stale gradients in depth](d2_stale_gradients_in_depth).

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

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from IPython.display import Markdown
from pargrad import AsyncTrainer, Scenario
from pargrad.book import (delay, experiments, glue, parabola_async, show_lines, show_source,
                          tuning)
from pargrad.book.plots_asynchronous import (
    async_timeline, loss_against_updates, stale_gradient, staleness_histograms,
)
from pargrad.book.parabola import parabola_data, parabola_model, squared_error

devices = pargrad.logical_devices(8)  # before anything else touches TensorFlow
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## The single-device loop, copied several times
#
# In asynchronous mode each device, again and again:
#
# 1. **reads** the latest shared parameters;
# 2. computes the **gradients on its own data**;
# 3. **applies** its update to the shared parameters, without waiting for
#    any other device.
#
# The price: while a device computes, the others update the parameters, so
# its gradient belongs to parameters that no longer exist. The number of updates that landed between its read and its
# apply is the update's **{term}`staleness`**.
#
# A dozen lines of NumPy show both on the loss $w^2$: two workers read $w$,
# worker 0 applies its update, then worker 1 applies a gradient it computed
# at the old $w$:

# %% tags=["program"]
gradient = lambda w: 2 * w  # noqa: E731  (the loss w², its minimum at w = 0)
w, version, rate = 1.0, 0, 0.3  # the shared parameter and the number of updates applied to it
read = {}  # what each worker read: (w, version)
schedule = [(0, "read"), (1, "read"), (0, "apply"), (1, "apply")]
for worker, action in schedule:
    if action == "read":
        read[worker] = (w, version)
        continue
    w_read, version_read = read[worker]
    print(f"worker {worker}: gradient computed at w = {w_read:.2f}, applied at w = {w:.2f}, "
          f"staleness {version - version_read}: w -> {w - rate * gradient(w_read):.2f}")
    w, version = w - rate * gradient(w_read), version + 1

# %% [markdown]
# Worker 1's gradient, one update stale, was computed at $w = 1$ and
# carries $w$ past the minimum at 0.
#
# `pargrad.AsyncTrainer` does exactly this: the shared parameters live on one
# *parameter device*, and each device runs one worker, whose loop carries the
# idea in these lines:

# %%
show_lines(AsyncTrainer._work, "read = self._read(", "self._apply(")

# %% [markdown]
# `_read` takes the parameters and their version, `_gradients` computes on
# this worker's data, and `_apply` updates the shared parameters under a
# lock. The whole loop is in the collapsed cell:

# %% tags=["hide-cell"]
show_source(AsyncTrainer._work)

# %% [markdown]
# ## Two ways to run: real threads and a virtual clock
#
# `fit(..., mode="free-running")` runs one real thread per worker, in an
# order the operating system decides. `fit(..., mode="scheduled")` (the
# default) runs them in one thread, and a seeded {term}`virtual clock` decides
# the order, the same everywhere: a step takes `1 / speed` time units,
# plus an optional random delay (`jitter`).
#
# Three workers train the y = x² network for 12 updates; device 2 is half as
# fast, and small random delays shuffle the order:

# %%
x, y = parabola_data()
trainer = AsyncTrainer(parabola_model(seed=0), squared_error, devices[:3],
                       learning_rate=0.01, progress=False)
history = trainer.fit(x, y, steps=12, scenario=Scenario((1.0, 1.0, 0.5), jitter=0.2),
                      seed=1)
print("worker   :", history.worker)
print("read v   :", history.read_version)
print("applied v:", history.applied_version)
print("staleness:", history.staleness)
print("version counter:", trainer.version)

# %% tags=["remove-cell"]
figure = async_timeline(history)
glue("timeline-figure", figure, display=False)
plt.close(figure)  # shown once, by the numbered figure below

# %% [markdown]
# ```{glue:figure} timeline-figure
# :name: fig-async-timeline
#
# The run above, one row a worker: each update is a bar from the moment its
# worker read the parameters to the moment its gradient was applied, and
# the number in the bar is its staleness.
# Worker 2, on the device half as fast, has the longest bars.
# ```
#
# Every update is recorded ({numref}`fig-async-timeline`); the version
# counter equals the number of updates, so nothing was lost. The slow
# device's updates are the stalest: while it computes once, the two others
# each update about twice.
# %% [markdown]
# ## The stale gradient, drawn from a run
#
# The stale-gradient article's one picture: devices d0 and d1 both read the parameter at time t0; at t1 d0
# applies its update; at t2 d1 applies its gradient, computed at t0, to the
# parameter d0 has already moved, and shoots past the minimum.
#
# We draw it from a real run. The model $\hat y = w x$ has one parameter; the
# data are the 50 points $x$ of the y = x² question with targets $y = x/2$, so
# the loss $L(w) = \mathrm{mean}((w x - y)^2)$ is a parabola with its minimum
# at $w^* = 0.5$ and curvature $a = L''(w) = 2\,\mathrm{mean}(x^2)$. Change
# the next cell's three numbers to redraw the figure (the learning rate is a
# multiple of one over the curvature).

# %%
START = 3.0  # w at t0
STEP_TIMES_CURVATURE = 0.6  # learning rate x curvature; try 0.4 and 1.2
SPEEDS = [1.0, 0.8]  # d1 a little slower, so that d0's update lands first

targets = 0.5 * x


def one_parameter_model(w):
    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([np.array([[w]], np.float32)])
    return model


def mean_squared_error(y, predictions):
    return tf.reduce_mean(tf.square(y - predictions))


curvature = 2 * float(np.mean(x**2))
learning_rate = STEP_TIMES_CURVATURE / curvature
print(f"curvature {curvature:.4f}, learning rate {learning_rate:.4f}")

# %% [markdown]
# Two workers, on d0 and d1, each with its own half of the data (worker $i$
# gets every second example from $i$ on); the `on_update` hook records the
# parameter after each update:

# %%
stale_run = AsyncTrainer(one_parameter_model(START), mean_squared_error, devices[:2],
                         learning_rate=learning_rate, progress=False)
async_path = [START]
stale_history = stale_run.fit(
    x, targets, steps=2, scenario=Scenario(SPEEDS),
    on_update=lambda record: async_path.append(float(stale_run.get_weights()[0][0, 0])))
for key in ("worker", "read_version", "applied_version", "staleness", "time"):
    print(f"{key:>15}: {getattr(stale_history, key)}")
print("w at t0, t1, t2:", np.round(async_path, 4))

# %% [markdown]
# Both updates read version 0; d1's lands on top of d0's, with staleness 1.
# Two more runs from the same start judge it. The **fresh** run applies the
# same two updates in turn, each gradient taken where the parameter is: one
# device with both halves, in twice the time. The **synchronous** step of
# [Synchronous training](03_synchronous) averages the two gradients, both
# taken at $w_0$, and applies them once, ending with the slower device, as
# the asynchronous pair does.

# %% tags=["hide-input"]
halves = [(x[worker::2], targets[worker::2]) for worker in range(2)]  # the trainer's deal


def gradient(w, worker):
    """d loss / d w on one worker's half of the data, at the parameter value w."""
    w = tf.Variable(w)
    with tf.GradientTape() as tape:
        loss = mean_squared_error(halves[worker][1], w * halves[worker][0])
    return float(tape.gradient(loss, w))


def three_runs(start, rate):
    """(stale, fresh, synchronous) paths of w from `start`."""
    g0, g1 = gradient(start, 0), gradient(start, 1)  # both read at t0
    stale = [start, start - rate * g0, start - rate * g0 - rate * g1]
    fresh_first = start - rate * g0
    fresh = [start, fresh_first, fresh_first - rate * gradient(fresh_first, 1)]
    sync = [start, start - rate * (g0 + g1) / 2]
    return stale, fresh, sync


by_hand, fresh_path, sync_path = three_runs(START, learning_rate)
loss_at = lambda w: float(mean_squared_error(targets, w * x))  # noqa: E731
step_time = [1 / speed for speed in SPEEDS]  # the virtual clock: d1 takes longer a step
walls = {"asynchronous (stale)": float(stale_history.time[-1]),
         "the same two updates, fresh": step_time[0] + step_time[1],
         "synchronous, one step": max(step_time)}
print(f"{'run':30s} {'updates':>7s} {'wall time':>9s} {'w at the end':>12s} {'loss':>7s}")
for (name, wall), path in zip(walls.items(), (async_path, fresh_path, sync_path)):
    print(f"{name:30s} {len(path) - 1:7d} {wall:9.2f} {path[-1]:12.3f} {loss_at(path[-1]):7.3f}")

# %% tags=["remove-cell"]
assert np.allclose(by_hand, async_path, atol=1e-5)  # AsyncTrainer did exactly this (float32)
assert (async_path[-1] - 0.5) * (START - 0.5) < 0 < (fresh_path[-1] - 0.5) * (START - 0.5)
assert walls["asynchronous (stale)"] == walls["synchronous, one step"] < walls["the same two updates, fresh"]

# %% [markdown]
# Why does the stale update overshoot? Both gradients were computed at $w_0$,
# at distance $w_0 - w^*$ from the minimum. Each moves $w$ by $\eta a$ times
# that distance, so after both the distance is $(1 - 2\eta a)(w_0 - w^*)$:
# past the minimum as soon as $\eta a > 1/2$. Two fresh updates end at
# $(1 - \eta a)^2(w_0 - w^*)$, one synchronous step at
# $(1 - \eta a)(w_0 - w^*)$. (A hidden cell checks that the trainer did
# this.) A sweep of $\eta a$ finds where the stale pair starts to lose to
# each run:

# %%
sweep = {"step_times_curvature": np.round(np.arange(0.02, 1.3, 0.02), 2),
         "async": [], "fresh": [], "sync": []}
for product in sweep["step_times_curvature"]:
    for key, path in zip(("async", "fresh", "sync"),
                         three_runs(START, product / curvature)):
        sweep[key].append(abs(path[-1] - 0.5) / (START - 0.5))
sweep = {key: np.array(values) for key, values in sweep.items()}
products = sweep["step_times_curvature"]
worse_than_fresh = products[np.argmax(sweep["async"] > sweep["fresh"])]
worse_than_sync = products[np.argmax(sweep["async"] > sweep["sync"])]
print(f"the stale pair ends farther from the minimum than two fresh updates from eta*a = "
      f"{worse_than_fresh:.2f} on (2 - sqrt(2) = {2 - np.sqrt(2):.3f})")
print(f"... and farther than one synchronous step from eta*a = {worse_than_sync:.2f} on "
      f"(2/3 = {2 / 3:.3f})")

# %% tags=["remove-cell"]
assert abs(worse_than_fresh - (2 - np.sqrt(2))) <= 0.03 and abs(worse_than_sync - 2 / 3) <= 0.03
assert (sweep["async"][products < worse_than_fresh] <= sweep["fresh"][products < worse_than_fresh]).all()
distance = lambda path: abs(path[-1] - 0.5)  # noqa: E731
assert distance(fresh_path) < distance(async_path) < distance(sync_path)  # the figure: both hold
grid = np.linspace(-0.5, 3.5, 161)
figure = stale_gradient(grid, [loss_at(w) for w in grid], async_path, fresh_path,
                        sync_path)
glue("stale-gradient-figure", figure, display=False)
plt.close(figure)  # shown once, by the numbered figure below

# %% [markdown]
# ```{glue:figure} stale-gradient-figure
# :name: fig-stale-gradient
#
# The stale-gradient article's figure, from the runs above. The balls are
# the parameter $w$: black when both devices read it (t0), gray after the
# first update (t1), white after the second (t2). (a) Asynchronous: d1's
# gradient, read at t0, is applied after d0's update and carries $w$ past the
# minimum. (b) The same two updates, each gradient fresh. (c) One
# synchronous step at the asynchronous rate η, in the same wall time as (a).
# ```
#
# {numref}`fig-stale-gradient` holds the article's two claims.
# **Staleness hurts per update**, (a) against (b): once $\eta a$ passes
# $2 - \sqrt 2$, the stale pair ends farther from the minimum than the same
# two gradients taken fresh. **In the same time, asynchronous training is not
# necessarily worse**, (a) against (c): the synchronous step at $\eta$ takes
# as long as the stale pair but moves once, and the stale pair ends closer
# while $\eta a < 2/3$; the figure's rate lies between, so both hold. With
# $k$ workers that all read $w_0$ the factor is $1 - k\eta a$: the more
# workers, the smaller the safe learning rate
# ([why](d2_stale_gradients_in_depth.ipynb#the-stale-pair-one-synchronous-step-at-twice-the-rate)).
#
# ### Turn the dials yourself
#
# The playground below (in the rendered book) runs a gradient $\tau$ updates
# old, $w_{t+1} = w_t - \eta\lambda\, w_{t-\tau}$, on a parabola with
# curvature $\lambda$ (`pargrad.book.delay`). Move $\eta\lambda$, $\tau$ and
# the start, and watch where the stale run stops converging.
#
# <div id="pargrad-staleness-playground">(The staleness playground needs the
# rendered book, with JavaScript; in a notebook, change the numbers in the
# cells above instead.)</div>

# %% [markdown]
# ## Staleness, measured
#
# With $n$ equally fast devices, each of the $n - 1$ others applies one
# update while one computes, so the staleness should be $n - 1$. We measure it for 1, 2, 4 and 8 workers with random delays
# (`jitter`: on average {glue:text}`jitter-percent:.0f`% of a step), and for
# four workers of which one is four times slower, 400 updates each:

# %%
JITTER = 0.3
stalenesses = {}
for workers in (1, 2, 4, 8):
    trainer = AsyncTrainer(parabola_model(seed=0), squared_error,
                           devices[:workers], learning_rate=0.01, progress=False)
    run = trainer.fit(x, y, steps=400, scenario=Scenario((1.0,) * workers, JITTER), seed=0)
    stalenesses[f"{workers} worker{'s' * (workers > 1)}"] = run.staleness
    print(f"{workers} workers: mean staleness {run.staleness.mean():.3f}, "
          f"max {run.staleness.max()}")
trainer = AsyncTrainer(parabola_model(seed=0), squared_error, devices[:4],
                       learning_rate=0.01, progress=False)
run = trainer.fit(x, y, steps=400, scenario=Scenario((1, 1, 1, 0.25), jitter=JITTER), seed=0)
slow = run.worker == 3
stalenesses["4 workers, one 4x slower"] = run.staleness
print(f"one 4x slower: its {slow.mean():.1%} of the updates have mean staleness "
      f"{run.staleness[slow].mean():.2f}; the others' {run.staleness[~slow].mean():.2f}")

# %% tags=["remove-cell"]
glue("jitter-percent", 100 * JITTER)
glue("mean-staleness-uneven", float(run.staleness.mean()))
figure = staleness_histograms(stalenesses)
glue("staleness-figure", figure, display=False)
plt.close(figure)  # shown once, by the numbered figure below

# %% [markdown]
# ```{glue:figure} staleness-figure
# :name: fig-staleness-histograms
#
# The share of updates with each staleness, one panel a run: 1, 2, 4 and 8
# equal workers with random delays, and four workers of which one is four
# times slower.
# ```
#
# In {numref}`fig-staleness-histograms` the mean staleness is close to
# $n - 1$ for $n$ equal workers. Asynchronous training does not wait for
# {term}`stragglers <straggler>` (devices slower than the others), it lets
# them apply old news: a slow worker's few updates are very stale, the fast
# workers' a little fresher. The mean over all updates is still
# {glue:text}`mean-staleness-uneven:.2f`: every update lands inside the
# computations of the $n - 1$ others, whatever the speeds.
#
# ## Where asynchronous training breaks
#
# With a small learning rate staleness hardly matters. With a larger one, the figure's
# overshoot repeats at every update and grows with the staleness. We train
# the y = x² network with 1, 4 and 8 equal workers (staleness 0, 3 and 7),
# each on its own {term}`shard` of the 50 points, at two learning rates, 400
# updates each; `stop_on_non_finite=False` lets a diverging run go on
# instead of raising `pargrad.NonFiniteLossError`.

# %%
def train(workers, learning_rate, staleness_aware=False, updates=400):
    """One asynchronous run from seed 0's weights; its history and final loss on all 50 points."""
    trainer = AsyncTrainer(parabola_model(seed=0), squared_error, devices[:workers],
                           learning_rate=learning_rate, staleness_aware=staleness_aware,
                           progress=False, stop_on_non_finite=False)
    history = trainer.fit(x, y, steps=updates, scenario=Scenario((1.0,) * workers))
    model = parabola_model(seed=0)
    model.set_weights(trainer.get_weights())
    return history, float(squared_error(y, model(x)))


runs, final = {}, {}
for rate in (0.03, 0.1):
    for workers in (1, 4, 8):
        history, final[workers, rate] = train(workers, rate)
        runs[workers, rate] = history.loss
        print(f"learning rate {rate}, {workers} workers: final loss {final[workers, rate]:.3f}")
aware, aware_final = {}, {}
for workers in (4, 8):
    history, aware_final[workers] = train(workers, 0.1, staleness_aware=True)
    aware[workers] = history.loss
    print(f"learning rate 0.1 / (staleness + 1), {workers} workers: final loss "
          f"{aware_final[workers]:.3f}")

# %% tags=["remove-cell"]
for workers in (1, 4):
    assert np.isfinite(final[workers, 0.03]) and np.isfinite(final[workers, 0.1])
assert not np.isfinite(runs[8, 0.1][-1])  # 8 workers at 0.1 diverge
assert final[4, 0.03] < final[1, 0.03] < final[8, 0.03]  # this seed only
assert final[1, 0.1] < final[4, 0.1]
assert np.isfinite(aware_final[4]) and np.isfinite(aware_final[8])

# %% tags=["remove-input", "nbval-ignore-output"]
# (nbval compares a glued figure's pixels; these float32 curves move by rounding)
figure, axes = plt.subplots(1, 3, figsize=(13, 3.4))
names = {1: "1 worker", 4: "4 workers", 8: "8 workers"}
for ax, rate in zip(axes, (0.03, 0.1)):
    loss_against_updates({names[w]: runs[(w, rate)] for w in (1, 4, 8)}, window=8,
                         ax=ax, title=f"learning rate {rate}")
loss_against_updates({"1 worker": runs[(1, 0.1)],
                      **{names[w]: losses for w, losses in aware.items()}},
                     window=8, ax=axes[2], title="0.1 / (staleness + 1)")
figure.tight_layout()
glue("one-seed-figure", figure, display=False)
plt.close(figure)  # shown once, by the numbered figure below

# %% [markdown]
# ```{glue:figure} one-seed-figure
# :name: fig-one-seed
#
# Loss on all 50 points against updates (a running mean over 8 updates, log
# scale) for 1, 4 and 8 workers from one seed's initial weights: at rate
# 0.03, at rate 0.1, and at the staleness-aware rate 0.1 / (staleness + 1)
# beside one worker at 0.1. A line that leaves the plot overflowed.
# ```
#
# In {numref}`fig-one-seed`, at the smaller rate 4 workers happen to end
# below one worker and 8 above it; at the larger one the single worker trains
# fastest, 4 workers bounce and 8 diverge. The third
# panel divides each update's rate by its staleness plus one, the
# {term}`staleness-aware rate` of Zhang et al. {cite}`zhang2016staleness`: 4
# and 8 workers descend steadily again, with smaller steps. On a parabola of
# curvature $\lambda$, a gradient $\tau$ updates old converges only while
# $\eta\lambda$ stays below about $\pi/(2\tau + 1)$: the safe rate shrinks
# like one over twice the staleness
# ([Stale gradients in depth](d2_stale_gradients_in_depth) derives the bound).
# But these are single runs from one seed.
#
# ## Over many initial weights
#
# We ask the title question as [How the book decides](a0_methods) prescribes:
# on two sets of {glue:text}`seeds` seeds each (a seed fixes the initial
# weights), each method at the best learning rate of a grid $2^{1/4}$ apart,
# picked on a {term}`tuning pool` of {glue:text}`pool` other tuning seeds of the set's
# own; a verdict pools both sets and stands only if each leans the same way,
# and an "ahead" must come back on at least {glue:text}`min-agreement` of
# the pools' resampled draws, so that no verdict rests on a lucky pick.
# Every method makes {glue:text}`updates` updates. Each of 2, 4 and 8 asynchronous
# workers gets a **zero-staleness control**: one worker taking the same $n$
# shards in turn, every gradient fresh. Its gap to one worker is the cost of
# seeing each shard less often; the asynchronous workers' gap to it is the
# cost of staleness. The runs come from `pargrad.book.parabola_async`, a
# float64 NumPy replica of the trainer for many seeds at once, checked
# against it on the deep-dive page; `tools/measure_tuned_stale_gradients.py`
# stores them.

# %% tags=["remove-input"]
replication = parabola_async.tuned_replication("workers")
methods = parabola_async.worker_methods()
family = {m.name: experiments.statement_key("asynchronous training", m.name, "1 worker")
          for m in methods[1:]}   # each verdict after Holm's correction over the book's
Markdown(experiments.results_table(replication, "1 worker", family=family).to_markdown())

# %% [markdown]
# The table, over both seed sets: median final loss; the median per-seed
# ratio to one worker; the seeds on which the method ended lower; the verdict.

# %% tags=["remove-cell"]
glue("seeds", len(replication.page.seeds))
glue("pool", len(parabola_async.TUNED_SETS["page"][1]))
glue("min-agreement", f"{tuning.MIN_AGREEMENT:.0%}")
glue("updates", parabola_async.UPDATES)
staleness_ratios, examples_ratios = [], []
effects = {}  # (set, n) -> (examples' median ratio, staleness's median ratio)
for n in (2, 4, 8):
    verdict = replication.compare(f"{n} async workers", "1 worker")
    assert verdict.verdict == "1 worker ahead", verdict          # item 5: on both seed sets
    control = replication.compare(f"{n} shards in turn", "1 worker")
    assert control.verdict == "1 worker ahead", control          # part of the gap is examples
    staleness = replication.compare(f"{n} async workers", f"{n} shards in turn")
    assert staleness.verdict == f"{n} shards in turn ahead", staleness  # the rest is staleness
    examples_ratios.append(control.pooled.effect)
    staleness_ratios.append(staleness.pooled.effect)
    # staleness's share of the gap, in logs: log(async / in turn) / log(async / 1 worker)
    effects[n] = np.log(staleness.pooled.effect) / np.log(verdict.pooled.effect)
# staleness's ratio grows with the workers; its share of the gap is most of it from 4 on, flat
assert staleness_ratios[0] < staleness_ratios[1] < staleness_ratios[2], staleness_ratios
assert all(effects[n] > 0.5 for n in (4, 8)) and abs(effects[8] - effects[4]) < 0.1, effects
glue("share-4", 100 * effects[4])
glue("share-8", 100 * effects[8])
two = replication.compare("2 async workers", "1 worker")
assert two.page.wins > 0  # not on every seed
glue("two-wins-page", two.page.wins)
glue("two-wins-held-out", two.held_out.wins)
glue("examples-low", min(examples_ratios))
glue("examples-high", max(examples_ratios))
glue("staleness-low", min(staleness_ratios))
glue("staleness-high", max(staleness_ratios))
for run in (replication.page, replication.held_out):
    best = [run.rates[m.name] for m in methods if "async" in m.name or m.name == "1 worker"]
    assert best == sorted(best, reverse=True), best  # more staleness, smaller best rate
glue("bound-7", delay.stable_rate_bound(7))

glue("bound-factor-7", delay.stable_rate_bound(0) / delay.stable_rate_bound(7))

# %% [markdown]
# **Per update, one worker is ahead of 2, 4 and 8 asynchronous workers on
# both seed sets**, each at its own best rate, and the more workers, the
# smaller that best rate. Not on every seed: 2 asynchronous workers end lower
# on {glue:text}`two-wins-page` of the page's {glue:text}`seeds` seeds and on
# {glue:text}`two-wins-held-out` of the held-out ones. The zero-staleness
# controls lose to one worker too, by a median ratio of
# {glue:text}`examples-low:.2f` to {glue:text}`examples-high:.2f`: part of
# the gap is examples. The rest is staleness: each control beats its asynchronous
# workers on both sets, by a median ratio of {glue:text}`staleness-low:.1f`
# to {glue:text}`staleness-high:.1f`, growing with the workers. From 4
# workers on it is most of the gap, and a steady share of it: measured in
# logarithms, {glue:text}`share-4:.0f` % of the gap at 4 workers and
# {glue:text}`share-8:.0f` % at 8.
#
# ## Remedies: a guard, not a gain
#
# The staleness-aware rate and delay-compensated asynchronous SGD (DC-ASGD)
# {cite}`zheng2017asynchronous`, which corrects a stale gradient for the
# distance the parameters moved since the read, both keep a too-high learning
# rate from blowing up. Whether either does better than a well-tuned
# constant rate, with four workers of which one is ten times slower, is
# measured, sweeps and verdicts, in
# [Stale gradients in depth](d2_stale_gradients_in_depth). Bounding the staleness instead (a worker too far ahead waits
# {cite}`ho2013more`) is run in
# [Sync vs async in the same time](05_sync_vs_async).
#
# ## Lost updates
#
# One more failure has nothing to do with staleness. An update is a
# *read-modify-write*: if two workers do it at once, both can read the same
# value, and the second write wipes out the first. Keras 3's `Variable.assign_add` is such a
# read-modify-write:

# %% tags=["program"]
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # set before TensorFlow starts: no start-up logs

import keras

counter = keras.Variable(0.0)
read_by_d0 = counter + 0.0  # d0 reads 0
read_by_d1 = counter + 0.0  # d1 reads 0, before d0 has written
counter.assign(read_by_d0 + 1.0)  # d0 writes 1
counter.assign(read_by_d1 + 1.0)  # d1 writes 1, over d0's 1
print("two additions of 1 give", float(counter.numpy()))

# %% [markdown]
# With real threads it happens all the time (the deep-dive page counts it).
# A native `tf.Variable.assign_add` runs as one kernel under the variable's
# lock, and `AsyncTrainer` applies every update under a lock: nothing is
# lost. At scale, synchronous training with backup workers came out ahead
# {cite}`chen2016revisiting`: [Sync vs async in the same
# time](05_sync_vs_async) tells that history.
#
# ## Summary
#
# - Asynchronous data parallelism runs the single-device loop on every
#   device, on shared parameters: read, compute on its own data, apply,
#   without waiting.
# - An update's staleness, the updates that landed between its read and its
#   apply, is $n - 1$ on average with $n$ devices, whatever their speeds; a
#   slow device applies few, very stale updates.
# - Two stale updates computed at the same point overshoot when
#   $\eta a > 1/2$; against one synchronous step at the same rate, in the
#   same wall time, the stale pair loses only beyond $\eta a = 2/3$. The
#   safe rate shrinks about like
#   $1/(2\tau + 1)$ with the staleness $\tau$.
# - Per update, on both seed sets, one worker at its best rate ends lower
#   than 2, 4 and 8 asynchronous workers at theirs, though not on every seed;
#   a zero-staleness control puts part of the gap on examples and, from 4
#   workers on, most of it on staleness.
# - The staleness-aware rate and DC-ASGD guard against a too-high rate;
#   how they compare with a tuned constant rate is measured in the deep dive.
# - Updates to shared parameters must be atomic.
#
# ## Exercises
#
# 1. Redraw the stale-gradient figure with `STEP_TIMES_CURVATURE` just below
#    and at 0.5, and at twice the figure's value. Then add a third worker (`devices[:3]`,
#    `Scenario((1, 0.9, 0.8))`, `steps=3`): from which value of $\eta a$ on
#    does the third update overshoot?
#
#    *Hint:* after $k$ stale updates computed at the same point, the distance
#    to the minimum is multiplied by $1 - k\eta a$.
# 2. Set `SPEEDS = [0.8, 1.0]` in the figure's cell. Which worker applies
#    first now, and does the picture change? Why?
# 3. In the staleness measurements, make one of 8 workers ten times slower.
#    Predict the mean staleness of its updates, then run it.
#
#    *Hint:* count the updates the seven others apply while it computes once.
# 4. Find the largest learning rate at which 8 equal workers still converge
#    on the y = x² network in 400 updates. How does it compare with $1/8$ of
#    the single worker's largest rate?
#
# ```{dropdown} Solution to exercise 1
# With two workers the second update overshoots when $1 - 2\eta a < 0$, that
# is from $\eta a = 0.5$ on; just below it stops short, at twice the figure's
# value it lands far beyond. With three workers reading the same point, the third update
# overshoots from $\eta a = 1/3$ on: the limit shrinks as $1/k$.
# ```
#
# ```{dropdown} Solution to exercise 2
# Worker 1 (now the faster) applies first and worker 0's gradient is the
# stale one; the picture is the same with the roles of d0 and d1 swapped,
# because both gradients were computed at the same point.
# ```
#
# ```{dropdown} Solution to exercise 3
# While the slow worker computes once (ten time units), each of the seven
# others applies about ten updates, so its updates have a staleness of about
# 70; the fast workers' updates stay near 7 or below, since the slow worker
# lands only once per ten of their steps.
# ```
#
# ```{dropdown} Solution to exercise 4
# The delayed-gradient bound answers it: with staleness 7 the largest stable
# $\eta\lambda$ is $2\sin(\pi/30)$, {glue:text}`bound-7:.3f`, against 2 for
# one worker, a factor of about 1/{glue:text}`bound-factor-7:.1f`
# (`parabola_async.largest_stable_rate` measures it per seed, as the
# deep-dive page does). That is close to $1/8$, and a little below it,
# because the stale steps of a fixed delay overshoot more than eight small
# steps would.
# ```
