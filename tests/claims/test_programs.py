"""Every program the book offers to copy runs as copied.

A program is a code cell tagged ``program`` (CONTRIBUTING.md): one
self-contained cell, its imports, its data, its training, and a last line
that prints the number that proves it.  Each runs alone in a fresh
interpreter (this one's ``sys.executable``), from an empty directory, and
must print exactly what the chapter stores for that cell.  It may import
the standard library and pargrad's declared dependencies, not pargrad
itself: a reader copies it into a Python without the book.
"""

import ast
import functools
import importlib.metadata
import os
import pathlib
import re
import resource
import subprocess
import sys
import tomllib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
TAG = "program"
# The budget for running every program, in processor seconds (user + system) of the
# programs' processes: unlike the wall clock, it does not grow when other jobs share the cores.
# The eight programs took 62 on an idle two-core machine, each about 4 of them starting
# TensorFlow; the budget leaves room for a slower CPU, not for a ninth program of the same size.
CPU_SECONDS_IN_ALL = 80


def programs():
    """``(notebook, index among the notebook's programs, cell)`` for every cell tagged program."""
    found = []
    for notebook in NOTEBOOKS:
        cells = [cell for cell in nbformat.read(notebook, as_version=4).cells
                 if cell.cell_type == "code" and TAG in cell.metadata.get("tags", [])]
        found.extend((notebook, index, cell) for index, cell in enumerate(cells))
    return found


PROGRAMS = programs()
IDS = [f"{notebook.stem}-{index}" for notebook, index, _ in PROGRAMS]
ELAPSED = []


@functools.cache
def declared_modules():
    """Import names of the distributions pyproject.toml declares (not pargrad itself)."""
    normal = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {normal(re.split(r"[ <>=!~;\[]", requirement, maxsplit=1)[0])
              for requirement in project["dependencies"]}
    return {module for module, distributions in importlib.metadata.packages_distributions().items()
            if any(normal(d) in wanted for d in distributions)}


def stored_stdout(cell):
    return "".join(output.get("text", "") for output in cell.outputs
                   if output.output_type == "stream" and output.name == "stdout")


def imported_modules(source):
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_book_has_programs_to_copy():
    chapters = {notebook.stem for notebook, _, _ in PROGRAMS}
    assert {"03_synchronous", "04_asynchronous", "06_accumulation_tf1",
            "07_accumulation_tf2"} <= chapters


@pytest.mark.parametrize("notebook, index, cell", PROGRAMS, ids=IDS)
def test_program_imports_only_what_a_reader_has(notebook, index, cell):
    allowed = declared_modules() | set(sys.stdlib_module_names)
    extra = imported_modules(cell.source) - allowed
    assert not extra, (f"{notebook.name}, program {index}: imports {sorted(extra)}; a program "
                       "to copy uses only the standard library and pargrad's dependencies")


@pytest.mark.claim
@pytest.mark.parametrize("notebook, index, cell", PROGRAMS, ids=IDS)
def test_program_runs_alone_and_prints_its_stored_proof(notebook, index, cell, tmp_path):
    stored = stored_stdout(cell)
    assert stored.strip(), f"{notebook.name}, program {index}: its last line must print the proof"
    script = tmp_path / "program.py"
    script.write_text(cell.source + "\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", MPLBACKEND="Agg")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ELAPSED.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    assert run.returncode == 0, f"{notebook.name}, program {index} failed:\n{run.stderr[-3000:]}"
    printed = run.stdout.rstrip("\n").splitlines()
    expected = stored.rstrip("\n").splitlines()
    assert printed[-1:] == expected[-1:], (
        f"{notebook.name}, program {index}: the proof line differs from the page's")
    assert printed == expected, f"{notebook.name}, program {index}: output differs from the page's"


def test_programs_run_within_their_budget():
    if len(ELAPSED) < len(PROGRAMS):
        pytest.skip("the programs did not all run in this session")
    assert sum(ELAPSED) < CPU_SECONDS_IN_ALL, (
        f"the programs took {sum(ELAPSED):.0f} processor seconds in all")
