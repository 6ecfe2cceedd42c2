"""The density check for the verdicts of "Asynchronous training" and "Stale
gradients in depth" that rest on sweeps: each is re-run on the page's two seed sets with every
method swept again on a grid twice as dense around its optimum (density=2: the rate, and
DC-ASGD's λ as well), and must not change. The fixed-rate verdicts of the pages sweep nothing."""

import numpy as np
import pytest

from pargrad.book import experiments, parabola_async

SEEDS, TUNING = np.arange(30), np.arange(100, 120)
HELD_OUT, HELD_OUT_TUNING = np.arange(1000, 1030), np.arange(1100, 1120)
REMEDY_TUNING = np.arange(100, 100 + parabola_async.REMEDY_TUNING)
HELD_OUT_REMEDY_TUNING = np.arange(1100, 1100 + parabola_async.REMEDY_TUNING)
RATES = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.4]

# What the pages print (density 1), pair by pair.
TABLE = {(f"{n} async workers", "1 worker"): "1 worker ahead" for n in (2, 4, 8)}
TABLE.update({(f"{n} shards in turn", "1 worker"): "1 worker ahead" for n in (2, 4, 8)})
TABLE.update({(f"{n} async workers", f"{n} shards in turn"): f"{n} shards in turn ahead"
              for n in (2, 4, 8)})
REMEDIES = {("best constant rate", "rate / (staleness + 1)"): experiments.NO_DIFFERENCE,
            ("DC-ASGD", "best constant rate"): experiments.NEGLIGIBLE,
            ("DC-ASGD", "rate / (staleness + 1)"): experiments.NO_DIFFERENCE}


def table_methods():
    def method(name, n, **options):
        return experiments.Method(name, parabola_async.remembered(
            lambda rate, seeds: parabola_async.final_losses(n, rate, seeds, 400, **options)),
            RATES)
    methods = [method("1 worker", 1)]
    for n in (2, 4, 8):
        methods += [method(f"{n} shards in turn", n, sequential=True),
                    method(f"{n} async workers", n)]
    return methods


@pytest.fixture(scope="module")
def table():
    return experiments.replicate(table_methods(), SEEDS, TUNING, HELD_OUT, HELD_OUT_TUNING,
                                 density=2)


@pytest.fixture(scope="module")
def remedies():
    return parabola_async.replicate_resolved(
        parabola_async.remedy_methods(), SEEDS, REMEDY_TUNING, HELD_OUT, HELD_OUT_REMEDY_TUNING,
        parabola_async.REMEDY_KNOBS, density=2, step=parabola_async.LAMBDA_STEP)


@pytest.mark.parametrize("pair", list(TABLE), ids=" vs ".join)
def test_the_asynchronous_chapters_table_keeps_its_verdicts_on_a_denser_grid(table, pair):
    verdict = table.compare(*pair)
    assert verdict.verdict == TABLE[pair], verdict


@pytest.mark.parametrize("pair", list(REMEDIES), ids=" vs ".join)
def test_the_remedies_keep_their_verdicts_on_a_denser_grid(remedies, pair):
    verdict = remedies.compare(*pair)
    assert verdict.verdict == REMEDIES[pair], verdict
