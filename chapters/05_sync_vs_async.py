# %% [markdown]
# # Sync vs async in the same time
#
# The stale-gradient article ([Where this book starts](00_sources)) ends its
# comparison of the two modes with a claim: in the same
# wall-clock time, asynchronous training is not necessarily worse than
# synchronous training, and both are used in practice. DAWNBench's measure
# is exactly "the same time": how long it takes to reach a target accuracy
# {cite}`coleman2017dawnbench`. The answer to the y = x² question goes
# further: synchronous training "was mostly abandoned". This chapter tests
# both claims with experiments instead of repeating them.
#
# **In this chapter you will**
#
# - race `SyncTrainer` and `AsyncTrainer` on a real task, scikit-learn's
#   handwritten digits, on four devices, with equal devices, one device three
#   times slower, and heavy-tailed random delays on every device;
# - put both trainers on the same *virtual clock*, where a synchronous step
#   costs its slowest replica, and measure test accuracy against time;
# - build a DAWNBench-style time-to-target table over many seeds, every
#   method at the best rate of its own sweep in each scenario, with a
#   zero-staleness control,
#   and answer each question with a paired rule fixed in advance;
# - add the three classic mitigations as trainer options and see what each
#   buys: backup workers, the staleness-aware learning rate and bounded
#   staleness;
# - compare with a measured, free-running race on the wall clock, every
#   contender timed by one clock, the machine's load recorded with it;
# - see what large-scale training did since, and why.
#
# Runs in under two minutes on two CPU cores: the long sweeps are stored,
# and the chapter re-runs samples of them live.

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
# As in every chapter: `pargrad` first, four logical devices before
# TensorFlow starts, seeds.

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import matplotlib.pyplot as plt
import numpy as np
from pargrad.book import digits, glue, plots, race, show_source
from pargrad.asynchronous import AsyncTrainer
from pargrad.scenario import Scenario
from pargrad.book.instruments import InstrumentedSyncTrainer, backup_worker_mask, sync_step_times
from pargrad.strategies import sync_strategy

devices = pargrad.logical_devices(4)
keras.utils.set_random_seed(0)
print(devices)

# %% [markdown]
# ## The task
#
# The 1,797 handwritten digits of scikit-learn (8×8 pixels, ten classes) ship
# inside the library, so nothing is downloaded. A fixed, stratified split
# keeps a quarter of them for testing; the model is a small perceptron
# (64 → 64 ReLU → 10 logits), and the metric is test accuracy.

# %%
x_train, y_train, x_test, y_test = data = race.digits_data(seed=0)
model = digits.digits_model(seed=0)
print(f"train {x_train.shape}, test {x_test.shape}, parameters {model.count_params()}")
print(f"untrained test accuracy: {digits.accuracy(model, x_test, y_test):.3f}")
glue("parameters", model.count_params())
glue("train-size", len(x_train))

# %% [markdown]
# Each device computes the gradient of a batch of 32 examples a step. An
# asynchronous update therefore uses 32 examples; a synchronous step on four
# devices averages 4 × 32 = 128. Each method's learning rate comes from its
# own sweep in each scenario, shown with the race below (the rates printed
# here are the methods' defaults, which the races replace). The
# zero-staleness control is
# one device as fast as the four together, applying the asynchronous
# workers' updates (same batch, same rate) one after the other, so none is
# stale.

# %%
for name, options in race.METHODS.items():
    print(f"{name:24s} {options}")

# %% [markdown]
# ## One clock for both
#
# To compare "in the same time" the two trainers need the same clock. Time on
# real hardware depends on the machine and the moment, so, as in the chapter
# "Asynchronous training", we first use a *virtual clock*: device $d$ needs
# $(1 + \text{delay}) / \text{speed}_d$ time units for a step, the delay drawn
# at random from a seeded generator. The three scenarios:

# %%
for name, scenario in race.SCENARIOS.items():
    print(f"{name:22s} speeds {np.round(scenario.speeds, 3)}, mean delay {scenario.jitter} "
          f"({scenario.delay_distribution})")

# %% [markdown]
# The heavy-tailed delays are Pareto-distributed (`pargrad.scenario.random_delay`)
# with a mean of half a step: most steps are barely delayed, but now and then a
# device stalls for many steps, like a machine that a colleague's job has just
# landed on.
#
# On this clock an asynchronous worker applies its update when its step ends
# (that is `AsyncTrainer`'s scheduled mode). A synchronous step ends when the
# *last* replica's gradient has arrived. Here are the first three steps of each
# scenario, each replica's time and the step's:

# %%
for name, scenario in race.SCENARIOS.items():
    times = race.replica_times(3, scenario, seed=0)
    print(name)
    for row, step in zip(times, sync_step_times(times)):
        print(f"   replicas {np.round(row, 2)} -> step {step:.2f}")

# %% [markdown]
# Every gradient and every update in the races below is really computed, by
# `SyncTrainer` on a `MirroredStrategy` and by `AsyncTrainer`; only the
# durations come from the clock. Communication is free on this clock, for
# both trainers.
#
# ## Three mitigations, as trainer options
#
# **{term}`Backup workers <backup worker>`** (Chen et al. {cite}`chen2016revisiting`). Chen et al.
# run $N + b$ workers and apply each update with the first $N$ gradients to
# arrive, dropping the $b$ latest, so a straggler no longer sets the pace. We
# keep the same four devices for every method, so here the four are the
# $N + b$: `backup_workers=b` keeps the first $N = 4 - b$ gradients and
# drops the $b$ slowest. (Chen et al.'s notation, $N$ kept and $b$ backups,
# is the one of the chapter "Synchronous training", and the only one on this
# page.)

# %%
show_source(backup_worker_mask)

# %% [markdown]
# The book's `InstrumentedSyncTrainer(backup_workers=b)`, the synchronous
# trainer with the instruments of this chapter wrapped around its core step,
# applies this rule inside the real step: before the step it sets each
# replica's weight, $(N + b)/N$ for the $N$ replicas that arrive first and 0
# for the $b$ others (in the code, `self.replicas` is $N + b$ and
# `self.backup_workers` is $b$); every replica multiplies its
# gradient by its weight before the one all-reduce, so the update is the mean
# gradient over the examples that arrived in time.

# %%
show_source(InstrumentedSyncTrainer._set_plan)

# %% [markdown]
# What is real and what is not: the gradients, the weighting and the
# all-reduce are real; *who arrives first* is decided from the clock before
# the step, because a `MirroredStrategy` all-reduce always waits for every
# replica. Two steps on the digits, replica 1 slow in the first and replica 0
# in the second:

# %%
strategy = sync_strategy(4)
with strategy.scope():
    sync_model = digits.digits_model(seed=0)
trainer = InstrumentedSyncTrainer(sync_model, strategy, loss=race.cross_entropy_per_example,
                                  learning_rate=0.8, backup_workers=1, progress=False)
history = trainer.fit(x_train, y_train, steps=2, batch_size=128,
                      replica_times=np.array([[1.0, 5.0, 1.2, 1.1], [2.0, 1.0, 1.0, 1.0]]))
print("gradients used:\n", history.used.astype(int))
print("virtual step times:", history.virtual_step_time)

# %% [markdown]
# **Staleness-aware learning rate** (Zhang et al. {cite}`zhang2016staleness`,
# chapter "Asynchronous training"): `AsyncTrainer(staleness_aware=True)`
# divides each update's learning rate by its staleness plus one.
#
# **{term}`Bounded staleness <bounded staleness>`** (stale synchronous parallel, Ho et al.
# {cite}`ho2013more`): `AsyncTrainer(staleness_bound=s)` makes a worker that
# has applied more than $s$ updates beyond the worker with the fewest (among
# those still running) wait before it reads again (a free-running worker waits for it in `AsyncTrainer._claim_update`,
# the one line of its loop that bounded staleness adds). The rule:

# %%
show_source(AsyncTrainer.may_start)

# %% [markdown]
# Two workers, one three times slower, bound 1: after its second update the
# fast worker is two updates ahead and waits (its next read is at time 3, when
# the slow worker's update lands), instead of racing on:

# %%
ssp = AsyncTrainer(digits.digits_model(seed=0), digits.cross_entropy, devices[:2],
                   learning_rate=0.2, staleness_bound=1, progress=False)
waits = ssp.fit(x_train, y_train, steps=8, batch_size=32, scenario=Scenario((1.0, 1 / 3)))
for key in ("worker", "read_time", "time", "staleness"):
    print(f"{key:>10}: {np.round(waits[key], 2)}")

# %% [markdown]
# ## The race on the virtual clock
#
# `pargrad.book.race.race(method, scenario, seed)` trains for a budget of time
# units, {glue:text}`budget-equal:.0f` with equal devices,
# {glue:text}`budget-slow:.0f` with a device three times slower and
# {glue:text}`budget-heavy:.0f` with heavy-tailed delays (long enough for
# every method to reach the higher target, plain synchronous training behind
# a slow device included), copies the parameters at the first
# update after every {glue:text}`every:.0f` units, and evaluates every copy on
# the test set afterwards. Every conclusion below follows the rule of the
# chapter "Asynchronous training", fixed before the runs:

# %%
from pargrad.book import experiments

print(experiments.RULE)
stored = race.stored_sweep("sync_vs_async_virtual")
settings = stored["settings"]
as_arrays = lambda r: {**r, **{k: np.array(r[k], float) for k in ("time", "accuracy", "loss")}}  # noqa: E731
results = [as_arrays(r) for r in stored["results"]]
sweep_runs = stored["sweep"]  # one entry a (scenario, method, rate, tuning seed): its times to the targets
BUDGETS, EVERY, TARGETS = settings["budgets"], settings["every"], settings["targets"]
SEEDS = settings["seeds"]
print(f"{len(results)} races ({SEEDS} seeds of every method in every scenario) and "
      f"{len(sweep_runs)} learning-rate sweep races on {len(settings['tuning_seeds'])} other seeds")
print("budgets:", BUDGETS)
glue("budget-equal", BUDGETS["equal devices"])
glue("budget-slow", BUDGETS["one device 3x slower"])
glue("budget-heavy", BUDGETS["heavy-tailed delays"])
glue("every", EVERY)
glue("seeds", SEEDS)
glue("tuning-seeds", len(settings["tuning_seeds"]))
glue("target-low", 100 * TARGETS[0])
glue("target-high", 100 * TARGETS[1])
plateau = float(np.median([r["accuracy"][-1] for r in results if r["scenario"] == "equal devices"]))
glue("plateau", 100 * plateau)
assert plateau > max(TARGETS) + 0.01

# %% [markdown]
# Each seed sets the initial weights, the batches and the delays, and the
# same seed gives every method the same ones: the runs are paired. The targets
# are {glue:text}`target-low:.0f`% and {glue:text}`target-high:.0f`% test
# accuracy, both below the plateau the runs with equal devices end on (a
# median final accuracy of {glue:text}`plateau:.0f`%): on a plateau, the
# first checkpoint above a target is mostly noise.
#
# The sweeps and the races take far longer than a chapter may, so
# `benchmarks/sync_vs_async.py --clock virtual` ran them and stored them in
# `pargrad/book/data/sync_vs_async_virtual.json`: every checkpoint of every
# race, and each sweep run's times to the two targets. It took
# {glue:text}`sweep-minutes:.0f` minutes in {glue:text}`sweep-jobs` processes
# on {glue:text}`sweep-cores` cores of a shared machine (load average
# {glue:text}`sweep-load:.1f` at the start, {glue:text}`sweep-load-after:.1f`
# at the end: other work took most of the cores); re-make it with
# `.venv/bin/python benchmarks/sync_vs_async.py --clock virtual`
# (`--cache DIR` lets an interrupted run resume). The virtual clock is
# seeded, so the file can be checked: this cell re-runs three of its races
# and one of its sweep runs live and compares them with the file.

# %%
run = stored["run"]
print(f"made by {stored['script']} in {run['seconds'] / 60:.0f} minutes, {run['jobs']} processes, "
      f"{run['cores']} cores, load average {run['load_average_before']} at the start, {run['date']}")
glue("sweep-minutes", run["seconds"] / 60)
glue("sweep-jobs", run["jobs"])
glue("sweep-cores", run["cores"])
glue("sweep-load", float(run["load_average_before"][0]))
glue("sweep-load-after", float(run["load_average_after"][0]))
for scenario, method in (("equal devices", "sync"), ("equal devices", "async"),
                         ("one device 3x slower", "sync, 1 backup")):
    kept = next(r for r in results if (r["scenario"], r["method"], r["seed"]) == (scenario, method, 0))
    live = race.race(method, scenario, seed=0, budget=BUDGETS[scenario], every=EVERY, data=data,
                     devices=devices, learning_rate=kept["learning_rate"])
    assert np.allclose(live["accuracy"], kept["accuracy"], atol=3 / len(y_test))
    for target in TARGETS:
        assert abs(race.digits_time_to_target(live, target)
                   - race.digits_time_to_target(kept, target)) <= EVERY
    print(f"re-run live, matches the file: {scenario}, {method}")
kept = next(r for r in sweep_runs if (r["scenario"], r["method"], r["seed"])
            == ("one device 3x slower", "sync", settings["tuning_seeds"][0]))
live = race.race("sync", "one device 3x slower", seed=kept["seed"], every=EVERY, data=data,
                 budget=BUDGETS["one device 3x slower"], devices=devices,
                 learning_rate=kept["learning_rate"])
for target, stored_time in zip(TARGETS, kept["time_to_target"]):
    assert abs(race.digits_time_to_target(live, target)
               - (np.inf if stored_time is None else stored_time)) <= EVERY
print(f"re-run live, matches the file: the sweep's run of sync at rate "
      f"{kept['learning_rate']:.3g}, one device 3x slower, tuning seed {kept['seed']}")

# %% [markdown]
# ### The learning rates
#
# Every method was swept in every scenario, on the
# {glue:text}`tuning-seeds` tuning seeds (never on the seeds of the
# verdicts), over rates a factor $2^{1/4} \approx$
# {glue:text}`grid-step:.2f` apart; its rate in a scenario is the one with
# the lowest median time to the higher target there, and the grid grew until
# that rate had a neighbour on each side. This cell recomputes each choice
# from the stored sweep with `experiments.sweep`, which refuses an optimum at
# the edge of the grid, and checks that the grid is evenly spaced:

# %%
def stored_run(scenario, method, target):
    """A harness run function that reads the stored sweep instead of training."""
    column = TARGETS.index(target)
    kept = {(round(r["learning_rate"], 6), r["seed"]): r["time_to_target"][column]
            for r in sweep_runs if (r["scenario"], r["method"]) == (scenario, method)}

    def run(rate, seeds):
        return [np.inf if kept[round(rate, 6), int(s)] is None else kept[round(rate, 6), int(s)]
                for s in seeds]

    return run


show = lambda t: f"{t:5.1f}" if np.isfinite(t) else "never"  # noqa: E731
glue("grid-step", settings["grid_step"])
best_rates, sweeps = {}, {}
for scenario, chosen_rates in settings["best_rates"].items():
    print(scenario)
    for method, chosen in chosen_rates.items():
        rates = sorted({r["learning_rate"] for r in sweep_runs
                        if (r["scenario"], r["method"]) == (scenario, method)})
        # evenly spaced (the file keeps a sweep's rates to six decimals)
        assert np.allclose(np.diff(np.log(rates)), np.log(settings["grid_step"]), atol=1e-4)
        swept = experiments.sweep(experiments.Method(
            method, stored_run(scenario, method, settings["sweep_target"]), rates),
            settings["tuning_seeds"])
        assert np.isclose(swept.best, chosen, rtol=1e-5)
        best_rates.setdefault(scenario, {})[method] = chosen
        sweeps[scenario, method] = swept
        print(f"   {method:26s} best {chosen:.3g}  medians: "
              + " ".join(f"{rate:.3g}:{show(m)}" for rate, m in zip(swept.rates, swept.medians)))
print("\nbest rate           " + " ".join(f"{s:>22s}" for s in race.SCENARIOS))
for method in race.METHODS:
    print(f"{method:26s}" + " ".join(f"{best_rates[s][method]:22.3g}" for s in race.SCENARIOS))
print("sync / async              " + " ".join(
    f"{best_rates[s]['sync'] / best_rates[s]['async']:22.2f}" for s in race.SCENARIOS))

# %% [markdown]
# Is the grid fine enough? Near each optimum, how much worse are the two
# neighbouring rates, in checkpoint intervals of the median time to the
# higher target on the tuning seeds?

# %%
def neighbours_gap(swept):
    """The larger gap between the best rate's median and its two neighbours', in checkpoints."""
    at = list(swept.rates).index(swept.best)
    return max(swept.medians[at - 1], swept.medians[at + 1]) - swept.medians[at]


gaps = {key: neighbours_gap(swept) / EVERY for key, swept in sweeps.items()}
for (scenario, method), gap in gaps.items():
    print(f"{scenario:22s} {method:26s} {gap:4.1f}")
glue("largest-gap", max(gaps.values()))
glue("median-gap", float(np.median(list(gaps.values()))))
assert all(np.isfinite(gap) for gap in gaps.values())
slow, equal = best_rates["one device 3x slower"], best_rates["equal devices"]
assert slow["async"] < equal["async"]  # what the text says
assert best_rates["heavy-tailed delays"]["sync, 1 backup"] > equal["sync, 1 backup"]

# %% [markdown]
# For half the optima both neighbours are within
# {glue:text}`median-gap:.1f` checkpoint intervals of the optimum's median
# time, and for none is one further than {glue:text}`largest-gap:.1f`: a
# finer grid could only choose among rates whose medians on the tuning seeds
# differ by a few checkpoints. Where several rates tie, the sweep takes the
# smallest.
#

# %% [markdown]
# The linear scaling rule {cite}`goyal2017accurate` would give the
# synchronous step, which averages four times as many examples, four times
# the asynchronous rate; the sweeps' ratios are printed above, scenario by
# scenario. The scenarios move the rates: behind a device three times
# slower, plain asynchronous training's best rate is lower than with equal
# devices, and with heavy-tailed
# delays synchronous training with a backup worker takes a larger one: one
# rate for all scenarios, tuned on equal devices, would not be each
# method's best.
#
# ### Accuracy against time
#
# {numref}`fig-race-virtual` shows the three contenders that answer the
# stale-gradient article's question, plain synchronous, synchronous with one
# backup worker and plain asynchronous, in each scenario (the mitigations of
# asynchronous training come in the verdicts after it).

# %%
CONTENDERS = ("sync", "sync, 1 backup", "async", "sequential, no staleness")


def race_figure(runs, target, xlabel):
    """Accuracy against time, one panel a scenario, the three contenders (and the control)."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 3.8), sharey=True)
    for ax, scenario in zip(axes, race.SCENARIOS):
        plots.race_curves([r for r in runs if r["scenario"] == scenario
                           and r["method"] in CONTENDERS], ax=ax, title=scenario,
                          target=target, xlabel=xlabel, ylim=(0.6, 1.0))
    figure.tight_layout()
    return figure


figure = race_figure(results, TARGETS[1], "virtual time")
glue("race-virtual", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} race-virtual
# :name: fig-race-virtual
#
# Test accuracy against virtual time. The line is the median of the seeds,
# the band spans the lowest and the highest seed, the dotted horizontal line
# is the higher target. Solid: synchronous; dashed: asynchronous; dotted
# (equal devices only): the zero-staleness control, one device doing the
# asynchronous workers' updates one after the other.
# ```
#
# ## Time to target, DAWNBench's way
#
# DAWNBench ranks entries by the time they need to reach a fixed accuracy
# {cite}`coleman2017dawnbench,coleman2019analysis`. Ours: the first checkpoint
# at or above each target, for each seed; "never" means not within the
# budget. {numref}`fig-time-to-target` shows every seed of every method at
# the higher target; the table below it has both.

# %%
table = race.time_to_target_table(results, TARGETS[1])
figure = plots.time_to_target_chart(table, unit="virtual time")
glue("time-to-target", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} time-to-target
# :name: fig-time-to-target
#
# Time to the higher target on the virtual clock, one row a scenario and
# method: a dot for each seed, a bar to the median, an × for a seed that never
# got there within the budget.
# ```

# %% tags=["hide-output"]
for target in TARGETS:
    print(f"time to {target:.0%}:")
    print(race.format_table(race.time_to_target_table(results, target),
                            unit="virtual time units", digits=1))

# %% [markdown]
# The questions, each answered seed by seed with the rule above at both
# targets. A verdict holds at a target when the sign test over the
# {glue:text}`seeds` paired seeds gives p < 0.05; "no difference shown" is a
# tie.

# %%
QUESTIONS = {
    "equal devices": [("sequential, no staleness", "async"), ("sync", "async"),
                      ("sync", "sync, 1 backup"), ("async, staleness-aware", "async"),
                      ("async, bound 2", "async")],
    "one device 3x slower": [("async", "sync"), ("sync, 1 backup", "sync"),
                             ("sync, 1 backup", "async"), ("async, staleness-aware", "async"),
                             ("async, bound 2", "async")],
    "heavy-tailed delays": [("async", "sync"), ("sync, 1 backup", "sync"),
                            ("sync, 1 backup", "async"), ("async, staleness-aware", "async"),
                            ("async, bound 2", "async")],
}
verdicts = {}
for scenario, pairs in QUESTIONS.items():
    print(scenario)
    for first, second in pairs:
        for target in TARGETS:
            verdict = race.paired_verdict(results, scenario, first, second, target)
            verdicts[scenario, first, second, target] = verdict
            print(f"   {target:.0%}: {verdict}")

# %% [markdown]
# The cell below holds the verdicts the text states, at the lower and the
# higher target, and checks each against the seeds:

# %%
SHOWN, NONE = "ahead", "no difference shown"
STATED = {  # (scenario, first, second): verdict at the lower target, at the higher
    ("equal devices", "sequential, no staleness", "async"): (SHOWN, SHOWN),
    ("equal devices", "sync", "async"): (SHOWN, NONE),
    ("equal devices", "sync", "sync, 1 backup"): (NONE, SHOWN),
    ("equal devices", "async, staleness-aware", "async"): (NONE, NONE),
    ("equal devices", "async, bound 2", "async"): (NONE, NONE),
    ("one device 3x slower", "async", "sync"): (SHOWN, SHOWN),
    ("one device 3x slower", "sync, 1 backup", "sync"): (SHOWN, SHOWN),
    ("one device 3x slower", "sync, 1 backup", "async"): (SHOWN, SHOWN),
    ("one device 3x slower", "async, staleness-aware", "async"): (NONE, SHOWN),
    ("one device 3x slower", "async, bound 2", "async"): ("second", "second"),
    ("heavy-tailed delays", "async", "sync"): (SHOWN, SHOWN),
    ("heavy-tailed delays", "sync, 1 backup", "sync"): (SHOWN, SHOWN),
    ("heavy-tailed delays", "sync, 1 backup", "async"): (NONE, NONE),
    ("heavy-tailed delays", "async, staleness-aware", "async"): (NONE, NONE),
    ("heavy-tailed delays", "async, bound 2", "async"): (NONE, NONE),
}
for (scenario, first, second), expected in STATED.items():
    for target, stated in zip(TARGETS, expected):
        verdict = verdicts[scenario, first, second, target]
        wanted = {SHOWN: f"{first} ahead", "second": f"{second} ahead", NONE: NONE}[stated]
        assert verdict.verdict == wanted, (scenario, first, second, target, verdict)
        assert verdict.seeds == SEEDS >= experiments.MIN_SEEDS
slow = [verdicts["one device 3x slower", m, "sync", t] for m in ("async", "sync, 1 backup")
        for t in TARGETS]
assert all(v.wins == SEEDS for v in slow)  # on every seed
assert all(v.ties == SEEDS for t in TARGETS
           for v in [verdicts["equal devices", "async, bound 2", "async", t]])  # identical runs
assert all(verdicts["equal devices", "sequential, no staleness", "async", t].wins == SEEDS
           for t in TARGETS)
assert all(verdicts["one device 3x slower", "async, bound 2", "async", t].losses == SEEDS
           for t in TARGETS)
print("every verdict the text states holds, on", SEEDS, "seeds")
for name, key in {"eq-sync-async": ("equal devices", "sync", "async"),
                  "eq-sync-backup": ("equal devices", "sync", "sync, 1 backup"),
                  "slow-backup-async": ("one device 3x slower", "sync, 1 backup", "async"),
                  "slow-aware-async": ("one device 3x slower", "async, staleness-aware", "async"),
                  "heavy-backup-async": ("heavy-tailed delays", "sync, 1 backup", "async")}.items():
    for level, target in zip(("low", "high"), TARGETS):
        verdict = verdicts[(*key, target)]
        glue(f"{name}-{level}-wins", verdict.wins)
        glue(f"{name}-{level}-losses", verdict.losses)
        glue(f"{name}-{level}-p", verdict.p_value)

# %% [markdown]
# **Equal devices.** Does staleness cost? The control answers: one device
# making the same kind of updates one after the other, each gradient fresh,
# reaches both targets before the four asynchronous workers on every one of
# the {glue:text}`seeds` seeds. Synchronous training is ahead of
# asynchronous training at the lower target (better in
# {glue:text}`eq-sync-async-low-wins` seeds, worse in
# {glue:text}`eq-sync-async-low-losses`, p =
# {glue:text}`eq-sync-async-low-p:.2g`); at the higher one no difference is
# shown (better in {glue:text}`eq-sync-async-high-wins`, worse in
# {glue:text}`eq-sync-async-high-losses`, p =
# {glue:text}`eq-sync-async-high-p:.2g`: just short of the rule's threshold,
# and the rule, fixed in advance, decides). A backup worker buys nothing
# with equal devices (nobody is late; it only drops a quarter of the
# examples): at the lower target no difference is shown, and at the higher
# plain synchronous training is ahead ({glue:text}`eq-sync-backup-high-wins`
# seeds to {glue:text}`eq-sync-backup-high-losses`, p =
# {glue:text}`eq-sync-backup-high-p:.2g`). The staleness-aware rate shows no
# difference from the plain rate, each at its own best rate, and bounded
# staleness never binds: its runs are the plain asynchronous ones, seed for
# seed.
#
# **One device three times slower.** Plain synchronous training waits three
# units every step, for the slow device; asynchronous training and one backup
# worker (drop the slowest gradient) both reach both targets before it, on
# every seed. Between those two, the backup worker is ahead at both targets
# (better in {glue:text}`slow-backup-async-low-wins` seeds, worse in
# {glue:text}`slow-backup-async-low-losses`, p =
# {glue:text}`slow-backup-async-low-p:.2g`, at the lower;
# {glue:text}`slow-backup-async-high-wins` to
# {glue:text}`slow-backup-async-high-losses`, p =
# {glue:text}`slow-backup-async-high-p:.2g`, at the higher); the one drops
# the slow device's gradients, the other applies them late. Bounded
# staleness makes the fast workers wait for the slow one and is behind plain
# asynchronous training on every seed. The staleness-aware rate
# shows no difference at the lower target and is ahead of the plain rate at
# the higher one ({glue:text}`slow-aware-async-high-wins` seeds to
# {glue:text}`slow-aware-async-high-losses`, p =
# {glue:text}`slow-aware-async-high-p:.2g`), in the scenario where one
# device's updates are staler than the others'.
#
# **Heavy-tailed delays.** Every step of synchronous training waits for the
# *worst* of four delays, and with a heavy tail that worst one is often long:
# asynchronous training and a backup worker are both ahead of plain
# synchronous training at both targets. Between them no difference is shown
# (better in {glue:text}`heavy-backup-async-low-wins` and
# {glue:text}`heavy-backup-async-high-wins` seeds, worse in
# {glue:text}`heavy-backup-async-low-losses` and
# {glue:text}`heavy-backup-async-high-losses`, at the two targets), nor for
# the two asynchronous mitigations against plain asynchronous training.
#
# So, over {glue:text}`seeds` seeds on the virtual clock, each method at its
# own best rate in each scenario, the stale-gradient article's claim holds
# where it was made: with stragglers, asynchronous training is not worse
# than plain synchronous training in the same time; it is ahead. With equal
# devices synchronous training is ahead at the lower target, and staleness
# has a measurable cost (the control). And the remedy the field adopted,
# synchronous training with one backup worker, is ahead of plain synchronous
# training wherever a device is late, ahead of asynchronous training behind a
# persistently slow device, not shown different from it under heavy-tailed
# delays, and
# behind plain synchronous training at the higher target with equal devices,
# where it only wastes examples.
#
# ## On the wall clock
#
# The virtual clock leaves out everything but computation. On the wall
# clock, `race(..., mode="free-running")` runs real threads for
# `AsyncTrainer` and a real `MirroredStrategy` step for `SyncTrainer`. Our four
# logical devices share two CPU cores, so a device's compute time is
# *emulated*, as an accelerator's: each device's step is stretched to
# `step_seconds` times the same $(1 + \text{delay}) / \text{speed}$, the host
# thread waiting meanwhile as it would for a GPU, and a dropped backup worker
# is cut off. Everything else is measured: Python, the lock, launching the
# step, the all-reduce.
#
# **One clock for every contender.** A checkpoint's time is the elapsed time
# since the timed run began, taken around the whole run: the trainer's
# bookkeeping, launching each call, the copies of the parameters at the
# checkpoints, everything, for `SyncTrainer` and `AsyncTrainer` alike. Both
# are warmed up the same way before that clock starts: `race.WARM_UP_STEPS`
# untimed steps on the same arrays the timed run uses (so nothing is traced or
# compiled on the clock), then the weights are reset to the seed's initial
# weights.
#
# First, a live race (its numbers change from run to run, with the machine's
# load, which the cell prints): the 3× slower device, one seed, a few seconds
# a method. The cell checks one thing, the robust one: asynchronous training
# and synchronous training with one backup worker each reach the lower target
# before plain synchronous training, which waits three times as long every
# step.

# %% tags=["nbval-ignore-output"]
import os

load_before = os.getloadavg()
live = [race.race(method, "one device 3x slower", seed=0, budget=4.0, every=0.2,
                  mode="free-running", step_seconds=0.02, data=data, devices=devices,
                  learning_rate=best_rates["one device 3x slower"][method])
        for method in ("sync", "sync, 1 backup", "async")]
print(f"load average before {np.round(load_before, 2)}, after {np.round(os.getloadavg(), 2)} "
      f"on {os.cpu_count()} cores")
for target in TARGETS:
    print(race.format_table(race.time_to_target_table(live, target),
                            unit=f"seconds to {target:.0%}, wall clock", digits=2))
print("updates in the budget:", {r["method"]: int(r["updates"][-1]) for r in live})
reached = {r["method"]: race.digits_time_to_target(r, TARGETS[0]) for r in live}
assert reached["async"] < reached["sync"] - 0.2 and reached["sync, 1 backup"] < reached["sync"] - 0.2

# %% [markdown]
# The stored sweep: every contender in every scenario, several seeds, measured
# by `tools/measure_race_sweep.py` into `pargrad/book/data/sync_vs_async.json`
# together with the machine and its load before and after every run. A
# measurement on a busy machine measures the other work too, so the script
# refuses to store one when the load average is above half a core, unless
# told otherwise; the next cell prints what the stored one was measured on,
# and at which learning rates: each method at the best rate of its own sweep
# *in that scenario*, the rates of the virtual-clock comparison above (the
# cell checks that they are the same).

# %%
measured = race.stored_sweep("sync_vs_async")
machine = measured["machine"]
print(f"{machine['cpu']}, {machine['cores']} cores, TensorFlow {machine['tensorflow']}, "
      f"{machine['date']}")
print(f"load average before the sweep {machine['load_average_before']}, after "
      f"{machine['load_average_after']}"
      + (" (measured on a busy machine: provisional)" if machine["allowed_load"] else ""))
wall_settings = measured["settings"]
wall_rates = race.wall_clock_rates(wall_settings)
for r_scenario, rates in wall_rates.items():
    print(f"learning rates, {r_scenario}: " + ", ".join(f"{m} {v:.3g}" for m, v in rates.items()))
# what the text says: measured at each scenario's own swept rates
assert all(rate == best_rates[s][m] for s, rates in wall_rates.items() for m, rate in rates.items())
walls = [{**r, **{k: np.array(r[k], float) for k in ("time", "updates", "accuracy")}}
         for r in measured["results"]]
WALL_SEEDS = wall_settings["seeds"]
glue("wall-seeds", WALL_SEEDS)
glue("wall-load", float(machine["load_average_before"][0]))
for target in wall_settings["targets"]:
    print(f"\nseconds to {target:.0%}, one column a seed ('-': never), and the 1-minute load "
          "average at the start of each run:")
    for r_scenario in race.SCENARIOS:
        for method in ("sync", "sync, 1 backup", "async"):
            runs = sorted((r for r in walls if r["scenario"] == r_scenario and r["method"] == method),
                          key=lambda r: r["seed"])
            times = [race.digits_time_to_target(r, target) for r in runs]
            print(f"   {r_scenario:22s} {method:16s} "
                  + " ".join(f"{t:5.2f}" if np.isfinite(t) else "    -" for t in times)
                  + "   load " + " ".join(f"{r['load_before']:.1f}" for r in runs))
claims = race.wall_clock_claims(walls, wall_settings["targets"][0], wall_settings["every"])
for claim, holds in claims.items():
    print(f"{'holds' if holds else 'FAILS'} on all {WALL_SEEDS} seeds (sign test): {claim}")
assert all(claims.values())

# %% [markdown]
# The claim the cell checks holds on all {glue:text}`wall-seeds` seeds of the
# stored sweep (over so few seeds the sign test needs nearly all of them): with a
# device three times slower, asynchronous training and one backup worker
# both reach the lower target before plain synchronous training. The other
# comparisons are printed seed by seed and not claimed: with this few seeds,
# on a clock that moves with the machine's load (the stored sweep's started at
# a load average of {glue:text}`wall-load:.1f`), the virtual clock's verdicts
# above are the evidence, and the wall clock an illustration. Was the warm-up
# fair? If a trainer still traced or compiled on the clock, its first
# checkpoint interval would be slower per update than the rest:

# %%
def first_interval_ratio(runs):
    """Median over runs of (seconds per update before the first checkpoint) / (after it)."""
    ratios = [((r["time"][1] - r["time"][0]) / (r["updates"][1] - r["updates"][0]))
              / ((r["time"][-1] - r["time"][1]) / (r["updates"][-1] - r["updates"][1]))
              for r in runs if len(r["time"]) > 2 and r["updates"][1] > 0]
    return float(np.median(ratios))


for kind in ("sync", "async"):
    runs = [r for r in walls if r["method"] == kind and r["scenario"] == "equal devices"]
    ratio = first_interval_ratio(runs)
    print(f"{kind:5s}: first interval / the rest, seconds per update: {ratio:.2f}")
    assert ratio < 1.5, "a trainer pays for start-up on the clock"
equal_sync = [r for r in walls if r["scenario"] == "equal devices" and r["method"] == "sync"]
per_step = np.median([r["time"][-1] / r["updates"][-1] for r in equal_sync])
print(f"synchronous step with equal devices: {per_step * 1e3:.1f} ms for "
      f"{wall_settings['step_seconds'] * 1e3:.0f} ms of emulated compute")

# %% [markdown]
# Neither trainer's first interval is much slower than the rest (the check
# allows half as long again), so neither pays for start-up on the clock.

# %%
figure = race_figure(walls, wall_settings["targets"][1], "seconds (wall clock)")
glue("race-wall", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} race-wall
# :name: fig-race-wall
#
# Test accuracy against the wall clock, measured on the machine the cell
# above describes: median of the seeds, band from the lowest to the highest.
# Solid: synchronous; dashed: asynchronous.
# ```
#
# {numref}`fig-race-wall` is the wall clock's picture. Where it differs from
# the virtual clock, the difference is overhead: a synchronous step costs
# more than its emulated compute (the line above says how much: launching the
# step from Python, handing four replicas their shards and the all-reduce,
# all on two shared cores), once per step and on the critical path, while the
# asynchronous workers' overheads overlap with each other's emulated
# compute. The virtual clock charges nothing for that overhead, nor for
# communication: on real accelerators a step's compute is long next to the
# launch, which favours the virtual clock's picture, but gradients of a large
# model cross a network every synchronous step (and every asynchronous update
# crosses it to a parameter server), which the chapter "What communication
# costs" prices. Neither clock alone is the guide for a real model; the
# virtual one isolates waiting, the wall clock adds this machine's overheads.
#
# ## What happened since
#
# The answer to the y = x² question said synchronous training "was mostly abandoned". In the
# early 2010s that was a fair description: the parameter-server systems of
# Dean et al. {cite}`dean2012large` trained asynchronously, and Hogwild!
# {cite}`niu2011hogwild` dropped even the locks. The field then went the
# other way, for the reasons this chapter measured:
#
# - Chen et al. {cite}`chen2016revisiting` revisited synchronous training and
#   showed that a few backup workers remove the straggler problem, with
#   faster convergence and better test accuracy than asynchronous training.
# - Goyal et al. {cite}`goyal2017accurate` showed how to train with very large
#   synchronous batches: scale the learning rate linearly with the batch, and
#   warm it up over the first epochs. ResNet-50 trained on ImageNet in one
#   hour on 256 GPUs, with the accuracy of the small-batch run.
# - All-reduce made synchronous training simple and fast: Horovod
#   {cite}`sergeev2018horovod` brought ring all-reduce to TensorFlow, and
#   PyTorch's DistributedDataParallel {cite}`li2020pytorch` overlaps it with
#   the backward pass. `MirroredStrategy` and `MultiWorkerMirroredStrategy`
#   are TensorFlow's own.
# - DAWNBench's time-to-accuracy entries up to April 2018 were dominated by
#   synchronous, all-reduce training {cite}`coleman2019analysis`. The
#   leaderboard's final ImageNet results, when submissions closed in 2020,
#   trained ResNet-50 to 93% top-5 accuracy in 2 min 38 s (Alibaba Cloud,
#   March 2020), 2 min 43 s and 9 min 22 s (Huawei Cloud ModelArts, 2019 and
#   2018), each on clusters of 128 GPUs or more {cite}`dawnbench2020leaderboard`. (A
#   slower figure often quoted, also on the page the stale-gradient article comes from,
#   is an earlier one from a 2018 press report, not the leaderboard's.)
#
# Asynchronous training did not disappear. It lives on where its strengths
# matter: sparse models with huge embedding tables trained on parameter
# servers (TensorFlow's `ParameterServerStrategy` is asynchronous), clusters
# of unreliable or unequal machines, and, with staleness corrections such as
# the staleness-aware rate or delay compensation {cite}`zheng2017asynchronous`,
# wherever waiting costs more than staleness. The answer to the y = x² question's claim is
# therefore the reverse of its claim: synchronous training became the
# default, with its weakness, stragglers, handled by backup workers and by
# homogeneous hardware.
#
# Where the network is slow, between data centres or over the internet,
# training went back to communicating rarely, which neither mode of this
# page does: each worker takes many steps on its own copy of the parameters
# between averages of them (local SGD), and DiLoCo trains language models on
# islands of accelerators that synchronise only now and then. The chapter
# {doc}`11_communicating_rarely` takes that up.
#
# **What is about this small problem, and what is known at scale.** The
# verdicts of this page are about a perceptron of {glue:text}`parameters`
# parameters on {glue:text}`train-size` training digits, four devices, and
# delays we chose; they say which method
# reaches a target first *here*, over these seeds. The direction of each
# agrees with what is reported at scale, where it has been measured: Chen et
# al. found synchronous training with backup workers faster to a given
# accuracy and more accurate than asynchronous training for Inception on
# ImageNet on 50 to 200 workers {cite}`chen2016revisiting`; Dutta et al.
# model and measure the trade-off between the error of stale updates and the
# time saved by not waiting, and find that which one wins depends on the
# distribution of the delays, as our scenarios do {cite}`dutta2018slow`; and
# Goyal et al.'s synchronous large-batch recipe is what the fastest
# DAWNBench entries used {cite}`goyal2017accurate,coleman2019analysis`. What
# this page cannot show is the cost of communication at scale, which the
# chapter "What communication costs" prices.
#
# ## Summary
#
# - On one virtual clock, a synchronous step costs its slowest replica; an
#   asynchronous worker applies when it is ready. Both trainers compute every
#   gradient for real; only durations are modelled, and communication is free.
# - Every verdict rests on {glue:text}`seeds` paired seeds, every method at
#   the best rate of its own sweep in each scenario (on other seeds, optimum
#   inside the grid),
#   and the rule of the chapter "Asynchronous training": an exact sign test,
#   p < 0.05, otherwise "no difference shown"; at two targets below the
#   plateau.
# - With equal devices, a zero-staleness control reached both targets before
#   asynchronous training on every seed: staleness has a measurable cost.
#   Synchronous training was ahead of asynchronous training at the lower
#   target only; a backup worker was behind plain synchronous training at
#   the higher target (it drops examples and nobody is late).
# - With one 3× slower device or heavy-tailed delays, asynchronous training
#   and synchronous training with one backup worker were both ahead of plain
#   synchronous training; between the two, the backup worker was ahead with
#   the persistently slow device, and no difference was shown with
#   heavy-tailed delays. Bounded staleness throttled the fast workers behind
#   a persistent straggler; the staleness-aware rate was ahead of a tuned
#   constant rate only at the higher target behind the slow device.
# - Every method was swept in every scenario: the best rates differ between
#   scenarios, so one rate for all would have favoured some methods.
# - On the wall clock, every contender is timed by one clock, the elapsed
#   time around its whole run; the stored measurement carries the machine's
#   load, and with its few seeds it illustrates rather than decides.
#
# ## Exercises
#
# 1. Add a fourth scenario with two devices twice as slow. How many backup
#    workers does synchronous training need, and what does it cost with equal
#    devices?
#
#    *Hint:* every step must be able to drop both slow devices' gradients.
# 2. Run a learning-rate sweep yourself, on a few seeds:
#    `race.race("async", "equal devices", learning_rate=rate, seed=seed)` over
#    a grid of rates, and the same for `"sync"`, scored by the time to the
#    lower target; pick each best rate with `experiments.sweep`. Is the best
#    synchronous rate four times the best asynchronous one?
#
#    *Hint:* one synchronous update averages four workers' gradients; four
#    asynchronous updates each apply one.
# 3. Try `staleness_bound` 0, 1, 4 and 8 with the 3× slower device. Where does
#    bounded staleness stop hurting, and why?
#
#    *Hint:* how far ahead does a fast worker get in one step of the slow
#    one?
# 4. Compute the verdicts at a target on the plateau with
#    `race.paired_verdict(results, scenario, first, second, 0.96)`. Which
#    verdicts change, and why is a target on the plateau a poor measure?
#
#    *Hint:* a lower target rewards early speed, a higher one the quality of
#    the late updates.
# 5. Run `tools/measure_race_sweep.py --step-ms 5 --output /tmp/race.json`
#    on your machine. What
#    happens to synchronous training when the step is small next to the cost
#    of launching it?
#
#    *Hint:* a synchronous step pays the launch and the all-reduce once per
#    update, whatever the step's size.
#
# ### Solutions
#
# These exercises change the chapter's runs; their solutions say what to look
# for, and the chapter's cells give the code to start from.
#
# ```{dropdown} Solution to exercise 1
# Two: with two slow devices, a step that waits for the first $N$ of
# $N + 2$ gradients never waits for a slow one. With equal devices the two
# backup workers' gradients are computed and dropped, so each update uses
# fewer examples than the workers computed: the cost is wasted work, not
# time.
# ```
#
# ```{dropdown} Solution to exercise 2
# Roughly, but not exactly: the averaged synchronous gradient is four times
# less noisy and tolerates a larger rate (the linear scaling rule), while the
# asynchronous updates are stale and tolerate a smaller one; the sweep shows
# how close to four the ratio of the best rates comes on this task.
# ```
#
# ```{dropdown} Solution to exercise 3
# With a *persistent* 3× straggler, no finite bound stops hurting. The bound
# counts applied updates: each fast worker applies three updates for every
# one of the slow worker, so its lead grows by two every slow step, and
# whatever the bound $s$, after about $s/2$ slow steps every fast worker is
# $s$ ahead and from then on waits for the slow one at every step. A larger
# bound only delays the throttling; in the long run the fast workers apply
# one update per slow step, as in synchronous training (in the chapter's
# stored runs, compare the updates of "async, bound 2" with plain "async").
# A bound helps against *transient* stragglers, whose lag it lets the others
# absorb: with heavy-tailed delays the slow device changes from step to step,
# and the counts even out.
# ```
#
# ```{dropdown} Solution to exercise 4
# On the plateau, the first checkpoint above the target depends on small
# wobbles of the test accuracy (one test image is a fraction of a percent),
# so seeds that reach it late or never do so by chance, and the sign test
# sees more ties and more "never": verdicts there turn into "no difference
# shown", or flip. That is why the page's targets sit below the plateau,
# where every method climbs steadily.
# ```
#
# ```{dropdown} Solution to exercise 5
# With steps of a few milliseconds, the fixed cost of a synchronous step
# (launching it on every replica and the all-reduce) becomes a large part of
# each update, so synchronous training falls behind even with equal devices;
# accumulating several micro-batches per update, or larger batches, spreads
# that cost again.
# ```
