"""pargrad: the code of the book on synchronous and asynchronous parallel training.

Importing pargrad imports TensorFlow without its native start-up messages.
"""

from pargrad._quiet import import_tensorflow_quietly

import_tensorflow_quietly()

from pargrad import cost, digits, race, tf1  # noqa: E402
from pargrad.accumulate import GradientAccumulator, peak_memory  # noqa: E402
from pargrad.asynchronous import AsyncTrainer, lost_updates, random_delay  # noqa: E402
from pargrad.book import show_source  # noqa: E402
from pargrad.cluster import (  # noqa: E402
    ClusterError,
    ClusterTimeoutError,
    LocalCluster,
    run_cluster,
    tf_config,
)
from pargrad.numerics import rounding_tolerance, unit_roundoff  # noqa: E402
from pargrad.multiworker import train_parabola_multiworker  # noqa: E402
from pargrad.parameter_server import parameter_server_strategy, train_parameter_server  # noqa: E402
from pargrad.devices import DevicesAlreadyInitializedError, logical_devices  # noqa: E402
from pargrad.parabola import (  # noqa: E402
    add_layer,
    fit_one_device,
    initial_weights,
    parabola_data,
    parabola_forward,
    parabola_model,
    squared_error,
)
from pargrad.sync import (  # noqa: E402
    DevicesNotReadyError,
    SyncHistory,
    SyncTrainer,
    backup_worker_mask,
    choose_cross_device_ops,
    ring_all_reduce,
    squared_error_per_example,
    sync_step_times,
    sync_strategy,
    train_parabola,
)

__version__ = "0.1.0"
