"""What `make test-other-numerics` runs is what another order of additions can change.

That run repeats the `claim` items and the chapters not marked ``order_free`` with
no oneDNN and one thread an operation.  Two kinds of work would be duplicated there:

* a `claim` item that computes what it checks without TensorFlow (float64 NumPy
  replays, Python floats): those settings change TensorFlow's kernels only.
  Every claim item must reach TensorFlow: its body, the module functions and
  fixtures it uses, or the pargrad and helper modules they name, import
  ``tensorflow`` or ``keras`` (read statically, from the sources);
* an item that compares a chapter cell's output with the stored one when the
  run compares that output itself (nbval on the chapter) or leaves the chapter
  out for its ``order_free`` reason.  Such a test file is marked ``order_free``
  (``pytestmark``), and the run leaves it out (``-m "... and not order_free"``);
  every item marked ``order_free`` still runs in the first pass.

tests/claims/test_programs.py is the one such file (a test below fails for
another): each program's stored output is compared by nbval in its chapter,
which nbval must therefore compare (no ``nbval-ignore-output``, ``nbval-skip``
or ``raises-exception`` tag), or left out for its chapter's ``order_free`` reason.
"""

import ast
import functools
import pathlib
import re
import sys
import textwrap

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import marks  # noqa: E402  (tools/ is no package)

sys.path.remove(str(ROOT / "tools"))

TEST_FILES = sorted((ROOT / "tests").rglob("test_*.py"))
NUMERIC_ROOTS = {"tensorflow", "keras"}
# Importing one of these is running TensorFlow's kernels.
MAKEFILE = (ROOT / "Makefile").read_text()


# -- where a name is defined --------------------------------------------------------------

def module_path(name):
    """The source of a project module (``pargrad.book.replay``, a tests/ helper such as
    ``sync_problem``), or None for a module from elsewhere."""
    parts = name.split(".")
    if parts[0] == "pargrad":
        base = ROOT.joinpath(*parts)
    elif len(parts) == 1 and (ROOT / "tests" / f"{name}.py").exists():
        base = ROOT / "tests" / name
    else:
        return None
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").exists() else None


@functools.cache
def parsed(path):
    return ast.parse(pathlib.Path(path).read_text(), filename=str(path))


def imported_modules(tree):
    """Every module an import statement anywhere in ``tree`` names: for ``from M import a``,
    ``M.a`` where that is a project module, else ``M``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                member = f"{node.module}.{alias.name}"
                names.add(member if module_path(member) else node.module)
    return names


def reaches_tensorflow(name, seen=None):
    """Whether module ``name`` as a whole may run TensorFlow: it or a project module it imports
    (at any depth) imports ``tensorflow`` or ``keras``.  A package's ``__init__`` counts only
    where the package itself is imported (pargrad's imports TensorFlow, so every import of a
    pargrad module does, but a module's computation uses what its own imports bring)."""
    if name.split(".")[0] in NUMERIC_ROOTS:
        return True
    path = module_path(name)
    seen = set() if seen is None else seen
    if path is None or path in seen:
        return False
    seen.add(path)
    return any(reaches_tensorflow(module, seen) for module in imported_modules(parsed(path)))


def bindings(tree):
    """A module's top-level names: {name: ("module", dotted name) | ("def", node)}."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    "module", alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = ("module", f"{node.module}.{alias.name}")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound[node.name] = ("def", node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bound[name.id] = ("def", node)
    return bound


def name_uses_tensorflow(dotted, seen):
    """Whether what ``dotted`` names (``pargrad.book.replay.start``, ``tf.reduce_sum``,
    ``pargrad.logical_devices``) may run TensorFlow: a function or class of a project module
    is read itself (with what it uses), a module used whole as ``reaches_tensorflow`` says."""
    parts = dotted.split(".")
    if parts[0] in NUMERIC_ROOTS:
        return True
    for end in range(len(parts), 0, -1):
        path = module_path(".".join(parts[:end]))
        if path is None:
            continue
        if end == len(parts):
            return reaches_tensorflow(dotted)
        tree = parsed(path)
        kind, what = bindings(tree).get(parts[end], (None, None))
        if kind == "module":
            return name_uses_tensorflow(".".join([what, *parts[end + 1:]]), seen)
        if kind == "def":
            return uses_tensorflow(what, tree, {}, seen)
        return reaches_tensorflow(".".join(parts[:end]))
    return False   # NumPy, the standard library: not TensorFlow


def code_strings(node):
    """The string constants in ``node`` that are Python code with an import statement."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and "import" in sub.value:
            try:
                found.append(ast.parse(textwrap.dedent(sub.value)))
            except SyntaxError:
                pass
    return found


def uses_tensorflow(node, module_tree, fixtures, seen=None):
    """Whether the function (or class, or assignment) ``node`` of ``module_tree`` may run
    TensorFlow: an import in its body, a name it uses (of its module, or imported there) that
    may, or, for a test or a fixture, a fixture it takes (``fixtures``: name -> (node, tree))."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return False
    seen.add(id(node))
    bound = bindings(module_tree)
    if any(reaches_tensorflow(m) for m in imported_modules(node)):
        return True
    if any(reaches_tensorflow(m) for code in code_strings(node) for m in imported_modules(code)):
        return True   # code that it runs in a fresh process (the run_python fixture)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        takes_fixtures = node.name.startswith("test") or any(
            "fixture" in ast.unparse(d) for d in node.decorator_list)
        for arg in node.args.args if takes_fixtures else []:
            if arg.arg in fixtures:
                fixture, tree = fixtures[arg.arg]
                if uses_tensorflow(fixture, tree, fixtures, seen):
                    return True
        body = node.body
    else:
        body = [node]
    for part in body:
        bases = {id(sub.value) for sub in ast.walk(part) if isinstance(sub, ast.Attribute)}
        for sub in ast.walk(part):
            if isinstance(sub, ast.Attribute) and id(sub) not in bases:
                chain, value = [sub.attr], sub.value   # the whole chain: a.b.c
                while isinstance(value, ast.Attribute):
                    chain.insert(0, value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in bound:
                    kind, what = bound[value.id]
                    if kind == "module" and name_uses_tensorflow(".".join([what, *chain]), seen):
                        return True
                    if kind == "def" and uses_tensorflow(what, module_tree, fixtures, seen):
                        return True
            elif isinstance(sub, ast.Name) and id(sub) not in bases and sub.id in bound:
                kind, what = bound[sub.id]
                if kind == "module" and name_uses_tensorflow(what, seen):
                    return True
                if kind == "def" and uses_tensorflow(what, module_tree, fixtures, seen):
                    return True
    return False


def fixtures_of(*trees):
    """Every ``@pytest.fixture`` function of the trees: name -> (node, its module's tree)."""
    found = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                    "fixture" in ast.unparse(d) for d in node.decorator_list):
                found[node.name] = (node, tree)
    return found


CONFTEST = parsed(ROOT / "tests" / "conftest.py")


def claim_functions(path):
    """The test functions of a test file that are marked ``claim`` (on the function, or on
    every test of the file by ``pytestmark``)."""
    tree = parsed(path)
    everywhere = "claim" in marks.file_marks(path)
    return tree, [node for node in tree.body if isinstance(node, ast.FunctionDef)
                  and node.name.startswith("test")
                  and (everywhere or any(re.fullmatch(r"pytest\.mark\.claim(\(.*\))?", ast.unparse(d))
                                         for d in node.decorator_list))]


CLAIMS = [(path, node.name) for path in TEST_FILES for node in claim_functions(path)[1]]


@pytest.mark.parametrize("path, name", [c for c in CLAIMS if "order_free" not in marks.file_marks(c[0])],
                         ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, pathlib.Path) else v)
def test_a_claim_item_runs_tensorflow(path, name):
    tree, functions = claim_functions(path)
    function = next(f for f in functions if f.name == name)
    assert uses_tensorflow(function, tree, {**fixtures_of(CONFTEST), **fixtures_of(tree)}), (
        f"{path.relative_to(ROOT)}::{name} is marked claim but computes what it checks without "
        "TensorFlow (NumPy, Python floats): no oneDNN and one thread an operation cannot change "
        "it, so `make test-other-numerics` would only run it twice. Remove its claim mark "
        "(the first pass still runs it), or mark the TensorFlow test that it stands for")


def test_the_finder_tells_numpy_from_tensorflow():
    """The check above can fail: a NumPy replay does not reach TensorFlow, a trainer does."""
    source = (
        "import numpy as np\nimport pargrad\nfrom pargrad.book import replay\n"
        "from pargrad.local_sgd import LocalSGDTrainer\n"
        "def helper():\n    return LocalSGDTrainer\n"
        "def test_numpy():\n    assert replay.start([3]) and pargrad.rounding_tolerance('float64', 2)\n"
        "def test_trainer():\n    LocalSGDTrainer\n"
        "def test_through_a_helper():\n    helper()\n"
        "def test_through_the_package():\n    pargrad.logical_devices(4)\n"
        "def test_through_a_fixture(devices):\n    np.zeros(3)\n"
        "def test_importing_it():\n    import keras  # noqa: F401\n"
        "def test_in_a_fresh_process(run_python):\n    run_python('import pargrad.sync')\n"
        "def test_numpy_in_a_fresh_process(run_python):\n    run_python('import numpy')\n")
    tree = ast.parse(source)
    fixtures = fixtures_of(CONFTEST)
    used = {node.name: uses_tensorflow(node, tree, fixtures) for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}
    assert used == {"test_numpy": False, "test_trainer": True, "test_through_a_helper": True,
                    "test_through_the_package": True, "test_through_a_fixture": True,
                    "test_importing_it": True, "test_in_a_fresh_process": True,
                    "test_numpy_in_a_fresh_process": False}
    assert not name_uses_tensorflow("pargrad.book.replay.train_rounds", set())
    assert reaches_tensorflow("pargrad.sync") and name_uses_tensorflow("pargrad.SyncTrainer", set())


# -- the items left out because the run checks the same output elsewhere ------------------

def test_the_other_numerics_run_leaves_out_what_is_marked_order_free():
    assert re.search(r'test-other-numerics:.*\n.*-m "\(claim or notebook\) and not order_free"',
                     MAKEFILE)


def programs():
    """(chapter name, cell) for every cell tagged ``program`` (tests/claims/test_programs.py)."""
    return [(path.stem, cell) for path in sorted((ROOT / "chapters").glob("*.ipynb"))
            for cell in nbformat.read(path, as_version=4).cells
            if cell.cell_type == "code" and "program" in cell.metadata.get("tags", [])]


def test_programs_are_order_free_because_their_chapters_compare_their_output():
    """test_programs.py's claim items compare each program's output with its chapter's stored
    one; the other-numerics run leaves them out: nbval compares the same output in the chapter,
    or the chapter is order_free, a reason that covers its every checked output."""
    assert "order_free" in marks.file_marks(ROOT / "tests" / "claims" / "test_programs.py")
    numeric = {name for name in marks.chapters() if "order_free" not in marks.marks_of(name)}
    found = programs()
    assert found
    for chapter, cell in found:
        tags = set(cell.metadata.get("tags", []))
        assert not tags & {"nbval-ignore-output", "nbval-skip", "raises-exception"}, (
            f"{chapter}: a program whose output nbval does not compare; remove "
            "`pytestmark = pytest.mark.order_free` from tests/claims/test_programs.py")
    # the chapters of the programs run there under nbval, but for chapter 12 (order_free:
    # tests/test_sharded.py's claim items re-run its bit-for-bit equality)
    assert {chapter for chapter, _ in found} - numeric <= {
        name for name in marks.chapters() if "order_free" in marks.marks_of(name)}


def test_every_test_file_marked_order_free_has_its_reason_checked_here():
    marked = {str(path.relative_to(ROOT)) for path in TEST_FILES
              if "order_free" in marks.file_marks(path)}
    assert marked == {"tests/claims/test_programs.py"}, (
        f"{sorted(marked)}: a test file marked order_free needs a test here that checks why "
        "`make test-other-numerics` may leave it out (as the programs' test above)")
