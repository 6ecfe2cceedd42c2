"""The experiment harness: sweeps with the optimum inside the grid, per-seed runs, the paired rule."""

import math

import numpy as np
import pytest

from pargrad.book import experiments


def quadratic_method(name, best, rates=(0.1, 0.2, 0.4, 0.8, 1.6), noise=0.01):
    """A method whose score is (log rate - log best)^2 plus seeded noise: best at `best`."""

    def run(rate, seeds):
        noise_of = np.array([np.random.default_rng(int(s)).normal(0, noise) for s in seeds])
        return (math.log(rate) - math.log(best)) ** 2 + noise_of

    return experiments.Method(name, run, rates)


def test_sweep_picks_the_lowest_median_inside_the_grid():
    result = experiments.sweep(quadratic_method("q", best=0.4), np.arange(10))
    assert result.best == 0.4
    assert result.scores.shape == (5, 10)
    assert np.argmin(result.medians) == 2


@pytest.mark.parametrize("best, side", [(0.1, "smaller"), (1.6, "larger")])
def test_sweep_refuses_an_optimum_at_the_edge(best, side):
    with pytest.raises(ValueError, match=f"edge of the grid.*add {side} rates"):
        experiments.sweep(quadratic_method("q", best=best), np.arange(10))


def test_a_diverged_run_counts_as_the_worst_score():
    def run(rate, seeds):
        return np.where(np.full(len(seeds), rate > 0.5), np.nan, abs(rate - 0.3))

    method = experiments.Method("d", run, [0.1, 0.3, 0.45, 0.8])
    result = experiments.sweep(method, np.arange(5))
    assert result.best == 0.3 and np.isinf(result.medians[-1])


def test_run_experiment_tunes_on_other_seeds_than_it_reports():
    tuned_on = []

    def run(rate, seeds):
        if rate != 0.4:
            tuned_on.extend(seeds)
        return (math.log(rate) - math.log(0.4)) ** 2 + 0 * np.asarray(seeds, float)

    method = experiments.Method("m", run, (0.1, 0.2, 0.4, 0.8))
    fixed = experiments.Method("control", lambda rate, seeds: np.ones(len(seeds)))
    result = experiments.run_experiment([method, fixed], np.arange(20))
    assert result.rates == {"m": 0.4, "control": None}
    assert set(tuned_on).isdisjoint(range(20))
    assert result.scores["m"].shape == (20,) and "control" not in result.sweeps


def test_sign_test_is_the_exact_binomial():
    a, b = np.zeros(20), np.ones(20)
    a[:5] = 2.0  # first better in 15, worse in 5
    wins, losses, ties, p = experiments.sign_test(a, b)
    assert (wins, losses, ties) == (15, 5, 0)
    expected = 2 * sum(math.comb(20, k) for k in range(6)) / 2**20
    assert p == pytest.approx(expected, rel=1e-12)
    assert experiments.sign_test(b, a)[3] == pytest.approx(p)


def test_ties_and_two_infinities_are_dropped():
    a = np.array([1.0, np.inf, np.nan, 2.0])
    b = np.array([1.0, np.inf, np.inf, 3.0])
    assert experiments.sign_test(a, b) == (1, 0, 3, 1.0)


def test_compare_applies_the_rule():
    rng = np.random.default_rng(0)
    better = rng.uniform(0, 1, 25)
    clear = experiments.compare(better, better + 0.1, "A", "B")
    assert clear.verdict == "A ahead" and clear.wins == 25 and clear.p_value < 1e-6
    assert experiments.compare(better + 0.1, better, "A", "B").verdict == "B ahead"
    coin = np.where(np.arange(25) % 2 == 0, 1.0, -1.0)
    assert experiments.compare(coin, np.zeros(25)).verdict == "no difference shown"
    assert "sign test p" in str(clear)


def test_the_rule_needs_enough_seeds():
    with pytest.raises(ValueError, match="at least 20 paired seeds"):
        experiments.compare(np.zeros(10), np.ones(10))
    assert experiments.compare(np.zeros(10), np.ones(10), min_seeds=10).verdict == "A ahead"


def test_a_split_just_above_the_level_is_no_difference():
    # 14 of 20: p = 0.115 > 0.05, a tie by the rule; 15 of 20: p = 0.041, a verdict
    a = np.zeros(20)
    b = np.where(np.arange(20) < 14, 1.0, -1.0)
    assert experiments.compare(a, b).verdict == "no difference shown"
    b = np.where(np.arange(20) < 15, 1.0, -1.0)
    assert experiments.compare(a, b).verdict == "A ahead"


def test_bad_input_says_what_to_pass():
    with pytest.raises(ValueError, match="at least 3 increasing"):
        experiments.Method("m", lambda r, s: s, [0.2, 0.1, 0.3])
    with pytest.raises(TypeError, match="run must be a function"):
        experiments.Method("m", 3, [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="one score a seed"):
        experiments.sweep(experiments.Method("m", lambda r, s: [1.0], [0.1, 0.2, 0.3]), [0, 1])
    with pytest.raises(ValueError, match="must differ"):
        experiments.sweep(quadratic_method("q", 0.4), [1, 1])
    with pytest.raises(ValueError, match="names must differ"):
        experiments.run_experiment([quadratic_method("q", 0.4)] * 2, np.arange(20))
    with pytest.raises(ValueError, match="no rates to sweep"):
        experiments.sweep(experiments.Method("c", lambda r, s: np.ones(len(s))), [0, 1])


def test_seeds_alpha_and_min_seeds_are_checked_in_the_librarys_voice():
    with pytest.raises(TypeError, match="each of seeds must be a whole number >= 0 .*pass 0"):
        experiments.sweep(quadratic_method("q", 0.4), [0.0, 1.0])
    with pytest.raises(ValueError, match="each of seeds must be a whole number >= 0, got -1."):
        experiments.sweep(quadratic_method("q", 0.4), [-1, 1])
    with pytest.raises(ValueError, match="alpha must be a share strictly between 0 and 1"):
        experiments.compare(np.zeros(20), np.ones(20), alpha=1.5)
    with pytest.raises(ValueError, match="min_seeds must be a whole number >= 1"):
        experiments.compare(np.zeros(20), np.ones(20), min_seeds=0)
