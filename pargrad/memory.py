"""What training holds in memory on each device: the formula, and the bytes TensorFlow holds.

Taught in the chapter "When the model does not fit".  Data parallelism keeps
a full copy of the weights, the gradients and the optimizer state on every
device; sharded data parallelism (ZeRO, Rajbhandari et al. 2019; FSDP in
PyTorch) keeps 1/N of some of them on each of N devices:

=====  ==================================================  ======================
stage  sharded over the N replicas                         held whole on each
=====  ==================================================  ======================
0      nothing (plain data parallelism, ``SyncTrainer``)   everything
1      optimizer state (and master weights, if any)        parameters, gradients
2      optimizer state (and master weights), gradients     parameters
3      everything                                          nothing
=====  ==================================================  ======================

:func:`state_bytes` is the formula (bytes per device, one function, which
the chapter's calculator repeats in JavaScript bit for bit);
:func:`sharded_components` says which components a stage shards;
:func:`bytes_by_device` counts what a trainer actually holds, by walking its
variables and grouping them by device; :func:`peak_bytes_by_device` reads each
logical GPU's peak where TensorFlow can (not on a CPU).

Bytes a parameter (``precision``):

* ``"float32"`` / ``"float64"``: parameters and gradients 4 / 8 bytes; the
  optimizer state in the same precision (Adam's two moments 2 x, momentum
  1 x, plain SGD none).
* ``"mixed"``: parameters and gradients in float16/bfloat16 (2 + 2 bytes),
  and a float32 *master* copy of the weights (4 bytes) that the optimizer
  updates, with its state in float32 (Adam 4 + 4): the Ultra-Scale
  Playbook's 2 + 2 + 12 bytes a parameter, ZeRO's K = 12.

No master copy in full precision: in ``"float32"``/``"float64"`` the
parameters are the master weights.  Each owner's optimizer updates its
shard in place, the shard being a piece of the owner's own copy of the
parameters (:class:`pargrad.sharded.ShardedTrainer`), so stage 1 on one
device holds exactly what data parallelism holds, and the totals are
ZeRO's: with P, G, K the bytes a parameter of the parameters, gradients
and optimizer state, Psi parameters and N replicas, per device

* stage 0: (P + G + K) Psi;
* stage 1: (P + G) Psi + K Psi / N;
* stage 2: P Psi + (G + K) Psi / N;
* stage 3: (P + G + K) Psi / N.

A master copy exists only under mixed precision (16-bit parameters and
gradients, float32 master weights in K, sharded with the optimizer state).

A shard holds ``ceil(parameters / replicas)`` values: the parameters are
flattened into one vector padded with zeros to a multiple of the replicas,
so the count is exact, not a fraction of a byte; at stages 1 and 2 each
replica's full copy is that padded vector, ``replicas x shard`` values
(``parameters`` itself whenever the replicas divide it).
"""

import numbers

from pargrad.allreduce import sharded_step_bytes
from pargrad.checks import ArgumentTypeError, check_choice, check_whole_number

PRECISIONS = ("float32", "float64", "mixed")
OPTIMIZERS = ("sgd", "momentum", "adam")
STAGES = (0, 1, 2, 3)
COMPONENTS = ("parameters", "gradients", "optimizer_state", "master_weights")

# How many values of state each optimizer keeps per parameter.
STATE_VALUES = {"sgd": 0, "momentum": 1, "adam": 2}


def check_stage(stage, *, allowed=STAGES, advice="Pass 1, 2 or 3 (0 is plain data "
                "parallelism: pargrad.SyncTrainer)."):
    """``stage`` as an int if it is one of ``allowed``: TypeError for a non-int (or a bool)."""
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral):
        raise ArgumentTypeError(f"stage must be an int, one of {', '.join(map(str, allowed))}, "
                                f"got {stage!r}. {advice}")
    if int(stage) not in allowed:
        raise ValueError(f"stage must be one of {', '.join(map(str, allowed))}, got {stage!r}. "
                         f"{advice}")
    return int(stage)


def sharded_components(stage):
    """The components that ``stage`` (0-3) splits over the replicas, as a tuple of names.

    Stage 1 shards the optimizer state (and the master weights), stage 2
    also the gradients, stage 3 also the parameters.  Taught in the chapter
    "When the model does not fit".
    """
    stage = check_stage(stage, advice="Pass 0, 1, 2 or 3.")
    return (("optimizer_state", "master_weights") if stage >= 1 else ()) + \
        (("gradients",) if stage >= 2 else ()) + (("parameters",) if stage >= 3 else ())


def state_bytes(parameters, *, replicas, stage, precision="float32", optimizer="adam"):
    """Bytes each device holds for ``parameters`` trained on ``replicas`` at ``stage``.

    Returns ``{"parameters", "gradients", "optimizer_state",
    "master_weights", "total"}``, each in bytes per device (ints).  A
    sharded component holds ``ceil(parameters / replicas)`` values per
    device, a whole one ``parameters`` (at stages 1 and 2 the parameters'
    padded flat copy, ``replicas x ceil(parameters / replicas)``).  ``precision`` is ``"float32"``,
    ``"float64"`` or ``"mixed"`` (16-bit parameters and gradients, float32
    master weights and optimizer state); ``optimizer`` is ``"sgd"``,
    ``"momentum"`` or ``"adam"``.  Stage 0 is plain data parallelism.

    ZeRO's Figure 1 (7.5e9 parameters, mixed precision Adam, 64 replicas):
    120, 31.4, 16.6 and 1.9 GB at stages 0-3.  The whole rule (the
    chapter's calculator repeats it)::

        value  = 2 if mixed else 4 (float32) or 8 (float64)   # parameter, gradient
        state  = 4 if mixed else value                          # optimizer, master
        shard  = ceil(parameters / replicas)
        count(c) = shard if stage shards c else parameters
        parameters      = value x (replicas x shard if stage in (1, 2) else count(parameters))
        gradients       = value x count(gradients)
        optimizer_state = state x values_per_parameter(optimizer) x count(optimizer_state)
        master_weights  = state x count(master_weights)   if mixed else 0

    Taught in the chapter "When the model does not fit".
    """
    parameters = check_whole_number("parameters", parameters, 1)
    replicas = check_whole_number("replicas", replicas, 1)
    stage = check_stage(stage, advice="Pass 0, 1, 2 or 3.")
    check_choice("precision", precision, PRECISIONS)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    value = {"float32": 4, "float64": 8, "mixed": 2}[precision]
    state = 4 if precision == "mixed" else value
    shard = -(-parameters // replicas)                  # ceil, in integers
    sharded = sharded_components(stage)

    def count(component):
        return shard if component in sharded else parameters

    has_master = precision == "mixed"        # in full precision the parameters are the master
    padded_copy = replicas * shard if stage in (1, 2) else count("parameters")
    held = {
        "parameters": value * padded_copy,
        "gradients": value * count("gradients"),
        "optimizer_state": state * STATE_VALUES[optimizer] * count("optimizer_state"),
        "master_weights": state * count("master_weights") if has_master else 0,
    }
    held["total"] = sum(held.values())
    return held


def zero_bytes_sent(parameter_bytes, *, replicas, stage):
    """Bytes each replica sends per step by ZeRO's count, for ``parameter_bytes`` of parameters.

    Stages 0-2: a ring all-reduce's ``2 (R - 1) / R`` of the bytes (at
    stages 1 and 2 as a reduce-scatter of the gradients and an all-gather
    of the updated parameters); stage 3: 1.5 times that (the parameters
    are all-gathered twice, for the forward and for the backward pass, and
    the gradients reduce-scattered once): :func:`pargrad.allreduce.sharded_step_bytes`
    with one or two gathers.  Taught in the chapter "When the model does not fit".
    """
    replicas = check_whole_number("replicas", replicas, 1)
    gathers = 2 if "parameters" in sharded_components(stage) else 1
    return sharded_step_bytes(parameter_bytes, replicas, gathers=gathers)


# ----------------------------------------------------------------------------
# What a trainer holds, counted
# ----------------------------------------------------------------------------

def bytes_by_device(trainer):
    """``{device name: {component: bytes, ..., "total": bytes}}`` that ``trainer`` holds.

    Counted from the variables the trainer reports by component
    (``trainer.variables_by_component()``: :meth:`pargrad.SyncTrainer.variables_by_component`,
    :meth:`pargrad.ShardedTrainer.variables_by_component`), grouped by the
    device each lives on.  Components as :func:`state_bytes`: parameters,
    gradients, optimizer_state, master_weights.  A ``SyncTrainer`` keeps its
    gradients as tensors that live from the backward pass to the update: it
    reports them at the size of its parameters, so that the stages compare
    like for like; a ``ShardedTrainer`` keeps them in variables (full-size
    per replica at stage 1, the owner's shard at stages 2 and 3), as
    PyTorch's ``.grad``.  Counters (iteration counts, learning rates, the
    position) are not counted.  This module imports no trainer.

    Taught in the chapter "When the model does not fit".
    """
    counter = getattr(trainer, "variables_by_component", None)
    if not callable(counter):
        raise TypeError(f"bytes_by_device counts a trainer that reports its variables by "
                        f"component (pargrad.SyncTrainer, pargrad.ShardedTrainer), got "
                        f"{type(trainer).__name__}; pass the trainer you fit with.")
    return _grouped(counter())


def _grouped(rows):
    """Sum ``[(component, tf.Variable or tensor)]`` into ``{device: {component: bytes}}``."""
    import tensorflow as tf
    table = {}
    for component, variable in rows:
        device = tf.DeviceSpec.from_string(variable.device).to_string()
        nbytes = int(variable.shape.num_elements()) * variable.dtype.size
        row = table.setdefault(device, dict.fromkeys(COMPONENTS, 0))
        row[component] += nbytes
    for row in table.values():
        row["total"] = sum(row[c] for c in COMPONENTS)
    return table


def peak_bytes_by_device():
    """``({logical GPU: peak bytes}, None)`` on GPUs, or ``(None, reason)`` on a CPU.

    On a GPU every logical GPU has its own allocator, whose peak
    ``tf.config.experimental.get_memory_info`` reads.  On a CPU all logical
    devices share one allocator, and TensorFlow raises for them, so no
    per-device peak exists: count the bytes held instead
    (:func:`bytes_by_device`).  Taught in the chapter "When the model does
    not fit".
    """
    import tensorflow as tf
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return None, ("on a CPU all logical devices share one allocator, so TensorFlow keeps "
                      "no per-device peak (get_memory_info raises for CPUs); the bytes each "
                      "device holds are counted from its variables instead")
    return {gpu.name: int(tf.config.experimental.get_memory_info(gpu.name)["peak"])
            for gpu in gpus}, None
