"""pargrad.book.plots_accumulation: peak memory against the batch, and the token-weighting diagram."""

import numpy as np
from figure_checks import assert_readable, closing, drawn_texts

from pargrad.book import plots_accumulation as plots


def test_token_diagram_states_both_means():
    losses = plots._diagram_losses()
    everything = np.concatenate(losses)
    means = [np.concatenate(losses[:2]).mean(), np.concatenate(losses[2:]).mean()]
    assert abs(np.mean(means) - everything.mean()) > 0.1   # the diagram shows a visible gap
    with closing(plots.token_weighting_diagram()) as figure:
        text = "\n".join(t.get_text() for t in drawn_texts(figure))
    assert f"= {np.mean(means):.3f}" in text
    assert f"= {everything.mean():.3f} = the big batch's" in text
    assert f"{len(everything)}" in text
    assert_readable("token_weighting_diagram", plots.token_weighting_diagram())


def test_peak_memory_draws_both_curves_against_the_batch_on_a_log2_axis():
    sizes = [8, 16, 32, 64]
    figure = plots.peak_memory_against_batch(sizes, [10, 20, 40, 80], [10, 10, 10, 10], 8,
                                             device="GPU")
    with closing(figure):
        ax = figure.axes[0]
        assert ax.get_xscale() == "log"
        assert [list(line.get_ydata()) for line in ax.get_lines()[:2]] == [
            [10, 20, 40, 80], [10, 10, 10, 10]]
        assert ax.get_ylabel() == "peak memory (MB)"
        assert "micro-batches of 8" in ax.get_lines()[1].get_label()
    assert_readable("peak_memory_against_batch",
                    plots.peak_memory_against_batch(sizes, [1, 2, 3, 4], [1, 1, 1, 1], 8))
