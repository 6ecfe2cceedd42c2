"""The conclusions of the page "Stale gradients in depth" on delay compensation (DC-ASGD),
re-run on other seeds at a reduced count: two sets of 20 paired seeds (the rule's minimum),
each with 10 tuning seeds, four workers, one ten times slower, as on the page. DC-ASGD is
tuned over rate and λ together, on a λ grid wide enough that its optimum lies inside (on
fresh tuning seeds the best λ is not one of the small ones). The
staleness-aware rule's verdicts too: a tuned constant rate is ahead of it;
at a fixed base rate it is ahead of that constant (a guard), but against a constant with the
same mean step its lead is not shown. And the page's exercise 1: with equal workers DC-ASGD
gains nothing either."""

import numpy as np
import pytest

from pargrad.book import experiments, parabola_async, replay
from pargrad.book.parabola import parabola_data
from pargrad.scenario import Scenario, virtual_schedule

UNEVEN = [1.0, 1.0, 1.0, 0.1]
RATES = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.4]
LAMBDAS = [0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0]  # 0: plain asynchronous SGD
UPDATES = 400


def final_losses(rate, seeds, speeds=UNEVEN, **options):
    return parabola_async.final_losses(4, rate, seeds, UPDATES, speeds=speeds, **options)


def method(name, **options):
    return experiments.Method(name, lambda rate, seeds: final_losses(rate, seeds, **options),
                              RATES + [0.6])


@pytest.fixture(scope="module", params=[(range(1000, 1020), range(1100, 1110)),
                                        (range(2000, 2020), range(2100, 2110))],
                ids=["seeds 1000-1019", "seeds 2000-2019"])
def outcome(request):
    seeds, tuning = (np.arange(r.start, r.stop) for r in request.param)
    dc = experiments.Method("DC-ASGD", lambda setting, seeds: final_losses(
        setting["rate"], seeds, delay_compensation=setting["λ"]),
        grid={"rate": RATES, "λ": LAMBDAS}, limits={"λ": (0.0,)})  # raises if the optimum is at an edge
    swept = experiments.sweep(dc, tuning)
    tuned = experiments.run_experiment(
        [method("best constant rate"), method("rule", staleness_aware=True)], seeds, tuning)
    compensated = final_losses(swept.best["rate"], seeds, delay_compensation=swept.best["λ"])
    return dict(seeds=seeds, strength=swept.best["λ"], tuned=tuned, compensated=compensated)


def test_the_best_lambda_lies_below_the_top_of_the_grid(outcome):
    assert outcome["strength"] < max(LAMBDAS)   # λ = 0 (no compensation) is a limit, not an edge


def test_tuned_dc_asgd_is_not_ahead_of_the_best_constant_rate(outcome):
    verdict = experiments.compare(outcome["compensated"],
                                  outcome["tuned"].scores["best constant rate"], "DC-ASGD", "constant")
    assert verdict.verdict != "DC-ASGD ahead", verdict


def test_tuned_dc_asgd_ends_below_the_staleness_aware_rule_on_most_seeds(outcome):
    # The page shows "DC-ASGD ahead" on 30 + 30 seeds; 20 seeds with 10 tuning seeds do not
    # always reach the sign test's level (13-7 on seeds 1000-1019), but the direction holds.
    verdict = experiments.compare(outcome["compensated"], outcome["tuned"].scores["rule"],
                                  "DC-ASGD", "rule")
    assert verdict.verdict != "rule ahead" and verdict.wins > verdict.losses, verdict
    assert verdict.effect < 1, verdict
    if outcome["seeds"][0] == 2000:   # the third set: the page's verdict itself (15-5 here)
        assert verdict.verdict == "DC-ASGD ahead", verdict


def above_start(seeds, rate, **options):
    """How many runs end above their starting loss (a diverged run counts)."""
    x, y = parabola_data(dtype="float64")
    start = replay.full_loss(replay.stacked_weights(seeds), x, y)
    return int(np.sum(~(final_losses(rate, seeds, **options) < start)))


def test_compensation_is_a_guard_narrower_than_the_staleness_aware_rule(outcome):
    seeds = outcome["seeds"]
    assert above_start(seeds, 0.14) > 0
    assert above_start(seeds, 0.14, delay_compensation=0.3) == 0
    assert above_start(seeds, 0.2) == len(seeds)
    assert above_start(seeds, 0.2, delay_compensation=0.3) <= len(seeds) / 10
    assert above_start(seeds, 0.2, delay_compensation=3.0) == len(seeds)
    assert all(above_start(seeds, 0.3, delay_compensation=s) > len(seeds) / 2 for s in (0.1, 0.3, 1.0, 3.0))
    assert above_start(seeds, 0.3, staleness_aware=True) == 0


def test_a_tuned_constant_rate_is_ahead_of_the_staleness_aware_rule(outcome):
    verdict = outcome["tuned"].compare("best constant rate", "rule")
    assert verdict.verdict != "rule ahead" and verdict.wins > verdict.losses, verdict
    assert verdict.effect < 1, verdict
    if outcome["seeds"][0] == 2000:   # the third set; 1000-1019, part of the page's held-out
        assert verdict.verdict == "best constant rate ahead", verdict   # set, gives 13-7


@pytest.mark.parametrize("base", [0.1, 0.2])
def test_the_rule_is_a_guard_at_its_base_rate_but_not_ahead_of_the_same_mean_step(outcome, base):
    seeds = outcome["seeds"]
    by_rule = final_losses(base, seeds, staleness_aware=True)
    at_base = experiments.compare(by_rule, final_losses(base, seeds), "rule", "constant")
    assert at_base.verdict == "rule ahead", at_base
    same_mean = parabola_async.mean_rate(virtual_schedule(Scenario(UNEVEN), UPDATES), base,
                                         staleness_aware=True)
    matched = experiments.compare(by_rule, final_losses(same_mean, seeds), "rule", "same mean")
    assert matched.verdict in (experiments.NO_DIFFERENCE, experiments.NEGLIGIBLE), matched


def test_with_equal_workers_dc_asgd_gains_nothing():
    seeds, tuning = np.arange(2000, 2020), np.arange(2100, 2110)
    equal = [1.0] * 4
    dc = experiments.Method("DC-ASGD", lambda setting, seeds: final_losses(
        setting["rate"], seeds, equal, delay_compensation=setting["λ"]),
        grid={"rate": RATES, "λ": LAMBDAS}, limits={"λ": (0.0,)})
    plain = experiments.Method("constant", lambda rate, seeds: final_losses(rate, seeds, equal),
                               RATES + [0.6])
    result = experiments.run_experiment([dc, plain], seeds, tuning)
    verdict = result.compare("DC-ASGD", "constant")
    assert verdict.verdict != "DC-ASGD ahead", verdict
