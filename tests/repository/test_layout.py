"""The package's shape: two layers, no import cycle, one name a thing, tests that mirror it.

The library (``pargrad/*.py``) never imports the book's instruments
(``pargrad/book``); no module imports itself back through another; no name
has a second path (a module ``__getattr__``, an "older name"); no function
imports a pargrad module unless it runs in a child process; every library
module has a test file of its name in ``tests/``, every book module in
``tests/book/``; and the code a chapter shows says so in its docstring.
"""

import ast
import builtins
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import pargrad

PACKAGE = pathlib.Path(pargrad.__file__).parent
ROOT = PACKAGE.parent
LIBRARY = sorted(path for path in PACKAGE.glob("*.py"))
CHAPTERS = sorted((ROOT / "chapters").glob("*.py"))


def imported_modules(path):
    """Every module a file imports, at any depth (also inside functions)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_library_never_imports_the_book():
    assert len(LIBRARY) >= 8, "the library modules moved; update this test"
    offenders = {path.name: [name for name in imported_modules(path)
                             if name == "pargrad.book" or name.startswith("pargrad.book.")]
                 for path in LIBRARY if path.name != "__init__.py"}
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, (f"library modules import the book layer: {offenders}; move the "
                           "code they need into the library, or the module into pargrad/book")


def test_the_book_layer_is_a_sub_package_with_its_data():
    from pargrad.book import race

    assert (PACKAGE / "book" / "__init__.py").exists()
    assert sorted(p.name for p in (PACKAGE / "book" / "data").glob("*.json")) == [
        "rare_communication_sweeps.json", "rare_communication_tuned.json",
        "stale_gradients_tuned.json", "stated_verdicts.json",
        "sync_vs_async.json", "sync_vs_async_virtual.json",
        "sync_vs_async_virtual_held_out.json"]
    assert race.stored_sweep("sync_vs_async_virtual")


def test_importing_pargrad_loads_no_book_module():
    """A cluster worker imports pargrad, not the book (its figures, tasks, stored sweeps).

    Not asserted: matplotlib and IPython themselves, because Keras 3 imports both
    on ``import keras`` (keras/src/visualization, keras/src/saving/file_editor.py).
    """
    code = ("import sys, pargrad; "
            "book = sorted(m for m in sys.modules if m.startswith('pargrad.book')); "
            "assert not book, book; "
            "assert not hasattr(pargrad, 'race') and not hasattr(pargrad, 'parabola_model')")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]


# -- the public names ----------------------------------------------------------

def test_all_lists_exactly_the_public_library_names():
    """``pargrad.__all__`` is every public name the package holds, modules aside."""
    public = {name for name, value in vars(pargrad).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert len(pargrad.__all__) == len(set(pargrad.__all__)), "a name twice in __all__"
    missing = [name for name in pargrad.__all__ if not hasattr(pargrad, name)]
    assert not missing, f"pargrad.__all__ names what pargrad does not hold: {missing}"
    assert set(pargrad.__all__) == public, (
        f"add to pargrad.__all__: {sorted(public - set(pargrad.__all__))}; "
        f"remove: {sorted(set(pargrad.__all__) - public)}")
    for name in pargrad.__all__:
        home = getattr(getattr(pargrad, name), "__module__", "")
        assert home.startswith("pargrad.") and not home.startswith("pargrad.book"), (name, home)


def test_star_import_gives_only_the_public_names():
    namespace = {}
    exec("from pargrad import *", namespace)  # noqa: S102  (the statement under test)
    assert set(namespace) - {"__builtins__"} == set(pargrad.__all__)


# -- imports: no cycle, no second path ------------------------------------------

def module_name(path):
    """``pargrad/book/race.py`` -> ``pargrad.book.race``; a package's __init__ -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def import_graph(modules=MODULES):
    """{module: the pargrad modules it imports}, module-level and inside functions alike."""
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                         else node.module for a in node.names]
            else:
                continue
            edges.update(target for target in found if target in modules and target != name)
        graph[name] = edges
    return graph


def cycles(graph):
    """The import cycles of ``graph``, each as a path ``a -> b -> ... -> a``."""
    found, done = [], set()

    def visit(node, path):
        for target in sorted(graph[node]):
            if target in path:
                cycle = path[path.index(target):] + [target]
                if set(cycle) not in [set(c) for c in found]:
                    found.append(cycle)
            elif target not in done:
                visit(target, path + [target])
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node, [node])
    return [" -> ".join(cycle) for cycle in found]


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == ["a -> b -> c -> a"]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_pargrad_modules():
    graph = import_graph()
    assert "pargrad.sync" in graph and "pargrad.data" in graph["pargrad.sync"]
    found = cycles(graph)
    assert not found, ("import cycles among pargrad's modules (a module imports, at any depth, "
                       f"one that imports it back): {found}; move the shared code into one of "
                       "them or a third module")


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p))
def test_no_module_serves_names_through_getattr(path):
    """A module ``__getattr__`` is a second path to a name (a lazy re-export, an old name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hooks = [node.name for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__")]
    assert not hooks, f"{module_name(path)} defines {hooks}: import the name from its home"


SECOND_NAME_WORDS = re.compile(r"older name|old name|\balias(es)?\b|still resolves", re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")) + CHAPTERS,
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_second_name_is_announced(path):
    lines = [f"{number}: {line.strip()}" for number, line in
             enumerate(path.read_text().splitlines(), 1) if SECOND_NAME_WORDS.search(line)]
    assert not lines, (f"{path.relative_to(ROOT)} speaks of a second name for something; "
                       f"keep one name and update its callers: {lines}")


# -- tests mirror the package --------------------------------------------------

# Library modules whose test file another change adds (each listed here is
# expected to exist at the merge; remove it from this set then).
TEST_FILE_ADDED_ELSEWHERE = set()


def test_every_library_module_has_a_test_file_of_its_name():
    modules = sorted(path.stem for path in LIBRARY if not path.stem.startswith("_"))
    assert {"sync", "asynchronous", "checks", "numerics"} <= set(modules)
    missing = [f"tests/test_{name}.py" for name in modules
               if not (ROOT / "tests" / f"test_{name}.py").exists()
               and name not in TEST_FILE_ADDED_ELSEWHERE]
    assert not missing, f"library modules without a test file of their name: {missing}"


BOOK = sorted(path for path in (PACKAGE / "book").glob("*.py") if not path.stem.startswith("_"))


def test_every_book_module_has_a_test_file_of_its_name_in_tests_book():
    assert {"race", "replay", "parameter_server"} <= {path.stem for path in BOOK}
    missing = [f"tests/book/test_{path.stem}.py" for path in BOOK
               if not (ROOT / "tests" / "book" / f"test_{path.stem}.py").exists()]
    assert not missing, f"book modules without a test file of their name: {missing}"


@pytest.mark.parametrize("folder, modules", [
    ("tests", LIBRARY), ("tests/book", BOOK)], ids=["library", "book"])
def test_every_unit_test_file_is_named_for_a_module(folder, modules):
    """tests/ holds test_X.py for pargrad/X.py, tests/book/ for pargrad/book/X.py, nothing else;
    X's tests that start clusters may sit beside them in test_X_cluster.py, so that test_X.py
    is a loop that starts none (tests/repository/test_marks.py checks its `clusters` mark)."""
    names = {path.stem for path in modules} | (TEST_FILE_ADDED_ELSEWHERE if folder == "tests" else set())
    names |= {f"{name}_cluster" for name in names}
    strays = [f"{folder}/{path.name}" for path in sorted((ROOT / folder).glob("test_*.py"))
              if path.stem[len("test_"):] not in names]
    assert not strays, (f"{strays} test no module of their name: rename them for the module "
                        "they test, or move them to tests/repository/ or tests/claims/")


def function_level_pargrad_imports(path):
    """(line, function) of each import of a pargrad module inside a function of ``path``,
    unless that function says it runs in a child process."""
    source = path.read_text()
    found = []
    for function in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        text = "\n".join(source.splitlines()[function.lineno - 1:function.end_lineno])
        for node in ast.walk(function):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if (any(name == "pargrad" or name.startswith("pargrad.") for name in names)
                    and "child process" not in text.lower()):
                found.append((node.lineno, function.name))
    return sorted(set(found))


def test_the_finder_of_function_level_imports_finds_them(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import pargrad\n\ndef f():\n    from pargrad.sync import SyncTrainer\n\n"
                      "def g():\n    # In a child process.\n    import pargrad.book\n\n"
                      "def h():\n    import json\n")
    assert function_level_pargrad_imports(module) == [(4, "f")]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_pargrad_modules_are_imported_at_the_top(path):
    """An import inside a function hides a dependency; only code run in a child process keeps one
    (it says so: a comment or its docstring names the child process)."""
    found = function_level_pargrad_imports(path)
    assert not found, (f"{path.relative_to(ROOT)} imports pargrad modules inside functions "
                       f"(line, function): {found}; move them to the top of the module")


BOOK_CHECKS = ["test_book_html.py", "test_notebooks.py", "test_prose_numbers.py"]


def test_the_book_checks_live_in_tests_claims():
    """Tests of a chapter's conclusions and of the pages are book checks, beside no unit test."""
    claims = sorted(path.name for path in (ROOT / "tests" / "claims").glob("test_*.py"))
    assert set(BOOK_CHECKS) <= set(claims), claims
    assert any(name.endswith("_conclusions.py") for name in claims), claims
    strays = [path.name for path in (ROOT / "tests").rglob("test_*.py")
              if path.parent.name != "claims"
              and (path.name.endswith("_conclusions.py") or path.name in BOOK_CHECKS)]
    assert not strays, f"move these to tests/claims/: {strays}"


# -- shown code is marked ------------------------------------------------------

def chapter_title(path):
    """A chapter's title: its first markdown heading ``# # Title``."""
    for line in path.read_text().splitlines():
        if line.startswith("# # "):
            return line[4:].strip()
    raise AssertionError(f"{path.name} has no '# # Title' heading")


TITLES = {path: chapter_title(path) for path in CHAPTERS}
for _page in sorted((ROOT / "chapters").glob("*.md")):
    _heading = next((line for line in _page.read_text().splitlines() if line.startswith("# ")), None)
    if _heading:
        TITLES[_page] = _heading[2:].strip()


def shown_targets(path):
    """The expressions a chapter passes to ``show_source``/``show_lines`` as their first argument."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func).split(".")[-1] in (
                "show_source", "show_lines"):
            found.append(ast.unparse(node.args[0]))
    return sorted(set(found))


def chapter_namespace(path):
    """What a chapter's import statements bind (executed, nothing else of the chapter).

    An optional import (inside ``try ... except ImportError``) may fail here.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    namespace = {"__builtins__": builtins}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"),  # noqa: S102
                     namespace)
            except ImportError:
                pass
    return namespace


def quoted_in(docstring, opening):
    """The quoted titles in the sentences of ``docstring`` that begin with ``opening``."""
    text = " ".join((docstring or "").split())
    titles = []
    for match in re.finditer(opening + r"s? ", text):
        sentence = re.match(r'(?:[^".]|"[^"]*")*', text[match.end():]).group(0)
        titles += re.findall(r'"([^"]+)"', sentence)
    return titles


SHOWN = [(path, target) for path in CHAPTERS for target in shown_targets(path)]


def test_the_chapters_show_code():
    assert len(SHOWN) > 20, "the chapters show less code than they did; update this test"


@pytest.mark.parametrize("path, target", SHOWN,
                         ids=[f"{p.stem}:{t}" for p, t in SHOWN])
def test_shown_code_says_where_it_is_shown(path, target):
    """Whoever edits code a chapter shows learns it from the docstring, before nbval fails."""
    shown = eval(target, chapter_namespace(path))  # noqa: S307  (a name from the chapter's code)
    if not getattr(inspect.unwrap(shown), "__module__", "").startswith("pargrad"):
        pytest.skip(f"{target} is not pargrad's code")
    title = TITLES[path]
    assert title in quoted_in(inspect.getdoc(shown), "Shown in the chapter"), (
        f'{target} is shown in {path.name}; add to its docstring: Shown in the chapter "{title}".')


def excerpts(path):
    """(target, first, last) of each ``show_lines`` call of a chapter, its markers as literals."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "show_lines":
            markers = [ast.literal_eval(argument) for argument in node.args[1:]]
            yield ast.unparse(node.args[0]), *markers, *[None] * (2 - len(markers))


EXCERPTS = [(path, *excerpt) for path in CHAPTERS for excerpt in excerpts(path)]


@pytest.mark.parametrize("path, target, first, last", EXCERPTS,
                         ids=[f"{p.stem}:{t}:{f}" for p, t, f, _ in EXCERPTS])
def test_the_lines_a_chapter_shows_are_still_in_the_code(path, target, first, last):
    """An edit that removes a shown line fails here, not only when the chapter runs."""
    from pargrad.book.display import show_lines

    show_lines(eval(target, chapter_namespace(path)), first, last)  # noqa: S307


def documented_objects():
    """(qualified name, docstring) of every pargrad module, class and function."""
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        yield name, ast.get_docstring(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield f"{name}.{node.name}", ast.get_docstring(node)


def test_quoted_in_reads_titles_across_lines():
    doc = 'Does x.  Taught in the chapters "Synchronous\n    training" and "Devices".  "Not" a title.'
    assert quoted_in(doc, "Taught in the chapter") == ["Synchronous training", "Devices"]


def test_every_named_chapter_exists():
    titles = set(TITLES.values())
    wrong = [(name, title) for name, doc in documented_objects()
             for opening in ("Taught in the chapter", "Shown in the chapter")
             for title in quoted_in(doc, opening) if title not in titles]
    assert not wrong, f"docstrings name chapters that do not exist (titles: {sorted(titles)}): {wrong}"


# -- the one map ----------------------------------------------------------------

def test_the_readme_maps_every_module():
    """The README's tables are the package's one hand-kept map: every module is in them."""
    readme = (ROOT / "README.md").read_text()
    modules = [path for path in sorted(PACKAGE.rglob("*.py")) if not path.stem.startswith("_")]
    missing = [module_name(path) for path in modules if f"`{path.stem}`" not in readme]
    assert not missing, f"add these modules to the README's map: {missing}"
    assert len(readme.splitlines()) <= 110, "the README is read in five minutes; keep it short"
