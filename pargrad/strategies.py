"""The strategy of a synchronous run, and how its replicas' gradients are summed.

Taught in the chapter "Synchronous training".  :func:`sync_strategy` makes
the ``tf.distribute`` strategy that :class:`pargrad.sync.SyncTrainer` (and
:class:`pargrad.local_sgd.LocalSGDTrainer`) train with: a
``MultiWorkerMirroredStrategy`` when ``TF_CONFIG`` names workers (see
:mod:`pargrad.cluster`), else a ``MirroredStrategy`` over this process's
logical devices (:func:`pargrad.logical_devices`);
:func:`choose_cross_device_ops` picks its all-reduce.
"""

import json
import os

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

from pargrad.checks import check_choice, check_whole_number  # noqa: E402


class DevicesNotReadyError(RuntimeError):
    """Fewer logical devices exist than the synchronous run asks for."""


def sync_strategy(replicas=None, cross_device_ops=None):
    """The strategy for synchronous training in this process.

    With ``TF_CONFIG`` naming a cluster of workers (as :mod:`pargrad.cluster`
    sets it) this is a ``MultiWorkerMirroredStrategy``: one replica for each
    device of each worker process (the book's workers have one device each),
    gradients all-reduced by collective ops over gRPC (a ring on CPUs; NCCL
    on GPUs when TensorFlow picks it).  Otherwise it is a
    ``MirroredStrategy`` over the first ``replicas`` logical devices (GPUs if
    there are any, else CPUs; all of them when ``replicas`` is None), so call
    :func:`pargrad.logical_devices` first.

    How the replicas' gradients are summed is chosen by
    :func:`choose_cross_device_ops` unless ``cross_device_ops`` says
    otherwise.

    Taught in the chapter "Synchronous training".
    """
    if _tf_config_names_workers():
        if replicas not in (None, 1):
            raise ValueError(
                "With TF_CONFIG set, each worker process holds one replica; "
                f"got replicas={replicas!r}. Pass replicas=None and choose the "
                "number of workers in pargrad.cluster instead."
            )
        return tf.distribute.MultiWorkerMirroredStrategy()

    kind = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    names = [device.name for device in tf.config.list_logical_devices(kind)]
    if replicas is None:
        replicas = len(names)
    replicas = check_whole_number("replicas", replicas,
                                  advice="Pass None for every logical device.")
    if replicas > len(names):
        raise DevicesNotReadyError(
            f"A synchronous run on {replicas} replicas needs {replicas} logical "
            f"{kind}s, but TensorFlow has {len(names)}: {names}. Call "
            f"pargrad.logical_devices({replicas}) (or more) before any other "
            "TensorFlow code runs; if TensorFlow has already started, restart "
            "the kernel first."
        )
    if cross_device_ops is None:
        cross_device_ops = choose_cross_device_ops(kind, _physical_gpu_of_each_logical_gpu()[:replicas]
                                                   if kind == "GPU" else [0] * replicas)
    return tf.distribute.MirroredStrategy(names[:replicas], cross_device_ops=cross_device_ops)


def choose_cross_device_ops(kind, physical_device_of_replica):
    """The all-reduce for replicas on logical devices of ``kind`` ("CPU" or "GPU").

    ``physical_device_of_replica[r]`` is the index of the physical device
    that replica ``r``'s logical device belongs to.

    * Replicas on physical GPUs of their own: ``tf.distribute.NcclAllReduce``,
      NVIDIA's library for summing across GPUs (``MirroredStrategy``'s
      default there too).  This is for one process's ``MirroredStrategy``
      only: ``MultiWorkerMirroredStrategy`` takes no ``cross_device_ops``,
      and its default ``CommunicationImplementation.AUTO`` runs TensorFlow's
      ring collectives even on GPUs; it uses NCCL only when given
      ``CommunicationOptions(implementation=NCCL)``.
    * Several replicas sharing one physical device (logical CPUs, or a GPU
      split by :func:`pargrad.logical_devices`):
      ``tf.distribute.ReductionToOneDevice``, which sums on one device and
      copies the sum back.  TensorFlow's default there (collective ops)
      gives every strategy in a process the same collective keys, so a
      second strategy with another number of replicas fails ("is joining a
      group with size 2, but that group has size 4"), and the chapters
      build several.

    Taught in the chapter "Synchronous training".
    """
    check_choice("kind", kind, ("CPU", "GPU"))
    physical = list(physical_device_of_replica)
    if kind == "GPU" and len(set(physical)) == len(physical) > 1:
        return tf.distribute.NcclAllReduce()
    return tf.distribute.ReductionToOneDevice()


def variables_outside_scope(strategy, variables):
    """The paths of those ``variables`` (Keras or ``tf.Variable``) not created in ``strategy.scope()``.

    Such a variable is not mirrored on the replicas.  Taught in the chapter
    "Synchronous training".
    """
    inside = strategy.extended.variable_created_in_scope
    return [v.path for v in variables if not inside(tf_variable(v))]


def tf_variable(variable):
    """The tf.Variable behind a Keras variable (or the variable itself)."""
    inner = getattr(variable, "value", None)   # a tf.Variable's own .value is a method
    return inner if isinstance(inner, tf.Variable) else variable


def _physical_gpu_of_each_logical_gpu():
    """For each logical GPU in TensorFlow's order, the index of its physical GPU."""
    owners = []
    for index, gpu in enumerate(tf.config.list_physical_devices("GPU")):
        split = tf.config.get_logical_device_configuration(gpu)
        owners += [index] * (len(split) if split else 1)
    return owners


def _tf_config_names_workers():
    config = os.environ.get("TF_CONFIG")
    if not config:
        return False
    try:
        cluster = json.loads(config).get("cluster", {})
    except ValueError:
        raise ValueError(f"TF_CONFIG is not valid JSON: {config!r}") from None
    return bool(cluster.get("worker"))
