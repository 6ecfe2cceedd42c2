"""Tuning inside the experiment (pargrad.book.tuning): picks, draws, the shift, the replication.

The stored runs of the chapters that use it, and their verdicts, are checked in
tests/claims/test_rare_communication_tuned_conclusions.py and
tests/claims/test_stale_gradients_tuned_conclusions.py.
"""

import numpy as np
import pytest

from pargrad.book import experiments, tuning

SEEDS = np.arange(100)


def test_pick_takes_the_lowest_median_then_the_lowest_mean():
    scores = np.array([[3.0, 3.0, 3.0], [1.0, 2.0, 9.0], [1.0, 2.0, 3.0], [np.nan, 0.1, 0.1]])
    # rows 1 and 2 tie on the median (2); row 2 has the lower mean; a diverged run is inf,
    # so row 3's median is 0.1 and it wins
    assert tuning.pick(scores) == 3
    assert tuning.pick(scores[:3]) == 2
    with pytest.raises(ValueError, match="smaller rates"):
        tuning.pick(np.full((2, 3), np.inf))


def test_pick_ties_medians_within_the_resolution():
    scores = np.array([[10.0, 10.0, 10.0], [9.5, 9.5, 30.0], [12.0, 12.0, 12.0]])
    assert tuning.pick(scores) == 1                        # the lowest median, 9.5
    assert tuning.pick(scores, resolution=1.0) == 0        # 10 ties 9.5; its mean is lower


def test_tuning_draws_cut_the_pool_and_resample_it():
    draws = tuning.tuning_draws(40)
    assert np.array_equal(np.sort(np.concatenate(draws["disjoint"])), np.arange(40))
    assert len(draws["bootstrap"]) == tuning.RESAMPLES
    assert all(len(d) == 40 and d.max() < 40 for d in draws["bootstrap"])
    assert not all(np.array_equal(d, draws["bootstrap"][0]) for d in draws["bootstrap"][1:])


def fake_measured(moved):
    """Two methods on one set: B at 1, A at exp(-0.2) x noise, A's test scores moved by the draw."""
    rng = np.random.default_rng(0)
    noise = np.exp(rng.normal(0, 0.5, len(SEEDS)))
    a = {str(i): (np.exp(-0.2 + moved * i) * noise).tolist() for i in range(3)}
    picks = {"pool": 0, "disjoint": [0, 1, 2, 0], "bootstrap": [0, 1, 2] * 3}
    one = {"settings": [0.1, 0.2, 0.3], "picked": picks, "test": a}
    other = {"settings": [0.1], "picked": {"pool": 0, "disjoint": [0] * 4, "bootstrap": [0] * 9},
             "test": {"0": np.ones(len(SEEDS)).tolist()}}
    return {"A": one, "B": other}


def test_the_tuning_shift_is_the_spread_of_the_draws_medians_in_standard_errors():
    still, sd = tuning.shift_in_errors(fake_measured(0.0), SEEDS, "A", "B")
    assert still == 0 and sd == 0
    moved, sd = tuning.shift_in_errors(fake_measured(0.1), SEEDS, "A", "B")
    error = 1.2533 * 0.5 / 10                      # about, at 100 seeds and spread 0.5
    assert sd == pytest.approx(np.std([0, 0.1, 0.2] * 3, ddof=1), rel=1e-9)
    assert moved == pytest.approx(sd / error, rel=0.25)
    experiment = tuning.experiment(fake_measured(0.1), SEEDS, ("disjoint", 1))
    assert experiment.rates == {"A": 0.2, "B": 0.1}


def test_a_tuned_replication_carries_its_tuning_noise_into_the_power():
    measured = fake_measured(0.1)
    replication = tuning.replication([measured, measured], [SEEDS, SEEDS])
    moved = replication.compare("A", "B")
    calm = replication.compare("A", "B", tuning_sd=0.0)
    assert moved.pooled.tuning_sd == pytest.approx(replication.tuning_sd("A", "B"))
    assert moved.pooled.tuning_sd > 0
    assert moved.pooled.power < calm.pooled.power
    assert isinstance(replication, experiments.Replication)


def test_an_ahead_that_the_draws_do_not_repeat_is_undecided():
    # A leads B on the pool's pick (0) but trails it on the other draws' picks (1, 2)
    measured = fake_measured(0.0)
    measured["A"]["test"]["1"] = measured["A"]["test"]["2"] = np.full(len(SEEDS), 3.0).tolist()
    replication = tuning.replication([measured, measured], [SEEDS, SEEDS])
    plain = experiments.Replication.compare(replication, "A", "B", tuning_sd=0.0)
    assert plain.verdict == "A ahead"
    assert replication.draw_agreement("A", "B") == pytest.approx(3 / 9)
    said = replication.compare("A", "B", tuning_sd=0.0)
    assert said.verdict == experiments.CLOSE                  # median ratio exp(-0.2) within 1.25


def test_measure_runs_the_grid_on_the_pool_and_the_picks_on_the_test_seeds():
    calls = []

    def run(rate, seeds):
        calls.append((rate, len(seeds)))
        return (rate - 0.2) ** 2 + 0.01 * np.asarray(seeds, float) / 1000

    method = experiments.Method("m", run, [0.1, 0.2, 0.3])
    measured = tuning.measure(method, np.arange(50), np.arange(100, 140))
    assert measured["settings"] == [0.1, 0.2, 0.3]
    assert measured["picked"]["pool"] == 1
    assert set(measured["test"]) == {"1"}                   # every draw picks 0.2
    assert calls == [(0.1, 40), (0.2, 40), (0.3, 40), (0.2, 50)]


def test_a_replication_needs_two_sets():
    with pytest.raises(ValueError, match="two seed sets"):
        tuning.replication([fake_measured(0.0)], [SEEDS])
