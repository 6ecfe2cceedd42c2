"""The gap the chapter "Accumulating sequences" states, re-measured on batches it was not
chosen on (and for the replicas).

The page measures, over fresh batches of its sequence task (data seed 1) for its model
(weights seed 1), how far the mean of the micro-batches' token means is from the big
batch's token mean, and states the median, the range and the share of fresh batches below
its first batch's gap (all glued from the stored notebook and read from it here); the
same batches split into two replicas' halves give the median and largest gap it states
"across replicas", zero only when the halves hold as many tokens.  This
test draws 100 *held-out* batches (data seeds 1001-1004, 25 batches each, never used by
the page), measures them with the page's own function
(``pargrad.book.sequences.mean_of_means_gaps``) and asks whether each stated number is
what these batches show.

The tolerance is derived, not chosen.  If the page's fraction ``f`` of its ``m`` batches
lies below a threshold, and the held-out batches come from the same distribution, the
count of ``n`` held-out batches below it follows the beta-binomial predictive
distribution with ``a = f m + 1``, ``b = (1 - f) m + 1`` (the page's own batches as
evidence, a uniform prior): that accounts for the page's sampling error as well as the
held-out one.  Each statement fails if the held-out count falls outside that
distribution's central 99 % (0.5 % in each tail).  A glued value is rounded, so every
threshold is taken at the lenient end of its rounding interval.
"""

import math
import pathlib
import re

import nbformat
import numpy as np
import pytest

import pargrad
from pargrad.book.sequences import mean_of_means_gaps, sequence_data, sequence_model

PAGE = pathlib.Path(__file__).resolve().parents[2] / "chapters" / "08_accumulating_sequences.ipynb"
BATCH, PIECES = 16, 4          # the page's batches: 16 sequences cut into 4 micro-batches
REPLICAS = 2                   # ... or split into two replicas' halves of 8
MODEL_SEED = 1                 # the page's model: the statement is about it
HELD_OUT = (1001, 1002, 1003, 1004)   # data seeds the page never drew
PER_SEED = 25
TAIL = 0.005                   # each tail of the central 99 %


def glued(name):
    """A value the stored page glued (its text, e.g. ``'6%'``)."""
    for cell in nbformat.read(PAGE, as_version=4).cells:
        for output in cell.get("outputs", []):
            if output.get("metadata", {}).get("scrapbook", {}).get("name") == name:
                return output["data"]["application/papermill.record/text/plain"].strip("'\"")
    raise AssertionError(f"{PAGE.name} glues no value named {name!r}; re-run the page.")


def percent(name):
    """A glued percentage and half a unit of its last digit: the rounding interval."""
    text = glued(name)
    assert re.fullmatch(r"\d+(\.\d+)?%", text), f"{name} = {text!r} is not a percentage"
    decimals = len(text[:-1].partition(".")[2])
    return float(text[:-1]) / 100, 0.5 * 10.0 ** -decimals / 100


def beta_binomial_bounds(n, a, b, tail=TAIL):
    """The smallest and largest count of the central ``1 - 2 tail`` of BetaBinomial(n, a, b)."""
    def log_beta(p, q):
        return math.lgamma(p) + math.lgamma(q) - math.lgamma(p + q)
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + log_beta(k + a, n - k + b) - log_beta(a, b)) for k in range(n + 1)]
    cdf = np.cumsum(pmf)
    low = int(np.searchsorted(cdf, tail))                   # P(count < low) <= tail
    high = int(np.searchsorted(cdf, 1 - tail))              # P(count > high) <= tail
    return low, high


def held_out_bounds(share, n):
    """Bounds for the held-out count below a threshold that ``share`` of the page's batches
    are below (``share`` as rounded on the page, taken at both ends of its rounding)."""
    m = int(glued("fresh_batches"))
    value, half = share
    low, _ = beta_binomial_bounds(n, (value - half) * m + 1, (1 - value + half) * m + 1)
    _, high = beta_binomial_bounds(n, (value + half) * m + 1, (1 - value - half) * m + 1)
    return low, high


def held_out_gaps(pieces):
    """The gap of each held-out batch cut into ``pieces`` equal parts."""
    model = sequence_model(seed=MODEL_SEED, dtype="float64")
    measured = [mean_of_means_gaps(model, *sequence_data(BATCH * PER_SEED, seed=seed,
                                                         dtype="float64"), BATCH, pieces)
                for seed in HELD_OUT]
    return np.concatenate(measured)


@pytest.fixture(scope="module")
def gaps():
    return held_out_gaps(PIECES)


@pytest.fixture(scope="module")
def replica_gaps():
    """Each held-out batch split into the page's two replicas' halves."""
    return held_out_gaps(REPLICAS)


def check_median(gaps, name):
    """Half of ``gaps`` lie below the glued median ``name``, within the derived bounds."""
    median, half = percent(name)
    low, high = held_out_bounds((0.5, 0.0), len(gaps))
    below_upper, below_lower = np.sum(gaps < median + half), np.sum(gaps < median - half)
    assert below_upper >= low and below_lower <= high, (
        f"stated median {glued(name)}: {below_lower}-{below_upper} of {len(gaps)} "
        f"held-out batches below it, expected {low}-{high}; held-out median "
        f"{np.median(gaps):.1%}")


def check_largest(gaps, name):
    """No more of ``gaps`` above the glued largest value ``name`` than the derived bound."""
    value, half = percent(name)
    beyond = np.sum(gaps > value + half)
    most = len(gaps) - held_out_bounds((1.0, 0.0), len(gaps))[0]
    assert beyond <= most, (
        f"{beyond} of {len(gaps)} held-out batches beyond the stated {glued(name)} "
        f"(at most {most} expected); held-out largest {gaps.max():.1%}")


def test_the_mean_of_means_is_never_the_token_mean(gaps):
    """'It is never zero': every held-out batch is off by far more than float64 rounding."""
    assert len(gaps) == len(HELD_OUT) * PER_SEED
    assert gaps.min() > 1e6 * pargrad.rounding_tolerance("float64", 1), gaps.min()


def test_the_stated_median_is_the_held_out_median(gaps):
    """Half of the held-out batches lie below the stated median, within the derived bounds."""
    check_median(gaps, "fresh_median")


@pytest.mark.parametrize("end", ["fresh_low", "fresh_high"])
def test_the_stated_range_holds_on_held_out_batches(gaps, end):
    """No more held-out batches beyond an end of the stated range than the derived bound."""
    if end == "fresh_high":
        check_largest(gaps, end)
        return
    value, half = percent(end)
    beyond, (_, most) = np.sum(gaps < value - half), held_out_bounds((0.0, 0.0), len(gaps))
    assert beyond <= most, (
        f"{beyond} of {len(gaps)} held-out batches below the stated {glued(end)} "
        f"(at most {most} expected); held-out smallest {gaps.min():.1%}")


def test_the_first_batch_is_unusually_uneven(gaps):
    """The page's first batch is off by more than the stated share of fresh batches,
    and by more than the held-out median ('an uneven one')."""
    first, half = percent("gap_mean_of_means")
    share = percent("first_batch_share")
    low, high = held_out_bounds(share, len(gaps))
    below = np.sum(gaps < first + half), np.sum(gaps < first - half)
    assert below[0] >= low and below[1] <= high, (
        f"{below[1]}-{below[0]} of {len(gaps)} held-out batches below the first batch's "
        f"{glued('gap_mean_of_means')}, expected {low}-{high} "
        f"(the page: {glued('first_batch_share')})")
    assert np.median(gaps) < first - half


def test_across_replicas_the_stated_median_and_largest_gap_hold(replica_gaps):
    """'Across replicas': the median and the largest gap over fresh batches split into two
    halves, as stated, and the page's one batch ('That is ... on one batch') above the
    held-out median."""
    check_median(replica_gaps, "replica_median")
    check_largest(replica_gaps, "replica_high")
    first, half = percent("gap_replicas")
    assert np.median(replica_gaps) < first - half, (
        f"held-out median {np.median(replica_gaps):.1%}, the page's batch {glued('gap_replicas')}")


def test_across_replicas_the_gap_is_zero_only_when_the_halves_hold_as_many_tokens(
        replica_gaps):
    """'0 only when both halves hold as many tokens', on every held-out batch."""
    tokens = np.concatenate([
        (sequence_data(BATCH * PER_SEED, seed=seed)[0] > 0).reshape(PER_SEED, REPLICAS, -1)
        .sum(axis=2) for seed in HELD_OUT])
    zero = replica_gaps <= pargrad.rounding_tolerance("float64", 1)
    assert np.array_equal(zero, tokens[:, 0] == tokens[:, 1]), (zero, tokens)
    assert zero.any() and not zero.all()
