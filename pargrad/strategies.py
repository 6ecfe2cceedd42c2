"""The strategy of a synchronous run, and how its replicas' gradients are summed.

Taught in the chapter "Synchronous training".  :func:`sync_strategy` makes
the ``tf.distribute`` strategy that :class:`pargrad.sync.SyncTrainer` (and
:class:`pargrad.local_sgd.LocalSGDTrainer`) train with: a
``MultiWorkerMirroredStrategy`` when ``TF_CONFIG`` names workers (see
:mod:`pargrad.cluster`), else a ``MirroredStrategy`` over this process's
logical devices (:func:`pargrad.logical_devices`);
:func:`choose_cross_device_ops` picks its all-reduce.

What every strategy trainer shares, so that each mistake has one check, one
sentence and one exception type: :func:`check_model_and_strategy`,
:func:`check_optimizer_in_scope`, :func:`check_rate_or_optimizer` (also
for :class:`pargrad.asynchronous.AsyncTrainer`), and the pieces of a step
on replicas: :func:`host_device` (where the data stay),
:func:`gather_from_replicas` (every replica's loss, for the finite-loss
check) and :class:`ReplicaEvaluation` (``evaluate`` and validation).
"""

import contextlib
import json
import os

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import check_choice, check_instance, check_whole_number  # noqa: E402
from pargrad.data import evaluation_batches  # noqa: E402


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


# ----------------------------------------------------------------------------
# The trainers' shared checks and pieces: one check per mistake, one sentence
# ----------------------------------------------------------------------------

def check_model_and_strategy(trainer, model, strategy):
    """Raise unless ``model`` is a built Keras model whose variables ``strategy`` mirrors.

    ``trainer`` names the class in the message.  A wrong type raises
    ``TypeError``; a model without variables, or built outside
    ``strategy.scope()``, ``ValueError``.  The one check of
    :class:`pargrad.sync.SyncTrainer` and :class:`pargrad.local_sgd.LocalSGDTrainer`.
    Taught in the chapter "Synchronous training".
    """
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"{trainer} needs a tf.distribute strategy, got {strategy!r}; "
                        "make one with pargrad.sync_strategy(replicas).")
    if not isinstance(model, keras.Model):
        raise TypeError(f"{trainer} needs a Keras model, got {type(model).__name__}; "
                        "pass a keras.Model (Sequential, functional or subclassed).")
    if not model.trainable_variables:
        raise ValueError("The model has no trainable variables yet; build it (give it a "
                         "keras.Input) inside `with strategy.scope():`.")
    outside = variables_outside_scope(strategy, model.trainable_variables)
    if outside:
        raise ValueError(
            f"The model's variables {outside} were created outside this strategy's scope, so "
            "they are not mirrored on its replicas. Build the model inside "
            "`with strategy.scope():` and pass that model.")


def check_optimizer_in_scope(name, optimizer, strategy, *, example="keras.optimizers.Adam(1e-3)",
                             default="optimizer=None for plain gradient descent"):
    """Raise unless ``optimizer`` is a Keras optimizer created inside ``strategy.scope()``.

    ``name`` is the argument's name in the message (``"optimizer"``,
    ``"outer_optimizer"``).  Whether it belongs to the strategy is read from
    its public ``iterations`` variable, which Keras creates with the
    optimizer: a mirrored variable only inside the scope.
    """
    check_instance(name, optimizer, keras.optimizers.Optimizer, "a Keras optimizer instance",
                   advice=f"Pass for example {example}, created inside strategy.scope().")
    inner = getattr(optimizer, "inner_optimizer", optimizer)     # a LossScaleOptimizer's
    if variables_outside_scope(strategy, [inner.iterations]):
        raise ValueError(f"The {name} was created outside this strategy's scope; create it "
                         f"inside `with strategy.scope():` or leave {default}.")


def check_rate_or_optimizer(trainer, optimizer, learning_rate, *, name="optimizer",
                            example="keras.optimizers.Adam(1e-3)", in_scope=True):
    """Check a trainer's optimizer argument: its type first, then no ``learning_rate`` beside it.

    ``optimizer`` (the argument ``name``) must be None or a Keras optimizer
    object (:class:`pargrad.checks.ArgumentTypeError` otherwise, naming
    ``example``); an optimizer carries its own rate, so a ``learning_rate``
    beside it, which would be silently ignored, raises ``ValueError``.  The
    one sentence every trainer says (``trainer`` names it; ``in_scope``:
    the optimizer belongs in ``strategy.scope()``).  Taught in the chapter
    "Your own model".
    """
    scope = ", created inside strategy.scope()" if in_scope else ""
    check_instance(name, optimizer, keras.optimizers.Optimizer, "a Keras optimizer instance",
                   optional=True, advice=f"Pass for example {example}{scope}, or None for "
                   "plain gradient descent at learning_rate.")
    if optimizer is not None and learning_rate is not None:
        raise ValueError(
            f"pass the learning rate to the optimizer, not to {trainer}: keras.optimizers."
            f"{type(optimizer).__name__}(learning_rate={learning_rate!r}){scope}.")


def host_device(strategy):
    """This process's CPU (the host of its replicas), where a trainer keeps the data."""
    return tf.DeviceSpec.from_string(strategy.extended.worker_devices[0]).replace(
        device_type="CPU", device_index=0).to_string()


def gather_from_replicas(value, replicas):
    """In replica context: every replica's ``value``, stacked on every replica, shape ``(replicas, ...)``.

    One all-reduce: each replica puts its value in its own row of zeros
    (with ``tf.where``, not a product, so an infinite value stays in its row
    alone) and the rows are summed.  How a trainer learns every replica's
    loss to name the one that is not finite.
    """
    context = tf.distribute.get_replica_context()
    value = tf.convert_to_tensor(value)
    mine = tf.equal(tf.range(replicas), context.replica_id_in_sync_group)
    mine = tf.reshape(mine, [replicas] + [1] * value.shape.rank)
    placed = tf.where(mine, value[None], tf.zeros_like(value)[None])
    return context.all_reduce(tf.distribute.ReduceOp.SUM, placed)


class ReplicaEvaluation:
    """The loss and metrics of a strategy's model on data, its replicas sharing each batch.

    One evaluation for every strategy trainer: ``evaluate(x, y)`` of
    :class:`pargrad.sync.SyncTrainer` and
    :class:`pargrad.local_sgd.LocalSGDTrainer` and their ``validation_data``.
    Called on a checked source (:mod:`pargrad.data`), it returns
    ``{prefix + "loss": ..., prefix + metric: ...}``, as Keras's
    ``evaluate(..., return_dict=True)``: in inference mode, the loss the mean
    over every example plus the model's regularization losses.  Taught in
    the chapter "Your own model".
    """

    def __init__(self, strategy, model, loss, metrics, feed):
        self.strategy, self.model, self.loss = strategy, model, loss
        self.metrics, self.feed = metrics, feed
        self._function = tf.function(self._distributed_sum, autograph=False)

    def __call__(self, source, prefix=""):
        for metric in self.metrics:
            metric.reset_state()
        total, count = 0.0, 0
        with contextlib.closing(evaluation_batches(source, self.feed)) as batches:
            for x, y in batches:
                total += float(self._function(x, y))
                count += int(x.shape[0])
        if count == 0:
            raise ValueError("The evaluation data hold no examples; pass at least one.")
        logs = {f"{prefix}loss": total / count + sum(float(p) for p in self.model.losses)}
        logs.update({f"{prefix}{metric.name}": float(metric.result()) for metric in self.metrics})
        return logs

    def _distributed_sum(self, x, y):
        """The summed per-example loss of ``(x, y)`` over all replicas (metrics updated).

        Evaluation needs no equal shards: replica ``r`` of ``R`` takes rows
        ``n r / R`` to ``n (r + 1) / R`` (possibly none), in inference mode.
        """
        replicas = self.strategy.num_replicas_in_sync

        def replica_evaluation():
            replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                              tf.int32)
            n = tf.shape(x)[0]
            low, high = n * replica // replicas, n * (replica + 1) // replicas
            with tf.device(self.feed.host):
                xb, yb = x[low:high], y[low:high]
            xb, yb = tf.identity(xb), tf.identity(yb)
            prediction = self.model(xb, training=False)
            for metric in self.metrics:
                metric.update_state(yb, prediction)
            return tf.reduce_sum(tf.cast(self.loss(yb, prediction), tf.float64))

        losses = self.strategy.run(replica_evaluation)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
