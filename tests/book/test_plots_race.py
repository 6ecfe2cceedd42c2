"""pargrad.book.plots_race: the race's curves and the time-to-target chart."""

import numpy as np
from figure_checks import assert_readable, closing

from pargrad.book import plots_race as plots


def race_curves_figure():
    """Three methods, five seeds each, accuracy rising along a virtual clock."""
    rng = np.random.default_rng(0)
    results = [{"method": method, "time": np.arange(0.0, 50.0, 5.0),
                "accuracy": 1 - 0.5 * np.exp(-np.arange(10) / (2 + i) + rng.normal(0, 0.1, 10))}
               for i, method in enumerate(("sync", "sync, 1 backup", "async")) for _ in range(5)]
    return plots.race_curves(results, title="equal devices", target=0.9)


def test_race_curves_draw_one_median_line_a_method_in_readable_text():
    with closing(race_curves_figure()) as figure:
        labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
        assert {"sync (5 seeds)", "sync, 1 backup (5 seeds)", "async (5 seeds)"} <= set(labels)
    assert_readable("race_curves", race_curves_figure())


def test_time_to_target_marks_a_seed_that_never_reached_it_at_the_right_edge():
    table = [{"scenario": "equal", "method": "sync", "times": [10.0, 12.0, 11.0], "median": 11.0},
             {"scenario": "equal", "method": "async", "times": [8.0, np.inf, 9.0], "median": 9.0}]
    with closing(plots.time_to_target_chart(table, unit="virtual time")) as figure:
        ax = figure.axes[0]
        never = [line for line in ax.get_lines() if line.get_marker() == "x" and len(line.get_xdata())]
        assert [(list(line.get_xdata()), list(line.get_ydata())) for line in never] == [
            ([1.08 * 12.0], [1])]                    # the async seed that never reached it
        assert [t.get_text() for t in ax.get_yticklabels()] == ["equal: sync", "equal: async"]
    assert_readable("time_to_target_chart", plots.time_to_target_chart(table))
