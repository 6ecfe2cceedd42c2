"""The conclusions of the chapter "Sync vs async in the same time" at a reduced seed count.

The chapter's verdicts rest on 20 seeds of stored virtual-clock races; here
the decisive ones are re-run live on 6 seeds with the rule's sign test (6 of
6 needed: p = 2/64), so that a change to a trainer or to the race that flips
one fails.  Each method runs at the best rate of its stored sweep.
"""

import numpy as np
import pytest

import pargrad
from pargrad.book import race

SEEDS = range(6)
TARGET = 0.90
BUDGET = 80.0


@pytest.fixture(scope="module")
def runs():
    devices = pargrad.logical_devices(4)
    data = race.digits_data(seed=0)
    rates = race.stored_sweep("sync_vs_async_virtual")["settings"]["best_rates"]
    cache = []

    def run(scenario, *methods):
        for method in methods:
            if not any(r["scenario"] == scenario and r["method"] == method for r in cache):
                cache.extend(race.race(method, scenario, seed=seed, budget=BUDGET, every=5.0,
                                       data=data, devices=devices,
                                       learning_rate=rates[method]) for seed in SEEDS)
        return cache

    return run


def verdict(results, scenario, first, second):
    return race.paired_verdict(results, scenario, first, second, TARGET, min_seeds=6).verdict


def test_with_a_slow_device_async_and_a_backup_worker_reach_the_target_before_sync(runs):
    results = runs("one device 3x slower", "sync", "sync, 1 backup", "async")
    assert verdict(results, "one device 3x slower", "async", "sync") == "async ahead"
    assert verdict(results, "one device 3x slower", "sync, 1 backup", "sync") == \
        "sync, 1 backup ahead"


def test_the_stored_virtual_sweep_repeats(runs):
    """The stored races the chapter's verdicts rest on are what the code computes now."""
    stored = race.stored_sweep("sync_vs_async_virtual")
    results = runs("one device 3x slower", "sync", "sync, 1 backup", "async")
    for live in results:
        kept = next(r for r in stored["results"] if (r["scenario"], r["method"], r["seed"])
                    == (live["scenario"], live["method"], live["seed"]))
        assert np.allclose(live["accuracy"], kept["accuracy"], atol=3 / 450)
