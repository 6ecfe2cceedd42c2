"""Every program the book offers to copy runs as copied.

A program is a code cell tagged ``program`` (CONTRIBUTING.md): one
self-contained cell, its imports, its data, its training, and a last line
that prints the number that proves it.  Each runs alone in a fresh
interpreter (this one's ``sys.executable``), from an empty directory, and
must print exactly what the chapter stores for that cell.  It may import
the standard library and pargrad's declared dependencies, not pargrad
itself: a reader copies it into a Python without the book.  It prints only
what it says: run as a reader runs it (no ``TF_CPP_MIN_LOG_LEVEL`` in the
environment), its stderr holds no TensorFlow log line, because a program
that imports TensorFlow silences the logs itself, in the two lines a reader
would write (``import os``; ``os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"``
before the import).
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

# make test-other-numerics leaves it out: nbval compares these outputs in the chapters there
# (tests/repository/test_other_numerics.py).
pytestmark = pytest.mark.order_free

ROOT = pathlib.Path(__file__).resolve().parents[2]

NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
TAG = "program"
# The budget for running every program, in processor seconds (user + system) of the
# programs' processes: unlike the wall clock, it does not grow when other jobs share the cores.
# The eight programs took 62 on an idle two-core machine, each about 4 of them starting
# TensorFlow; the budget leaves room for a slower CPU, not for a ninth program of the same size.
CPU_SECONDS_IN_ALL = 80

# A TensorFlow log line: absl's ("I0000 00:00:...  file.cc:12] ..."), the older
# "2025-01-01 12:00:00.0: I file.cc:12] ...", and the continuation of the CPU notice.
TF_LOG_LINE = re.compile(r"^(?:[IWEF]\d{4} |\d{4}-\d\d-\d\d [\d:.]+: [IWEF] |To enable the following "
                         r"instructions)")
# Printed while TensorFlow loads, before it reads TF_CPP_MIN_LOG_LEVEL: the CUDA notice on a
# machine without CUDA drivers (tensorflow/tensorflow#100442) and, on some x86 CPUs, the
# oneDNN notice (seen with the level set to 3 before the import): no program can silence
# them by the log level (TF_ENABLE_ONEDNN_OPTS=0 would change the numerics instead).
UNSILENCEABLE = re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers|"
                           r"port\.cc:\d+\] oneDNN custom operations are on|"
                           r"^WARNING: All log messages before absl::InitializeLog\(\)")


def tensorflow_log_lines(stderr):
    """The lines of ``stderr`` that TensorFlow logged and the program could have silenced."""
    return [line for line in stderr.splitlines()
            if TF_LOG_LINE.match(line) and not UNSILENCEABLE.search(line)]


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
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")}   # as a reader runs it
    env.update(MPLBACKEND="Agg")
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
    logged = tensorflow_log_lines(run.stderr)
    assert not logged, (f"{notebook.name}, program {index}: TensorFlow logs {len(logged)} lines, "
                        f"first {logged[0]!r}; set os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3' "
                        "before importing TensorFlow (or keras)")


def test_tensorflow_log_lines_are_told_from_the_unsilenceable_ones():
    stderr = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1796611750.450174   12286 cudart_stub.cc:31] Could not find cuda drivers "
        "on your machine, GPU will not be used.\n"
        "I0000 00:00:1796626112.645521   26524 port.cc:153] oneDNN custom operations are on. "
        "You may see slightly different numerical results\n"
        "I0000 00:00:1796611750.641442   12286 cpu_feature_guard.cc:227] This TensorFlow binary "
        "is optimized\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild\n"
        "2025-09-17 14:44:05.176998: E external/local_xla/cuda_fft.cc:467] Unable to register\n"
        "a line the program printed itself\n")
    assert [line[:12] for line in tensorflow_log_lines(stderr)] == [
        "I0000 00:00:", "To enable th", "2025-09-17 1"]


def test_programs_run_within_their_budget():
    if len(ELAPSED) < len(PROGRAMS):
        pytest.skip("the programs did not all run in this session")
    assert sum(ELAPSED) < CPU_SECONDS_IN_ALL, (
        f"the programs took {sum(ELAPSED):.0f} processor seconds in all")
