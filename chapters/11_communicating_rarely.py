# %% [markdown]
# # Communicating rarely
#
# ```{admonition} Takeaway
# Let every replica train alone for `H` steps and average the replicas'
# changes only then. Per step, plain averaging's loss grows with `H`;
# DiLoCo's cost is not shown; per byte sent, rare rounds win by far; in
# time, the link decides: inside a box, communicate every step; between
# data centres, DiLoCo's rare rounds win, even with a slow worker.
# ```
#
# Inside a data centre, Part II's answer stands: synchronous all-reduce won.
# Where the network is slow or workers come and go, training went back to
# communicating *rarely*: every replica takes `H` steps alone, then the
# replicas average what they did. Local SGD
# {cite}`lin2020dont,ortiz2021tradeoffs` is this idea with a plain average;
# DiLoCo {cite}`douillard2023diloco` feeds the average to an *outer*
# optimizer with Nesterov momentum (momentum: each step adds a decaying sum
# of the previous steps; Nesterov's variant evaluates that sum one step
# ahead); OpenDiLoCo and INTELLECT-1
# {cite}`jaghouar2024opendiloco,jaghouar2024intellect1` used it to train
# across continents. `H` turns synchronising into a dial.
#
# **The answer, on this page's problem.** At the same number of local
# steps, whether DiLoCo loses to its synchronous twin is not shown at any
# `H` up to {glue:text}`largest-h` ({glue:text}`largest-h` times less
# communication): our two seed sets disagree (the first table below).
# DiLoCo ends below plain synchronous SGD, but that lead is its outer
# momentum, not its rare communication: synchronous SGD with the same
# outer step leads by at least as much. In the same time with one slow worker,
# {glue:text}`fast-winner` comes first on a fast link and
# {glue:text}`slow-winner` on a slow one (the race tables).
#
# **In this chapter you will** read `pargrad.LocalSGDTrainer`; turn the dial
# from `H = 1` to `H = 256` and plot the loss against steps, bytes and
# modelled time on two links; race four methods with one slow worker; and
# let workers leave and join between rounds, across processes. The
# optional page [Communicating rarely in depth](d5_rare_communication_in_depth)
# holds the published results, every sweep, the race pair by pair and churn
# over many seeds.

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
from IPython.display import display
from pargrad.book.experiments import results_table
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
# its own *inner* optimizer on its shard of the data (its share of the
# examples), without any communication:

# %%
pargrad.book.show_lines(LocalSGDTrainer._replica_steps, "start = [", "return change, stacked")

# %% [markdown]
# Then one all-reduce averages the replicas' changes
# $\Delta = \frac{1}{R}\sum_r (w - w_r)$, and the *outer* optimizer applies
# $\Delta$ to $w$ as if it were a gradient:

# %%
pargrad.book.show_lines(LocalSGDTrainer._average_and_apply, "def average(change)",
                        "self.outer_optimizer.apply_gradients")

# %% [markdown]
# Between the two, the trainer gathers every replica's losses and stops
# before the average if one of them is not finite:

# %%
pargrad.book.show_lines(LocalSGDTrainer.run_call, "begin = time.perf_counter()",
                        "self._average_function")

# %% [markdown]
# A fit of `LocalSGDTrainer` is counted in rounds, `fit(x, y, rounds=...)`,
# where `SyncTrainer` and `AsyncTrainer` count `steps=`: a round is one
# update of the shared parameters, and "steps" would read as either the
# updates or the local steps, which differ by the factor `H` that this
# chapter turns.
#
# The outer optimizer decides the method:
#
# - `keras.optimizers.SGD(1.0)` gives $w - \Delta = \frac{1}{R}\sum_r w_r$,
#   the replicas' parameters averaged: **local SGD**, or model averaging
#   {cite}`lin2020dont`. With `H = 1` it is synchronous SGD
#   (`tests/test_local_sgd.py` checks that it equals `SyncTrainer` within
#   the rounding tolerance).
# - `keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)` treats
#   $\Delta$ as a gradient with Nesterov momentum: **DiLoCo**'s outer step,
#   with the paper's rate and momentum {cite}`douillard2023diloco`. The
#   paper's inner optimizer is AdamW; ours is plain SGD. We tune the outer
#   rate and momentum with the inner rate at every `H`, so that DiLoCo is
#   compared at its best.

# %%
for outer in replay.OUTERS:
    config = rc.outer_optimizer(outer).get_config()
    print(f"{outer:8s}: SGD(learning_rate={config['learning_rate']:.1f}, "
          f"momentum={config['momentum']:.1f}, nesterov={config['nesterov']})")

# %% [markdown]
# Each round, the trainer records the bytes each replica sends in a ring
# all-reduce of the parameters (the chapter
# [What communication costs](10_communication_costs));
# `LocalSGDHistory.clock_on(link, step_seconds)` charges a finished run's
# rounds on a `pargrad.cost.Link`. Every time on this page is such modelled
# time, never a wall-clock measurement.
#
# ## The problem, and many seeds
#
# The model is the y = x² question's 1-5-1 `tanh` network, in float64, on
# 48 evenly spaced points shuffled once, with four replicas: each gets a
# random quarter of the points, and every local step is a full-shard
# gradient step. Every replica takes 1024 local steps, whatever `H`.

# %%
x, y = rc.problem_data()
UPDATES, DIAL = rc.UPDATES, rc.DIAL
print(f"{len(x)} points, {rc.REPLICAS} replicas, {rc.PARAMETERS} parameters "
      f"({rc.PARAMETER_BYTES} bytes), {UPDATES} local steps a replica")

# %% [markdown]
# A verdict needs many seeds (initial weights) and every method tuned:
# thousands of runs. `pargrad.book.replay` replays what the trainer computes
# in vectorised float64 NumPy; each method keeps the setting its sweep on
# *tuning* seeds picked and runs on 20 other seeds, twice: on the page's
# seeds and on held-out seeds with their own sweep (the page
# [How the book decides](a0_methods)). A verdict stands only if both seed
# sets show it. The score is the mean loss over the last quarter of the run:
# DiLoCo's momentum makes the loss swing from round to round, so the final
# point depends on where the swing stands.
#
# First the real trainer, once for every `H` of the dial (seed 0, DiLoCo
# at its tuned setting): its histories give the figure's axes, and its
# final weights equal the replay's (checked in float64; the page
# [Communicating rarely in depth](d5_rare_communication_in_depth) explains
# the check).

# %% tags=["remove-input"]
dial = rc.replication_at_stored_rates("dial")
page = dial.page


def trainer_run(steps, setting, outer=replay.NESTEROV, seed=0):
    """LocalSGDTrainer on the chapter's problem: 4 replicas, full batch, UPDATES local steps."""
    rate, outer_rate, momentum = rc.outer_knobs(setting)
    strategy = pargrad.sync_strategy(rc.REPLICAS)
    with strategy.scope():
        model = parabola_model(seed=seed, hidden=rc.HIDDEN, dtype="float64")
        outer_step = rc.outer_optimizer(outer, outer_rate, momentum)
    trainer = LocalSGDTrainer(model, strategy, steps, learning_rate=rate,
                              outer_optimizer=outer_step, progress=False)
    history = trainer.fit(x, y, rounds=UPDATES // steps, batch_size=len(x))
    return trainer, history


def largest_gap(weights, state):
    return max(float(np.max(np.abs(np.asarray(a) - b[0]))) for a, b in zip(weights, state.weights))


tolerance = pargrad.rounding_tolerance("float64", UPDATES)
histories, agreements = {}, {}
for steps in DIAL:
    setting = page.rates[f"DiLoCo, H={steps}"]
    trainer, histories[steps] = trainer_run(steps, setting)
    knobs = (rc.REPLICAS, *rc.outer_knobs(setting)[:1], steps, UPDATES // steps, replay.NESTEROV,
             *rc.outer_knobs(setting)[1:])
    replayed, _ = replay.train_rounds(replay.start([0]), (x, y), *knobs)
    nudged = replay.start([0])
    nudged.weights = tuple(w * (1 + 1e-15) for w in nudged.weights)
    nudged, _ = replay.train_rounds(nudged, (x, y), *knobs)
    gap = largest_gap(trainer.model.get_weights(), replayed)
    sensitivity = largest_gap([w[0] for w in nudged.weights], replayed)
    agreements[steps] = (gap, sensitivity)
    if sensitivity < tolerance:
        print(f"H = {steps:3d}: trainer and replay equal within the float64 rounding tolerance "
              f"{tolerance:.0e}: {gap < tolerance}")
    else:   # chaotic: the gap's digits depend on the machine, only its size is the claim
        print(f"H = {steps:3d}: chaotic at this rate; trainer vs replay within 100 x the growth "
              f"of a 1e-15 nudge: {gap < 100 * sensitivity}")
contracting = [s for s, (gap, sensitivity) in agreements.items() if sensitivity < tolerance]
assert contracting and all(agreements[s][0] < tolerance for s in contracting)
assert all(gap < 100 * max(sensitivity, tolerance) for gap, sensitivity in agreements.values())

# %% [markdown]
# ## The dial
#
# The median over the 20 page seeds of the loss after every round, each
# method at its tuned setting, against four horizontal axes: the local steps
# each replica took, the bytes each replica sent, and the modelled time on
# two links. The fast link is an NVLink-class link inside one box; the slow
# one stands for a link between two data centres (tens of milliseconds
# each way, a gigabit a second: assumed orders of magnitude). One local
# step is charged a millisecond of compute, also an assumption.

# %%
STEP_SECONDS, FAST, SLOW = rc.STEP_SECONDS, rc.FAST, rc.SLOW
for link in (FAST, SLOW):
    print(f"{link.name:28s} one all-reduce of the model: "
          f"{cost.ring_all_reduce_time(rc.PARAMETER_BYTES, rc.REPLICAS, link) * 1e3:.3f} ms "
          f"(one local step: {STEP_SECONDS * 1e3:g} ms)")
def median_curve(setting, steps, outer):
    rate, outer_rate, momentum = rc.outer_knobs(setting)
    return np.median(rc.loss_curves(rate, rc.TEST_SEEDS, steps, UPDATES, outer,
                                    outer_rate=outer_rate, momentum=momentum), axis=1)


curves = {steps: {outer: median_curve(page.rates[rc.method_name(outer, steps)], steps, outer)
                  for outer in replay.OUTERS} for steps in DIAL}
figure = plots.dial_figure(curves, histories, FAST, SLOW, STEP_SECONDS, shown=(1, 16, 256))
glue("dial-figure", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} dial-figure
# :name: fig-dial
#
# The dial, three settings of `H` (dashed: local SGD; solid: DiLoCo). (a)
# Per local step, the median loss rises with `H`. (b)
# Per byte sent, rare communication wins by far. (c) On a fast link, time is
# compute, so (c) looks like (a). (d) On a slow link, time is communication,
# so (d) looks like (b).
# ```
#
# Which setting reaches a median loss of 0.01 first on each link:

# %%
def first_time_below(curve, clock, target):
    below = np.nonzero(curve <= target)[0]
    return clock[below[0]] if len(below) else np.inf


TARGET = 0.01
for link in (FAST, SLOW):
    times = {rc.method_name(outer, steps): first_time_below(
        curves[steps][outer], histories[steps].clock_on(link, STEP_SECONDS), TARGET)
        for steps in DIAL for outer in replay.OUTERS}
    order = sorted(times, key=times.get)
    print(f"{link.name}: first below {TARGET}: " + ", ".join(order[:3]))

# %% [markdown]
# That is the whole trade: rare communication pays in loss per step, and
# buys it back only where a step's communication costs more than its
# computation.
#
# ## What the saving costs
#
# DiLoCo's paper matched fully synchronous training with 8 workers and
# `H = 500`, communicating 500 times less {cite}`douillard2023diloco`. Our
# scaled-down version: DiLoCo at each `H` against DiLoCo at `H = 1`, that is
# synchronous SGD with the same outer step, and plain synchronous SGD
# (`local SGD, H=1`) as a control. Each row gives the median score on the
# page seeds, then the median per-seed ratio to the reference and the wins
# on the page seeds · the held-out seeds, and the verdict both support:

# %% tags=["remove-input"]
saving_rows = ["local SGD, H=1"] + [rc.method_name(replay.NESTEROV, s) for s in DIAL]
results_table(dial, "DiLoCo, H=1", saving_rows)

# %% tags=["remove-cell"]
saving = {s: dial.compare(f"DiLoCo, H={s}", "DiLoCo, H=1") for s in DIAL[1:]}
largest_free = max(s for s in DIAL[1:] if all(saving[t].verdict != "DiLoCo, H=1 ahead"
                                              for t in DIAL[1:] if t <= s))
page_costly = [s for s in DIAL[1:] if saving[s].page.verdict == "DiLoCo, H=1 ahead"]
momentum_alone = dial.compare("DiLoCo, H=1", "local SGD, H=1")
diloco4_vs_sync = dial.compare("DiLoCo, H=4", "local SGD, H=1")
assert diloco4_vs_sync.verdict == "DiLoCo, H=4 ahead"
assert momentum_alone.verdict == "DiLoCo, H=1 ahead"
assert all(saving[s].verdict == "not shown" for s in DIAL[1:]) and largest_free == DIAL[-1]
assert page_costly and all(saving[s].held_out.verdict == experiments.NO_DIFFERENCE
                           for s in DIAL[1:])
glue("largest-h", largest_free)
glue("page-costly-h", min(page_costly))
glue("momentum-ratio", f"{momentum_alone.page.effect:.2f} · {momentum_alone.held_out.effect:.2f}")
glue("diloco4-ratio", f"{diloco4_vs_sync.page.effect:.2f} · {diloco4_vs_sync.held_out.effect:.2f}")

# %% [markdown]
# The page's seeds put DiLoCo behind its synchronous twin from
# `H` = {glue:text}`page-costly-h` on; the held-out seeds, with their own
# sweep, show no difference at any `H`: a cost of the saving is not shown,
# and neither is its absence. Plain averaging loses as `H` grows on both
# seed sets ([Communicating rarely in depth](d5_rare_communication_in_depth)).
# DiLoCo at `H = 4` also ends
# below plain synchronous SGD (median ratio {glue:text}`diloco4-ratio`,
# page · held-out), but synchronous SGD with DiLoCo's outer step is ahead of
# plain synchronous SGD by about as much ({glue:text}`momentum-ratio`): the
# lead comes from the outer momentum, not from communicating rarely.
#
# ## Workers of uneven speed, in the same time
#
# Now one of the four workers is 3 times slower, and every method gets the
# same virtual time: what synchronous SGD needs for 256 steps on that link,
# scored by its mean loss over the last quarter of that time.
# Synchronous SGD, local SGD and DiLoCo wait for the slow worker every
# round; asynchronous SGD (the chapter
# [Asynchronous training](04_asynchronous)) does not, but each of its
# updates pays a push and a pull on the link. Local SGD and DiLoCo have `H`
# tuned with the rate (`H = 1` allowed), DiLoCo its outer step too, so that
# each method is at its best. One table a link, against asynchronous SGD:

# %% tags=["remove-input"]
races = {link.name: rc.replication_at_stored_rates(f"race, {link.name}") for link in (FAST, SLOW)}
for link in (FAST, SLOW):
    print(f"{link.name}; H picked by the page's sweep: "
          + ", ".join(f"{name.split(',')[0]} H = {int(races[link.name].page.rates[name]['H'])}"
                      for name in races[link.name].page.rates if "tuned" in name))
    display(results_table(races[link.name], "async"))

# %% tags=["remove-cell"]
fast_race, slow_race = races[FAST.name], races[SLOW.name]
fast_diloco = fast_race.compare("DiLoCo, H tuned", "async")
slow_diloco = slow_race.compare("DiLoCo, H tuned", "async")
glue("fast-winner", "DiLoCo with H tuned" if fast_diloco.verdict == "DiLoCo, H tuned ahead"
     else "asynchronous SGD" if fast_diloco.verdict == "async ahead" else "no method shown")
glue("slow-winner", "DiLoCo" if slow_diloco.verdict == "DiLoCo, H tuned ahead" else "no method")
glue("fast-verdict", {"DiLoCo, H tuned ahead": "ahead of it on both seed sets",
                      "async ahead": "behind it on both seed sets"}.get(
    fast_diloco.verdict, "not shown to differ from it"))
glue("fast-ratio", f"{fast_diloco.page.effect:.2f} · {fast_diloco.held_out.effect:.2f}")
glue("slow-ratio", f"{slow_diloco.page.effect:.2f} · {slow_diloco.held_out.effect:.2f}")
glue("fast-h", int(fast_race.page.rates["DiLoCo, H tuned"]["H"]))
glue("slow-h", int(slow_race.page.rates["DiLoCo, H tuned"]["H"]))
for race in races.values():   # both seed sets' sweeps pick the same H
    assert race.page.rates["DiLoCo, H tuned"]["H"] == race.held_out.rates["DiLoCo, H tuned"]["H"]
assert slow_diloco.verdict == "DiLoCo, H tuned ahead"
assert fast_diloco.verdict == "DiLoCo, H tuned ahead"
assert fast_race.compare("async", "sync").verdict == "async ahead"

# %% [markdown]
# On the fast link, communication is nearly free and the slow worker is the
# cost. Asynchronous SGD, which alone does not wait, is ahead of plain
# synchronous SGD; but DiLoCo with `H` tuned is {glue:text}`fast-verdict`
# (median ratio {glue:text}`fast-ratio`, page · held-out). Its sweep picks
# `H` = {glue:text}`fast-h`: synchronous SGD with DiLoCo's outer momentum,
# which, as in the dial, beats plain synchronous SGD. On the slow link,
# each asynchronous update pays two messages of tens of milliseconds; there
# DiLoCo, at `H` = {glue:text}`slow-h`, is ahead of asynchronous SGD on both
# seed sets ({glue:text}`slow-ratio`). These are statements about this small
# problem with one persistent straggler and these two links; the pairs not
# in the tables, and the per-seed picture, are in
# [Communicating rarely in depth](d5_rare_communication_in_depth).
#
# ## A worker leaves, another joins
#
# DiLoCo's paper reports that the method tolerates workers that become
# unavailable and uses workers that arrive during training
# {cite}`douillard2023diloco`, and INTELLECT-1 ran with providers joining and
# leaving {cite}`jaghouar2024intellect1`. Between two rounds, all the state
# a new set of workers needs is the averaged parameters and the outer
# optimizer's momentum: the inner optimizer here (SGD) keeps none. So we
# run three clusters of processes, one after the other, each resuming from
# what the previous one handed over: 3 workers, then 2 (one left), then 3
# again (one joined). Each worker runs `rare_communication.train_phase`:

# %%
pargrad.book.show_lines(rc.train_phase, "strategy = pargrad.sync_strategy()",
                        "trainer.fit(x, y")

# %% [markdown]
# ```{warning}
# Every worker runs a TensorFlow gRPC server. `LocalCluster` gives them
# addresses on 127.0.0.1, but the servers listen on all network interfaces
# (the chapter [Beyond one machine](09_beyond_one_machine)), and they have
# **no authentication and no encryption**: run clusters only on machines and
# networks you trust. Each `with` block below stops its processes when it
# ends, and a hidden check confirms that none is left.
# ```
#
# When a worker leaves, the trainer cuts the full batch over the workers
# that remain, so no data is lost here, only parallelism. The processes'
# result is compared with the float64 replay of the same handovers.

# %%
LOCAL_STEPS = rc.LOCAL_STEPS
PHASES = rc.CHURN_PHASES              # (workers, rounds): 3, then 2, then 3 again
PHASE_SETTING = page.rates[f"DiLoCo, H={LOCAL_STEPS}"]   # its tuned inner and outer step
PHASE_RATE, OUTER_RATE, MOMENTUM = rc.outer_knobs(PHASE_SETTING)
handed_over, phase_results, every_worker, pids = {}, [], [], []
for workers, rounds in PHASES:
    settings = {"rounds": rounds, "local_steps": LOCAL_STEPS, "learning_rate": PHASE_RATE,
                "outer_rate": OUTER_RATE, "momentum": MOMENTUM, **handed_over}
    with LocalCluster(rc.train_phase, workers=workers, kwargs=settings, timeout=150) as cluster:
        results = cluster.wait()
        pids += cluster.pids
    every_worker.append(results)
    phase_results.append(results[0])
    handed_over = {"weights": results[0]["weights"], "velocity": results[0]["velocity"]}
    print(f"{workers} workers, {rounds} rounds: loss on all points {results[0]['loss']:.3g}")

replayed, replay_losses = replay.replay_phases(PHASES, (x, y), PHASE_RATE, LOCAL_STEPS,
                                               outer_rate=OUTER_RATE, outer_momentum=MOMENTUM)
phase_tolerance = pargrad.rounding_tolerance("float64", sum(r for _, r in PHASES) * LOCAL_STEPS)
print(f"processes and replay equal after the three phases, within {phase_tolerance:.0e}: "
      f"{largest_gap(phase_results[-1]['weights'], replayed) < phase_tolerance}")

# %% tags=["remove-cell"]
for (workers, _), results in zip(PHASES, every_worker):
    assert [r["replicas"] for r in results] == [workers] * workers
    assert all(np.array_equal(a, b) for r in results for a, b in zip(r["weights"],
                                                                       results[0]["weights"]))
assert largest_gap(phase_results[-1]["weights"], replayed) < phase_tolerance
assert np.allclose([r["loss"] for r in phase_results], replay_losses, rtol=1e-9)
start_loss = float(replay.full_loss(replay.start([0]).weights, x, y)[0])
assert replay_losses[-1] < start_loss / 10
assert not [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

# %% [markdown]
# The three clusters, handing over weights and momentum, computed what the
# replay computes. Two things make this departure cheap: the two remaining
# workers cover all the data between them, and a round of two does the
# work of a round of three, in 3/2 the time on a clock. In
# DiLoCo's setting a departing worker takes its data and its compute with
# it, and the paper reports a loss that degrades gracefully. Over many
# seeds, neither seed set shows churn costing loss here
# ([Communicating rarely in depth](d5_rare_communication_in_depth)).
#
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

# %% tags=["remove-cell"]
glue("gpu-fast-comm", f"{scale[FAST.name][0] * 1e3:.0f} ms")
glue("gpu-slow-comm", f"{scale[SLOW.name][0]:.0f} s")
glue("gpu-slow-h", scale[SLOW.name][1])
glue("gpu-slow-util", f"{scale[SLOW.name][2]:.0%}")

# %% [markdown]
# Inside a box, one all-reduce of the billion parameters takes
# {glue:text}`gpu-fast-comm`, small next to a step, so synchronous training
# is the right end of the dial, as Part II found. Between data centres it
# takes {glue:text}`gpu-slow-comm`: synchronous training would spend nearly
# all its time communicating, and it takes `H` = {glue:text}`gpu-slow-h`
# local steps before compute fills 90% of the time; at DiLoCo's `H = 500`
# the compute share is {glue:text}`gpu-slow-util`. That is the regime of
# OpenDiLoCo's and INTELLECT-1's published utilisation
# {cite}`jaghouar2024opendiloco,jaghouar2024intellect1`, which also shrink
# the bytes (FP16 and int8 all-reduce) and overlap communication with
# computation.
#
# ## Summary
#
# - `LocalSGDTrainer`: `H` local steps a replica with an inner optimizer,
#   one all-reduce of the changes, an outer step; `SGD(1.0)` is local SGD
#   (synchronous SGD at `H = 1`), Nesterov momentum is DiLoCo.
# - Per step, communicating often is best; per byte, communicating rarely is
#   best by far; in time, the link decides.
# - On this problem, whether DiLoCo loses to its synchronous twin is not
#   shown (the seed sets disagree); its lead over plain synchronous SGD is
#   the outer momentum's.
# - With one slow worker, each method at its best, DiLoCo led
#   on both links: at `H` = {glue:text}`fast-h` inside a box, at
#   `H` = {glue:text}`slow-h` between data centres.
# - Between rounds, the state is the averaged weights and the outer
#   momentum: hand them over, and workers can leave and join.
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
def sorted_shards_losses(steps, rate=2.0**-4, seeds=rc.TEST_SEEDS):
    _, losses = replay.train_rounds(replay.start(seeds), rc.problem_data(shuffled=False),
                                    rc.REPLICAS, rate, steps, UPDATES // steps, replay.AVERAGE)
    return np.median(losses[-1])


for steps in DIAL:
    print(f"H = {steps:3d}: median loss {sorted_shards_losses(steps):.2g} with sorted shards, "
          f"{np.median(rc.final_losses(2.0**-4, rc.TEST_SEEDS, steps, UPDATES)):.2g} shuffled")

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
# the momentum overshoots and comes back, and restarting it damps the swing
# (computed below on both seed sets, scored by the mean over the last
# quarter of the rounds). A handover that keeps the momentum is the faithful
# one; a reset is a tuning choice.
# ```

# %%
def handover(run, **reset):
    setting = run.rates[f"DiLoCo, H={LOCAL_STEPS}"]       # each seed set's own sweep
    return rc.phase_scores(PHASES, setting, run.seeds, **reset)[0]


print(experiments.replicated(*[experiments.compare(
    handover(run), handover(run, reset_momentum=True), "momentum handed over",
    "momentum dropped") for run in (dial.page, dial.held_out)]))
