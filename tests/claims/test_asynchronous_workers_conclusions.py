"""The verdicts of the chapter "Asynchronous training" on its number of workers, re-decided
over 50 seeds (the rule's minimum for one set) with the NumPy replica of AsyncTrainer's
scheduled runs (pargrad.book.parabola_async; the replica is tested against the trainer in
tests/book/test_parabola_async.py)."""

import numpy as np

from pargrad.book import experiments, parabola_async

TUNING = np.arange(100, 110)
RATES = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.4, 0.6]
VERDICT_SEEDS = np.arange(50)


def test_one_worker_ends_below_four_at_the_chapters_small_rate():
    four = parabola_async.final_losses(4, 0.03, VERDICT_SEEDS)
    one = parabola_async.final_losses(1, 0.03, VERDICT_SEEDS)
    assert experiments.compare(four, one, "4", "1").verdict == "1 ahead"


def test_each_at_its_best_rate_more_workers_end_higher_with_smaller_rates():
    methods = [experiments.Method(str(n), lambda r, s, n=n: parabola_async.final_losses(n, r, s),
                                  RATES) for n in (1, 4, 8)]
    result = experiments.run_experiment(methods, VERDICT_SEEDS, TUNING)
    assert result.rates["1"] > result.rates["4"] > result.rates["8"]
    for n in ("4", "8"):
        assert result.compare(n, "1").verdict == "1 ahead"
