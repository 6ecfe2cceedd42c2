"""pargrad.book.plots_asynchronous: the chapter "Asynchronous training"'s figures and the stale-gradient depth page's."""

import types

import numpy as np
import pytest
from figure_checks import assert_readable, closing, drawn_texts

from pargrad.book import delay
from pargrad.book import plots_asynchronous as plots


def paired_scores_figure():
    """Final losses between 0.035 and 0.6: the range in which the old log ticks overlapped."""
    rng = np.random.default_rng(0)
    one = np.exp(rng.uniform(np.log(0.035), np.log(0.6), 30))
    return plots.paired_scores({
        "rate 0.03": ("4 workers", one * np.exp(rng.normal(0.05, 0.1, 30)), "1 worker", one),
        "8 workers": ("8 workers", one * np.exp(rng.normal(1.0, 0.7, 30)), "1 worker", one),
    })


def test_paired_scores_text_is_readable():
    assert_readable("paired_scores", paired_scores_figure())


def test_paired_scores_tick_labels_do_not_overlap():
    with closing(paired_scores_figure()) as figure:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        for ax in figure.axes:
            low, high = ax.get_xlim()
            labels = [label for label in ax.xaxis.get_ticklabels(which="both")
                      if label.get_visible() and label.get_text()
                      and low <= label.get_position()[0] <= high]
            boxes = sorted((label.get_window_extent(renderer) for label in labels),
                           key=lambda box: box.x0)
            assert len(boxes) >= 2
            assert all(left.x1 <= right.x0 for left, right in zip(boxes, boxes[1:]))



def stale_gradient_figure(sweep=True):
    """The article's figure on w², the runs going down the right branch, with the sweep panel."""
    weights = np.linspace(-2, 2, 101)
    x = np.linspace(0.1, 2, 8)
    sweeps = {"step_times_curvature": x, "async": np.linspace(0.5, 1.2, 8),
              "fresh": np.linspace(0.3, 1.0, 8), "sync": np.linspace(0.6, 1.3, 8),
              "sync_double": np.linspace(0.2, 1.1, 8)}
    return plots.stale_gradient(weights, weights ** 2, [1.5, 0.9, 0.3], [1.5, 0.9, 0.5], [1.5, 0.8],
                                sweep=sweeps if sweep else None,
                                sync_double_path=[1.5, 0.3] if sweep else None)


@pytest.mark.parametrize("sweep", [True, False], ids=["four panels", "three panels"])
def test_the_stale_gradient_figure_draws_its_panels_and_the_region_stale_beats_sync(sweep):
    with closing(stale_gradient_figure(sweep)) as figure:
        titles = [ax.get_title() for ax in figure.axes]
        assert titles[:3] == ["(a) asynchronous: stale", "(b) the same two updates, fresh",
                              "(c) synchronous, same wall time"]
        assert len(figure.axes) == (4 if sweep else 3)
        texts = {t.get_text() for t in drawn_texts(figure)}
        assert ("one step at 2η" in texts) == sweep
        assert "d1's stale update" in texts
        if sweep:   # async is worse than fresh everywhere, better than sync everywhere here
            assert any("better than sync" in t.get_text()
                       for t in figure.axes[3].get_legend().get_texts())
    assert_readable("stale_gradient", stale_gradient_figure(sweep))


def test_the_async_timeline_draws_one_bar_an_update_labelled_with_its_staleness():
    history = types.SimpleNamespace(worker=np.array([0, 1, 0]), read_time=np.array([0.0, 0.0, 1.0]),
                                    time=np.array([1.0, 1.5, 2.0]), staleness=np.array([0, 1, 1]))
    with closing(plots.async_timeline(history)) as figure:
        ax = figure.axes[0]
        assert len(ax.patches) == 3
        assert [t.get_text() for t in ax.texts] == ["0", "1", "1"]
    assert_readable("async_timeline", plots.async_timeline(history))


def test_staleness_histograms_give_shares_and_the_mean():
    with closing(plots.staleness_histograms({"4 workers": [0, 1, 1, 3]})) as figure:
        ax = figure.axes[0]
        assert [bar.get_height() for bar in ax.patches] == [0.25, 0.5, 0.0, 0.25]
        assert ax.get_title() == "4 workers\nmean 1.25"


def test_loss_against_updates_cuts_an_overflow_and_smooths_over_the_window():
    runs = {"1 worker": np.linspace(1, 0.1, 20), "8 workers": np.r_[np.linspace(1, 0.5, 19), np.inf]}
    with closing(plots.loss_against_updates(runs, window=4)) as figure:
        ax = figure.axes[0]
        assert ax.get_yscale() == "log"
        assert len(ax.get_lines()) == 2
        assert np.isfinite(ax.get_ylim()).all()


def test_the_stability_bound_draws_the_recursion_the_runs_and_the_ratios():
    x = np.linspace(0.05, 2.4, 40)
    growth = {tau: [delay.growth_per_update(delay.delayed_gradient_path(c, tau, 1.0, 60), tau)
                    for c in x] for tau in (1, 3)}
    figure = plots.stability_bound(delay.stable_rate_bound, x, growth, {1: [(0.5, 0.9)]},
                                   {2: [2.5, 3.0], 4: [5.0, 6.5]})
    with closing(figure):
        left, right = figure.axes[:2]
        assert {line.get_label() for line in left.get_lines()} >= {"τ = 1, recursion",
                                                                   "τ = 3, recursion"}
        verticals = [line.get_xdata()[0] for line in left.get_lines()
                     if len(set(line.get_xdata())) == 1]
        assert pytest.approx(sorted(verticals)) == sorted(delay.stable_rate_bound(t) for t in (1, 3))
    assert_readable("stability_bound", plots.stability_bound(
        delay.stable_rate_bound, x, growth, {1: [(0.5, 0.9)]}, {2: [2.5, 3.0]}))
