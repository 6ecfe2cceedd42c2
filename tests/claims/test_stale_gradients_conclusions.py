"""The delay bound's verdicts of the page "Stale gradients in depth", re-run on seeds the page
was not chosen on (2000-2019; 2000-2049 where a verdict needs the rule's 50 seeds): the y = x²
network's largest stable rate shrinks by about the bound's factor and on every seed, more
loosely from Keras's default initial weights (the caveat on the bound: up to 12 % on the page's
seeds, 14 % on the page's fresh set); and momentum 1 - 1/n does not explain the runs at rate
0.1."""

import numpy as np
import pytest

from pargrad.book import delay, experiments, parabola_async, replay
from pargrad.book.parabola import parabola_data

SEEDS = np.arange(2000, 2020)
VERDICT_SEEDS = np.arange(2000, 2050)   # one set: the rule needs 50 seeds


def deviations(weights):
    """Per n = 2, 4, 8: |median of (largest stable rate / one worker's) / the bound's ratio - 1|."""
    x, y = parabola_data(dtype="float64")
    one = parabola_async.largest_stable_rate(weights, x, y, 1)
    result = []
    for n in (2, 4, 8):
        ratios = parabola_async.largest_stable_rate(weights, x, y, n) / one
        assert np.all(ratios < 1), (n, ratios)   # it shrinks on every seed
        predicted = delay.stable_rate_bound(n - 1) / delay.stable_rate_bound(0)
        result.append(abs(np.median(ratios) / predicted - 1))
    return result


@pytest.fixture(scope="module")
def book_deviations():
    return deviations(replay.stacked_weights(SEEDS))


def test_the_largest_stable_rate_shrinks_as_the_delay_bound_says(book_deviations):
    assert max(book_deviations) < 0.10, book_deviations   # the page: within 6-8 %


def test_the_agreement_depends_on_the_initial_weights(book_deviations):
    glorot = deviations(replay.stacked_glorot_weights(SEEDS))
    assert max(glorot) > max(book_deviations), (glorot, book_deviations)
    assert max(glorot) < 0.20, glorot


@pytest.mark.parametrize("n", [4, 8])
def test_momentum_does_not_explain_the_runs_at_the_large_rate(n):
    control = parabola_async.final_losses(n, 0.1 / n, VERDICT_SEEDS, momentum=1 - 1 / n,
                                          sequential=True)
    verdict = experiments.compare(control, parabola_async.final_losses(n, 0.1, VERDICT_SEEDS),
                                  "control", "async")
    assert verdict.verdict == "control ahead" and verdict.losses == 0, verdict
    one = parabola_async.final_losses(1, 0.1, VERDICT_SEEDS)
    # close to one worker: the page's 30 seeds all within a factor 2; here 49 of 50 at 8 workers
    assert np.mean(control < 2 * one) >= 0.95 and np.median(control) < 1.5 * np.median(one)


def test_at_fixed_rates_stale_workers_end_below_one_worker_on_few_seeds_if_any():
    # The page counts its own seeds: 4 workers lower at rate 0.03 on 6 of 30, otherwise on none.
    # Here 8 workers at 0.03 may end lower on a few: the verdict holds, "none" is the page's count.
    at = {rate: {n: parabola_async.final_losses(n, rate, VERDICT_SEEDS) for n in (1, 4, 8)}
          for rate in (0.03, 0.1)}
    for rate, n in ((0.03, 4), (0.03, 8), (0.1, 4), (0.1, 8)):
        verdict = experiments.compare(at[rate][n], at[rate][1], f"{n} workers", "1 worker")
        assert verdict.verdict == "1 worker ahead", (rate, verdict)
        assert verdict.wins < len(VERDICT_SEEDS) / 3, (rate, verdict)
        assert rate == 0.03 or verdict.wins == 0, (rate, verdict)
