"""pargrad.book.display: the code a chapter shows, read from the package, and glued values."""

import pytest

from pargrad.book.display import glue, show_lines, show_source


def sample(values):
    total = 0
    for value in values:
        total += (value
                  * 2)
    return total


def test_show_source_is_the_whole_source():
    shown = show_source(sample).data
    assert shown.startswith("def sample(values):") and "return total" in shown


def test_show_lines_runs_from_first_to_last_dedented():
    assert show_lines(sample, "total = 0", "for value").data == "total = 0\nfor value in values:"
    assert show_lines(sample, "return total").data == "return total"


def test_show_lines_finishes_the_statement_it_opened():
    assert show_lines(sample, "total += (value").data == "total += (value\n          * 2)"


def test_show_lines_fails_when_the_marker_is_gone():
    with pytest.raises(ValueError, match="no line of sample contains 'gone'"):
        show_lines(sample, "gone")
    with pytest.raises(ValueError, match="after 'return total' contains 'total = 0'"):
        show_lines(sample, "return total", "total = 0")


def test_glue_passes_a_numpy_number_as_a_python_number(monkeypatch):
    import numpy as np

    shown = []
    monkeypatch.setitem(__import__("sys").modules, "myst_nb", None)   # not installed
    monkeypatch.setattr("IPython.display.display", shown.append)
    glue("half", np.float64(0.5))
    assert shown == [0.5] and type(shown[0]) is float


def documented(x):
    """Double ``x``.

    Twice the input.  Taught in the chapter "The training loop".  Shown in
    the chapters "Synchronous training" and "Beyond one machine" (to double).
    """
    return 2 * x


def only_a_note():
    """Shown in the chapter "Compatibility matrix"."""
    return 1


def test_show_source_leaves_out_the_docstrings_pointers_to_the_chapters():
    assert show_source(documented).data == (
        'def documented(x):\n    """Double ``x``.\n\n    Twice the input.\n    """\n'
        "    return 2 * x\n")
    assert show_source(only_a_note).data == "def only_a_note():\n    return 1\n"
