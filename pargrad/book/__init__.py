"""The book's instruments: its tasks, harnesses, demos, figures and stored data.

The library at the top of :mod:`pargrad` is what a reader takes home; this
sub-package is what the chapters use to *demonstrate* it.  The README's
table maps its modules.  A chapter imports a name from its module
(``from pargrad.book.parabola import parabola_data``); the three helpers
every chapter uses, :func:`show_source`, :func:`show_lines` and
:func:`glue` (:mod:`pargrad.book.display`), are importable from here.

The dependency points one way: the book imports the library, the library
never imports the book (``tests/repository/test_layout.py`` checks it).
"""

from pargrad.book.display import glue, show_lines, show_source

__all__ = ["glue", "show_lines", "show_source"]
