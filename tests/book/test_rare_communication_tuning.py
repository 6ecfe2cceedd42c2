"""Tuning inside the experiment (pargrad.book.rare_communication): picks, draws, the shift.

The stored runs themselves and the chapter's verdicts on them are checked in
tests/claims/test_rare_communication_tuned_conclusions.py.
"""

import numpy as np
import pytest

from pargrad.book import experiments
from pargrad.book import rare_communication as rc


def test_pick_takes_the_lowest_median_then_the_lowest_mean():
    scores = np.array([[3.0, 3.0, 3.0], [1.0, 2.0, 9.0], [1.0, 2.0, 3.0], [np.nan, 0.1, 0.1]])
    # rows 1 and 2 tie on the median (2); row 2 has the lower mean; a diverged run is inf,
    # so row 3's median is 0.1 and it wins
    assert rc.pick(scores) == 3
    assert rc.pick(scores[:3]) == 2
    with pytest.raises(ValueError, match="smaller rates"):
        rc.pick(np.full((2, 3), np.inf))


def test_tuning_draws_cut_the_pool_and_resample_it():
    draws = rc.tuning_draws(40)
    assert np.array_equal(np.sort(np.concatenate(draws["disjoint"])), np.arange(40))
    assert len(draws["bootstrap"]) == rc.RESAMPLES
    assert all(len(d) == 40 and d.max() < 40 for d in draws["bootstrap"])
    assert not all(np.array_equal(d, draws["bootstrap"][0]) for d in draws["bootstrap"][1:])


def fake_stored(moved):
    """Two methods on one set: B at 1, A at exp(-0.2) x noise, A's test scores moved by the draw."""
    rng = np.random.default_rng(0)
    noise = np.exp(rng.normal(0, 0.5, 100))
    a = {str(i): (np.exp(-0.2 + moved * i) * noise).tolist() for i in range(3)}
    picks = {"pool": 0, "disjoint": [0, 1, 2, 0], "bootstrap": [0, 1, 2] * 3}
    one = {"settings": [0.1, 0.2, 0.3], "picked": picks, "test": a}
    other = {"settings": [0.1], "picked": {"pool": 0, "disjoint": [0] * 4, "bootstrap": [0] * 9},
             "test": {"0": np.ones(100).tolist()}}
    return {"sets": {"page": {"dial": {"A": one, "B": other}}}}


def test_the_tuning_shift_is_the_spread_of_the_draws_medians_in_standard_errors():
    still, sd = rc.tuning_shift_in_errors("dial", "A", "B", stored=fake_stored(0.0))
    assert still == 0 and sd == 0
    moved, sd = rc.tuning_shift_in_errors("dial", "A", "B", stored=fake_stored(0.1))
    error = 1.2533 * 0.5 / 10                      # about, at 100 seeds and spread 0.5
    assert sd == pytest.approx(np.std([0, 0.1, 0.2] * 3, ddof=1), rel=1e-9)
    assert moved == pytest.approx(sd / error, rel=0.25)
    experiment = rc.tuned_experiment("dial", "page", ("disjoint", 1), fake_stored(0.1))
    assert experiment.rates == {"A": 0.2, "B": 0.1}


def test_a_tuned_replication_carries_its_tuning_noise_into_the_power():
    stored = fake_stored(0.1)
    stored["sets"]["held_out"] = stored["sets"]["page"]
    replication = rc.tuned_replication("dial", stored)
    moved = replication.compare("A", "B")
    calm = replication.compare("A", "B", tuning_sd=0.0)
    assert moved.pooled.tuning_sd == pytest.approx(replication.tuning_sd("A", "B"))
    assert moved.pooled.tuning_sd > 0
    assert moved.pooled.power < calm.pooled.power
    assert isinstance(replication, experiments.Replication)


def test_bad_input_to_the_tuned_runs_says_what_to_pass():
    with pytest.raises(ValueError, match="seed_set must be one of"):
        rc.measure_tuned("fresh", "dial", rc.SYNC)
    with pytest.raises(ValueError, match="name must be one of"):
        rc.measure_tuned("page", "dial", "Adam")
