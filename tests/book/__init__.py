"""Tests of the book's modules, ``pargrad/book/<module>.py`` -> ``test_<module>.py``.

A package, so that a book module's test may share its file name with a library
module's (``tests/test_<module>.py`` beside ``tests/book/test_<module>.py``).
"""
