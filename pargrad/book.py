"""Small helpers for the chapters themselves (used by every chapter)."""

import inspect

from IPython.display import Code


def show_source(obj):
    """Display the source code of a pargrad function or class, highlighted.

    Chapters show the package's code this way, so the text and the code that
    runs never drift apart.
    """
    return Code(inspect.getsource(obj), language="python")
