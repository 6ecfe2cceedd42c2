"""Tests live where their folder says, and cite no issue.

tests/test_X.py tests the library module pargrad/X.py and uses none of the
book layer's classes (those are tested in tests/book/); a test that decides a
verdict with the experiment engine (a chapter's conclusion re-decided) is in
tests/claims/, except the engine's own tests; no test line cites an issue
number (the reason is written out instead).  File names: test_layout.py.
"""

import ast
import pathlib
import re


ROOT = pathlib.Path(__file__).resolve().parents[2]
BOOK = ROOT / "pargrad" / "book"
TESTS = ROOT / "tests"
ALL_TESTS = sorted(TESTS.rglob("*.py"))
LIBRARY_TESTS = sorted(TESTS.glob("test_*.py"))


def tree(path):
    return ast.parse(path.read_text(), filename=str(path))


def used_names(module):
    """Bare names and attribute names a module uses."""
    return ({node.id for node in ast.walk(module) if isinstance(node, ast.Name)}
            | {node.attr for node in ast.walk(module) if isinstance(node, ast.Attribute)}
            | {alias.name for node in ast.walk(module) if isinstance(node, ast.ImportFrom)
               for alias in node.names})


def called_names(node):
    return {call.func.id if isinstance(call.func, ast.Name) else call.func.attr
            for call in ast.walk(node) if isinstance(call, ast.Call)
            and isinstance(call.func, (ast.Name, ast.Attribute))}


# -- no issue numbers ----------------------------------------------------------

CITATION = re.compile(r"\bissues?\s*#?\d+|(?<![\w&/])#\d{2,}\b", re.IGNORECASE)


def test_the_citation_finder_finds_citations():
    number = "39"  # not typed beside the word: this file cites no issue either
    assert CITATION.search(f"# re-decided (see Issue {number})")
    assert CITATION.search(f"as in #{number}, the rule")
    assert not CITATION.search("colour '#1f77b4', issues a warning, page#2, 3 issues")


def test_no_test_cites_an_issue():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in ALL_TESTS
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if CITATION.search(line)]
    assert not found, ("say what the test checks and why instead of citing an issue:\n"
                       + "\n".join(found))


# -- the library's tests use no book class -------------------------------------

BOOK_CLASSES = {node.name for path in sorted(BOOK.glob("*.py")) for node in tree(path).body
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}


def test_the_book_classes_are_found():
    assert {"InstrumentedSyncTrainer", "Verdict"} <= BOOK_CLASSES


def test_the_librarys_tests_use_no_class_of_the_book_layer():
    """tests/test_X.py tests pargrad/X.py; the book's data and models (functions) may feed it,
    but a book class (an instrumented trainer, a verdict) is tested in tests/book/."""
    found = {str(path.relative_to(ROOT)): sorted(used_names(tree(path)) & BOOK_CLASSES)
             for path in LIBRARY_TESTS}
    found = {path: names for path, names in found.items() if names}
    assert not found, f"move these tests to tests/book/test_<module>.py: {found}"


# -- verdicts are re-decided in tests/claims/ ------------------------------------

VERDICT_CLASSES = {"Verdict", "Replicated"}


def verdict_deciders():
    """{name: the book modules defining it} of the book layer's functions and methods that
    decide a verdict: those that make a Verdict or a Replicated, or call one that does."""
    calls, homes = {}, {}
    for path in sorted(BOOK.glob("*.py")):
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                calls.setdefault(node.name, set()).update(called_names(node))
                homes.setdefault(node.name, set()).add(path.stem)
    deciders = set()
    while True:
        more = {name for name, called in calls.items()
                if called & (deciders | VERDICT_CLASSES)} - deciders
        if not more:
            return {name: homes[name] for name in deciders}
        deciders |= more


DECIDERS = verdict_deciders()


def test_the_deciders_are_found():
    assert DECIDERS["replicated"] == {"experiments"}
    # Replication.compare, and the tuned replication's, which adds its tuning noise
    assert DECIDERS["compare"] == {"experiments", "tuning"}
    assert "paired_verdict" in DECIDERS
    assert not {"sweep", "last_quarter_mean", "run_experiment"} & set(DECIDERS)


def test_verdicts_are_decided_only_in_tests_claims():
    """A unit test (tests/test_*.py, tests/book/) decides no verdict, except a book module's
    own tests of the deciders it defines (on made-up scores: they test the rule)."""
    outside = {}
    for path in LIBRARY_TESTS + sorted((TESTS / "book").glob("test_*.py")):
        module = path.stem[len("test_"):] if path.parent.name == "book" else None
        names = sorted(name for name in called_names(tree(path)) & set(DECIDERS)
                       if module not in DECIDERS[name])
        if names:
            outside[str(path.relative_to(ROOT))] = names
    assert not outside, (
        f"these tests decide verdicts ({outside}): a chapter's conclusion re-decided belongs in "
        "tests/claims/")
