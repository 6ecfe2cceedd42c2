"""What every figure test of the book checks: readable text, and the figures closed afterwards.

Shared by the tests of ``pargrad/book/plots_*.py`` (one test file a module).
"""

import contextlib

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402

SMALLEST_POINTS = 9


def drawn_texts(figure):
    """Every non-empty Text artist of ``figure`` after drawing it (tick labels exist only then)."""
    figure.canvas.draw()
    return [text for text in figure.findobj(Text) if text.get_visible() and text.get_text().strip()]


@contextlib.contextmanager
def closing(figure):
    """``figure``, closed when the block ends (a test that fails leaves no figure open)."""
    try:
        yield figure
    finally:
        plt.close(figure)


def assert_readable(name, figure):
    """``figure`` is a matplotlib Figure whose every drawn text is at least 9 pt; closes it."""
    with closing(figure):
        assert isinstance(figure, matplotlib.figure.Figure)
        small = [(text.get_text(), text.get_fontsize()) for text in drawn_texts(figure)
                 if text.get_fontsize() < SMALLEST_POINTS]
        assert not small, f"{name}: text under {SMALLEST_POINTS} pt: {small}"
