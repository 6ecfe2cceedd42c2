"""Small helpers for the chapters themselves (used by every chapter)."""

import inspect
import re
import textwrap

import numpy as np

from IPython.display import Code


# A docstring's pointer to the book ("Taught in the chapter "X"." or "Shown in the chapters
# "X" and "Y" (why)."): for the package's reader, not for the chapter that shows the code.
_NOTE = (r'(?:Taught|Shown)\s+in\s+the\s+(?:chapters?|appendix)\s+"[^"]+"'
         r'(?:,?\s+and\s+"[^"]+")*(?:\s+\([^)]*\))?\.')
CHAPTER_NOTE = re.compile(r"[ \t]*(?<!\S)" + _NOTE)
ONLY_A_NOTE = re.compile(r'^[ \t]*(?:"""|\'\'\')' + _NOTE + r'(?:"""|\'\'\')[ \t]*\n', re.M)


def without_chapter_notes(source):
    """``source`` without its docstrings' "Taught in / Shown in the chapter ..." sentences."""
    source = ONLY_A_NOTE.sub("", source)
    source = CHAPTER_NOTE.sub("", source)
    source = re.sub(r"[ \t]+\n", "\n", source)
    source = re.sub(r"\n\n\n+", "\n\n", source)                      # two blank lines left
    return re.sub(r'\n\n([ \t]*(?:"""|\'\'\')[ \t]*\n)', r"\n\1", source)  # one before the """


def show_source(obj):
    """Display the source code of a pargrad function or class, highlighted.

    Chapters show the package's code this way, so the text and the code that
    runs never drift apart; the docstrings' pointers to the chapters
    ("Taught in the chapter ...") are left out, since the reader is in one.
    """
    return Code(without_chapter_notes(inspect.getsource(obj)), language="python")


def show_lines(obj, first, last=None):
    """Display the lines of ``obj``'s source that carry an idea, highlighted.

    From the first line that contains the text ``first`` through the first
    line after it that contains ``last`` (default: only that line),
    extended until its brackets close, dedented.  The excerpt is read
    from the package's code when the chapter runs, so it cannot drift from
    the code; if the marker text is no longer there, it raises
    ``ValueError`` and the chapter fails instead of showing stale code.
    """
    lines = inspect.getsource(obj).splitlines()
    name = getattr(obj, "__qualname__", repr(obj))
    start = next((i for i, line in enumerate(lines) if first in line), None)
    if start is None:
        raise ValueError(f"no line of {name} contains {first!r}; update the chapter's excerpt.")
    if last is None:
        end = start
    else:
        end = next((i for i in range(start, len(lines)) if last in lines[i]), None)
        if end is None:
            raise ValueError(f"no line of {name} after {first!r} contains {last!r}; "
                             "update the chapter's excerpt.")
    depth = sum(_bracket_depth(line) for line in lines[start:end + 1])
    while depth > 0 and end + 1 < len(lines):  # finish the statement the excerpt opened
        end += 1
        depth += _bracket_depth(lines[end])
    return Code(without_chapter_notes(textwrap.dedent("\n".join(lines[start:end + 1]))),
                language="python")


def _bracket_depth(line):
    """Opening minus closing brackets on a line of code, ignoring a trailing comment."""
    code = line.split("#")[0]
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def glue(name, value, display=False):
    """Store ``value`` for the rendered book under ``name``, or show it.

    With the book's build tools installed (``myst_nb``), this is
    ``myst_nb.glue``: the built page pastes the value where the text says
    ``{glue:text}`name``` or ``{glue:figure} name``.  Without them (a
    reader on Colab, who has only what ``pargrad`` declares) it shows the
    value in the notebook instead, so the chapter still runs and the reader
    still sees the figure or number.
    """
    if isinstance(value, np.generic):   # np.float64(0.5) would be pasted as its repr
        value = value.item()
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        from IPython.display import display as show
        show(value)
        return
    myst_glue(name, value, display=display)
