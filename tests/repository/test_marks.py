"""The `clusters` and `timing` marks are where the tests are, and nothing else names them.

A test file that starts a multi-process cluster (it calls ``LocalCluster``,
``run_cluster`` or a pargrad function that does) carries
``pytestmark = pytest.mark.clusters``; a chapter that does is marked
``clusters`` in tools/marks.py.  tests/conftest.py's scheduler reads the
marks (through tools/marks.py) and names no test; the Makefile takes its
chapter lists from tools/marks.py.
"""

import ast
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import marks  # noqa: E402  (tools/ is no package)

sys.path.remove(str(ROOT / "tools"))

TEST_FILES = sorted(path for path in (ROOT / "tests").rglob("test_*.py"))
CHAPTER_SOURCES = sorted((ROOT / "chapters").glob("*.py"))
STARTERS = {"LocalCluster", "run_cluster"}


def used_names(tree):
    """Every name a module uses: bare names, attributes (``x.name``) and imported names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names


def called_names(function):
    """The names a function calls (``f(...)``, ``x.f(...)``)."""
    return {node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            for node in ast.walk(function) if isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))}


def cluster_starters():
    """LocalCluster, run_cluster, and every pargrad function that calls one of them (at any depth)."""
    functions = {}
    for path in sorted((ROOT / "pargrad").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                functions.setdefault(node.name, set()).update(called_names(node))
    starters = set(STARTERS)
    while True:
        more = {name for name, calls in functions.items() if calls & starters} - starters
        if not more:
            return starters
        starters |= more


STARTING = cluster_starters()


def starts_clusters(path):
    return bool(used_names(ast.parse(path.read_text(), filename=str(path))) & STARTING)


def file_marks(path):
    """The marks of a test file's ``pytestmark``, as tests/conftest.py's scheduler reads them."""
    return marks.marks_of(path.relative_to(ROOT))


def test_the_finder_knows_the_books_cluster_helpers():
    assert {"LocalCluster", "run_cluster", "kill_worker_after_its_update"} <= STARTING
    assert "SyncTrainer" not in STARTING and "free_ports" not in STARTING


@pytest.mark.parametrize("path", [p for p in TEST_FILES if starts_clusters(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_test_file_that_starts_clusters_is_marked_clusters(path):
    assert "clusters" in file_marks(path), (
        f"{path.relative_to(ROOT)} starts clusters: add `pytestmark = pytest.mark.clusters` "
        "below its imports (or move its cluster tests to a test_<module>_cluster.py that has it)")


def test_a_file_marked_clusters_starts_clusters():
    stale = [str(p.relative_to(ROOT)) for p in TEST_FILES
             if "clusters" in file_marks(p) and not starts_clusters(p)]
    assert not stale, f"marked clusters but starting none (remove the mark): {stale}"


def test_a_cluster_file_is_marked_clusters():
    """test_X_cluster.py holds X's tests that start clusters (tests/repository/test_layout.py)."""
    unmarked = [str(p.relative_to(ROOT)) for p in TEST_FILES
                if p.stem.endswith("_cluster") and "clusters" not in file_marks(p)]
    assert not unmarked, f"add `pytestmark = pytest.mark.clusters` to {unmarked}"


def test_clusters_is_a_mark_of_files_not_of_tests():
    """The scheduler gives whole files to the cluster unit: it reads ``pytestmark`` only."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in TEST_FILES
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if line.lstrip().startswith("@pytest.mark.clusters")]
    assert not found, f"use `pytestmark = pytest.mark.clusters` in the file instead: {found}"


@pytest.mark.parametrize("path", CHAPTER_SOURCES, ids=lambda p: p.stem)
def test_a_chapter_that_starts_clusters_is_marked_clusters(path):
    marked = "clusters" in marks.marks_of(path.stem)
    assert marked == starts_clusters(path), (
        f"{path.name} {'starts' if starts_clusters(path) else 'starts no'} clusters: "
        f"{'add' if not marked else 'remove'} 'clusters' in tools/marks.py's MARKS")


def test_the_chapter_table_names_chapters_and_known_marks():
    assert set(marks.MARKS) <= set(marks.chapters()), (
        f"tools/marks.py names no chapter: {set(marks.MARKS) - set(marks.chapters())}")
    assert set().union(*marks.MARKS.values()) <= marks.KNOWN
    assert marks.marks_of("chapters/02_devices.ipynb") >= {"timing"}


def declared_marks():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {line.split(":")[0] for line in pyproject["tool"]["pytest"]["ini_options"]["markers"]}


def test_every_mark_used_is_declared():
    used = set(marks.KNOWN)
    for path in TEST_FILES:
        used |= set(re.findall(r"pytest\.mark\.(\w+)", path.read_text()))
    used -= {"parametrize", "usefixtures", "skip", "skipif", "xfail", "filterwarnings"}
    assert used <= declared_marks(), f"declare in pyproject.toml's markers: {used - declared_marks()}"


def test_the_conftest_names_no_test_and_no_chapter():
    strings = [node.value for node in ast.walk(ast.parse((ROOT / "tests" / "conftest.py").read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    named = [s for s in strings if re.search(r"\.py::\w|^(tests|chapters)/\S*\.(py|ipynb)$", s)]
    assert not named, f"tests/conftest.py names tests or files; mark them instead: {named}"


def test_the_makefile_names_no_chapter_by_hand():
    """Its lists of timed and order-free chapters come from tools/marks.py."""
    named = re.findall(r"chapters/\w+\.ipynb", (ROOT / "Makefile").read_text())
    assert not named, f"name these through tools/marks.py's marks: {named}"


def test_the_tool_prints_the_chapters_with_a_mark():
    def printed(*args):
        return subprocess.run([sys.executable, str(ROOT / "tools" / "marks.py"), *args],
                              capture_output=True, text=True, check=True).stdout.split()

    timed = printed("timing")
    assert "chapters/02_devices.ipynb" in timed
    assert sorted(timed + printed("--without", "timing")) == [
        f"chapters/{name}.ipynb" for name in marks.chapters()]
    completed = subprocess.run([sys.executable, str(ROOT / "tools" / "marks.py"), "slow"],
                               capture_output=True, text=True)
    assert completed.returncode != 0 and "unknown mark 'slow'" in completed.stderr


@pytest.mark.parametrize("mark", ["timing", "claim"])
def test_the_passes_that_grep_for_a_mark_find_every_marked_test_file(mark):
    """The Makefile's timing pass and its other-numerics run collect the files that contain
    `pytest.mark.timing` or `pytest.mark.claim` (grep), not the whole suite: a file that
    spells the mark another way would be left out."""
    other_spellings = [str(p.relative_to(ROOT)) for p in TEST_FILES
                       if re.search(rf"\bmark\.{mark}\b|\b{mark}\b\s*=\s*pytest", p.read_text())
                       and f"pytest.mark.{mark}" not in p.read_text()]
    assert not other_spellings, f"write the mark as @pytest.mark.{mark} in {other_spellings}"
    assert (f"grep -rl --include='test_*.py' 'pytest.mark.{mark}' tests"
            in (ROOT / "Makefile").read_text())
