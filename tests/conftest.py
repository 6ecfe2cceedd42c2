"""Unit tests share one process: split the CPU (or GPU) into 4 logical devices first.

Tests that need another split run in a subprocess: the ``run_python`` fixture.
"""

import collections
import functools
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pargrad
import tensorflow as tf
from pargrad.book.parabola import fit_one_device, parabola_data

DEVICES = pargrad.logical_devices(4)
# The tests compare float32 runs within float32 rounding; on Ampere and newer
# GPUs TensorFlow would run float32 matrix products in TF32 (about 1e-3
# relative error).  No effect on CPUs.
tf.config.experimental.enable_tensor_float_32_execution(False)


@pytest.fixture(scope="module")
def deterministic_ops():
    """Deterministic kernels for a module whose tests compare runs bit for bit.

    On a CPU TensorFlow's kernels already add in a fixed order; on a GPU
    some (a bias's or a convolution's gradient) may not, unless op
    determinism is on.  It is switched off again after the module, because
    it makes ``tf.timestamp`` raise, which the book's instrumented trainer
    uses.  TensorFlow's public API can only switch it on, hence the private
    ``disable_op_determinism``.

    Grappler's arithmetic optimizer is off too: it may regroup an ``add_n``
    of several replicas' values, and which grouping it picks can depend on
    the order in which the replicas' threads built the graph, so a sum came
    out one ulp apart in one CI run of ``test_sharded.py`` out of four.
    With it off, every sum adds in the order the code writes.
    """
    from tensorflow.python.framework import config

    before = tf.config.optimizer.get_experimental_options()
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    yield
    config.disable_op_determinism()
    tf.config.optimizer.set_experimental_options(
        {"arithmetic_optimization": before.get("arithmetic_optimization", True)})


def _run_python(code, timeout=120, env=None):
    """Run ``code`` in a fresh Python process; return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )


@pytest.fixture
def devices():
    """The four logical devices of the test session."""
    return DEVICES


# The float64 parabola run on one device with the full batch: the reference that
# tests/test_sync.py and tests/test_sync_cluster.py compare 2000 steps of SyncTrainer with.
REFERENCE_STEPS = 2000


@pytest.fixture(scope="session")
def parabola_reference():
    """The y = x² network on one device, full batch of 50, float64, REFERENCE_STEPS steps at
    Keras's float32 learning rate 1e-2 (kept in float32 even for a float64 model): (losses, weights)."""
    x, y = parabola_data(dtype="float64")
    return fit_one_device(x, y, steps=REFERENCE_STEPS, learning_rate=float(np.float32(1e-2)), seed=0)


@pytest.fixture
def run_python():
    """``run_python(code, timeout=120, env=None)``: run code in a fresh process."""
    return _run_python


# -- make test runs two pytest workers (pytest-xdist) ------------------------------------------------
#
# The Makefile's first pass runs everything not marked `timing` in two worker processes
# (-n 2 --dist loadfile); its second pass runs the `timing` items alone, one at a time, with no
# other test process beside them.  Which items go where comes from their marks (pyproject.toml
# declares them), set where the tests are; a chapter's marks from tools/marks.py (a notebook
# cannot carry a mark):
#
# * timing (`@pytest.mark.timing` on a test): an item that asserts on wall-clock time or a speed
#   ratio.  Beside another test process it would measure the other process too, so it runs in
#   the serial pass.
# * clusters (`pytestmark = pytest.mark.clusters` in a test file): the file starts multi-process
#   clusters on 127.0.0.1.  Every other file is one unit of work, run by one worker in order (a
#   notebook's cells share one kernel, a module's tests share its module fixtures and state);
#   the cluster files are one unit together, so two clusters never start at the same moment,
#   and the 3 to 5 processes of one cluster never share two cores with those of another.
#   tests/repository/test_marks.py fails when a file that starts a cluster lacks the mark.
#   The scheduler runs in pytest-xdist's controller, which sees node ids, not items: it reads a
#   file's `pytestmark` from its source (tools/marks.py).
#   (pytest-xdist's own xdist_group marks do not work with pytest 9: xdist 3.8 renames
#   `item._nodeid`, which pytest 9 no longer reads; hence a scheduler of our own.)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load_marks():
    spec = importlib.util.spec_from_file_location("marks", ROOT / "tools" / "marks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


marks = _load_marks()
marks_of_file = functools.lru_cache(maxsize=None)(marks.marks_of)


# Handed out first (the workers take units in collection order, --no-loadscope-reorder): the
# cluster unit, the notebooks and the claim files, the longest units; then the other files,
# those with most items first, so that short test files fill the end of the run on both workers.
FIRST = ["clusters", "chapters/", "tests/claims/"]


def _unit(nodeid):
    """The unit of work of an item: its file, or "clusters"."""
    file = nodeid.split("::", 1)[0]
    return "clusters" if "clusters" in marks_of_file(file) else file


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        if file.endswith(".ipynb"):
            item.add_marker(pytest.mark.notebook)
            for mark in sorted(marks.marks_of(file)):
                item.add_marker(getattr(pytest.mark, mark))

    sizes = collections.Counter(_unit(item.nodeid) for item in items)

    def rank(item):
        unit = _unit(item.nodeid)
        first = next((i for i, prefix in enumerate(FIRST) if unit.startswith(prefix)), None)
        if first is not None:
            return first, 0, ""
        return len(FIRST), -sizes[unit], unit

    items.sort(key=rank)  # stable: the order within a file (a notebook's cells) is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the files marked `clusters` as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileAndClusters(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return _unit(nodeid)

    return LoadFileAndClusters(config, log)


# Under xdist every worker takes the ports of the clusters it starts from its own block below
# the kernel's ephemeral range (32768-60999 here, where bind(0), and so Jupyter kernels and
# pargrad.cluster.free_ports, pick ports): a port chosen and released by one worker, not yet
# bound by its cluster's processes, cannot be chosen by the other worker's kernels.  Only the
# choice is replaced (LocalCluster's own port handling, and pargrad.cluster.free_ports itself
# in tests/test_cluster.py, are tested unchanged); without xdist nothing changes.
PORTS_FROM, PORTS_A_WORKER = 20000, 1000


def _worker_index():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


if _worker_index() is not None and _worker_index() < 12:
    import itertools
    import socket

    import pargrad.cluster

    _LOW = PORTS_FROM + PORTS_A_WORKER * _worker_index()
    _NEXT = itertools.cycle(range(_LOW, _LOW + PORTS_A_WORKER))

    def _free_ports_of_this_worker(n, host=pargrad.cluster.HOST):
        """``n`` distinct ports of this worker's block that are free on ``host`` right now."""
        ports = []
        for port in itertools.islice(_NEXT, PORTS_A_WORKER):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            ports.append(port)
            if len(ports) == n:
                return ports
        raise RuntimeError(f"fewer than {n} free ports in {_LOW}-{_LOW + PORTS_A_WORKER - 1}")

    pargrad.cluster.free_ports = _free_ports_of_this_worker
