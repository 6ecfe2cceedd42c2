"""The file-level pytest marks of test files and chapters: ``python tools/marks.py timing``.

A test file sets its marks itself (``pytestmark = pytest.mark.clusters``,
read here from its source: pytest-xdist's controller, which schedules files,
sees node ids, not items).  A notebook cannot carry a pytest mark, so a
chapter's marks are declared here, in MARKS, each with its reason.
tests/conftest.py gives a chapter's nbval items these marks and schedules by
``marks_of``; the Makefile derives its chapter lists from them
(``python tools/marks.py MARK`` prints the chapters with MARK,
``--without MARK`` the others); tests/repository/test_marks.py checks the
marks against the files (a file or chapter that starts a cluster must be
marked ``clusters``).

The marks (pyproject.toml declares them):

* ``timing``: the chapter times work and asserts on the times or their ratios;
  it runs alone, never beside another test process or chapter.
* ``clusters``: the chapter starts multi-process clusters on 127.0.0.1; it is
  in the one unit of work that runs every cluster-starting file in turn.
* ``order_free``: another order of additions (``make test-other-numerics``:
  no oneDNN, one thread an operation) cannot change its checked outputs, so
  that run leaves it out.  A test file may carry it too (``pytestmark``) when
  that run checks its claim items' outputs elsewhere
  (tests/repository/test_other_numerics.py checks the reason).
"""

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"

MARKS = {
    # device lists and timings
    "02_devices": {"timing", "order_free"},
    "03_synchronous": {"clusters"},
    # it reads stored races
    "05_sync_vs_async": {"order_free"},
    "09_beyond_one_machine": {"clusters"},
    # timings, and a cost model in Python floats
    "10_communication_costs": {"timing", "clusters", "order_free"},
    # float64 NumPy replays; their TensorFlow side (the trainer against the
    # replay, the handover across processes) is claim-marked in
    # tests/book/test_rare_communication.py
    "11_communicating_rarely": {"clusters", "order_free"},
    # its equalities are bit for bit between two runs of the same kernels (the
    # sharded and the mirrored one) under any numerics; tests/test_sharded.py's
    # claim tests re-run them under other numerics; its byte counts are integers
    "12_sharded_training": {"order_free"},
    # which APIs run
    "a2_compatibility": {"clusters", "order_free"},
    # its many-seed results are float64 NumPy replays; its TensorFlow side,
    # AsyncTrainer against the replay and against the delayed recursion, is
    # claim-marked in tests/book/test_parabola_async.py
    "d2_stale_gradients_in_depth": {"order_free"},
    # float64 NumPy replays, as "Communicating rarely"
    "d5_rare_communication_in_depth": {"order_free"},
    # timings, and a cost model in Python floats
    "d6_communication_in_depth": {"timing", "order_free"},
}

KNOWN = {"timing", "clusters", "order_free"}


def chapters():
    """Every executed chapter's name (``02_devices``), sorted."""
    return sorted(path.stem for path in CHAPTERS.glob("*.ipynb"))


def file_marks(path):
    """The marks a test file's ``pytestmark = ...`` sets on all its tests, read from its source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            values = [v.func if isinstance(v, ast.Call) else v for v in values]  # usefixtures(...)
            return {v.attr for v in values
                    if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Attribute)
                    and v.value.attr == "mark"}
    return set()


def marks_of(path):
    """The file-level marks of a chapter (``chapters/02_devices.ipynb``, its .py, or its name
    ``02_devices``) or of a test file (``tests/test_sync.py``), relative to the repository."""
    path = pathlib.Path(path)
    if path.suffix == ".py" and path.parts[:1] == ("tests",):
        return file_marks(ROOT / path) if (ROOT / path).exists() else set()
    return set(MARKS.get(path.stem, set()))


def main(argv):
    if len(argv) == 2 and argv[0] == "--without":
        without, mark = True, argv[1]
    elif len(argv) == 1:
        without, mark = False, argv[0]
    else:
        sys.exit("usage: python tools/marks.py [--without] MARK")
    if mark not in KNOWN:
        sys.exit(f"unknown mark {mark!r}; the chapters' marks are {sorted(KNOWN)}")
    print(" ".join(f"chapters/{name}.ipynb" for name in chapters()
                   if (mark in marks_of(name)) != without))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
