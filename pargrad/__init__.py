"""pargrad: the code of the book on synchronous and asynchronous parallel training.

Two layers.  The library, the modules at the top of the package, is what a
reader takes home; :mod:`pargrad.book` holds the book's instruments (tasks,
races, demos, figures, stored data), imports the library and is never
imported by it.  The README's table is the map of both.  The names below,
``__all__``, are the library's public names; a chapter imports the book's
from their home (``from pargrad.book.parabola import parabola_data``).

Importing pargrad imports TensorFlow without its native start-up messages.
"""

from pargrad import _quiet

_quiet.import_tensorflow_quietly()

from pargrad import cost, memory, tf1  # noqa: E402, F401  (modules a reader uses: pargrad.cost, pargrad.memory, pargrad.tf1)
from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.allreduce import ring_all_reduce, ring_bytes  # noqa: E402
from pargrad.asynchronous import AsyncHistory, AsyncTrainer  # noqa: E402
from pargrad.cluster import (  # noqa: E402
    ClusterError,
    ClusterTimeoutError,
    LocalCluster,
    run_cluster,
    tf_config,
)
from pargrad.devices import DevicesAlreadyInitializedError, logical_devices  # noqa: E402
from pargrad.local_sgd import LocalSGDHistory, LocalSGDTrainer  # noqa: E402
from pargrad.numerics import rounding_tolerance, unit_roundoff  # noqa: E402
from pargrad.scenario import Scenario, random_delay  # noqa: E402
from pargrad.sharded import ShardedHistory, ShardedTrainer  # noqa: E402
from pargrad.strategies import DevicesNotReadyError, choose_cross_device_ops, sync_strategy  # noqa: E402
from pargrad.sync import SyncHistory, SyncTrainer  # noqa: E402
from pargrad.data import NonFiniteDataError  # noqa: E402
from pargrad.losses import (  # noqa: E402
    NonFiniteLossError,
    per_example_loss,
    squared_error_per_example,
)

__all__ = [
    "AsyncHistory",
    "AsyncTrainer",
    "ClusterError",
    "ClusterTimeoutError",
    "DevicesAlreadyInitializedError",
    "DevicesNotReadyError",
    "GradientAccumulator",
    "LocalCluster",
    "LocalSGDHistory",
    "LocalSGDTrainer",
    "NonFiniteDataError",
    "NonFiniteLossError",
    "Scenario",
    "ShardedHistory",
    "ShardedTrainer",
    "SyncHistory",
    "SyncTrainer",
    "choose_cross_device_ops",
    "logical_devices",
    "per_example_loss",
    "random_delay",
    "ring_all_reduce",
    "ring_bytes",
    "rounding_tolerance",
    "run_cluster",
    "squared_error_per_example",
    "sync_strategy",
    "tf_config",
    "unit_roundoff",
]

__version__ = "0.1.0"
