"""pargrad: the code of the book on synchronous and asynchronous parallel training.

Two layers.  The library, at the top of the package, is what a reader takes
home: :mod:`pargrad.devices`, :mod:`pargrad.sync`,
:mod:`pargrad.asynchronous`, :mod:`pargrad.accumulate`, :mod:`pargrad.tf1`,
:mod:`pargrad.cluster`, :mod:`pargrad.numerics`, :mod:`pargrad.cost`,
:mod:`pargrad.training`, :mod:`pargrad.checks`, :mod:`pargrad.data`,
:mod:`pargrad.loop`, :mod:`pargrad.strategies`, :mod:`pargrad.scenario`.  The
book's instruments (tasks, races, demos, figures, stored data) live in
:mod:`pargrad.book`, which imports the library and is never imported by it.
The names below are re-exported from both layers, so ``pargrad.X`` is all a
chapter needs; the book's are loaded on first use (module ``__getattr__``),
so a cluster worker never imports matplotlib or IPython.

Importing pargrad imports TensorFlow without its native start-up messages.
"""

from pargrad._quiet import import_tensorflow_quietly

import_tensorflow_quietly()

# -- the library --------------------------------------------------------------
from pargrad import cost, tf1  # noqa: E402
from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.asynchronous import AsyncTrainer  # noqa: E402
from pargrad.cluster import (  # noqa: E402
    ClusterError,
    ClusterTimeoutError,
    LocalCluster,
    run_cluster,
    tf_config,
)
from pargrad.devices import DevicesAlreadyInitializedError, logical_devices  # noqa: E402
from pargrad.local_sgd import LocalSGDHistory, LocalSGDTrainer, ring_bytes  # noqa: E402
from pargrad.numerics import rounding_tolerance, unit_roundoff  # noqa: E402
from pargrad.scenario import Scenario, random_delay  # noqa: E402
from pargrad.training import NonFiniteDataError, NonFiniteLossError, per_example_loss  # noqa: E402
from pargrad.strategies import DevicesNotReadyError, choose_cross_device_ops, sync_strategy  # noqa: E402
from pargrad.allreduce import ring_all_reduce  # noqa: E402
from pargrad.sync import SyncHistory, SyncTrainer  # noqa: E402
from pargrad.training import squared_error_per_example  # noqa: E402

# -- the book's instruments, loaded on first use ---------------------------------
# A cluster worker (python -m pargrad.cluster) imports pargrad but needs none of
# the book, whose figures import matplotlib and IPython: pargrad.race,
# pargrad.InstrumentedSyncTrainer etc. import pargrad.book only when first read.
_BOOK_MODULES = ("allreduce_timing", "compatibility", "digits", "instruments", "multiworker",
                 "parabola", "parameter_server", "plots", "race")
_BOOK_NAMES = {
    "pargrad.book": ("show_lines", "show_source"),
    "pargrad.book.accumulation_memory": ("peak_memory",),
    "pargrad.book.lost_updates": ("lost_updates",),
    "pargrad.book.instruments": ("InstrumentedSyncTrainer", "backup_worker_mask",
                                 "sync_step_times"),
    "pargrad.book.multiworker": ("train_parabola_multiworker",),
    "pargrad.book.parabola": ("add_layer", "fit_one_device", "initial_weights", "parabola_data",
                              "parabola_forward", "parabola_model", "squared_error",
                              "train_parabola"),
    "pargrad.book.parameter_server": ("parameter_server_strategy", "train_parameter_server"),
}
_BOOK_HOME = {name: module for module, names in _BOOK_NAMES.items() for name in names}


def __getattr__(name):
    """The book's modules and names (``pargrad.race``, ``pargrad.parabola_model``), on first use."""
    import importlib

    if name in _BOOK_MODULES:
        value = importlib.import_module(f"pargrad.book.{name}")
    elif name in _BOOK_HOME:
        value = getattr(importlib.import_module(_BOOK_HOME[name]), name)
    else:
        raise AttributeError(f"module 'pargrad' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_BOOK_MODULES) | set(_BOOK_HOME))


__version__ = "0.1.0"
