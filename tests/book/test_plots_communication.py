"""pargrad.book.plots_communication: who sends what, the α-β fits, the dial and the seeds of local SGD."""

import types

import matplotlib
import numpy as np
import pytest
from figure_checks import assert_readable, closing, drawn_texts

from pargrad import cost
from pargrad.book import experiments, replay
from pargrad.book import plots_communication as plots
from pargrad.book import rare_communication as rc


@pytest.mark.parametrize("replicas", [3, 4])
def test_the_patterns_count_the_ring_steps_and_the_tree_rounds(replicas):
    with closing(plots.communication_patterns(replicas=replicas)) as figure:
        ring, tree, server = (ax.get_title() for ax in figure.axes)
        texts = [t.get_text() for t in drawn_texts(figure)]
    assert f"2(R-1) = {2 * (replicas - 1)} steps" in ring
    assert "2·ceil(log2 R) = 4 rounds" in tree            # 3 and 4 replicas: two rounds each way
    assert "W·n in and W·n out" in server
    assert texts.count("n/R") == replicas                   # one chunk a replica, to its neighbour
    assert {f"w{w}" for w in range(replicas)} <= set(texts)
    assert_readable("communication_patterns", plots.communication_patterns(replicas))


def test_the_fits_draw_the_measurements_the_line_and_the_residuals():
    nbytes = np.geomspace(1e3, 1e7, 6)
    fit = cost.fit_link(nbytes, 2e-5 + nbytes / 5e9, name="loopback")
    with closing(plots.alpha_beta_fits({"loopback": fit})) as figure:
        top, bottom = figure.axes
        assert len(top.get_lines()) == 2 and len(bottom.get_lines()) >= 1
        assert np.allclose(top.get_lines()[0].get_ydata(), fit.seconds * 1e3)
    assert_readable("alpha_beta_fits", plots.alpha_beta_fits({"loopback": fit}))


def test_the_dial_figure_draws_few_series_each_in_its_own_colour():
    def history(steps):
        rounds = rc.UPDATES // steps
        return types.SimpleNamespace(updates=np.arange(1, rounds + 1) * steps,
                                     bytes_sent=np.full(rounds, 96.0),
                                     clock_on=lambda link, seconds: np.arange(1, rounds + 1) * 1.0)

    curves = {s: {outer: np.linspace(1, 0.1, rc.UPDATES // s) for outer in replay.OUTERS}
              for s in rc.DIAL}
    histories = {s: history(s) for s in rc.DIAL}
    with closing(plots.dial_figure(curves, histories, rc.FAST, rc.SLOW, 1e-3,
                                   shown=(1, 16, 256))) as figure:
        for ax in figure.axes:
            lines = ax.get_lines()
            assert len(lines) == 6
            assert len({matplotlib.colors.to_hex(line.get_color()) for line in lines}) == 3
        assert all(text.get_fontsize() >= 9 for legend in figure.legends
                   for text in legend.get_texts())
        # at H = 1 each method is named as the text names it
        names = {text.get_text() for legend in figure.legends for text in legend.get_texts()}
        assert {"synchronous SGD", "synchronous SGD with momentum", "DiLoCo, H = 16"} <= names
        assert not [name for name in names if name.endswith("H = 1")]
    with pytest.raises(ValueError, match="shown must name H values"):
        plots.dial_figure(curves, histories, rc.FAST, rc.SLOW, 1e-3, shown=(2,))


def test_the_seeds_figure_marks_each_method_median_one_panel_an_experiment():
    scores = {"local SGD, H = 16": [0.1, 0.2, 0.4], "DiLoCo, H = 16": [0.05, 0.1, 0.3]}
    page = experiments.Experiment(seeds=np.arange(3), scores=scores, rates={}, sweeps={})
    with closing(plots.seeds_figure([page, page], ["even", "one slow"])) as figure:
        assert [ax.get_title() for ax in figure.axes] == ["even", "one slow"]
        medians = [line.get_ydata()[0] for line in figure.axes[0].get_lines()
                   if line.get_linestyle() == "-"]
        assert medians == [0.2, 0.1]
        assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == [
            "local SGD\nH = 16", "DiLoCo\nH = 16"]
    assert_readable("seeds_figure", plots.seeds_figure([page], ["even"]))
