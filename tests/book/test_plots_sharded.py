"""pargrad.book.plots_sharded: one sharded step replica by replica, and memory against replicas."""

import numpy as np
from figure_checks import assert_readable, closing

from pargrad.book import plots_sharded as plots


def memory_against_replicas_figure():
    """Four stages' bytes a device against 1-8 replicas, as the sharded-training chapter draws them."""
    formula = {s: {n: 4 * 1153 * (4 - s) // n + 4 * 1153 * s for n in range(1, 9)} for s in range(4)}
    counted = {s: {n: formula[s][n] for n in (1, 2, 4, 8)} for s in range(4)}
    return plots.memory_against_replicas(counted, formula)


def test_the_sharded_step_diagram_is_readable():
    assert_readable("sharded_step_diagram", plots.sharded_step_diagram())


def test_memory_against_replicas_draws_each_stage_formula_and_counted_points():
    with closing(memory_against_replicas_figure()) as figure:
        lines = figure.axes[0].get_lines()
        assert len(lines) >= 4
        ys = [np.asarray(line.get_ydata(), float) for line in lines]
        assert all(np.all(np.diff(y) <= 0) for y in ys)   # no stage needs more with more replicas
    assert_readable("memory_against_replicas", memory_against_replicas_figure())
