"""The conclusions of the chapter "Sync vs async in the same time", checked two ways.

The chapter's verdicts rest on two stored virtual-clock race files, each
with every method at the best rate of its own sweep in each scenario: the
page's (seeds 0-29, tuned on 100-109) and a held-out one (seeds 1000-1029,
tuned on its own seeds 1100-1109).  A verdict stands only if both files show
it (:func:`pargrad.book.experiments.replicated`).  Here:

* both files are what the code computes now: a sample of their races and of
  their sweep runs is re-run live, and each stored best rate is the choice
  of the book's fair rule (ties broken by the mean), inside its grid;
* the verdicts the pages state are recomputed from the two files.
"""

import numpy as np
import pytest

import pargrad
from pargrad.book import experiments, race

FILES = {"page": race.stored_sweep("sync_vs_async_virtual"),
         "held out": race.stored_sweep("sync_vs_async_virtual_held_out")}
STORED, HELD_OUT = FILES["page"], FILES["held out"]
SETTINGS = STORED["settings"]
TARGETS = tuple(SETTINGS["targets"])

# (scenario, first, second): the replicated verdict the chapter states at the
# lower and the higher target ("first" or "second" ahead, "negligible", or
# None: not shown).
STATED = {
    ("equal devices", "sequential, no staleness", "async"): ("first", "first"),
    ("equal devices", "sync", "async"): ("first", "first"),
    ("equal devices", "sync", "sync, 1 backup"): (None, None),
    ("equal devices", "async, staleness-aware", "async"): (None, None),
    ("equal devices", "async, bound 2", "async"): (None, None),
    ("one device 3x slower", "async", "sync"): ("first", "first"),
    ("one device 3x slower", "sync, 1 backup", "sync"): ("first", "first"),
    ("one device 3x slower", "sync, 1 backup", "async"): (None, None),
    ("one device 3x slower", "async, staleness-aware", "async"): (None, None),
    ("one device 3x slower", "async, bound 2", "async"): ("second", "second"),
    ("heavy-tailed delays", "async", "sync"): ("first", "first"),
    ("heavy-tailed delays", "sync, 1 backup", "sync"): ("first", "first"),
    ("heavy-tailed delays", "sync, 1 backup", "async"): (None, None),
    ("heavy-tailed delays", "async, staleness-aware", "async"): (None, None),
    ("heavy-tailed delays", "async, bound 2", "async"): ("second", "second"),
}


def test_the_two_files_share_their_settings_but_no_seed():
    page, held_out = STORED["settings"], HELD_OUT["settings"]
    for key in ("budgets", "every", "targets", "grid_step", "batch_size", "methods"):
        assert page[key] == held_out[key], key
    sets = [set(page["seed_list"]), set(page["tuning_seeds"]), set(held_out["seed_list"]),
            set(held_out["tuning_seeds"])]
    assert all(not a & b for i, a in enumerate(sets) for b in sets[i + 1:])
    assert len(page["seed_list"]) == len(held_out["seed_list"]) >= experiments.MIN_SEEDS


@pytest.mark.parametrize("key", sorted(STATED))
def test_the_stated_verdicts_replicate_on_the_held_out_file(key):
    page, held_out = race.stored_results(STORED), race.stored_results(HELD_OUT)
    scenario, first, second = key
    for target, stated in zip(TARGETS, STATED[key]):
        verdict = race.paired_verdict(page, scenario, first, second, target, held_out=held_out)
        wanted = {"first": f"{first} ahead", "second": f"{second} ahead",
                  "negligible": experiments.NEGLIGIBLE, None: experiments.NOT_SHOWN}[stated]
        assert verdict.verdict == wanted, verdict


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
