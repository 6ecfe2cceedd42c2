"""No figure code of the book (``pargrad/book/plots_*.py``, the chapters) sets a font under 9 points.

Matplotlib's defaults (10 pt text, "medium" ticks and legends) are readable;
what can make a text small is a size set by hand: a number under 9 or a
relative size ("small" is 8.3 pt at the default 10).  The figures' drawn
texts are checked by the tests of each ``plots_*`` module.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALLEST_POINTS = 9


def font_sizes_set_in(path):
    """``(line, value)`` of every ``fontsize=``/``labelsize=``/``size=`` keyword in a Python file."""
    tree = ast.parse(path.read_text())
    return [(node.lineno, ast.unparse(keyword.value)) for node in ast.walk(tree)
            if isinstance(node, ast.Call) for keyword in node.keywords
            if keyword.arg in ("fontsize", "labelsize", "size")]


def test_no_figure_code_sets_a_font_under_9_points():
    figures = sorted((ROOT / "pargrad" / "book").glob("plots_*.py"))
    assert len(figures) >= 2, "the book's figure modules are pargrad/book/plots_*.py"
    small = []
    for path in [*figures, *sorted((ROOT / "chapters").glob("*.py"))]:
        for line, value in font_sizes_set_in(path):
            readable = value.replace(".", "", 1).isdigit() and float(value) >= SMALLEST_POINTS
            named = value.strip("'\"") in ("medium", "large", "x-large", "xx-large", "larger")
            if not (readable or named or value.isidentifier()):
                small.append(f"{path.name}:{line}: {value}")
    assert not small, f"font sizes under {SMALLEST_POINTS} pt: {small}"
