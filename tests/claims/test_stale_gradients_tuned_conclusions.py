"""Tuning inside the experiment of "Asynchronous training" (its workers) and "Stale gradients in
depth" (its remedies): the stored runs re-run in part, every draw re-picked, each stated
verdict against its own tuning, on a third seed set, and on grids twice as dense.

tools/measure_tuned_stale_gradients.py tunes every method on a pool of 40 tuning seeds a seed
set (parabola_async.TUNED_SETS) on fine grids and stores each draw's pick (the pool, its four
disjoint draws of 10, 20 bootstrap resamples) with the 100 test seeds' scores there; the page's
and held-out sets again on grids twice as dense (the density check).  This file:

* re-runs a sample of those runs afresh (three pool and three test seeds of two settings a
  method) and re-picks every draw from the stored scores;
* checks each stated verdict: an "ahead" holds on tuning.MIN_AGREEMENT of the resampled
  draws, a "no difference shown" has power at a fifth of at least experiments.MIN_POWER with
  the tuning's noise included, and no pool's pick lies on its grid's edge;
* re-decides each on the third set alone: a stated "ahead" must be significant there in its
  direction, and where the page says neither is ahead, the third set must not put one ahead;
* re-decides each on the denser grids: the same verdict, or, for a page's "neither ahead",
  no "ahead" either.

Float64 NumPy replays: no ``claim`` mark.
"""

import numpy as np
import pytest

from pargrad.book import experiments, parabola_async, tuning

STORED = parabola_async.stored_tuned()
# what the pages state, pair by pair (None: neither ahead)
STATED = {
    "workers": {
        **{(f"{n} async workers", "1 worker"): "1 worker ahead" for n in parabola_async.WORKERS},
        **{(f"{n} shards in turn", "1 worker"): "1 worker ahead"
           for n in parabola_async.WORKERS},
        **{(f"{n} async workers", f"{n} shards in turn"): f"{n} shards in turn ahead"
           for n in parabola_async.WORKERS}},
    "remedies": {("best constant rate", "rate / (staleness + 1)"): None,
                 ("DC-ASGD", "best constant rate"): None,
                 ("DC-ASGD", "rate / (staleness + 1)"): None},
}
PAIRS = [(group, first, second) for group, pairs in STATED.items() for first, second in pairs]
NOT_AHEAD = (experiments.NO_DIFFERENCE, experiments.CLOSE, experiments.TOO_FEW,
             experiments.NEGLIGIBLE)


def ids(key):
    return " | ".join(key)


@pytest.mark.parametrize("seed_set", list(parabola_async.TUNED_SETS))
@pytest.mark.parametrize("group", list(STATED))
def test_a_sample_of_the_stored_tuning_runs_repeats(seed_set, group):
    test_seeds, pool = parabola_async.TUNED_SETS[seed_set]
    for method in parabola_async.tuned_methods(group):
        kept = STORED["sets"][seed_set][group][method.name]
        for index in {kept["picked"]["pool"], kept["picked"]["disjoint"][0]}:
            setting = kept["settings"][index]
            assert np.allclose(method.run(setting, pool[:3]), kept["scores"][index][:3],
                               rtol=1e-6, atol=0), (method.name, setting)  # stored to 7 digits
            assert np.allclose(method.run(setting, test_seeds[:3]),
                               kept["test"][str(index)][:3], rtol=1e-6, atol=0)


def test_every_draw_picks_what_the_stored_scores_pick_on_the_grids_stored():
    draws = tuning.tuning_draws(len(parabola_async.TUNED_SETS["page"][1]))
    for density, sets in ((1, STORED["sets"]), (2, STORED["dense"])):
        for seed_set, groups in sets.items():
            for group, methods in groups.items():
                grid = {m.name: m.settings() for m in parabola_async.tuned_methods(group, density)}
                assert set(methods) == set(grid), (seed_set, group)
                for name, kept in methods.items():
                    assert kept["settings"] == grid[name], (density, seed_set, name)
                    scores = np.where(np.asarray(kept["scores"]) < 0, np.inf, kept["scores"])
                    assert tuning.pick(scores) == kept["picked"]["pool"]
                    for kind in ("disjoint", "bootstrap"):
                        assert [tuning.pick(scores[:, d]) for d in draws[kind]] == \
                            kept["picked"][kind], (density, seed_set, name, kind)


def test_no_pools_pick_lies_on_its_grids_edge():
    for density, sets in ((1, STORED["sets"]), (2, STORED["dense"])):
        for seed_set, groups in sets.items():
            for group, methods in groups.items():
                for method in parabola_async.tuned_methods(group, density):
                    best = methods[method.name]["settings"][methods[method.name]["picked"]["pool"]]
                    for knob, values in method.axes.items():
                        value = best[knob] if isinstance(best, dict) else best
                        limits = (method.limits or {}).get(knob, ())
                        assert values[0] < value < values[-1] or value in limits, \
                            (density, seed_set, method.name, knob, value)


@pytest.fixture(scope="module")
def tuned():
    return {group: parabola_async.tuned_replication(group, STORED) for group in STATED}


@pytest.mark.parametrize("key", PAIRS, ids=ids)
def test_each_stated_verdict_survives_its_own_tuning(tuned, key):
    group, first, second = key
    verdict = tuned[group].compare(first, second)
    stated = STATED[group][first, second]
    pooled = verdict.pooled
    if stated is None:
        assert pooled.verdict in NOT_AHEAD, pooled
    else:
        assert pooled.verdict == stated, pooled
        assert tuned[group].draw_agreement(first, second) >= tuning.MIN_AGREEMENT
    if pooled.verdict == experiments.NO_DIFFERENCE:
        assert pooled.power >= experiments.MIN_POWER, pooled    # the tuning's noise included
        assert pooled.tuning_sd > 0


@pytest.mark.parametrize("key", PAIRS, ids=ids)
def test_each_stated_verdict_holds_on_a_third_seed_set(key):
    group, first, second = key
    third = tuning.experiment(STORED["sets"]["third"][group],
                              parabola_async.TUNED_SETS["third"][0])
    verdict = third.compare(first, second, min_seeds=1)
    stated = STATED[group][first, second]
    significant = verdict.p_value < experiments.ALPHA
    if stated is None:
        assert not (significant and abs(verdict.effect - 1) > experiments.FLOOR), verdict
    else:
        direction = 1 if stated == f"{first} ahead" else -1
        assert verdict.lean == direction and significant, verdict


@pytest.mark.parametrize("key", PAIRS, ids=ids)
def test_each_stated_verdict_holds_on_grids_twice_as_dense(key):
    group, first, second = key
    dense = parabola_async.tuned_replication(group, STORED, density=2).compare(first, second)
    stated = STATED[group][first, second]
    if stated is None:
        assert dense.verdict in NOT_AHEAD, dense
    else:
        assert dense.verdict == stated, dense


@pytest.mark.parametrize("group", list(STATED))
def test_a_method_measured_afresh_is_what_is_stored(group):
    """The cheapest method of each group, measured whole on the page's set: the stored dict."""
    name = "2 async workers" if group == "workers" else "best constant rate"
    fresh = parabola_async.measure_tuned("page", group, name)
    kept = STORED["sets"]["page"][group][name]
    assert fresh["picked"] == kept["picked"] and fresh["settings"] == kept["settings"]
    for index, scores in fresh["test"].items():
        assert np.allclose(scores, kept["test"][index], rtol=1e-6, atol=0)
