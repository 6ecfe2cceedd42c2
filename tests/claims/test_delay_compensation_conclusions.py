"""The conclusions of the page "Stale gradients in depth" on the remedies for staleness, re-run
on a third seed set tuned on its own seeds: 50 paired seeds (2000-2049, the rule's
minimum for one set) with 40 tuning seeds (2100-2139), four workers, one ten times slower, as
on the page. Every method at its best by another tuning procedure than the page's (which tunes
on pools of 40 on fixed fine grids and resamples them:
tests/claims/test_stale_gradients_tuned_conclusions.py): rates refined to 2^(1/4) around the
best, DC-ASGD's λ refined to sqrt(2) (parabola_async.resolve_knob). Tuned, neither remedy is ahead of the constant rate nor
the constant ahead of them; DC-ASGD is within 2 % of the constant; DC-ASGD and the
staleness-aware rule: neither ahead. At a fixed base rate the rule is a guard (ahead of that
constant), but against a constant with the same mean step no difference is shown. And the
page's exercise 1: with equal workers DC-ASGD gains nothing either. The guards' counts run on
seeds 1000-1019 (the page's held-out set) and 2000-2019."""

import numpy as np
import pytest

from pargrad.book import experiments, parabola_async, replay
from pargrad.book.parabola import parabola_data
from pargrad.scenario import Scenario, virtual_schedule

UNEVEN = list(parabola_async.UNEVEN)
UPDATES = 400
SEEDS = np.arange(2000, 2050)
TUNING = np.arange(2100, 2100 + parabola_async.REMEDY_TUNING)
NOT_AHEAD = (experiments.NO_DIFFERENCE, experiments.TOO_FEW, experiments.CLOSE,
             experiments.NEGLIGIBLE)


def final_losses(rate, seeds, speeds=UNEVEN, **options):
    return parabola_async.final_losses(4, rate, seeds, UPDATES, speeds=speeds, **options)


def tuned(speeds):
    """The three remedies' methods, each at its best on the third set's own tuning seeds."""
    methods = parabola_async.remedy_methods(speeds)
    methods[2], swept = parabola_async.resolve_knob(methods[2], TUNING, "λ",
                                                    parabola_async.LAMBDA_STEP)
    return experiments.run_experiment(methods, SEEDS, TUNING), swept


@pytest.fixture(scope="module")
def third():
    return tuned(UNEVEN)


def test_the_best_lambda_lies_inside_its_grid(third):
    _, swept = third
    assert swept.best["λ"] < max(parabola_async.LAMBDAS)   # λ = 0 is a limit, not an edge


def test_tuned_neither_the_constant_nor_the_staleness_aware_rule_is_ahead(third):
    result, _ = third
    verdict = result.compare("best constant rate", "rate / (staleness + 1)")
    assert verdict.verdict in NOT_AHEAD, verdict


def test_tuned_dc_asgd_is_within_two_percent_of_the_constant_rate(third):
    result, _ = third
    verdict = result.compare("DC-ASGD", "best constant rate")
    assert verdict.verdict in (experiments.NEGLIGIBLE, experiments.NO_DIFFERENCE), verdict
    assert abs(verdict.effect - 1) <= experiments.FLOOR, verdict


def test_tuned_neither_dc_asgd_nor_the_staleness_aware_rule_is_ahead(third):
    result, _ = third
    verdict = result.compare("DC-ASGD", "rate / (staleness + 1)")
    assert verdict.verdict in NOT_AHEAD, verdict


def above_start(seeds, rate, **options):
    """How many runs end above their starting loss (a diverged run counts)."""
    x, y = parabola_data(dtype="float64")
    start = replay.full_loss(replay.stacked_weights(seeds), x, y)
    return int(np.sum(~(final_losses(rate, seeds, **options) < start)))


@pytest.mark.parametrize("seeds", [np.arange(1000, 1020), np.arange(2000, 2020)],
                         ids=["seeds 1000-1019", "seeds 2000-2019"])
def test_compensation_is_a_guard_narrower_than_the_staleness_aware_rule(seeds):
    assert above_start(seeds, 0.14) > 0
    assert above_start(seeds, 0.14, delay_compensation=0.3) == 0
    assert above_start(seeds, 0.2) == len(seeds)
    assert above_start(seeds, 0.2, delay_compensation=0.3) <= len(seeds) / 10
    assert above_start(seeds, 0.2, delay_compensation=3.0) == len(seeds)
    assert all(above_start(seeds, 0.3, delay_compensation=s) > len(seeds) / 2 for s in (0.1, 0.3, 1.0, 3.0))
    assert above_start(seeds, 0.3, staleness_aware=True) == 0


@pytest.mark.parametrize("base", [0.1, 0.2])
def test_the_rule_is_a_guard_at_its_base_rate_but_not_ahead_of_the_same_mean_step(base):
    by_rule = final_losses(base, SEEDS, staleness_aware=True)
    at_base = experiments.compare(by_rule, final_losses(base, SEEDS), "rule", "constant")
    assert at_base.verdict == "rule ahead", at_base
    same_mean = parabola_async.mean_rate(virtual_schedule(Scenario(UNEVEN), UPDATES), base,
                                         staleness_aware=True)
    matched = experiments.compare(by_rule, final_losses(same_mean, SEEDS), "rule", "same mean")
    assert matched.verdict in (experiments.NO_DIFFERENCE, experiments.NEGLIGIBLE,
                               experiments.CLOSE), matched
    if base == 0.1:   # the page: within 2 % of 1 at base 0.1 (at 0.2, 25-25 here, ratio 1.07)
        assert abs(matched.effect - 1) <= experiments.FLOOR, matched


def test_with_equal_workers_dc_asgd_gains_nothing():
    result, _ = tuned([1.0] * 4)
    verdict = result.compare("DC-ASGD", "best constant rate")
    assert verdict.verdict != "DC-ASGD ahead", verdict
