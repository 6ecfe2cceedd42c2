"""The conclusions of the chapter "Sync vs async in the same time", checked two ways.

The chapter's verdicts rest on two stored virtual-clock race files, each
with every method at the best rate of its own sweep in each scenario: the
page's (seeds 0-29, tuned on 100-109) and a held-out one (seeds 1000-1029,
tuned on its own seeds 1100-1109).  Every verdict pools both files, which
must lean the same way (:func:`pargrad.book.experiments.replicated`).  Here:

* both files are what the code computes now: a sample of their races and of
  their sweep runs is re-run live, and each stored best rate is the choice
  of the book's fair rule (medians within one checkpoint interval tie, the
  tie broken by the mean), inside its grid;
* the verdicts the pages state are recomputed from the two files;
* the density check: every verdict again with each method swept on a grid
  twice as dense around its best rate (the midpoints of the four gaps
  nearest it, measured and stored with the files).
"""

import json
import pathlib

import numpy as np
import pytest

import pargrad
from pargrad.book import experiments, race

FILES = {"page": race.stored_sweep("sync_vs_async_virtual"),
         "held out": race.stored_sweep("sync_vs_async_virtual_held_out")}
STORED, HELD_OUT = FILES["page"], FILES["held out"]
SETTINGS = STORED["settings"]
TARGETS = tuple(SETTINGS["targets"])

# (scenario, first, second): the pooled verdict the chapters state at the
# lower and the higher target ("first" or "second" ahead, "negligible",
# "too few": too few seeds to tell, or None: no difference shown).
STATED = {
    ("equal devices", "sequential, no staleness", "async"): ("first", "first"),
    ("equal devices", "sync", "async"): ("first", "first"),
    ("equal devices", "sync", "sync, 1 backup"): (None, None),
    ("equal devices", "async, staleness-aware", "async"): ("first", None),
    ("equal devices", "async, bound 2", "async"): (None, None),
    ("one device 3x slower", "async", "sync"): ("first", "first"),
    ("one device 3x slower", "sync, 1 backup", "sync"): ("first", "first"),
    ("one device 3x slower", "sync, 1 backup", "async"): ("first", "first"),
    ("one device 3x slower", "async, staleness-aware", "async"): (None, None),
    ("one device 3x slower", "async, bound 2", "async"): ("second", "second"),
    ("heavy-tailed delays", "async", "sync"): ("first", "first"),
    ("heavy-tailed delays", "sync, 1 backup", "sync"): ("first", "first"),
    ("heavy-tailed delays", "sync, 1 backup", "async"): ("second", None),
    ("heavy-tailed delays", "async, staleness-aware", "async"): (None, None),
    ("heavy-tailed delays", "async, bound 2", "async"): ("second", "second"),
}


def wanted(first, second, stated):
    return {"first": f"{first} ahead", "second": f"{second} ahead",
            "negligible": experiments.NEGLIGIBLE, "too few": experiments.TOO_FEW,
            None: experiments.NO_DIFFERENCE}[stated]


def test_the_two_files_share_their_settings_but_no_seed():
    page, held_out = STORED["settings"], HELD_OUT["settings"]
    for key in ("budgets", "every", "targets", "grid_step", "batch_size", "methods"):
        assert page[key] == held_out[key], key
    sets = [set(page["seed_list"]), set(page["tuning_seeds"]), set(held_out["seed_list"]),
            set(held_out["tuning_seeds"])]
    assert all(not a & b for i, a in enumerate(sets) for b in sets[i + 1:])
    assert len(page["seed_list"]) == len(held_out["seed_list"])
    assert len(page["seed_list"]) + len(held_out["seed_list"]) >= experiments.MIN_SEEDS


@pytest.mark.parametrize("key", sorted(STATED))
def test_the_stated_verdicts_replicate_on_the_held_out_file(key):
    page, held_out = race.stored_results(STORED), race.stored_results(HELD_OUT)
    scenario, first, second = key
    for target, stated in zip(TARGETS, STATED[key]):
        verdict = race.paired_verdict(page, scenario, first, second, target, held_out=held_out)
        assert verdict.verdict == wanted(first, second, stated), verdict


@pytest.mark.parametrize("name", FILES)
def test_every_stored_rate_is_the_fair_choice_inside_its_grid(name):
    stored = FILES[name]
    settings = stored["settings"]
    tuning = settings["tuning_seeds"]
    for scenario, chosen in settings["best_rates"].items():
        for method, best in chosen.items():
            swept = race.stored_sweep_method(stored, scenario, method)
            # evenly spaced (the file keeps a sweep's rates to six decimals)
            assert np.allclose(np.diff(np.log(swept.settings())), np.log(settings["grid_step"]),
                               atol=1e-4)
            # refuses a plateau at an end of the grid, so every sweep settled
            fair = experiments.sweep(swept, tuning)
            assert np.isclose(best, fair.best, rtol=1e-5), (scenario, method)


@pytest.fixture(scope="module")
def devices():
    return pargrad.logical_devices(4)


@pytest.mark.parametrize("name, scenario, method", [
    ("page", "one device 3x slower", "sync"), ("page", "one device 3x slower", "sync, 1 backup"),
    ("held out", "one device 3x slower", "async"), ("held out", "heavy-tailed delays", "sync")])
def test_the_stored_races_repeat(devices, name, scenario, method):
    """A race of each file, re-run live at its stored rate, is what the file holds."""
    settings = FILES[name]["settings"]
    kept = next(r for r in FILES[name]["results"]
                if (r["scenario"], r["method"]) == (scenario, method))
    live = race.race(method, scenario, seed=kept["seed"], data=race.digits_data(seed=0),
                     budget=settings["budgets"][scenario], every=settings["every"],
                     devices=devices, learning_rate=kept["learning_rate"])
    assert np.allclose(live["accuracy"], kept["accuracy"], atol=3 / 450)


def test_a_stored_sweep_run_repeats(devices):
    run = next(r for r in HELD_OUT["sweep"] if r["scenario"] == "heavy-tailed delays"
               and r["method"] == "async")
    settings = HELD_OUT["settings"]
    live = race.race("async", "heavy-tailed delays", seed=run["seed"],
                     data=race.digits_data(seed=0), devices=devices,
                     budget=settings["budgets"]["heavy-tailed delays"], every=settings["every"],
                     learning_rate=run["learning_rate"])
    for target, stored in zip(TARGETS, run["time_to_target"]):
        assert abs(race.digits_time_to_target(live, target)
                   - (np.inf if stored is None else stored)) <= settings["every"]


def test_both_files_hold_the_midpoints_of_every_compared_method():
    for f in FILES.values():
        dense = f["settings"]["dense_best_rates"]
        for scenario, first, second in STATED:
            assert {first, second} <= dense.get(scenario, {}).keys(), (scenario, first, second)


# On the denser grids no verdict moves ("The race in depth"): the one undecided verdict that
# moved under the old wording (slow device, staleness-aware vs async, higher target) is "no
# difference shown" on both grids, the rule's power at its spread being above 0.8 on both.
DENSE_STATED = STATED


@pytest.mark.parametrize("key", sorted(STATED))
def test_on_a_grid_twice_as_dense_every_verdict_is_the_stated_one(key):
    """Each method swept again with the midpoints of the four gaps nearest its best: same verdict."""
    scenario, first, second = key
    for target, stated in zip(TARGETS, DENSE_STATED[key]):
        dense = race.stored_verdict(STORED, HELD_OUT, scenario, first, second, target, density=2)
        assert dense.verdict == wanted(first, second, stated), (target, dense)


def test_the_stored_sweeps_and_the_verdicts_agree_with_the_files_races():
    """Swept again from the files (density 1), each verdict is the one of the stored races."""
    page, held_out = race.stored_results(STORED), race.stored_results(HELD_OUT)
    for scenario, first, second in STATED:
        for target in TARGETS:
            again = race.stored_verdict(STORED, HELD_OUT, scenario, first, second, target)
            kept = race.paired_verdict(page, scenario, first, second, target, held_out=held_out)
            assert (again.verdict, again.pooled.wins, again.pooled.losses) == (
                kept.verdict, kept.pooled.wins, kept.pooled.losses)


# A third seed set, tuned on its own seeds (2100-2109) and raced on 50 others
# (2000-2049), for the stated "ahead" verdicts that fresh seeds had put in doubt:
# bounded staleness behind plain asynchronous training with heavy-tailed delays,
# the staleness-aware rate with equal devices, and the backup worker against
# asynchronous training behind the slow device.  Made by
#   benchmarks/sync_vs_async.py --clock virtual --seeds 50 --first-seed 2000
#   --first-tuning-seed 2100 --only "heavy-tailed delays/async"
#   --only "heavy-tailed delays/async, bound 2" --output tests/claims/data/...
# and extended (--extend, its "extensions" record the command) by the two other
# scenarios' pairs.  The registry of stated verdicts keeps each third-set result
# (tools/measure_stated_verdicts.py); a stated "ahead" the third set does not repeat
# is demoted on the pages (experiments.corrected).
THIRD = json.loads((pathlib.Path(__file__).parent / "data"
                    / "sync_vs_async_virtual_third.json").read_text())
# The third set alone, at the lower and the higher target: bounded staleness leans
# behind at the lower (20 wins to 28, ratio 1.05) but cannot decide, and is behind
# at the higher; the staleness-aware rate leans ahead (18 to 12) but cannot decide at
# either; the backup worker is ahead behind the slow device at both.
THIRD_STATED = {("heavy-tailed delays", "async, bound 2", "async"): (None, "second"),
                ("equal devices", "async, staleness-aware", "async"): (None, None),
                ("one device 3x slower", "sync, 1 backup", "async"): ("first", "first")}


def test_the_third_set_is_new_and_swept_by_the_rule():
    settings = THIRD["settings"]
    used = set()
    for f in FILES.values():
        used |= set(f["settings"]["seed_list"]) | set(f["settings"]["tuning_seeds"])
    assert not used & (set(settings["seed_list"]) | set(settings["tuning_seeds"]))
    assert len(settings["seed_list"]) >= experiments.MIN_SEEDS   # enough for one set alone
    for scenario, chosen in settings["best_rates"].items():
        for method, best in chosen.items():
            fair = experiments.sweep(race.stored_sweep_method(THIRD, scenario, method),
                                     settings["tuning_seeds"])
            assert np.isclose(best, fair.best, rtol=1e-5), (scenario, method)


@pytest.mark.parametrize("key", sorted(THIRD_STATED))
def test_the_re_decided_verdicts_hold_on_a_third_seed_set(key):
    scenario, first, second = key
    runs = race.stored_results(THIRD)
    for target, stated in zip(TARGETS, THIRD_STATED[key]):
        verdict = race.paired_verdict(runs, scenario, first, second, target)
        assert verdict.verdict == wanted(first, second, stated), (target, verdict)


@pytest.mark.parametrize("method", ["async, bound 2", "async, staleness-aware"])
def test_a_third_set_race_repeats(devices, method):
    settings = THIRD["settings"]
    kept = next(r for r in THIRD["results"] if r["method"] == method)
    live = race.race(kept["method"], kept["scenario"], seed=kept["seed"],
                     data=race.digits_data(seed=0), devices=devices,
                     budget=settings["budgets"][kept["scenario"]], every=settings["every"],
                     learning_rate=kept["learning_rate"])
    assert np.allclose(live["accuracy"], kept["accuracy"], atol=3 / 450)
