"""One source of truth: the widgets' JavaScript computes what pargrad computes.

A table of inputs goes through pargrad in Python and through the page's
JavaScript in headless Chromium; every number must agree to 1e-9 (relative;
both are IEEE float64 and do the same operations in the same order, so they
usually agree to the last bit).  The largest differences are written to
_build/browser/agreement.txt, which `make test-browser` prints.
"""

import ast
import itertools
import json
import math

import numpy as np
import pytest

from browser_pages import ROOT, open_page
from pargrad import cost
from pargrad.book.delay import delayed_gradient_path, stable_rate_bound

TOLERANCE = 1e-9
_worst = {}


def differences(name, python, javascript):
    """Record and return the largest absolute and relative difference of two tables."""
    python = np.asarray(python, dtype=float)
    javascript = np.asarray(javascript, dtype=float)
    assert python.shape == javascript.shape, (name, python.shape, javascript.shape)
    absolute = np.abs(python - javascript)
    scale = np.maximum(np.abs(python), np.finfo(float).tiny)
    relative = np.where(absolute == 0, 0.0, absolute / scale)
    count, worst_absolute, worst_relative = _worst.get(name, (0, 0.0, 0.0))
    _worst[name] = (count + python.size, max(worst_absolute, float(absolute.max())),
                    max(worst_relative, float(relative.max())))
    return float(absolute.max()), float(relative.max())


@pytest.fixture(scope="module", autouse=True)
def write_agreement(shots):
    yield
    lines = [f"{'quantity':34s} {'values':>7s} {'max abs diff':>13s} {'max rel diff':>13s}"]
    lines += [f"{name:34s} {n:7d} {a:13.3g} {r:13.3g}" for name, (n, a, r) in _worst.items()]
    (shots / "agreement.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def page(browser):
    open_page(browser, "chapters/10_communication_costs", "pargrad-scaling-calculator")
    return browser


def run_js(page, expression, *arguments):
    """Evaluate ``expression`` (which sees ``args``) in the page; return its JSON value."""
    return json.loads(page.execute_script(
        f"var args = arguments[0]; return JSON.stringify({expression});", list(arguments)))


def test_delayed_gradient_paths_agree(page):
    cases = list(itertools.product([0.05, 0.3, 0.6, 0.99, 1.0, 1.2, 1.9, 2.1],
                                   [0, 1, 2, 3, 7, 15], [3.0, -1.7, 0.25]))
    javascript = run_js(page, "args.map(c => pargrad.delay.delayedGradientPath(c[0], c[1], c[2], 60))",
                        *cases)
    python = [delayed_gradient_path(rate, tau, start, 60) for rate, tau, start in cases]
    absolute, relative = differences("delayed_gradient_path", python, javascript)
    assert relative <= TOLERANCE, (absolute, relative)
    assert np.isfinite(python).all()  # the table stays within float64, so every value counts


def test_stability_bounds_and_the_three_runs_agree(page):
    staleness = list(range(0, 41))
    javascript = run_js(page, "args.map(t => pargrad.delay.stableRateBound(t))", *staleness)
    _, relative = differences("stable_rate_bound", [stable_rate_bound(t) for t in staleness],
                              javascript)
    assert relative <= TOLERANCE
    # The synchronous run of the playground: one step a round of W = tau + 1 gradients.
    cases = [(0.6, 1, 3.0), (0.4, 3, -2.0), (1.5, 7, 1.0)]
    runs = run_js(page, "args.map(c => pargrad.delay.threeRuns(c[0], c[1], c[2], 40))", *cases)
    for (rate, tau, start), run in zip(cases, runs):
        assert run["workers"] == tau + 1
        for key, path in [("stale", delayed_gradient_path(rate, tau, start, 40)),
                          ("fresh", delayed_gradient_path(rate, 0, start, 40)),
                          ("sync", delayed_gradient_path(rate, 0, start, 40 // (tau + 1)))]:
            _, relative = differences(f"playground {key} run", path, run[key])
            assert relative <= TOLERANCE, key


def chapter_links():
    """The links of chapter 10's table, by running the chapter's own cell that defines them."""
    source = (ROOT / "chapters" / "10_communication_costs.py").read_text()
    cells = [cell for cell in source.split("\n# %%") if "links = {" in cell]
    assert len(cells) == 1, "chapter 10 should define its table of links in one cell: links = {...}"
    code = cells[0].split("\n", 1)[1]
    namespace = {"cost": cost, "print": lambda *args, **kwargs: None}
    exec(compile(ast.parse(code), "chapter 10, the table of links", "exec"), namespace)
    return namespace["links"]


def test_link_presets_are_the_chapters_table(page):
    links = chapter_links()
    presets = run_js(page, "pargrad.cost.LINKS")
    assert [preset["name"] for preset in presets] == list(links)
    for preset in presets:
        assert preset["latency"] == links[preset["name"]].latency
        assert preset["bandwidth"] == links[preset["name"]].bandwidth


LINKS = [cost.Link(5e-6, 25e9), cost.Link(20e-6, 100e9 / 8), cost.Link(1e-3, 1e6), cost.Link(0, 3e11)]


def as_js(link):
    return [link.latency, link.bandwidth]


def test_communication_times_agree(page):
    sizes = [0, 4, 1e3, 1.024e8, 6.8e8]
    replicas = [1, 2, 3, 8, 64, 1000]
    cases = [(n, r, as_js(link)) for n, r, link in itertools.product(sizes, replicas, LINKS)]
    for name, function in [("ring_all_reduce_time", "ringAllReduceTime"),
                           ("tree_all_reduce_time", "treeAllReduceTime")]:
        javascript = run_js(page, f"args.map(c => pargrad.cost.{function}(c[0], c[1], "
                                  "pargrad.cost.link(c[2][0], c[2][1])))", *cases)
        python = [getattr(cost, name)(n, r, cost.Link(*link)) for n, r, link in cases]
        _, relative = differences(name, python, javascript)
        assert relative <= TOLERANCE, name
    cases = [(n, w, s, as_js(link)) for n, w, s, link
             in itertools.product(sizes, [1, 4, 64], [1, 4, 64], LINKS)]
    javascript = run_js(page, "args.map(c => pargrad.cost.parameterServerTime(c[0], c[1], c[2], "
                              "pargrad.cost.link(c[3][0], c[3][1])))", *cases)
    python = [cost.parameter_server_time(n, w, s, cost.Link(*link)) for n, w, s, link in cases]
    _, relative = differences("parameter_server_time", python, javascript)
    assert relative <= TOLERANCE
    cases = [(n, g, b, as_js(inside), as_js(across)) for n, g, b, (inside, across)
             in itertools.product(sizes, [1, 8], [1, 8, 64], itertools.permutations(LINKS, 2))]
    javascript = run_js(page, "args.map(c => pargrad.cost.hierarchicalAllReduceTime(c[0], c[1], "
                              "c[2], pargrad.cost.link(c[3][0], c[3][1]), "
                              "pargrad.cost.link(c[4][0], c[4][1])))", *cases)
    python = [cost.hierarchical_all_reduce_time(n, g, b, cost.Link(*inside), cost.Link(*across))
              for n, g, b, inside, across in cases]
    _, relative = differences("hierarchical_all_reduce_time", python, javascript)
    assert relative <= TOLERANCE


def test_step_time_and_efficiency_agree(page):
    cases = list(itertools.product([1e-3, 0.05, 2.0], [0, 1e-4, 0.05, 3.0], [0.0, 0.25, 1.0]))
    javascript = run_js(page, "args.map(c => [pargrad.cost.stepTime(c[0], c[1], c[2]), "
                              "pargrad.cost.scalingEfficiency(c[0], "
                              "pargrad.cost.stepTime(c[0], c[1], c[2]))])", *cases)
    python = [[cost.step_time(c, m, o), cost.scaling_efficiency(c, cost.step_time(c, m, o))]
              for c, m, o in cases]
    _, relative = differences("step_time, scaling_efficiency", python, javascript)
    assert relative <= TOLERANCE


def test_smallest_batches_are_the_same_whole_numbers(page):
    cases = list(itertools.product([1e-5, 4.872e-4, 0.02], [0, 1e-4, 0.0123, 1.7],
                                   [0.5, 0.9, 0.99], [0.0, 0.5, 1.0]))
    javascript = run_js(page, "args.map(c => pargrad.cost.smallestBatchForEfficiency("
                              "c[0], c[1], c[2], c[3]))", *cases)
    python = [cost.smallest_batch_for_efficiency(*case) for case in cases]
    differences("smallest_batch_for_efficiency", python, javascript)
    assert javascript == python
    assert max(python) > 1000  # the table reaches large batches, not only the trivial 1


def test_a_whole_calculator_step_agrees(page):
    links = chapter_links()
    settings = []
    for algorithm, replicas, link, overlap in itertools.product(
            ["ring", "tree", "hierarchical", "parameter server"], [8, 64],
            ["25 GbE", "InfiniBand HDR"], [False, True]):
        settings.append({"parameters": 25.6e6, "bytesPerParameter": 2, "secondsPerExample": 4.872e-4,
                         "batch": 64, "replicas": replicas, "algorithm": algorithm,
                         "link": {"latency": links[link].latency, "bandwidth": links[link].bandwidth},
                         "inside": {"latency": links["NVLink A100"].latency,
                                    "bandwidth": links["NVLink A100"].bandwidth},
                         "replicasPerBox": 8, "servers": 4, "overlap": overlap, "target": 0.9})
    javascript = run_js(page, "args.map(s => pargrad.cost.dataParallelStep(s))", *settings)
    python, integers = [], []
    for s in settings:
        nbytes = s["parameters"] * s["bytesPerParameter"]
        link = cost.Link(**s["link"])
        communication = {
            "ring": lambda: cost.ring_all_reduce_time(nbytes, s["replicas"], link),
            "tree": lambda: cost.tree_all_reduce_time(nbytes, s["replicas"], link),
            "hierarchical": lambda: cost.hierarchical_all_reduce_time(
                nbytes, 8, s["replicas"] // 8, cost.Link(**s["inside"]), link),
            "parameter server": lambda: cost.parameter_server_time(nbytes, s["replicas"], 4, link),
        }[s["algorithm"]]()
        compute = s["batch"] * s["secondsPerExample"]
        step = cost.step_time(compute, communication, float(s["overlap"]))
        python.append([compute, communication, step, cost.scaling_efficiency(compute, step)])
        integers.append(cost.smallest_batch_for_efficiency(
            s["secondsPerExample"], communication, 0.9, float(s["overlap"])))
    _, relative = differences("calculator step (4 numbers)", python,
                              [[r["compute"], r["communication"], r["step"], r["efficiency"]]
                               for r in javascript])
    assert relative <= TOLERANCE
    assert [r["smallestBatch"] for r in javascript] == integers


def test_bad_input_is_refused_in_both(page):
    messages = run_js(page, """[
        () => pargrad.cost.ringAllReduceTime(1e6, 0, pargrad.cost.link(5e-6, 25e9)),
        () => pargrad.cost.link(5e-6, 0),
        () => pargrad.cost.stepTime(0.1, 0.05, 2),
        () => pargrad.cost.smallestBatchForEfficiency(1, 1, 1.0),
        () => pargrad.delay.delayedGradientPath(0.5, -1, 1, 10),
      ].map(f => { try { f(); return null; } catch (e) { return e.message; } })""")
    python = []
    for call in [lambda: cost.ring_all_reduce_time(1e6, 0, cost.Link(5e-6, 25e9)),
                 lambda: cost.Link(5e-6, 0),
                 lambda: cost.step_time(0.1, 0.05, overlap=2),
                 lambda: cost.smallest_batch_for_efficiency(1, 1, 1.0),
                 lambda: delayed_gradient_path(0.5, -1, 1, 10)]:
        with pytest.raises(ValueError) as error:
            call()
        python.append(str(error.value))
    for js, py in zip(messages, python):
        assert js is not None
        assert js.split(",")[0] == py.split(",")[0]  # the same sentence, up to the value's spelling
    assert math.isclose(stable_rate_bound(1), 1.0)
