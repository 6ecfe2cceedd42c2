# %% [markdown]
# # Asynchronous training
#
# The simplest way to train on several devices is to not coordinate them at
# all: every device runs the single-device training loop on its own data, on
# parameters they all share. This is *asynchronous* data-parallel training,
# the mode of the first large-scale systems {cite}`dean2012large`.
#
# Two of the texts that started this book ([Where this book
# starts](00_sources)) guide the chapter. The stale-gradient article, on
# TensorFlow's two modes of parallel training, describes asynchronous mode and
# draws its weakness in one picture, which we reproduce from a real run.
# The y = x² question of the chapter "The training loop" gives the test
# problem again: its 1-5-1 `tanh` network fitting $y = x^2$.
#
# **In this chapter you will**
#
# - see asynchronous training in words and in code: the single-device loop,
#   copied once per device;
# - draw the famous stale-gradient picture from a real two-device run: one
#   device's gradient, computed for parameters that have moved since, pushes
#   them past the minimum;
# - measure staleness, the number of updates that land while a device computes,
#   for 1, 2, 4 and 8 devices and with one slow device;
# - watch asynchronous training break as staleness and learning rate grow, and
#   repair it with a staleness-aware learning rate;
# - see why updates to shared parameters must be atomic, by losing some.
#
# Runs in under two minutes on two CPU cores.

# %% tags=["colab"]
# On Colab: install pargrad from the book's repository. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad @ git+{REPOSITORY}@main"],
        check=True,
    )

# %% [markdown]
# We import `pargrad` first (it silences TensorFlow's start-up lines), split the
# CPU into eight logical devices before anything else touches TensorFlow, and
# seed everything.

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from pargrad.book import plots
from pargrad.asynchronous import AsyncTrainer, lost_updates
from pargrad.book import show_lines

devices = pargrad.logical_devices(8)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## The single-device loop, copied several times
#
# One training iteration is a forward pass on a small batch, the loss, a
# backward pass and an update. In asynchronous mode each device:
#
# 1. **reads** the latest shared parameters, whenever it is ready to start;
# 2. computes the loss and the **gradients on its own data**;
# 3. **applies** its update to the shared parameters, on its own, without
#    waiting for any other device.
#
# Then it starts again. Nobody waits for anybody, so a fast device is never
# held up by a slow one. The price: while a device computes, the others keep
# updating the parameters, so by the time its gradient is applied, it was
# computed for parameters that no longer exist. It is *stale*. We call the
# number of updates that landed between a device's read and its apply the
# update's **{term}`staleness`**.
#
# `pargrad.AsyncTrainer` does exactly this. The shared parameters live on one
# *parameter device* (the first device); one worker runs on each device. These
# are the lines of a worker's loop, as each worker's thread runs it, that
# carry the idea:

# %%
show_lines(AsyncTrainer._work, "parameters, version = self._read()", "self._apply(")

# %% [markdown]
# It is the single-device loop: `_read` takes the current parameters and
# their version, `_gradients` computes the loss and the gradients on this
# worker's data, and `_apply` updates the shared parameters. In between, a
# device that is slower than the others (`speed` below 1) or a random delay
# waits the extra time. Around these lines, in the collapsed cell below, the
# loop claims one of the requested updates (`_claim_update`, where the
# *bounded staleness* of the chapter "Sync vs async in the same time" will
# make a worker wait while it is too far ahead of the others) and stops when
# the run is over.

# %% tags=["hide-cell"]
pargrad.show_source(AsyncTrainer._work)

# %% [markdown]
# Reading and
# applying happen under a lock, so that a read sees a whole version of the
# parameters and an update is applied in one piece. Applying records the
# staleness, and divides the learning rate by `staleness + 1` when we ask for
# the staleness-aware rate (more on that below):

# %%
pargrad.show_source(AsyncTrainer._apply)

# %% [markdown]
# ## Two ways to run: real threads and a virtual clock
#
# `fit(..., mode="free-running")` starts one real thread per worker; that is
# what you would use for speed, and its order of events depends on the
# operating system. A book needs figures that come out the same on every
# machine, so `fit(..., mode="scheduled")` (the default) runs the same workers
# in one thread and lets a *seeded virtual clock* decide who reads and who
# applies when: a step on a device takes `1 / speed` time units, plus an
# optional random delay (`jitter`). Same seed, same run, same numbers.
#
# Here are three workers training the y = x² network for 12 updates; device 2 is half as fast, and small random
# delays shuffle the order. Each bar runs from a worker's read to its apply;
# the number is the staleness of that update.

# %%
x, y = pargrad.parabola_data()
trainer = AsyncTrainer(pargrad.parabola_model(seed=0), pargrad.squared_error, devices[:3],
                       learning_rate=0.01, progress=False)
history = trainer.fit(x, y, updates=12, speeds=[1.0, 1.0, 0.5], jitter=0.2, seed=1)
print("worker   :", history["worker"])
print("read v   :", history["read_version"])
print("applied v:", history["applied_version"])
print("staleness:", history["staleness"])
print("version counter:", trainer.version)
figure = plots.async_timeline(history)

# %% [markdown]
# Every update is recorded: the worker, the version of the parameters it read,
# the version it was applied to, their difference (the staleness), its loss
# and its time. The version counter counts the applied updates, so nothing
# was lost: 12 requested, 12 applied. The slow device's updates are the stalest:
# while it computes once, the two others each update about twice.
#
# (`AsyncTrainer` shows a progress bar while it trains; `progress=False`
# switches it off.)
#
# ## The stale gradient, drawn from a run
#
# The stale-gradient article explains asynchronous training with one picture. A loss curve; a
# black ball is the parameter at time t0, when devices d0 and d1 both read it.
# Both gradients point left, downhill. At t1 d0 applies its update: the gray
# ball. At t2 d1 applies its gradient, computed at t0, to the parameter that d0
# has already moved: the white ball shoots past the minimum.
#
# We produce the picture with a real run. The model has one parameter $w$ and
# predicts $\hat y = w x$; the data are the 50 points $x$ of the y = x² question with
# targets $y = 0.5\,x$, so the loss $L(w) = \mathrm{mean}((w x - y)^2)$ is a
# parabola with its minimum at $w^* = 0.5$ and curvature
# $L''(w) = 2\,\mathrm{mean}(x^2)$. Change the three numbers in the next cell to
# redraw the figure: the learning rate is set as a multiple of one over the
# curvature.

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
# Two workers, on devices d0 and d1, each with its own half of the data (the
# trainer deals the examples out: worker $i$ gets every second example
# starting at $i$). We record the parameter after every update with the
# `on_update` hook, and run two updates:

# %%
stale_run = AsyncTrainer(one_parameter_model(START), mean_squared_error, devices[:2],
                         learning_rate=learning_rate, progress=False)
async_path = [START]
stale_history = stale_run.fit(
    x, targets, updates=2, speeds=SPEEDS,
    on_update=lambda record: async_path.append(float(stale_run.get_weights()[0][0, 0])))
for key in ("worker", "read_version", "applied_version", "staleness", "time"):
    print(f"{key:>15}: {stale_history[key]}")
print("w at t0, t1, t2:", np.round(async_path, 4))

# %% [markdown]
# Both updates read version 0; d0's lands at time 1, d1's at time 1.25 on
# top of d0's, with staleness 1. To judge that result we need two more runs
# from the same start. The **fresh** run applies the same two updates one
# after the other, each gradient taken where the parameter is when it is
# applied: what one device would do with the same two halves of the data, in
# twice the time. The **synchronous** step averages the two gradients, both
# taken at $w_0$, and applies them once: it ends when the slower device
# does, at the same wall time as the asynchronous pair.

# %%
halves = [(x[worker::2], targets[worker::2]) for worker in range(2)]  # the trainer's deal


def gradient(w, worker):
    """d loss / d w on one worker's half of the data, at the parameter value w."""
    w = tf.Variable(w)
    with tf.GradientTape() as tape:
        loss = mean_squared_error(halves[worker][1], w * halves[worker][0])
    return float(tape.gradient(loss, w))


def three_runs(start, rate):
    """(stale, fresh, synchronous) paths of w from `start` with learning rate `rate`."""
    g0, g1 = gradient(start, 0), gradient(start, 1)  # both read at t0
    stale = [start, start - rate * g0, start - rate * g0 - rate * g1]
    fresh_first = start - rate * g0
    fresh = [start, fresh_first, fresh_first - rate * gradient(fresh_first, 1)]
    sync = [start, start - rate * (g0 + g1) / 2]
    return stale, fresh, sync


by_hand, fresh_path, sync_path = three_runs(START, learning_rate)
assert np.allclose(by_hand, async_path, atol=1e-5)  # AsyncTrainer did exactly this (float32)
loss_at = lambda w: float(mean_squared_error(targets, w * x))  # noqa: E731
step_time = [1 / speed for speed in SPEEDS]  # the virtual clock: d1 takes longer a step
walls = {"asynchronous (stale)": float(stale_history["time"][-1]),
         "the same two updates, fresh": step_time[0] + step_time[1],
         "synchronous, one step": max(step_time)}
print(f"eta * a = {learning_rate * curvature:.2f}")
print(f"{'run':30s} {'updates':>7s} {'wall time':>9s} {'w at the end':>12s} {'loss':>7s}")
for (name, wall), path in zip(walls.items(), (async_path, fresh_path, sync_path)):
    print(f"{name:30s} {len(path) - 1:7d} {wall:9.2f} {path[-1]:12.3f} {loss_at(path[-1]):7.3f}")
assert (async_path[-1] - 0.5) * (START - 0.5) < 0 < (fresh_path[-1] - 0.5) * (START - 0.5)
assert walls["asynchronous (stale)"] == walls["synchronous, one step"] < walls["the same two updates, fresh"]

# %% [markdown]
# The wall times are those of the virtual clock above. The synchronous step
# waits for the slower device, d1, and so ends when d1's stale update lands;
# the fresh run must wait for d0's update before d1 may read, so its two
# steps take turns instead of overlapping.
#
# Why does the stale update overshoot? Write $a_0, a_1$ for the curvatures
# of the two halves of the data (they average to the curvature $a$). Then
# $w_1 - w^* = (1 - \eta a_0)(w_0 - w^*)$, and d1's stale update subtracts
# $\eta a_1 (w_0 - w^*)$, its gradient *at $w_0$*. The three runs end at
#
# $$\begin{aligned}
# \text{stale:}\quad & w_2 - w^* = \bigl(1 - \eta(a_0 + a_1)\bigr)(w_0 - w^*) \approx (1 - 2\eta a)(w_0 - w^*),\\
# \text{fresh:}\quad & w_2 - w^* = (1 - \eta a_1)(1 - \eta a_0)(w_0 - w^*) \approx (1 - \eta a)^2 (w_0 - w^*),\\
# \text{synchronous:}\quad & w_1 - w^* = (1 - \eta a)(w_0 - w^*).
# \end{aligned}$$
#
# Both stale updates were sized for the distance from $w_0$; applied one
# after the other they cover it twice, and the ball passes the minimum as
# soon as $\eta a > 1/2$. Which run ends closest depends on $\eta a$ alone.
# We sweep it, with the same gradients computed at every value, and find
# where the stale pair starts to lose to each of the others:

# %%
sweep = {"step_times_curvature": np.round(np.arange(0.02, 1.3, 0.02), 2),
         "async": [], "fresh": [], "sync": []}
for product in sweep["step_times_curvature"]:
    for key, path in zip(("async", "fresh", "sync"), three_runs(START, product / curvature)):
        sweep[key].append(abs(path[-1] - 0.5) / (START - 0.5))
sweep = {key: np.array(values) for key, values in sweep.items()}
products = sweep["step_times_curvature"]
worse_than_fresh = products[np.argmax(sweep["async"] > sweep["fresh"])]
worse_than_sync = products[np.argmax(sweep["async"] > sweep["sync"])]
print(f"the stale pair ends farther from the minimum than two fresh updates from eta*a = "
      f"{worse_than_fresh:.2f} on (2 - sqrt(2) = {2 - np.sqrt(2):.3f})")
print(f"... and farther than one synchronous step from eta*a = {worse_than_sync:.2f} on "
      f"(2/3 = {2 / 3:.3f})")
assert abs(worse_than_fresh - (2 - np.sqrt(2))) <= 0.03 and abs(worse_than_sync - 2 / 3) <= 0.03
assert (sweep["async"][products < worse_than_fresh] <= sweep["fresh"][products < worse_than_fresh]).all()

# %%
from pargrad.book import glue

grid = np.linspace(-0.5, 3.5, 161)
curve = [loss_at(w) for w in grid]
figure = plots.stale_gradient(grid, curve, async_path, fresh_path, sync_path, sweep=sweep)
glue("stale-gradient-figure", figure, display=False)
plt.close(figure)  # shown once, by the numbered figure below

# %% [markdown]
# ```{glue:figure} stale-gradient-figure
# :name: fig-stale-gradient
#
# The stale-gradient article's figure, from the runs above ($\eta a$ = 0.6). The balls
# are the parameter $w$: black when both devices read it (t0), gray after
# the first update (t1), white after the second (t2). (a) Asynchronous: d1's
# gradient, read at t0, is applied after d0's update and carries $w$ past the
# minimum. (b) The same two updates, each gradient fresh. (c) One
# synchronous step, in the same wall time as (a). (d) The distance to the
# minimum after each run, relative to the start, for every $\eta a$; shaded
# where the stale pair loses to the fresh one yet beats the synchronous step.
# ```
#
# {numref}`fig-stale-gradient` shows the stale-gradient article's two claims side by side, and
# why they do not contradict each other. **Staleness hurts** per update:
# panel (a) against panel (b), the same two gradients' worth of work, and
# the stale pair overshoots and ends farther away, once $\eta a$ passes the
# first threshold printed above (below it, on this parabola, the stale pair
# even lands closer, because it moves farther). **In the same time,
# asynchronous training is not necessarily worse**: panel (a) against panel
# (c). The fresh run needs twice the wall time of the other two, because its
# second gradient must wait for the first update; the synchronous step
# takes the same time as the asynchronous pair but moves once, and the stale
# pair ends closer to the minimum than it does up to the second threshold
# above. Panel (d) draws both comparisons for every $\eta a$: between the
# two thresholds, both claims hold at once, as they do at the figure's
# $\eta a$ = 0.6. With $k$ workers that all read $w_0$ the stale factor is
# $1 - k\eta a$: the more workers, the smaller the learning rate that is safe.

# %% [markdown]
# ### Turn the dials yourself
#
# In the rendered book, the staleness playground below runs the recursion
# of this picture in your browser, on a parabola with curvature $\lambda$:
# every update applies a gradient that is $\tau$ updates old,
# $w_{t+1} = w_t - \eta\lambda\, w_{t-\tau}$ (`pargrad.book.delay`), as
# $\tau + 1$ equal workers that all read $w_0$ do. Move the sliders for
# $\eta\lambda$, $\tau$ and the starting point: it redraws the black, gray
# and white balls of the first round of updates, the loss of the stale, the
# fresh and the synchronous runs over the same number of gradients, and where
# the stale run stops converging (`pargrad.book.delay.stable_rate_bound`).
#
# <div id="pargrad-staleness-playground">(The staleness playground needs the
# rendered book, with JavaScript; in a notebook, change the numbers in the
# cells above instead.)</div>

# %% [markdown]
# ## Staleness, measured
#
# How stale are the updates? If all $n$ devices are equally fast, each takes
# one time unit a step and they take turns: while one computes, each of the
# $n - 1$ others applies one update. So the staleness should be $n - 1$. We
# measure it for 1, 2, 4 and 8 workers with small random delays
# (`jitter=0.3`: each step takes 30% longer on average, at random), 400 updates
# each, on the y = x² network:

# %%
stalenesses = {}
for workers in (1, 2, 4, 8):
    trainer = AsyncTrainer(pargrad.parabola_model(seed=0), pargrad.squared_error,
                           devices[:workers], learning_rate=0.01, progress=False)
    run = trainer.fit(x, y, updates=400, jitter=0.3, seed=0)
    stalenesses[f"{workers} worker{'s' * (workers > 1)}"] = run["staleness"]
    print(f"{workers} workers: mean staleness {run['staleness'].mean():.3f}, "
          f"max {run['staleness'].max()}, histogram sums to {np.bincount(run['staleness']).sum()}")

# %% [markdown]
# Now four workers, one of them four times slower than the others:

# %%
trainer = AsyncTrainer(pargrad.parabola_model(seed=0), pargrad.squared_error, devices[:4],
                       learning_rate=0.01, progress=False)
run = trainer.fit(x, y, updates=400, jitter=0.3, seed=0, speeds=[1, 1, 1, 0.25])
slow = run["worker"] == 3
stalenesses["4 workers, one 4x slower"] = run["staleness"]
print(f"slow worker: {slow.mean():.1%} of the updates, mean staleness "
      f"{run['staleness'][slow].mean():.2f}")
print(f"the others : {1 - slow.mean():.1%} of the updates, mean staleness "
      f"{run['staleness'][~slow].mean():.2f}")
figure = plots.staleness_histograms(stalenesses)

# %% [markdown]
# The mean staleness is close to $n - 1$ for $n$ equal workers, spread a little
# by the random delays. A slow worker changes the picture twice over: it
# contributes few updates, and each of them is very stale (the other three
# apply about four updates each while it computes one), while the fast workers'
# updates become a little *fresher*, because the slow one rarely gets in
# between. Asynchronous training does not wait for {term}`stragglers <straggler>`
# (devices slower than the others); it lets them
# apply old news.
#
# Notice that the mean over *all* updates is still 2.98. That is no accident:
# every worker always has exactly one computation in flight, so every update
# lands inside the computations of the $n - 1$ other workers and adds one to
# the staleness of each of them. Whatever the speeds, the mean staleness is
# $n - 1$ (up to the computations still in flight when the run stops); what
# speeds change is how it is shared out.
#
# With real threads the staleness depends on the machine and the moment, so
# the next cell's numbers change from run to run; the cell checks what must
# hold whatever they are:

# %% tags=["nbval-ignore-output"]
trainer = AsyncTrainer(pargrad.parabola_model(seed=0), pargrad.squared_error, devices[:2],
                       learning_rate=0.01, progress=False)
free = trainer.fit(x, y, updates=300, mode="free-running")
print("staleness histogram with 2 threads:", np.bincount(free["staleness"]))
print(f"{len(free['loss'])} updates applied, version counter {trainer.version}")
assert trainer.version == len(free["loss"]) == 300
assert free["staleness"].max() >= 1

# %% [markdown]
# Measuring speed with real threads on a CPU takes two settings, which
# `benchmarks/async.py` uses: one intra-op thread
# (`tf.config.threading.set_intra_op_parallelism_threads(1)`, before
# TensorFlow starts; *intra-op* threads split one operation over the cores,
# *{term}`inter-op threads`* run independent operations side by side), and
# `AsyncTrainer(..., jit_compile=True)`. `jit_compile=True`
# ({term}`jit_compile`) is the `tf.function` option that compiles a function
# with {term}`XLA`, TensorFlow's optimising compiler, which fuses its
# operations into a few kernels; here it lets
# XLA run each worker's gradient step, and each update, as one computation on
# the worker's own thread. Without them, one worker alone already spreads its operations over
# both cores, and a second worker has no core of its own to add. With them,
# each worker is one core, like a device, and the benchmark prints how close
# two workers come to twice the updates per second of one.
#
# ## Where asynchronous training breaks
#
# Stale gradients are gradients of the wrong point. With a small learning rate
# the parameters move little between a read and an apply, and the staleness
# hardly matters. With a larger one, the overshoot of the figure above repeats
# at every step, and it grows with the staleness. We train the y = x² network
# with 1, 4 and 8 equally fast workers (staleness 0, 3 and 7) at two learning
# rates, 400 updates each. Each worker computes on its own share of the 50
# points, so the recorded losses jump from worker to worker; the plots show
# the mean over 8 consecutive updates. Some runs diverge: by default `fit`
# stops at the first NaN or infinite loss with `pargrad.NonFiniteLossError`,
# naming the update and the worker; here `stop_on_non_finite=False` lets them
# run on, because the divergence is what we want to see.

# %%
def train(workers, learning_rate, staleness_aware=False, updates=400, speeds=None):
    """One asynchronous run; returns its history and its loss on all 50 points at the end."""
    trainer = AsyncTrainer(pargrad.parabola_model(seed=0), pargrad.squared_error,
                           devices[:workers], learning_rate=learning_rate,
                           staleness_aware=staleness_aware, progress=False,
                           stop_on_non_finite=False)
    history = trainer.fit(x, y, updates=updates, speeds=speeds)
    return history, full_loss(trainer.get_weights())


def full_loss(weights):
    """The loss of the y = x² network with these weights on all 50 points."""
    model = pargrad.parabola_model(seed=0)
    model.set_weights(weights)
    return float(pargrad.squared_error(y, model(x)))


runs, final = {}, {}
for rate in (0.03, 0.1):
    for workers in (1, 4, 8):
        history, final[workers, rate] = train(workers, rate)
        runs[workers, rate] = history["loss"]
        print(f"learning rate {rate}, {workers} workers: loss on all 50 points after 400 "
              f"updates {final[workers, rate]:.3f}")

# %% [markdown]
# The remedy of Zhang et al. {cite}`zhang2016staleness`: divide the learning
# rate of each update by its staleness plus one. A fresh gradient gets the
# full step, a gradient that is seven updates old an eighth of it.

# %%
aware, aware_final = {}, {}
for workers in (4, 8):
    history, aware_final[workers] = train(workers, 0.1, staleness_aware=True)
    aware[workers] = history["loss"]
    print(f"learning rate 0.1 / (staleness + 1), {workers} workers: loss on all 50 points "
          f"{aware_final[workers]:.3f}; updates with staleness {workers - 1}: "
          f"{np.mean(history['staleness'] == workers - 1):.0%}")

# %%
figure, axes = plt.subplots(1, 3, figsize=(13, 3.4))
names = {1: "1 worker", 4: "4 workers", 8: "8 workers"}
for ax, rate in zip(axes, (0.03, 0.1)):
    plots.loss_against_updates({names[w]: runs[(w, rate)] for w in (1, 4, 8)}, window=8,
                               ax=ax, title=f"learning rate {rate}")
plots.loss_against_updates({"1 worker": runs[(1, 0.1)],
                            **{names[w]: losses for w, losses in aware.items()}},
                           window=8, ax=axes[2], title="0.1 / (staleness + 1)")
figure.tight_layout()
for workers in (1, 4):
    assert np.isfinite(final[workers, 0.03]) and np.isfinite(final[workers, 0.1])
assert not np.isfinite(runs[8, 0.1][-1])  # 8 workers at 0.1 diverge
assert np.isfinite(aware_final[4]) and np.isfinite(aware_final[8])

# %% [markdown]
# At learning rate 0.03 staleness does not hurt 4 workers at all: they end
# *lower* than the single worker. 8 workers keep up until, near the end,
# their stale updates start to wobble. At 0.1 the single worker trains
# fastest of all, 4 workers bounce up and down, and 8 workers diverge: their
# loss leaves the plot within fifty updates and ends as `nan`. The
# staleness-aware rate brings 4 and 8 workers back to a steady descent, at a
# price: the steps are smaller, so per update it learns more slowly than one
# worker at full rate.
#
# ### Why 4 stale workers beat one fresh one
#
# Two things differ between one worker and four: the four use a quarter of
# the data each per update, and their gradients are three updates stale. A
# zero-staleness control separates the two: one worker that takes the same
# quarters in turn, at the same learning rate, each gradient fresh. Mitliagkas
# et al. {cite}`mitliagkas2016asynchrony` showed that on average asynchrony
# with $n$ workers acts like *momentum* $\mu = 1 - 1/n$ with learning rate
# $\eta / n$: a stale gradient is a gradient from a few steps back, which is
# what a momentum term adds. So the second control is that run, fresh and
# sequential, with momentum 0.75 and learning rate 0.03 / 4:

# %%
def sequential_sgd(shards, learning_rate, momentum=0.0, updates=400):
    """One worker, no staleness: the shards x[i::shards] in turn; loss on all points at the end."""
    model = pargrad.parabola_model(seed=0)
    optimizer = keras.optimizers.SGD(learning_rate, momentum=momentum)
    parts = [(tf.constant(x[i::shards]), tf.constant(y[i::shards])) for i in range(shards)]

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = pargrad.squared_error(yb, model(xb))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    for update in range(updates):
        step(*parts[update % shards])
    return full_loss(model.get_weights())


controls = {"4 async workers (staleness 3)": final[4, 0.03],
            "1 worker, the same quarters, fresh": sequential_sgd(4, 0.03),
            "1 worker, fresh, momentum 0.75, rate 0.03/4": sequential_sgd(4, 0.03 / 4, 0.75),
            "1 worker, all 50 points (above)": final[1, 0.03]}
for name, loss in controls.items():
    print(f"{name:45s} loss on all 50 points after 400 updates {loss:.3f}")
stale, fresh, momentum = list(controls.values())[:3]
assert stale < fresh and abs(stale - momentum) < abs(stale - fresh)

# %% [markdown]
# The smaller batches are not what helps: the fresh run on the same quarters
# ends about where the single worker does. The staleness is: the run with
# momentum $1 - 1/n$ lands close to the asynchronous one. On a smooth, slow
# descent like this one (0.03 is a small rate for this network), the implicit
# momentum speeds training up; at 0.1 the same momentum, on top of a large
# step, is what makes 4 workers bounce and 8 diverge.
#
# ### When the staleness-aware rate earns its keep
#
# With equal workers, the staleness-aware rate is nothing new: almost every
# update has staleness $n - 1$ (the share printed above), so
# $\eta / (\tau + 1)$ is just the constant $\eta / n$, a smaller learning
# rate. And a constant rate chosen by hand can do better: 8 workers at the
# plain rate 0.03 end lower than 8 workers at $0.1 / (\tau + 1)$ (compare the
# two lines printed above). The rule only pays when staleness is *uneven*, so
# that it can give fresh updates full steps and stale ones small steps. Four
# workers, one of them ten times slower: its updates are very stale, the
# others' barely. We compare the rule with plain asynchronous training at the
# same base rate, and with a plain constant rate equal to the base rate
# divided by the mean staleness plus one (the same average step):

# %%
uneven = [1.0, 1.0, 1.0, 0.1]
for rate in (0.1, 0.2):
    plain_history, plain = train(4, rate, speeds=uneven)
    staleness = plain_history["staleness"]
    slow = plain_history["worker"] == 3
    matched_rate = rate / (staleness.mean() + 1)
    _, matched = train(4, matched_rate, speeds=uneven)
    _, rule = train(4, rate, staleness_aware=True, speeds=uneven)
    print(f"base rate {rate}: mean staleness {staleness[~slow].mean():.1f} (fast workers), "
          f"{staleness[slow].mean():.1f} (slow worker)")
    print(f"   plain {rate}: {plain:.3f}   plain {matched_rate:.3f} (same mean step): "
          f"{matched:.3f}   {rate} / (staleness + 1): {rule:.3f}")
    assert rule < matched and not plain < rule  # the rule wins; plain may even diverge (nan)

# %% [markdown]
# Here the rule is the best of the three at both base rates: the slow
# worker's old news is damped, while the fast workers keep most of their
# step. So use it where workers are uneven; with equal workers, just lower
# the learning rate.
#
# Other remedies bound the staleness instead (stale synchronous parallel:
# a worker more than $s$ updates ahead waits {cite}`ho2013more`) or correct the
# stale gradient with a first-order estimate of how it has changed
# {cite}`zheng2017asynchronous`.
#
# ## Lost updates
#
# There is one more way for asynchronous training to go wrong, and it has
# nothing to do with staleness. An update is a *read-modify-write*: read the
# parameter, add the step, write the result. If two workers do this at the
# same time, both can read the same value, and the second write wipes out the
# first. Keras 3's variables implement `assign_add` exactly that way:

# %%
pargrad.show_source(keras.Variable.assign_add)

# %% [markdown]
# Here is the unlucky interleaving, step by step: d0 and d1 both read the
# counter, then both write back what they read plus one.

# %%
counter = keras.Variable(0.0)
read_by_d0 = counter + 0.0  # d0 reads 0
read_by_d1 = counter + 0.0  # d1 reads 0, before d0 has written
counter.assign(read_by_d0 + 1.0)  # d0 writes 1
counter.assign(read_by_d1 + 1.0)  # d1 writes 1, over d0's 1
print("two additions of 1 give", float(counter.numpy()))

# %% [markdown]
# With real threads, the interleaving is up to the operating system, but it
# happens all the time. `pargrad.asynchronous.lost_updates` lets two threads add
# 1 to a variable 2000 times each and counts what is missing. With a Keras
# variable (the count differs from run to run):

# %% tags=["nbval-ignore-output"]
lost = lost_updates(keras.Variable(0.0), threads=2, increments=2000)
print(f"Keras variable: {lost} of 4000 additions lost")
assert lost > 0

# %% [markdown]
# A native `tf.Variable` adds in one kernel, `AssignAddVariableOp`, which
# TensorFlow runs while holding the variable's lock, so the read and the write
# cannot be torn apart:

# %%
print("tf.Variable: lost", lost_updates(tf.Variable(0.0), threads=2, increments=2000))

# %% [markdown]
# `AsyncTrainer` is safe twice over: its shared parameters are native
# `tf.Variable`s, and it applies each update, together with the version
# counter and the record, under one lock. That is why its version counter
# always equals the number of applied updates, as every run above checked.
#
# A lock serialises the updates. Hogwild! {cite}`niu2011hogwild` goes the other
# way and drops the lock altogether: for sparse problems, where each update
# touches only a few parameters, collisions are rare, and the occasional lost
# or mixed update costs less than the waiting a lock would cause. For dense
# networks like ours every update touches every parameter, so a lock (or an
# atomic kernel) is the safe default.
#
# ## Is asynchronous worse?
#
# The stale-gradient article concludes that, for the same wall-clock time, asynchronous training
# is not necessarily worse than synchronous, and that both are used. Per
# update, asynchronous training loses (stale gradients, smaller safe learning
# rates); per second, it gains whenever devices are uneven, because nobody
# waits for the slowest. The benchmark `benchmarks/async.py` measures both on
# two devices, one made twice as slow. The fair measure is DAWNBench's
# {cite}`coleman2017dawnbench`: the time to reach a target accuracy. (The page
# the stale-gradient article comes from lists DAWNBench among its related articles; the article
# itself does not use it.) The answer to the y = x² question went
# further and claimed
# that synchronous training "was mostly abandoned". The field went the other
# way: Chen et al. {cite}`chen2016revisiting` showed that synchronous training
# with a few backup workers beats asynchronous training, large-batch
# synchronous SGD trained ImageNet in an hour {cite}`goyal2017accurate`, and
# the analysis of DAWNBench's entries up to April 2018 found the fastest to
# be synchronous, all-reduce-based runs {cite}`coleman2019analysis`. The chapter after the
# next one measures sync against async on the same clock.
#
# ## Summary
#
# - Asynchronous data parallelism is the single-device loop run by every
#   device on shared parameters: read, compute on its own data, apply, with no
#   waiting.
# - An update's staleness is the number of updates that landed between its
#   read and its apply. With $n$ devices it is $n - 1$ on average, whatever
#   their speeds; a slow device applies few, very stale updates.
# - A stale gradient was computed for a point the parameters have left. Two
#   updates sized for the same point cover the distance twice: with two
#   workers the parameter overshoots the minimum of a parabola when
#   $\eta a > 1/2$. Against the same two updates made fresh, staleness costs
#   once $\eta a$ passes about $2 - \sqrt 2$; against one synchronous step in
#   the same wall time, only beyond about $2/3$. Both of the article's claims
#   hold, for different comparisons.
# - Staleness acts like momentum $1 - 1/n$ {cite}`mitliagkas2016asynchrony`:
#   at a small learning rate 4 stale workers trained *better* per update than
#   one fresh worker; at a large one the same momentum makes training bounce
#   and, with 8 workers, diverge.
# - A learning rate divided by staleness + 1 restores stability. With equal
#   workers it is just a constant, smaller rate (and a hand-picked one can do
#   better); it earns its keep when staleness is uneven, as with one slow
#   worker.
# - Updates to shared parameters must be atomic. Keras 3's `assign_add` is a
#   read-modify-write and loses updates under threads; native
#   `tf.Variable.assign_add` does not; `AsyncTrainer` applies under a lock.
#
# ## Exercises
#
# 1. Redraw the stale-gradient figure with `STEP_TIMES_CURVATURE` 0.4, 0.5 and
#    1.2. Then add a third worker (`devices[:3]`, `speeds=[1, 0.9, 0.8]`,
#    `updates=3`): from which value of $\eta a$ on does the third update
#    overshoot? Compare with $1 - k\eta a$.
#
#    *Hint:* after $k$ stale updates computed at the same point, the distance
#    to the minimum is multiplied by $1 - k\eta a$; it overshoots when that
#    is negative.
# 2. Set `SPEEDS = [0.8, 1.0]` in the figure's cell. Which worker applies
#    first now, and does the picture change? Why?
#
#    *Hint:* the two workers read the same parameters; which gradient is
#    stale depends only on who applies second.
# 3. In the staleness measurements, make one of 8 workers ten times slower.
#    Predict the mean staleness of its updates before you run it.
#
#    *Hint:* count the updates the seven others apply while the slow one
#    computes once.
# 4. Find the largest learning rate at which 8 equal workers still converge
#    on the y = x² network in 400 updates, with and without the staleness-aware
#    rate. How do the two compare with $1/8$ of the single worker's largest
#    rate?
#
#    *Hint:* with 8 workers the mean staleness is 7; a stale step behaves
#    roughly like part of one step 8 times as long.
# 5. Run `lost_updates` with 1, 2 and 4 threads on a Keras variable. Why is
#    nothing lost with one thread? Wrap the `assign_add` in a
#    `threading.Lock` and check that nothing is lost with four.
#
#    *Hint:* a lost update needs two threads between the read and the write
#    of `assign(self + value)`.
#
# ### Solutions
#
# These exercises change the chapter's runs; their solutions say what to look
# for, and the chapter's cells give the code to start from.
#
# ```{dropdown} Solution to exercise 1
# With two workers the second update overshoots when $1 - 2\eta a < 0$, that
# is from $\eta a = 0.5$ on; at 0.4 it stops short, at 1.2 it lands far
# beyond. With three workers reading the same point, the third update
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
# Without the correction, the largest stable rate with 8 workers is roughly
# an eighth of the single worker's, since about eight stale steps computed at
# nearly the same point add up. Dividing each update's rate by its staleness
# plus one brings the usable rate close to the single worker's again, at the
# price of smaller steps per update.
# ```
#
# ```{dropdown} Solution to exercise 5
# With one thread every `assign` reads the value the previous one wrote, so
# nothing is lost. With two or four threads, two of them can read the same
# old value and both write old + 1: one increment disappears. Holding a
# `threading.Lock` around each `assign_add` makes read and write one step,
# and four threads lose nothing.
# ```
