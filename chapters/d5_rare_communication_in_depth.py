# %% [markdown]
# # Communicating rarely in depth
#
# ```{admonition} Takeaway
# Every verdict of [Communicating rarely](11_communicating_rarely) pools
# two seed sets of 30, each with its own sweep of every knob, and needs both
# to lean the same way. Scored at the final point, DiLoCo's swinging
# momentum decides some verdicts by luck; with the paper's outer step fixed,
# DiLoCo looks worse than it is.
# ```
#
# This optional page holds what the chapter
# [Communicating rarely](11_communicating_rarely) rests on: how its
# verdicts are made, the published results, DiLoCo's outer step tuned at
# every `H`, the uneven race pair by pair, and churn over many seeds. It
# runs only the float64 replay (`pargrad.book.replay`), which the chapter
# checks against the real trainer.
#
# In this chapter you will see each verdict on both seed sets, why the
# last-quarter mean replaces the final point, and what tuning the outer step
# changes.

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

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from pargrad.book import experiments, glue, replay, tuning
from pargrad.book.plots_communication import seeds_figure
from pargrad.book import rare_communication as rc

# %% [markdown]
# ## How the chapter's verdicts are made
#
# The tuning is part of the experiment. `tools/measure_tuned_rare_communication.py`
# (minutes of NumPy) runs every method's whole grid on a pool of tuning
# seeds that belongs to one seed set, takes the pool's best, and also cuts
# the pool into draws of ten seeds and
# resamples it, running each draw's pick on the test seeds. The runs ship
# in `pargrad/book/data/rare_communication_tuned.json`
# (`tests/claims/test_rare_communication_tuned_conclusions.py` runs a
# sample again); the pages read them:

# %%
pargrad.book.show_source(rc.measure_tuned)

# %%
for which, (test, pool) in rc.TUNED_SETS.items():
    print(f"{which:8s} test seeds {test[0]}-{test[-1]}, tuning pool {pool[0]}-{pool[-1]}")
print(experiments.RULE)

# %% [markdown]
# Each grid is one that earlier sweeps extended until no best touched its
# end; only a natural limit may be the best: momentum 0 (plain averaging)
# and, for the race's methods that communicate rarely, `H = 2`. How far
# the draw of tuning seeds moves each stated comparison, in seed standard
# errors of its median log-ratio (the page's set · the held-out set), and
# the rule's power at a fifth and false "ahead" rate with that noise:

# %% tags=["hide-input"]
def tuning_row(set_name, first, second):
    shifts = [rc.tuning_shift_in_errors(set_name, first, second, which, kind)[0]
              for kind in ("disjoint", "bootstrap") for which in ("page", "held_out")]
    v = rc.tuned_replication(set_name).compare(first, second).pooled
    false = experiments.power_at(v.spread, v.set_sizes, tuning_sd=v.tuning_sd, effect=1.0)
    return (f"{first[:22]:22s} vs {second[:22]:22s} {shifts[0]:5.2f} · {shifts[1]:<5.2f}"
            f"{shifts[2]:8.2f} · {shifts[3]:<5.2f} {v.power:6.2f} {false:6.3f}")


print(f"{'':51s} {'draws of 10':13s} {'pool of 40':13s} {'power':>6s} {'false':>6s}")
for set_name in rc.STATED_METHODS:
    print(set_name)
    for key in rc.STATED_PAIRS[set_name]:
        print("  ", tuning_row(set_name, *key))
glue("min-agreement", f"{tuning.MIN_AGREEMENT:.0%}")

# %% [markdown]
# Even with pools of forty, most shifts exceed the target of half a
# standard error. So a lead must also exceed what the tuning alone could
# make of it (`experiments.tuning_margin`), which holds the false "ahead"
# rate of the last column near the test's level, and hold on
# {glue:text}`min-agreement` of the resampled draws
# ([How the book decides](a0_methods)).
#
# **The trainer against the replay.** The chapter runs the real
# `LocalSGDTrainer` once for every `H`. Where the run contracts, its final
# weights equal the replay's within the float64 rounding tolerance of 1024
# updates (`pargrad.rounding_tolerance`). Where a nudge of the initial
# weights by one part in $10^{15}$ already grows to a visible gap, the run
# is chaotic and no implementation repeats it to the digit; there the
# trainer and the replay may differ by at most a hundred times what the
# nudge produces.
#
# ## Three published results, scaled down

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
# Each replica's communication in 1024 local steps (a ring all-reduce every
# round), and both outer steps' median score on the page's seeds:

# %%
dial = rc.tuned_replication("dial")
page = dial.page
per_round = 2 * (rc.REPLICAS - 1) / rc.REPLICAS * rc.PARAMETER_BYTES
print(f"{'H':>4s} {'rounds':>6s} {'bytes a replica':>15s} {'less communication':>18s} "
      f"{'local SGD':>10s} {'DiLoCo':>8s}")
for steps in rc.DIAL:
    rounds = rc.UPDATES // steps
    print(f"{steps:4d} {rounds:6d} {rounds * per_round:15.0f} {steps:17d}x "
          f"{np.median(page.scores[rc.method_name(replay.AVERAGE, steps)]):10.2g} "
          f"{np.median(page.scores[rc.method_name(replay.NESTEROV, steps)]):8.2g}")

# %% [markdown]
# **1. DiLoCo's saving at similar loss**, the chapter's sentences as a
# table (last-quarter mean, both seed sets pooled):

# %%
experiments.results_table(dial, rc.SYNC_MOMENTUM,
                          [rc.SYNC] + [rc.method_name(replay.NESTEROV, s) for s in rc.DIAL[1:]],
                          family={rc.method_name(replay.NESTEROV, s): experiments.statement_key(
                              "communicating rarely", "dial", rc.method_name(replay.NESTEROV, s),
                              rc.SYNC_MOMENTUM) for s in rc.DIAL[1:]})

# %% [markdown]
# Each of its verdicts seed set by seed set, then at the final point
# instead, where the verdict at `H = 4` depends on where the outer
# momentum's swing stands at the last round:

# %% tags=["hide-input"]
def said(result, *statement):
    """One verdict as a sentence: what it says, wins and losses over both sets, the ratio.

    With a ``statement`` of the book's registry (set, first, second), the verdict is the one
    after Holm's correction over the book's stated verdicts.
    """
    key = experiments.statement_key("communicating rarely", *statement)
    if statement and key in experiments.stated_family():
        result = experiments.corrected(result, key)
    v = getattr(result, "pooled", result)
    return (f"{v.first} vs {v.second}: {v.text}; better on {v.wins} of {v.seeds} seeds, "
            f"worse on {v.losses}, median ratio {experiments.format_ratio(v.effect)}")


for steps in rc.DIAL[1:]:
    print(said(dial.compare(f"DiLoCo, H={steps}", rc.SYNC_MOMENTUM), "dial",
               f"DiLoCo, H={steps}", rc.SYNC_MOMENTUM))


def final_point(experiment, name, seeds):
    rate, outer_rate, momentum = rc.outer_knobs(experiment.rates[name])
    steps = 1 if name == rc.SYNC_MOMENTUM else int(name.split("=")[1])
    return rc.loss_curves(rate, seeds, steps, rc.UPDATES, replay.NESTEROV, outer_rate=outer_rate,
                          momentum=momentum)[-1]


final_verdicts = []
for steps in (4, 16):
    verdicts = [experiments.compare(final_point(run, f"DiLoCo, H={steps}", run.seeds),
                                    final_point(run, rc.SYNC_MOMENTUM, run.seeds),
                                    f"DiLoCo, H={steps}", rc.SYNC_MOMENTUM, min_seeds=1)
                for run in (dial.page, dial.held_out)]
    final_verdicts.append(experiments.replicated(*verdicts))
    print(f"final point, {said(final_verdicts[-1])}")

# %% [markdown]
# **2. Local SGD loses when `H` grows too large.** At ImageNet scale, less
# communication came with lower accuracy, the more so with more local steps
# {cite}`ortiz2021tradeoffs`. Each `H` against synchronous SGD (`H = 1`):

# %%
experiments.results_table(dial, rc.SYNC, [rc.method_name(replay.AVERAGE, s) for s in rc.DIAL])

# %% [markdown]
# The loss grows with `H`, slowly here: the replicas see random quarters of
# one curve, so their local optima are close. With shards that differ (the
# chapter's exercise 1), large `H` is ruinous.
#
# **3. The outer Nesterov step against plain averaging.** Ortiz et al.
# recovered accuracy with a "slow momentum" on the averaged update, and
# DiLoCo's ablations chose Nesterov for the outer step
# {cite}`ortiz2021tradeoffs,douillard2023diloco`. DiLoCo with its inner
# rate, outer rate and momentum swept together, against local SGD at the
# same `H`; and, at `H = 64`, with the paper's outer step fixed:

# %%
print("outer grid:", rc.OUTER_GRID, "| inner rates: 2^-8 ... 2^-1")
for steps in rc.DIAL:
    diloco, local = rc.method_name(replay.NESTEROV, steps), rc.method_name(replay.AVERAGE, steps)
    picked = [run.rates[diloco] for run in (dial.page, dial.held_out)]
    print(f"H = {steps}: tuned (page · held-out): " + " · ".join(
        f"inner {p['rate']:.3g}, outer {p['outer_rate']:g}, momentum "
        f"{p['momentum']:g}" for p in picked))
    print("   ", said(dial.compare(diloco, local)))
paper = f"DiLoCo, paper's step, H={rc.PAPER_H}"
print(f"outer step fixed (0.7, 0.9): {said(dial.compare(paper, f'local SGD, H={rc.PAPER_H}'))}")

# %% tags=["remove-cell"]
tuned64 = dial.compare("DiLoCo, H=64", "local SGD, H=64")
fixed64 = dial.compare(paper, "local SGD, H=64")
assert tuned64.verdict == "DiLoCo, H=64 ahead"
assert fixed64.verdict == "local SGD, H=64 ahead"
FINAL_POINT_VERDICTS = [f"{rc.SYNC_MOMENTUM} ahead", f"{rc.SYNC_MOMENTUM} ahead"]
assert [v.verdict for v in final_verdicts] == FINAL_POINT_VERDICTS
assert all(dial.compare(rc.method_name(replay.NESTEROV, s), rc.method_name(replay.AVERAGE, s))
           .verdict == f"{rc.method_name(replay.NESTEROV, s)} ahead" for s in rc.DIAL)
glue("tuned64", tuned64.verdict)
glue("fixed64", fixed64.verdict)

# %% [markdown]
# Tuned, DiLoCo is ahead of plain averaging at every `H`, on both seed
# sets (an independent re-implementation written from the papers cannot
# show it at `H = 256`: there the lead belongs to this code's problem). With the paper's outer step fixed, DiLoCo at `H = 64` (16 rounds)
# gets "{glue:text}`fixed64`": a momentum of 0.9 remembers about ten
# rounds, and was tuned for runs of hundreds. A method whose knob is left
# at another setting's value is not compared at its best.
#
# ## The uneven race, pair by pair
#
# The chapter's race: one worker of four 3 times slower, every method in
# the virtual time synchronous SGD needs for 256 steps on the link. Its
# methods:

# %%
pargrad.book.show_source(rc.uneven_methods)

# %% tags=["hide-input"]
races = {link.name: rc.tuned_replication(f"race, {link.name}") for link in (rc.FAST, rc.SLOW)}
figure = seeds_figure([race.page for race in races.values()],
                      [f"one worker 3x slower, {name}" for name in races])
glue("uneven-figure", figure, display=False)
plt.close(figure)

# %% [markdown]
# ```{glue:figure} uneven-figure
# :name: fig-uneven
#
# Mean loss over the last quarter of the time, every page seed (dots) and
# the median (bar), each method at its own best setting, in the same virtual
# time; one worker of four is 3 times slower.
# ```
#
# The chapter's two races as tables:

# %%
for link_name, race in races.items():
    print(f"{link_name}: the sweeps picked H = {int(race.page.rates[rc.LOCAL_TUNED]['H'])} "
          f"for local SGD and H = {int(race.page.rates[rc.DILOCO_TUNED]['H'])} for DiLoCo")
    family = {name: experiments.statement_key("communicating rarely", f"race, {link_name}",
                                              name, rc.SYNC_MOMENTUM)
              for name in (rc.DILOCO_TUNED, rc.ASYNC, rc.LOCAL_TUNED)}
    display(experiments.results_table(race, rc.SYNC_MOMENTUM, family=family))

# %% [markdown]
# The best settings each seed set's sweep picked, and every pair under the
# book's rule (both seed sets pooled, each leaning the same way), with each
# set's wins and losses:

# %%
def setting_text(setting):
    setting = setting if isinstance(setting, dict) else {"rate": setting}
    return ", ".join(f"rate {v:.3g}" if knob == "rate" else f"{knob} {v:g}"
                     for knob, v in setting.items())


for link_name, race in races.items():
    print(link_name)
    for name in race.page.rates:
        print(f"    {name:30s} page: {setting_text(race.page.rates[name])}; held-out: "
              f"{setting_text(race.held_out.rates[name])}")
    names = list(race.page.scores)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            print("   ", said(race.compare(first, second), f"race, {link_name}", first, second))

# %% tags=["remove-cell"]
pairs = [(link_name, first, second) for link_name, race in races.items()
         for i, first in enumerate(race.page.scores) for second in list(race.page.scores)[i + 1:]]
at_the_end = {link_name: rc.tuned_rescored(f"race, {link_name}", "final point")
              for link_name in races}
changed = [pair for pair in pairs if races[pair[0]].compare(*pair[1:]).verdict
           != at_the_end[pair[0]].compare(*pair[1:]).verdict]
glue("race-pairs", len(pairs))
glue("race-changed", len(changed))

# %% [markdown]
# Each race scores a run by its mean loss over the last quarter of the time
# ([How the book decides](a0_methods)): DiLoCo's loss swings from round to
# round. Scored at the end of the time instead, at the same settings,
# {glue:text}`race-changed` of these {glue:text}`race-pairs` verdicts change.

# %% [markdown]
# ## What churn costs, over many seeds
#
# The chapter runs three clusters of processes: 3 workers, then 2, then 3
# again, handing over the weights and the outer momentum. Over the page's
# seeds and the held-out seeds, the same phases against 3 workers
# throughout, scored at the final point and by the mean over the last
# quarter of the rounds:

# %%
churn = {score: experiments.replicated(*[rc.churn_verdict(run, score)
                                           for run in (dial.page, dial.held_out)])
         for score in ("last quarter", "final point")}
for score, verdict in churn.items():
    print(f"scored by the {score}: {said(verdict)}")

# %% tags=["remove-cell"]
CHURN_VERDICTS = {"last quarter": f"{rc.CHURN} ahead", "final point": f"{rc.CHURN} ahead"}
assert {score: v.verdict for score, v in churn.items()} == CHURN_VERDICTS
glue("churn-robust", churn["last quarter"].verdict)
glue("churn-final", churn["final point"].verdict)

# %% [markdown]
# By the last-quarter mean the verdict is "{glue:text}`churn-robust`"; at
# the final point, "{glue:text}`churn-final`". Both seed sets lean that way
# (a third set, tuned on its own seeds, too, in the claim tests): here the
# departure costs no loss, and the run with churn even ends lower. Here the
# two remaining workers still cover all the data, each on a larger shard; in
# DiLoCo's setting a departing worker takes its data and compute with it.

# %% [markdown]
# ## Summary
#
# - Every verdict of "Communicating rarely" pools the page's seeds and
#   held-out seeds, each set tuned on its own pool of seeds, and needs both
#   sets to lean the same way; resampling the pools measures how far the
#   tuning moves a verdict; a third set checks each statement in the claim
#   tests.
# - Scored at the final point, a DiLoCo run is judged at wherever its outer
#   momentum's swing happens to stand; the mean over the last quarter of the
#   rounds is the robust score the chapter uses.
# - Tuning DiLoCo's outer rate and momentum changes what the dial shows at
#   large H: with the paper's outer step fixed, local SGD looks better there.
# - Churn showed no cost here; the run with churn even ends lower, on both
#   seed sets.
#
# ## Exercises
#
# 1. Score the churn runs at the final point on several fresh seed sets
#    (`rc.phase_scores` with other seeds). How often does "one left, one
#    joined" end lower? What does that say about a verdict from one seed set?
#
# ```{dropdown} Solution
# The final-point split moves more from seed set to seed set than the
# last-quarter mean's (28-2 and 22-8 against 30-0 and 26-4 here): a
# final-point metric of an oscillating run is a coin toss weighted by the
# oscillation's phase, and one seed set decides little.
# ```

