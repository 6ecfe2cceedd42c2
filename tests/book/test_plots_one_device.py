"""pargrad.book.plots_one_device: the training loop's loss and fit, and the logical-devices diagram."""

import matplotlib
import numpy as np
from figure_checks import SMALLEST_POINTS, assert_readable, closing, drawn_texts

from pargrad.book import plots_one_device as plots


def test_loss_curve_draws_one_line_a_call_on_a_log_scale_from_step_1():
    with closing(plots.loss_curve([1.0, 0.5, 0.25], label="first")) as figure:
        ax = figure.axes[0]
        plots.loss_curve([2.0, 1.0], ax=ax, label="second")
        assert ax.get_yscale() == "log"
        assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2, 3], [1, 2]]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["first", "second"]


def test_parabola_fit_draws_the_points_and_one_line_a_prediction():
    x = np.linspace(-1, 1, 50)[:, None]
    figure = plots.parabola_fit(x, x ** 2, {"before": 0 * x, "after": x ** 2})
    with closing(figure):
        labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
        assert labels == ["data: y = x²", "before", "after"]
    assert_readable("parabola_fit", plots.parabola_fit(x, x ** 2, {"after": x ** 2}))


def test_devices_diagram_links_every_logical_device_to_every_core_in_readable_text():
    names = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    with closing(plots.logical_devices_diagram(names, cores=2)) as figure:
        texts = drawn_texts(figure)
        labels = {text.get_text() for text in texts}
        assert {"CPU:0", "CPU:1", "CPU:2", "core 0", "core 1"} <= labels
        assert "after pargrad.logical_devices(3)" in labels
        arrows = [a for a in figure.axes[1].texts if isinstance(a, matplotlib.text.Annotation)]
        assert len(arrows) == len(names) * 2
        assert min(text.get_fontsize() for text in texts) >= SMALLEST_POINTS
