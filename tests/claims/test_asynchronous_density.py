"""The density check for the verdicts of "Asynchronous training" and "Stale
gradients in depth" that rest on sweeps: each is re-run on the page's two seed sets with every
method swept again on a grid twice as dense around its optimum (density=2: the rate, and
DC-ASGD's λ as well), and must not change. The fixed-rate verdicts of the pages sweep nothing.

The sweeps are float64 NumPy replays (a minute of one core): their per-seed losses are stored
in data/asynchronous_density.json, written by ``python tools/store_density_sweeps.py`` (and by
``make outputs``). The verdicts are decided again here from the stored losses, every setting the
sweeps ask for read from the file (a setting missing from it fails, saying to store them again);
a sample of stored settings, of every method, is replayed afresh and must match."""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from pargrad.book import experiments, parabola_async

SEEDS, TUNING = np.arange(30), np.arange(100, 120)
HELD_OUT, HELD_OUT_TUNING = np.arange(1000, 1030), np.arange(1100, 1120)
REMEDY_TUNING = np.arange(100, 100 + parabola_async.REMEDY_TUNING)
HELD_OUT_REMEDY_TUNING = np.arange(1100, 1100 + parabola_async.REMEDY_TUNING)
RATES = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.4]
STORED = pathlib.Path(__file__).parent / "data" / "asynchronous_density.json"
STORE_AGAIN = "python tools/store_density_sweeps.py"

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


def key(setting, seeds):
    """A run's key in the stored file: its setting (a rate, or DC-ASGD's rate and λ) and seeds."""
    seeds = [int(seed) for seed in seeds]
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        seeds = f"{seeds[0]}..{seeds[-1]}"
    if isinstance(setting, dict):
        setting = {knob: float(value) for knob, value in sorted(setting.items())}
    return json.dumps([setting, seeds], ensure_ascii=False)


def with_runs(methods, runs):
    """``methods`` whose runs are ``runs(name, run)(setting, seeds)``."""
    return [dataclasses.replace(method, run=runs(method.name, method.run)) for method in methods]


def replications(runs):
    """The density check's two replications (the table's, the remedies'), methods run by ``runs``."""
    table = experiments.replicate(with_runs(table_methods(), runs), SEEDS, TUNING, HELD_OUT,
                                  HELD_OUT_TUNING, density=2)
    remedies = parabola_async.replicate_resolved(
        with_runs(parabola_async.remedy_methods(), runs), SEEDS, REMEDY_TUNING, HELD_OUT,
        HELD_OUT_REMEDY_TUNING, parabola_async.REMEDY_KNOBS, density=2,
        step=parabola_async.LAMBDA_STEP)
    return table, remedies


def record():
    """Run both replications afresh: ``{method name: {key: per-seed losses}}``, every run asked for."""
    recorded = {}

    def recording(name, run):
        def run_and_record(setting, seeds):
            losses = np.asarray(run(setting, seeds), float)
            recorded.setdefault(name, {})[key(setting, seeds)] = losses.tolist()
            return losses
        return run_and_record

    replications(recording)
    return recorded


def stored():
    if not STORED.exists():
        pytest.fail(f"{STORED} is missing: write it with `{STORE_AGAIN}`.")
    return json.loads(STORED.read_text())["runs"]


def from_the_file(runs):
    def reading(name, run):
        def read(setting, seeds):
            try:
                return np.asarray(runs[name][key(setting, seeds)], float)
            except KeyError:
                pytest.fail(f"{name} at {key(setting, seeds)} is not in {STORED.name}: the sweeps "
                            f"changed; store them again with `{STORE_AGAIN}`.")
        return read
    return reading


@pytest.fixture(scope="module")
def decided():
    return replications(from_the_file(stored()))


@pytest.mark.parametrize("pair", list(TABLE), ids=" vs ".join)
def test_the_asynchronous_chapters_table_keeps_its_verdicts_on_a_denser_grid(decided, pair):
    verdict = decided[0].compare(*pair)
    assert verdict.verdict == TABLE[pair], verdict


@pytest.mark.parametrize("pair", list(REMEDIES), ids=" vs ".join)
def test_the_remedies_keep_their_verdicts_on_a_denser_grid(decided, pair):
    verdict = decided[1].compare(*pair)
    assert verdict.verdict == REMEDIES[pair], verdict


def fresh_runs():
    """Each method's own run (not remembered across methods), by name."""
    return {method.name: method.run
            for method in table_methods() + parabola_async.remedy_methods()}


@pytest.mark.parametrize("name", [method.name for method in table_methods()]
                         + ["best constant rate", "rate / (staleness + 1)", "DC-ASGD"])
def test_a_sample_of_the_stored_runs_matches_a_fresh_replay(name):
    """Four stored runs of each method (a fixed draw from its keys), replayed afresh: equal."""
    runs = stored()[name]
    run = fresh_runs()[name]
    for drawn in np.random.default_rng(0).choice(sorted(runs), size=4, replace=False):
        setting, seeds = json.loads(drawn)
        if isinstance(seeds, str):
            first, last = (int(s) for s in seeds.split(".."))
            seeds = np.arange(first, last + 1)
        fresh = np.asarray(run(setting, np.asarray(seeds)), float)
        np.testing.assert_allclose(fresh, runs[drawn], rtol=1e-9, atol=0, err_msg=(
            f"{name} at {drawn} differs from the stored run: if the replays, seeds or grids "
            f"changed, store them again with `{STORE_AGAIN}`; if nothing changed, this CPU's "
            "BLAS kernels add in another order (x86-64 kernels with FMA, OpenBLAS's Haswell, "
            "SkylakeX and Zen, agree to 1e-9; Sandybridge's and older ones do not), and the "
            "verdicts above were decided on the stored machine's numbers"))
