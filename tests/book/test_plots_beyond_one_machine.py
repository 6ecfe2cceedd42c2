"""pargrad.book.plots_beyond_one_machine: a parameter server's updates, and a killed run resumed."""

import numpy as np
import pytest
from figure_checks import assert_readable, closing

from pargrad.book import plots_beyond_one_machine as plots


def parameter_server_result():
    """Two workers' updates on one clock: worker 1 stops after its third."""
    finished = 100.0 + np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9])
    return {"finished": finished, "worker": np.array([0, 1, 0, 1, 1, 0, 0]),
            "loss": np.linspace(1.0, 0.2, 7)}


def test_the_updates_figure_puts_each_worker_on_its_row_from_the_first_update():
    result = parameter_server_result()
    figure = plots.parameter_server_updates(result, kill_time=100.55,
                                            reference_loss=np.linspace(1.0, 0.1, 7))
    with closing(figure):
        left, right = figure.axes
        rows = [np.asarray(c.get_positions()) for c in left.collections]
        assert [list(np.round(r, 6)) for r in rows] == [[0.0, 0.2, 0.6, 0.8], [0.1, 0.3, 0.4]]
        assert [line.get_xdata()[0] for line in left.get_lines()] == [pytest.approx(0.45)]  # the kill
        assert [line.get_label() for line in right.get_lines()] == ["parameter servers", "one device"]
    assert_readable("parameter_server_updates", plots.parameter_server_updates(result))


def test_the_recovery_timeline_draws_both_runs_the_kill_and_the_checkpoints():
    interrupted = [(0.0, 0), (1.0, 50), (2.0, 100)]
    resumed = [(3.0, 100), (4.0, 150)]
    with closing(plots.recovery_timeline(interrupted, resumed, 2.5, [50, 100])) as figure:
        ax = figure.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["first run", "after the restart", "worker 1 killed", "checkpoints"]
        steps = [line.get_ydata()[0] for line in ax.get_lines()[3:]]
        assert steps == [50, 100]
    assert_readable("recovery_timeline", plots.recovery_timeline(interrupted, resumed, 2.5, [50]))
