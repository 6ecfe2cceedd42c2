# %% [markdown]
# # Communicating rarely
#
# The answer to the y = x² question ([Where this book starts](00_sources))
# says synchronous training "was mostly abandoned" for asynchronous
# training. The chapters of Part II showed what happened inside a data
# centre instead: synchronous all-reduce won. This chapter shows what
# happened next, where the network is slow or workers come and go: training
# went back to communicating *rarely*. Every replica trains alone for `H`
# steps, and only then do the replicas average what they did. Local SGD
# {cite}`lin2020dont,ortiz2021tradeoffs` is this idea with a plain average;
# DiLoCo {cite}`douillard2023diloco` feeds the average to an *outer*
# optimizer with Nesterov momentum; OpenDiLoCo and INTELLECT-1
# {cite}`jaghouar2024opendiloco,jaghouar2024intellect1` used it to train
# across continents. The stale-gradient article asked what one gives up by
# not synchronising every step; `H` turns that yes/no question into a dial.
#
# **In this chapter you will**
#
# - read `pargrad.LocalSGDTrainer`: `H` local steps a replica, one real
#   all-reduce of the parameter changes, an outer step (plain averaging or
#   DiLoCo's Nesterov);
# - turn the dial from `H = 1` (synchronous SGD) to `H = 256` and plot the
#   loss against updates, against bytes sent, and against modelled time on
#   a fast link inside a box and a slow link between data centres;
# - reproduce, scaled down, three published results, and see where the
#   small version agrees and where it does not;
# - race synchronous, asynchronous, local SGD and DiLoCo with one slow worker
#   in the same virtual time;
# - let a worker leave and another join between rounds, across processes.
#
# Every conclusion here rests on 20 seeds, each method at the best rate of
# its own sweep. Runs in one to one and a half minutes on two CPU cores,
# most of it in the real trainer and in starting TensorFlow in eight worker
# processes.

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
# We import `pargrad` first (it keeps TensorFlow's start-up lines quiet) and
# split the CPU into four logical devices, one a replica.

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import matplotlib.pyplot as plt
import numpy as np
import psutil
from pargrad import cost
from pargrad.book import experiments, glue
from pargrad.book import plots, replay
from pargrad.book import rare_communication as rc
from pargrad.book.parabola import parabola_model
from pargrad.cluster import LocalCluster
from pargrad.local_sgd import LocalSGDTrainer

devices = pargrad.logical_devices(4)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## The idea, in the trainer's code
#
# A round of `LocalSGDTrainer` has three parts. First, every replica copies
# the shared parameters $w$ into its own copy $w_r$ and takes `H` steps of
# its own *inner* optimizer on its shard of the data, without any
# communication:

# %%
pargrad.book.show_lines(LocalSGDTrainer._replica_steps, "start = [", "return change, stacked")

# %% [markdown]
# Then one all-reduce averages the replicas' changes
# $\Delta = \frac{1}{R}\sum_r (w - w_r)$ (TensorFlow's cross-device ops in one
# process, `MultiWorkerMirroredStrategy`'s collectives across processes),
# and the *outer* optimizer applies $\Delta$ to $w$ as if it were a gradient:

# %%
pargrad.book.show_lines(LocalSGDTrainer._average_and_apply, "def average(change)",
                        "self.outer_optimizer.apply_gradients")

# %% [markdown]
# Between the two, the trainer gathers every replica's losses and stops
# before the average if one of them is not finite (the shared parameters
# then stay those of the round's start):

# %%
pargrad.book.show_lines(LocalSGDTrainer.run_call, "begin = time.perf_counter()",
                        "self._average_function")

# %% [markdown]
# Which outer optimizer turns this into which method:
#
# - `keras.optimizers.SGD(1.0)` gives $w - \Delta = \frac{1}{R}\sum_r w_r$:
#   the replicas' parameters averaged. This is **local SGD**, or model
#   averaging {cite}`lin2020dont`. With `H = 1` and an inner SGD it is
#   synchronous SGD: the average of one step from the same $w$ is one step
#   along the average gradient (`tests/test_local_sgd.py` checks that it
#   equals `SyncTrainer` within the rounding tolerance).
# - `keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)` treats
#   $\Delta$ as a gradient with Nesterov momentum: **DiLoCo**'s outer step
#   {cite}`douillard2023diloco`, with the paper's rate and momentum. The
#   paper's inner optimizer is AdamW; ours is plain SGD, whose rate we sweep.
#
# The two outer optimizers of this page, as `rare_communication.outer_optimizer`
# makes them:

# %%
for outer in replay.OUTERS:
    config = rc.outer_optimizer(outer).get_config()
    print(f"{outer:8s}: SGD(learning_rate={config['learning_rate']:.1f}, "
          f"momentum={config['momentum']:.1f}, nesterov={config['nesterov']})")

# %% [markdown]
# Each round, the trainer records the bytes each replica sends in a ring
# all-reduce of the parameters, $2(R-1)/R$ times their size (the chapter
# "What communication costs"), and, given a `pargrad.cost.Link`, the modelled
# time of that all-reduce. `LocalSGDHistory.clock_on(link, step_seconds)`
# charges a finished run on any other link without running it again.
#
# ```{note}
# The trainer's `scenario` (the replicas' speeds) and `step_seconds` move only this *virtual*
# clock: a "slow" replica is not slowed down on the wall clock (no sleep, no
# core held), so the runs and their results do not depend on it. Every time
# on this page is modelled time, never a wall-clock measurement.
# ```
#
# ## The chapter's problem, and a replay for many seeds
#
# The model is the y = x² question's 1-5-1 `tanh` network, in float64, on
# 48 evenly spaced points (shuffled once, as a data loader would), with
# four replicas: each gets a random quarter of the points, and every local
# step is a full-shard gradient step. A verdict needs many seeds and a rate
# sweep for every method, thousands of runs; `pargrad.book.replay`
# replays exactly what the trainer computes in vectorised float64 NumPy, and
# `pargrad.book.rare_communication` holds this page's experiments on it.
# Before we trust it, we run the real trainer for every `H` of the dial (on
# seed 0, DiLoCo's outer step, each at the inner rate its sweep picks
# below) and compare the final weights.

# %%
x, y = rc.problem_data()
UPDATES, DIAL, GRID = rc.UPDATES, rc.DIAL, rc.GRID
TEST_SEEDS, TUNING_SEEDS = rc.TEST_SEEDS, rc.TUNING_SEEDS
print(f"{len(x)} points, {rc.REPLICAS} replicas, {rc.PARAMETERS} parameters "
      f"({rc.PARAMETER_BYTES} bytes), {UPDATES} local steps a replica")
print("inner rates swept:", [f"2^{int(np.log2(r))}" for r in GRID])

# %% [markdown]
# ## The book's rule for a verdict
#
# Each method is swept over the grid on 20 *tuning* seeds (initial weights)
# and keeps the rate with the lowest median loss, which must lie inside the
# grid (`pargrad.book.experiments.sweep` raises otherwise); then every
# method runs at its own best rate on 20 *other* seeds, and two methods are
# compared seed by seed with the rule fixed before any run:

# %%
print(experiments.RULE)

# %% [markdown]
# The score is the loss on all 48 points of the shared parameters after
# 1024 local steps a replica, that is after `1024 / H` rounds. The sweeps
# on the tuning seeds (8 rates x 20 seeds for each of the chapter's 18
# methods) take about half a minute of NumPy; they were made by
# `tools/measure_rare_communication.py` and ship with the package in
# `pargrad/book/data/rare_communication_sweeps.json` (the test
# `tests/test_rare_communication.py` re-measures them). The page runs the
# test seeds live, at the stored best rates, after checking that each lies
# inside its grid:

# %%
pargrad.book.show_source(rc.experiment_at_stored_rates)

# %%
dial = rc.experiment_at_stored_rates("dial")
for name, best in dial.rates.items():
    print(f"{name:18s} best inner rate 2^{int(np.log2(best)):d}   "
          f"median loss on the test seeds {np.median(dial.scores[name]):.2g}")

# %% [markdown]
# Now the real trainer, once for every `H`, DiLoCo at its best rate, on
# seed 0; the replay of the same run on the same seed; and the largest gap
# between their final weights. A float64 equality can be shown only where
# the run does not amplify rounding: next to each gap we print how far the
# replay itself moves when its initial weights are nudged by one part in
# $10^{15}$.

# %%
def trainer_run(steps, rate, outer=replay.NESTEROV, seed=0):
    """LocalSGDTrainer on the chapter's problem: 4 replicas, full batch, UPDATES local steps."""
    strategy = pargrad.sync_strategy(rc.REPLICAS)
    with strategy.scope():
        model = parabola_model(seed=seed, hidden=rc.HIDDEN, dtype="float64")
        outer_step = rc.outer_optimizer(outer)
    trainer = LocalSGDTrainer(model, strategy, steps, learning_rate=rate,
                              outer_optimizer=outer_step)
    history = trainer.fit(x, y, rounds=UPDATES // steps, batch_size=len(x))
    return trainer, history


def largest_gap(weights, state):
    return max(float(np.max(np.abs(np.asarray(a) - b[0]))) for a, b in zip(weights, state.weights))


tolerance = pargrad.rounding_tolerance("float64", UPDATES)
histories, agreements = {}, {}
for steps in DIAL:
    rate = dial.rates[f"DiLoCo, H={steps}"]
    trainer, histories[steps] = trainer_run(steps, rate)
    replayed, _ = replay.train_rounds(replay.start([0]), (x, y), rc.REPLICAS, rate, steps,
                                      UPDATES // steps, replay.NESTEROV)
    nudged = replay.start([0])
    nudged.weights = tuple(w * (1 + 1e-15) for w in nudged.weights)
    nudged, _ = replay.train_rounds(nudged, (x, y), rc.REPLICAS, rate, steps, UPDATES // steps,
                                    replay.NESTEROV)
    gap = largest_gap(trainer.model.get_weights(), replayed)
    sensitivity = largest_gap([w[0] for w in nudged.weights], replayed)
    agreements[steps] = (gap, sensitivity)
    if sensitivity < tolerance:
        print(f"H = {steps:3d}: trainer and replay equal within the tolerance {tolerance:.0e}: "
              f"{gap < tolerance}")
    else:   # chaotic: the gap's digits depend on the machine, only its size is the claim
        print(f"H = {steps:3d}: chaotic at this rate (a nudge of 1e-15 grows past the "
              f"tolerance); trainer vs replay within 100 x the nudge's growth: "
              f"{gap < 100 * sensitivity}")
contracting = [s for s, (gap, sensitivity) in agreements.items() if sensitivity < tolerance]
assert contracting and all(agreements[s][0] < tolerance for s in contracting)
assert all(gap < 100 * max(sensitivity, tolerance) for gap, sensitivity in agreements.values())
glue("tolerance", f"{tolerance:.0e}")
glue("contracting", ", ".join(str(s) for s in contracting))

# %% [markdown]
# Where the run contracts (`H` = {glue:text}`contracting`), the trainer and
# the replay agree within the float64 rounding tolerance of 1024 updates,
# {glue:text}`tolerance` (`pargrad.rounding_tolerance`). Where a nudge of
# one part in $10^{15}$ already grows to a visible gap, the run is chaotic
# at that rate and no implementation could repeat it to the digit; there
# the trainer and the replay differ by no more than a hundred times what the
# nudge produces (checked, not printed: the digits of a chaotic gap depend
# on the machine), which is all an equality can mean there. The replay computes what
# the trainer computes; from here on, it runs the seeds.
#
# ## The dial
#
# Four views of the same runs: the median over the 20 test seeds of the loss
# after every round, each setting at its best rate, against the local steps
# each replica took, against the bytes each replica sent, and against the
# modelled time on two links. Every horizontal axis comes from the
# trainer's `LocalSGDHistory` of the run above. The links:

# %%
STEP_SECONDS, FAST, SLOW = rc.STEP_SECONDS, rc.FAST, rc.SLOW
print(f"one local step: {STEP_SECONDS * 1e3:g} ms of modelled compute")
for link in (FAST, SLOW):
    print(f"{link.name:28s} latency {link.latency * 1e6:8.0f} µs, bandwidth "
          f"{link.bandwidth / 1e9:7.3f} GB/s; one all-reduce of the model: "
          f"{cost.ring_all_reduce_time(rc.PARAMETER_BYTES, rc.REPLICAS, link) * 1e3:.3f} ms")

# %% [markdown]
# The fast link is an NVLink-class link inside one box (its bandwidth as in
# the chapter "What communication costs"); the slow one stands for a link
# between two data centres, with a one-way latency of tens of milliseconds
# and a gigabit a second: assumed orders of magnitude, not a measurement.
# One local step is charged a millisecond of compute, also an assumption. Our model has only 16
# parameters, so on both links an all-reduce costs its latencies, not its
# bytes; the section "What a GPU reader will see" puts real model sizes in.

# %%
curves = {steps: {outer: np.median(rc.loss_curves(
    dial.rates[rc.method_name(outer, steps)], TEST_SEEDS, steps, UPDATES, outer), axis=1)
    for outer in replay.OUTERS} for steps in DIAL}
figure = plots.dial_figure(curves, histories, FAST, SLOW, STEP_SECONDS)
glue("dial-figure", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} dial-figure
# :name: fig-dial
#
# The dial. (a) Per local step, communicating every step (`H = 1`) is
# best for plain averaging, and larger `H` costs loss. (b) Per byte sent,
# rare communication wins by far. (c) On a fast link, time is compute, so
# (c) looks like (a). (d) On a slow link, time is communication, so (d)
# looks like (b). Dashed: local SGD; solid: DiLoCo.
# ```
#
# The time to reach a loss, read off the curves: which `H` gets there
# first on each link.

# %%
def first_time_below(curve, clock, target):
    below = np.nonzero(curve <= target)[0]
    return clock[below[0]] if len(below) else np.inf


TARGET = 0.01
for link in (FAST, SLOW):
    times = {rc.method_name(outer, steps): first_time_below(curves[steps][outer], histories[steps].clock_on(link, STEP_SECONDS),
                              TARGET) for steps in DIAL for outer in replay.OUTERS}
    order = sorted(times, key=times.get)
    print(f"{link.name}: median loss {TARGET} first reached by")
    for name in order[:4]:
        print(f"    {name:18s} after {times[name]:.3g} s")
    glue(f"first-{'fast' if link is FAST else 'slow'}", order[0])

# %% [markdown]
# To a loss of 0.01, the first to arrive is {glue:text}`first-fast` on the
# fast link and {glue:text}`first-slow` on the slow one (the median over 20
# seeds). That is the whole trade: rare communication pays in loss per
# step, and buys it back only where a step's communication costs more than
# its computation.
#
# ## Three published results, scaled down
#
# The numbers the papers report, for reference (printed here so that the
# page states them once, with their sources):

# %%
PUBLISHED = [
    ("DiLoCo: workers, inner steps H, communication saved", "8 workers, H = 500, 500x less",
     "douillard2023diloco"),
    ("OpenDiLoCo: compute utilisation across 2 continents", "90-95 %", "jaghouar2024opendiloco"),
    ("INTELLECT-1: 10B parameters, H = 100 with int8 all-reduce", "400x less bandwidth, "
     "83-96 % compute utilisation", "jaghouar2024intellect1"),
]
for what, value, key in PUBLISHED:
    print(f"{what:58s} {value:40s} [{key}]")

# %% [markdown]
# **1. DiLoCo's communication saving at similar loss.** DiLoCo with 8 workers
# and `H = 500` matched fully synchronous training while communicating 500
# times less {cite}`douillard2023diloco`. Our table: for every `H`, the
# communication each replica does in 1024 local steps, the ratio to
# synchronous training, and the median final loss of both outer steps.

# %%
sync_bytes = histories[1].bytes_sent.sum()
print(f"{'H':>4s} {'rounds':>6s} {'bytes a replica':>15s} {'less communication':>18s} "
      f"{'local SGD loss':>14s} {'DiLoCo loss':>11s}")
for steps in DIAL:
    sent = histories[steps].bytes_sent.sum()
    print(f"{steps:4d} {len(histories[steps].loss):6d} {sent:15.0f} {sync_bytes / sent:17.0f}x "
          f"{np.median(dial.scores[f'local SGD, H={steps}']):14.2g} "
          f"{np.median(dial.scores[f'DiLoCo, H={steps}']):11.2g}")
assert all(sync_bytes / histories[s].bytes_sent.sum() == s for s in DIAL)

# %%
def p_text(verdict):
    """The sign test's p-value for the prose: "p = 0.5" or "p < 1e-4"."""
    p = experiments.format_p(verdict.p_value)
    return f"p {p}" if p.startswith("<") else f"p = {p}"


verdicts = {
    "diloco4-vs-sync": dial.compare("DiLoCo, H=4", "local SGD, H=1"),
    "diloco4-vs-sync-nesterov": dial.compare("DiLoCo, H=4", "DiLoCo, H=1"),
    "diloco16-vs-sync-nesterov": dial.compare("DiLoCo, H=16", "DiLoCo, H=1"),
}
for name, verdict in verdicts.items():
    print(verdict)
assert verdicts["diloco4-vs-sync"].verdict == "DiLoCo, H=4 ahead"
assert verdicts["diloco4-vs-sync-nesterov"].verdict == "no difference shown"
assert verdicts["diloco16-vs-sync-nesterov"].verdict == "DiLoCo, H=1 ahead"
for key, verdict in verdicts.items():
    glue(key, f"{verdict.wins} of {verdict.seeds} seeds, {p_text(verdict)}")

# %% [markdown]
# With `H = 4`, DiLoCo communicates 4 times less than synchronous SGD and
# ends lower ({glue:text}`diloco4-vs-sync`). That comparison flatters
# it: part of its lead is the outer momentum, not the rare communication.
# Against synchronous training with the same outer Nesterov step (`H = 1`),
# DiLoCo at `H = 4` shows no difference (better in
# {glue:text}`diloco4-vs-sync-nesterov`): no loss that 20 seeds can see,
# for 4 times less communication. At `H = 16` the saving costs loss: the synchronous run
# is ahead (DiLoCo better in only {glue:text}`diloco16-vs-sync-nesterov`).
# **Where it agrees**: a saving at similar loss exists, and DiLoCo beats
# plain synchronous SGD. **Where it differs**: the saving is 4×, not 500×.
# Our runs are 1024 steps long, so `H = 256` leaves 4 rounds, where
# DiLoCo's ran tens of thousands of steps with hundreds of rounds; and a
# 16-parameter network fitted to 48 points is far from a language model
# whose replicas, after 500 steps of their own, still sit in the same
# basin.
#
# **2. Local SGD loses when `H` grows too large.** Ortiz et al. found at
# ImageNet scale that lower communication came with lower accuracy, the
# more so with more local steps {cite}`ortiz2021tradeoffs`.

# %%
ortiz = {"sync-vs-local64": dial.compare("local SGD, H=1", "local SGD, H=64"),
         "local4-vs-local256": dial.compare("local SGD, H=4", "local SGD, H=256")}
for verdict in ortiz.values():
    print(verdict)
assert ortiz["sync-vs-local64"].verdict == "local SGD, H=1 ahead"
assert ortiz["local4-vs-local256"].verdict == "local SGD, H=4 ahead"
medians = [np.median(dial.scores[f"local SGD, H={s}"]) for s in DIAL]
print("median loss, local SGD, H = 1 ... 256:", " ".join(f"{m:.2g}" for m in medians))
for key, verdict in ortiz.items():
    glue(key, f"{verdict.wins} of {verdict.seeds} seeds, {p_text(verdict)}")

# %% [markdown]
# **Agrees**: synchronous SGD ends below local SGD with `H = 64` (in
# {glue:text}`sync-vs-local64`), and `H = 4` below `H = 256` (in
# {glue:text}`local4-vs-local256`). The median loss grows with `H`
# (printed above), slowly on this small problem: its replicas see random
# quarters of the same curve, so their local optima are close. With shards
# that differ (exercise 1), large `H` is ruinous.
#
# **3. The outer Nesterov step beats plain averaging.** Ortiz et al.
# recovered accuracy with a "slow momentum" on the averaged update, and
# DiLoCo's ablations chose Nesterov for the outer step
# {cite}`ortiz2021tradeoffs,douillard2023diloco`. Here, at the same `H`, each
# at its own best inner rate:

# %%
nesterov = {steps: dial.compare(f"DiLoCo, H={steps}", f"local SGD, H={steps}")
            for steps in (4, 16, 64)}
for verdict in nesterov.values():
    print(verdict)
assert nesterov[4].verdict == "DiLoCo, H=4 ahead" and nesterov[16].verdict == "DiLoCo, H=16 ahead"
assert nesterov[64].verdict == "local SGD, H=64 ahead"
for steps, verdict in nesterov.items():
    glue(f"nesterov-{steps}", f"{verdict.wins} of {verdict.seeds} seeds, "
         f"{p_text(verdict)}")

# %% [markdown]
# **Agrees** at `H = 4` (DiLoCo better in {glue:text}`nesterov-4`) and
# `H = 16` ({glue:text}`nesterov-16`). **Differs** at `H = 64`: plain
# averaging is ahead there (DiLoCo better in only {glue:text}`nesterov-64`).
# With 16 rounds, a momentum of 0.9, whose memory is about ten rounds, has
# hardly started, and each of its steps is a large one: the outer step
# rate 0.7 and momentum 0.9 were tuned for runs of hundreds of rounds. We
# kept the paper's outer settings fixed and swept only the inner rate.
#
# ## Workers of uneven speed, in the same time
#
# Now one of the four workers is 3 times slower, and every method gets the
# same virtual time: the time synchronous SGD needs for 256 steps on that
# link (so synchronous SGD ends at the same loss on both links, by
# construction; the others do not). Synchronous SGD, local SGD and DiLoCo wait for the slow worker every
# round; asynchronous SGD does not, but each of its updates pays a push and
# a pull on the link. The asynchronous runs are replayed with
# `pargrad.book.replay.train_async` on `AsyncTrainer`'s virtual clock (the
# float64 replay checked against it in the chapter "Asynchronous training"),
# on the same shards, with each worker's step time plus its two messages as
# its time per update.

# %%
pargrad.book.show_source(rc.uneven_methods)

# %%
LOCAL_STEPS = rc.LOCAL_STEPS
print("speeds:", [round(s, 3) for s in rc.SPEEDS])
uneven = {}
for link in (FAST, SLOW):
    uneven[link.name] = rc.experiment_at_stored_rates(f"race, {link.name}")
    print(f"{link.name}: {rc.race_budget(link):.3g} s of virtual time")
    for name, rate in uneven[link.name].rates.items():
        print(f"    {name:16s} best rate 2^{int(np.log2(rate)):d}, median loss "
              f"{np.median(uneven[link.name].scores[name]):.2g}")

# %%
figure = plots.seeds_figure(list(uneven.values()), [f"one worker 3x slower, {name}"
                                                    for name in uneven])
glue("uneven-figure", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} uneven-figure
# :name: fig-uneven
#
# Final loss of every seed (dots) and the median (bar), each method at its
# own best rate, in the same virtual time; one worker of four is 3 times
# slower.
# ```
#
# Every pair, by the rule:

# %%
names = list(uneven[FAST.name].scores)
pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
table = {}
for link_name, experiment in uneven.items():
    print(link_name)
    for a, b in pairs:
        table[link_name, a, b] = experiment.compare(a, b)
        print("   ", table[link_name, a, b])
leaders = {link_name: min(experiment.scores, key=lambda n: np.median(experiment.scores[n]))
           for link_name, experiment in uneven.items()}
assert leaders[FAST.name] == "async" and leaders[SLOW.name] == f"DiLoCo, H={LOCAL_STEPS}"
assert table[FAST.name, "sync", "async"].verdict == "async ahead"
assert table[SLOW.name, "async", f"DiLoCo, H={LOCAL_STEPS}"].verdict == \
    f"DiLoCo, H={LOCAL_STEPS} ahead"
assert table[SLOW.name, "sync", f"DiLoCo, H={LOCAL_STEPS}"].verdict == \
    f"DiLoCo, H={LOCAL_STEPS} ahead"
glue("fast-leader", leaders[FAST.name])
glue("slow-leader", leaders[SLOW.name])

# %% [markdown]
# On the fast link, communication is nearly free and the slow worker is the
# cost: {glue:text}`fast-leader` has the lowest median, and is ahead of
# synchronous SGD by the rule, because it alone does not wait. On the slow
# link, each update of asynchronous SGD pays two messages of tens of
# milliseconds and each synchronous step an all-reduce: there
# {glue:text}`slow-leader` leads, ahead of both by the rule. The other pairs
# are printed above; where the rule says "no difference shown", the page
# claims none. These are statements about this small problem with one
# persistent straggler and the two links above. A local-SGD variant that
# lets the slow worker take fewer local steps, instead of making everyone
# wait, is exercise 3.
#
# ## A worker leaves, another joins
#
# DiLoCo's paper reports that the method tolerates workers that become
# unavailable and makes use of workers that arrive during training
# {cite}`douillard2023diloco`, and INTELLECT-1 ran with providers joining and
# leaving {cite}`jaghouar2024intellect1`. Between two rounds, all the state
# a new set of workers needs is the averaged parameters and the outer
# optimizer's momentum: the inner optimizer here (SGD) keeps none. So we
# run it as three clusters of processes, one after the other, each
# resuming from what the previous one handed over: 3 workers, then 2 (one
# left), then 3 again (one joined). Each worker runs
# `rare_communication.train_phase`:

# %%
pargrad.book.show_lines(rc.train_phase, "strategy = pargrad.sync_strategy()",
                        "trainer.fit(x, y")

# %% [markdown]
# ```{warning}
# Every worker runs a TensorFlow gRPC server. `LocalCluster` gives them
# addresses on 127.0.0.1, but the servers listen on all network interfaces
# (the chapter "Beyond one machine"), and they have **no authentication and
# no encryption**: run clusters only on machines and networks you trust.
# Each `with` block below stops its processes when it ends, and the last
# cell checks that none is left.
# ```
#
# When a worker leaves, the trainer cuts the full batch over the workers
# that remain, so no data is lost here, only parallelism. We compare the
# processes' result with the replay of the same handovers, in float64.

# %%
PHASES = [(3, 8), (2, 8), (3, 8)]     # (workers, rounds)
PHASE_RATE = dial.rates[f"DiLoCo, H={LOCAL_STEPS}"]
handed_over, phase_results, pids = {}, [], []
for workers, rounds in PHASES:
    settings = {"rounds": rounds, "local_steps": LOCAL_STEPS, "learning_rate": PHASE_RATE,
                **handed_over}
    with LocalCluster(rc.train_phase, workers=workers, kwargs=settings, timeout=150) as cluster:
        results = cluster.wait()
        pids += cluster.pids
    assert all(r["replicas"] == workers for r in results)
    assert all(np.array_equal(a, b) for r in results for a, b in zip(r["weights"],
                                                                       results[0]["weights"]))
    phase_results.append(results[0])
    handed_over = {"weights": results[0]["weights"], "velocity": results[0]["velocity"]}
    print(f"{workers} workers, {rounds} rounds: loss on all points {results[0]['loss']:.3g}")

replayed, replay_losses = replay.replay_phases(PHASES, (x, y), PHASE_RATE, LOCAL_STEPS)
phase_tolerance = pargrad.rounding_tolerance("float64", sum(r for _, r in PHASES) * LOCAL_STEPS)
phase_gap = largest_gap(phase_results[-1]["weights"], replayed)
print(f"processes and replay equal after the three phases, within {phase_tolerance:.0e}: "
      f"{phase_gap < phase_tolerance}")
assert phase_gap < phase_tolerance
assert np.allclose([r["loss"] for r in phase_results], replay_losses, rtol=1e-9)
_, stayed_curve = replay.train_rounds(replay.start([0]), (x, y), 3, PHASE_RATE, LOCAL_STEPS, 24,
                                     replay.NESTEROV)
print("3 workers throughout, same rounds:",
      " ".join(f"{stayed_curve[k - 1, 0]:.3g}" for k in (8, 16, 24)))
start_loss = float(replay.full_loss(replay.start([0]).weights, x, y)[0])
print(f"loss at the start {start_loss:.3g}")
assert replay_losses[-1] < start_loss / 10
glue("phase-tolerance", f"{phase_tolerance:.0e}")

# %% [markdown]
# The three clusters, handing over weights and momentum, computed what the
# replay computes, within {glue:text}`phase-tolerance`. The loss rises in
# the middle phase, but not because a worker left: with 3 workers
# throughout it rises too (the line above the last), because DiLoCo's outer
# momentum overshoots and comes back, as momentum does. What did the
# departure cost? The replay answers over 20 seeds, at the same rate: the
# same three phases against 3 workers throughout.

# %%
def after_phases(phases, seeds):
    state = replay.start(seeds)
    for workers, rounds in phases:
        state, curve = replay.train_rounds(state, (x, y), workers, PHASE_RATE, LOCAL_STEPS, rounds,
                                           replay.NESTEROV)
    return curve[-1]


stayed = after_phases([(3, 24)], TEST_SEEDS)
left_and_joined = after_phases(PHASES, TEST_SEEDS)
churn = experiments.compare(stayed, left_and_joined, "3 workers throughout",
                            "one left, one joined")
print(churn)
print(f"median final loss: {np.median(stayed):.2g} throughout, "
      f"{np.median(left_and_joined):.2g} with the departure and arrival")
glue("churn", churn.verdict)
glue("churn-counts", f"{churn.losses} of {churn.seeds} seeds")

# %% [markdown]
# The rule's verdict: {glue:text}`churn`. The departure cost nothing here;
# the run with churn even ends lower, in {glue:text}`churn-counts`, which
# says more about where the outer momentum's swing stands after 24 rounds
# than about churn itself. Two things make our departure cheap: the two
# remaining workers cover all the data between them (with larger shards),
# and each still takes a full-shard step, so a round of two does the work
# of a round of three (on a clock, it would take 3/2 times as long). In
# DiLoCo's setting a departing worker takes its data and its compute with
# it, and the paper reports a loss that degrades gracefully, not one that
# is untouched.

# %%
assert not [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
print(f"{len(pids)} worker processes started, none left running")

# %% [markdown]
# ## What a GPU reader will see
#
# Our 16 parameters make every all-reduce a matter of latency. At scale it
# is a matter of bytes. The same calculator, for a model of a billion
# parameters sending float32 changes, 8 workers, and an assumed half a
# second of compute a step:

# %%
MODEL_BYTES, WORKERS, STEP = 4 * 1e9, 8, 0.5      # float32: 4 bytes a parameter
print(f"{MODEL_BYTES / 1e9:.0f} GB of changes a round, {WORKERS} workers, {STEP} s a step")
print(f"{'link':28s} {'all-reduce':>10s} {'H for 90% compute':>18s} {'compute at H=500':>17s}")
scale = {}
for link in (FAST, SLOW):
    communication = cost.ring_all_reduce_time(MODEL_BYTES, WORKERS, link)
    needed = int(np.ceil(9 * communication / STEP))       # H x STEP >= 0.9 (H x STEP + comm)
    utilisation = 500 * STEP / (500 * STEP + communication)
    scale[link.name] = (communication, needed, utilisation)
    print(f"{link.name:28s} {communication:9.3g}s {needed:18d} {utilisation:16.0%}")
glue("gpu-fast-comm", f"{scale[FAST.name][0] * 1e3:.0f} ms")
glue("gpu-slow-comm", f"{scale[SLOW.name][0]:.0f} s")
glue("gpu-slow-h", scale[SLOW.name][1])
glue("gpu-slow-util", f"{scale[SLOW.name][2]:.0%}")

# %% [markdown]
# Inside a box, one all-reduce of the billion parameters takes
# {glue:text}`gpu-fast-comm`, small next to a step, so synchronous training
# is the right end of the dial, as the chapters of Part II found. Between
# data centres it takes {glue:text}`gpu-slow-comm`: synchronous training
# would spend nearly all its time communicating, and it takes
# `H` = {glue:text}`gpu-slow-h` local steps before compute fills 90% of the
# time; at DiLoCo's `H = 500` the compute share is
# {glue:text}`gpu-slow-util`. That is the regime of OpenDiLoCo's and
# INTELLECT-1's utilisation figures printed above, which also shrink the
# bytes (FP16 and int8 all-reduce) and overlap communication with
# computation. On a GPU our tiny model's step would take microseconds, the
# latency of the slow link would dominate even more, and the dial's
# lessons would hold as panels (c) and (d) show.

# %% [markdown]
# ## Summary
#
# - `LocalSGDTrainer`: `H` local steps a replica with an inner optimizer,
#   one all-reduce of the changes, an outer step; `SGD(1.0)` is local SGD
#   (and synchronous SGD at `H = 1`), Nesterov is DiLoCo.
# - Per step, communicating every step is best; per byte, communicating
#   rarely is best by far; in time, the link decides.
# - Scaled down, DiLoCo showed no difference from synchronous training (with
#   the same outer step) at 4 times less communication, not 500; local SGD lost as `H`
#   grew; the outer Nesterov step beat plain averaging at `H` = 4 and 16
#   but not at 64, with few rounds.
# - With one slow worker, asynchronous SGD led on the fast link and DiLoCo
#   on the slow one.
# - Between rounds, the state is the averaged weights and the outer
#   momentum: hand them over, and workers can leave and join.
# - Every verdict above rests on 20 seeds, each method at its own best
#   rate, under the stated sign-test rule.
#
# ## Exercises
#
# 1. Give each replica its own stretch of the x range
#    (`rc.problem_data(shuffled=False)`: replica 0 sees x from -2 to -1,
#    and so on). What happens to local SGD as `H` grows?
# 2. For the billion-parameter model between data centres, how much would
#    sending the changes in int8 instead of float32 (as INTELLECT-1 did)
#    lower the `H` needed for 90% compute?
# 3. Instead of waiting, let the slow worker take `H / 3` local steps a
#    round while the others take `H`. Why does the average then need
#    weighting, and what does the trainer do today?
# 4. Hand over only the weights, not the outer momentum, between the
#    phases. What changes?
#
# ```{dropdown} Solution to exercise 1
# Each replica then fits its own quarter of the parabola, and the average of
# four networks that each fit a different stretch is not a network that fits
# the whole: the loss after the same 1024 steps grows steeply with `H`
# (run below, each `H` at one rate, 2^-4).
# ```

# %%
def sorted_shards_losses(steps, rate=2.0**-4, seeds=TEST_SEEDS):
    _, losses = replay.train_rounds(replay.start(seeds), rc.problem_data(shuffled=False),
                                    rc.REPLICAS, rate, steps, UPDATES // steps, replay.AVERAGE)
    return np.median(losses[-1])


for steps in DIAL:
    print(f"H = {steps:3d}: median loss {sorted_shards_losses(steps):.2g} with sorted shards, "
          f"{np.median(rc.final_losses(2.0**-4, TEST_SEEDS, steps, UPDATES)):.2g} shuffled")

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# int8 sends a quarter of the bytes; on the slow link the all-reduce is
# almost all bytes, so its time, and the `H` needed, fall about fourfold
# (computed below).
# ```

# %%
int8 = cost.ring_all_reduce_time(MODEL_BYTES / 4, WORKERS, SLOW)
print(f"all-reduce in int8: {int8:.3g} s; H for 90% compute: {int(np.ceil(9 * int8 / STEP))}")

# %% [markdown]
# ```{dropdown} Solution to exercise 3
# A replica that took `H / 3` steps moved about a third as far, so in a
# plain mean its data count a third as much as the others': the average is
# pulled towards the fast replicas' shards. Weighting each change by the
# steps it took (or dividing each by its steps, so that every replica
# contributes an average step) restores equal weight to every example. The
# trainer today makes every replica take `H` steps and charges the round to
# the slowest on the virtual clock (its `scenario`); this variant is not built.
# ```
#
# ```{dropdown} Solution to exercise 4
# Each phase then starts its outer momentum from zero, so the resumed run
# is no longer the same computation as an uninterrupted one (the float64
# equality above needs the momentum). Whether that hurts depends on the run:
# here the momentum overshoots (the loss rose mid-run even without churn),
# and restarting it damps the swing, so dropping it ends *lower* on most
# seeds (computed below). A handover that keeps the momentum is the faithful
# one; a reset is a tuning choice.
# ```

# %%
def phases_without_momentum(seeds):
    state = replay.start(seeds)
    for workers, rounds in PHASES:
        state = replay.State(state.weights, tuple(np.zeros_like(w) for w in state.weights))
        state, curve = replay.train_rounds(state, (x, y), workers, PHASE_RATE, LOCAL_STEPS, rounds,
                                           replay.NESTEROV)
    return curve[-1]


print(experiments.compare(left_and_joined, phases_without_momentum(TEST_SEEDS),
                          "momentum handed over", "momentum dropped"))
