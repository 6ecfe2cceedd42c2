"""pargrad: the code of the book on synchronous and asynchronous parallel training.

Two layers.  The library, at the top of the package, is what a reader takes
home: :mod:`pargrad.devices`, :mod:`pargrad.sync`,
:mod:`pargrad.asynchronous`, :mod:`pargrad.accumulate`, :mod:`pargrad.tf1`,
:mod:`pargrad.cluster`, :mod:`pargrad.numerics`, :mod:`pargrad.cost`,
:mod:`pargrad.training`, :mod:`pargrad.checks`, :mod:`pargrad.scenario`.  The
book's instruments (tasks, races, demos, figures, stored data) live in
:mod:`pargrad.book`, which imports the library and is never imported by it.
The names below are re-exported from both layers, so ``pargrad.X`` is all a
chapter needs.

Importing pargrad imports TensorFlow without its native start-up messages.
"""

from pargrad._quiet import import_tensorflow_quietly

import_tensorflow_quietly()

# -- the library --------------------------------------------------------------
from pargrad import cost, tf1  # noqa: E402
from pargrad.accumulate import GradientAccumulator, peak_memory  # noqa: E402
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
from pargrad.sync import (  # noqa: E402
    DevicesNotReadyError,
    SyncHistory,
    SyncTrainer,
    choose_cross_device_ops,
    ring_all_reduce,
    squared_error_per_example,
    sync_strategy,
)

# -- the book's instruments ---------------------------------------------------
from pargrad.book import (  # noqa: E402  (the modules, as pargrad.race etc. before)
    allreduce_timing,
    compatibility,
    digits,
    instruments,
    multiworker,
    parabola,
    parameter_server,
    plots,
    race,
    show_lines,
    show_source,
)
from pargrad.book.instruments import (  # noqa: E402
    InstrumentedSyncTrainer,
    backup_worker_mask,
    sync_step_times,
)
from pargrad.book.lost_updates import lost_updates  # noqa: E402
from pargrad.book.multiworker import train_parabola_multiworker  # noqa: E402
from pargrad.book.parabola import (  # noqa: E402
    add_layer,
    fit_one_device,
    initial_weights,
    parabola_data,
    parabola_forward,
    parabola_model,
    squared_error,
    train_parabola,
)
from pargrad.book.parameter_server import parameter_server_strategy, train_parameter_server  # noqa: E402

__version__ = "0.1.0"
