"""Synchronous data-parallel training on ``tf.distribute``.

Taught in the chapter "Synchronous training".  Every replica reads the same
parameters, computes the gradient of its shard of the global batch, the
gradients are summed by one all-reduce, and one update is applied
everywhere.  In one process the replicas are the devices of a
``tf.distribute.MirroredStrategy``; across processes (``TF_CONFIG`` set, see
:mod:`pargrad.cluster`) they are the workers of a
``tf.distribute.MultiWorkerMirroredStrategy``.

The trainer is a custom training loop, not Keras ``fit``: Keras 3's ``fit``
fails under ``MultiWorkerMirroredStrategy`` and its gradient accumulation
fails under ``MirroredStrategy`` (see the book's design notes).

:class:`SyncTrainer` holds only the idea.  Its per-replica step,
:meth:`SyncTrainer._replica_step`, is three lines: the replica's gradients,
the finite-loss check, then one all-reduce and one update.  What the book
adds to *show* a step (each replica's timestamps, stragglers, emulated
devices, backup workers) is a subclass in the book's layer,
:class:`pargrad.book.instruments.InstrumentedSyncTrainer`, which wraps those
instruments around the same lines and sets its per-step plan in the one
hook of the loop, :meth:`SyncTrainer._before_step`.  What a reader's own
model and data need before the first step (targets shaped as Keras shapes
them, dtypes, the loss by name, clear errors) is in :mod:`pargrad.training`,
shared with the asynchronous trainer.  This module never imports the book.

A reader's map: where ``learning_rate`` goes, from the call to the update.

1. ``SyncTrainer(model, strategy, learning_rate=0.01)``: ``__init__`` makes
   ``keras.optimizers.SGD(learning_rate)`` inside ``strategy.scope()`` (or
   takes your ``optimizer``, which carries its own rate; under a
   ``mixed_float16`` policy it wraps it in a ``LossScaleOptimizer``), builds
   it for the model's variables and keeps it as ``self.optimizer``.
   Nothing else in this module reads the rate.
2. ``trainer.fit(x, y, steps, batch_size)``: checks the data and casts it
   (:func:`pargrad.training.prepare_arrays`), checks that ``batch_size``
   splits over replicas x ``accumulation_steps``; :meth:`_train` runs the
   epochs (callbacks, metrics, validation) and :meth:`_epoch_calls` says
   which batches come next; per call :meth:`_run` calls
   ``self._step_function``, the ``tf.function`` of :meth:`_distributed_step`
   (or ``_steps_function``, a graph loop of it, with ``steps_per_call``).
3. :meth:`_distributed_step`: ``strategy.run`` runs, on every replica,
   :meth:`_shard` (its rows of the batch) and :meth:`_replica_step`.
4. :meth:`_replica_step`: :meth:`_local_gradients` -> :meth:`_gradients`
   computes the loss summed over the shard and divided by the *global*
   batch size (``tf.nn.compute_average_loss``), plus the model's
   regularization losses divided by the replicas, and its gradients; then
   ``self.optimizer.apply_gradients(...)``.
5. Inside Keras (``keras/src/backend/tensorflow/optimizer.py``):
   ``_backend_update_step`` sums the replicas' gradients with one all-reduce
   (``_all_reduce_sum_gradients``) and calls ``SGD.update_step`` on each
   mirrored variable: ``variable -= learning_rate * gradient``, the same
   update on every replica.

``batch_size`` takes the same road: ``fit`` passes it to every step as a
Python int (so shapes are static), :meth:`_shard` cuts ``batch_size /
replicas`` rows per replica and :meth:`_gradients` divides the loss by it.
A ``tf.data.Dataset`` joins the same road: each of its batches is read on
the host and passed to the same step, with the batch's size as
``batch_size``.
"""

import dataclasses
import json
import os
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import check_choice, check_flag, check_whole_number  # noqa: E402
from pargrad.training import (  # noqa: E402
    NonFiniteDataError,
    NonFiniteLossError,
    TrainingPosition,
    first_non_finite_row,
    input_dtype,
    keras_metrics,
    loss_dtype,
    per_example_loss,
    prepare_arrays,
    squared_error_per_example,
)


# ----------------------------------------------------------------------------
# The strategy
# ----------------------------------------------------------------------------

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
# What a run records
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class SyncHistory:
    """What :meth:`SyncTrainer.fit` measured: per step (update), and per epoch as Keras does.

    Per epoch, as Keras's ``History``: ``history["loss"]`` (the mean of the
    epoch's step losses, regularization included), one entry per metric
    (``history["accuracy"]``, ...), ``history["val_loss"]`` and
    ``history["val_<metric>"]`` with ``validation_data``; ``epoch`` lists the
    epochs' indices and ``params`` what the callbacks were told
    (``epochs``, ``steps``).  A fit with ``steps=`` is one epoch.

    Per step, the arrays below, one row a step.  Times are seconds on the
    wall clock of this process (``time.time()`` and ``tf.timestamp()`` read
    the same clock).  For each local replica ``r`` and step ``i``:

    * ``compute_start[i, r]``: the replica's input is on its device; its
      forward pass waits for this timestamp (without that tie the runtime
      may run the timestamp after the pass; on a busy machine the replica
      may still queue for a core, which then counts as compute);
    * ``compute_end[i, r]``: its gradients are computed (for a straggler:
      after its extra delay);
    * ``update_end[i, r]``: the all-reduced update has been applied to its
      copy of the parameters.

    ``launch = compute_start - start`` is the time before the replica began,
    ``compute = compute_end - compute_start`` the time it worked,
    ``wait = update_end - compute_end`` the time it spent in the all-reduce:
    waiting for the slowest replica, the communication itself, and the
    (small) update.  ``launch + compute + wait <= step_time``; with
    ``steps_per_call=1`` the step is timed in Python, so the rest is
    fetching the results, and with more steps a call, the step ends with
    the last replica's update and the three add up to ``step_time`` for
    that replica.
    Only :class:`pargrad.book.instruments.InstrumentedSyncTrainer` records
    them; the core :class:`SyncTrainer` leaves them NaN.  Under
    ``MultiWorkerMirroredStrategy`` only this process's replicas are recorded.

    When ``fit`` was given ``replica_times`` (the virtual clock, backup
    workers): ``used[i, r]`` tells whether replica ``r``'s gradient counted in
    step ``i``, and ``virtual_step_time[i]`` is the step's length on that
    clock (:func:`pargrad.book.instruments.sync_step_times`); otherwise both
    are None.  ``stragglers`` is ``{replica: factor}`` of a run with stragglers.
    """

    loss: np.ndarray
    start: np.ndarray
    step_time: np.ndarray
    compute_start: np.ndarray
    compute_end: np.ndarray
    update_end: np.ndarray
    replicas: int
    accumulation_steps: int
    micro_batch_size: int
    stragglers: dict = dataclasses.field(default_factory=dict)
    used: np.ndarray = None
    virtual_step_time: np.ndarray = None
    history: dict = dataclasses.field(default_factory=dict)
    epoch: list = dataclasses.field(default_factory=list)
    params: dict = dataclasses.field(default_factory=dict)

    @property
    def effective_batch_size(self):
        """Examples per update: micro-batch x accumulation steps x replicas."""
        return self.micro_batch_size * self.accumulation_steps * self.replicas

    @property
    def launch(self):
        """Seconds from the step's start until each replica began computing.

        It covers launching the step and handing each replica its input; on
        few cores the replicas also queue for a core here.
        """
        return self.compute_start - self.start[:, None]

    @property
    def compute(self):
        """Seconds each replica computed, shape (steps, local replicas)."""
        return self.compute_end - self.compute_start

    @property
    def wait(self):
        """Seconds each replica spent in the all-reduce and update."""
        return self.update_end - self.compute_end

    @property
    def steps_per_second(self):
        """Updates per second over the whole run."""
        return len(self.step_time) / float(np.sum(self.step_time))

    def __len__(self):
        return len(self.loss)


# ----------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------

# The text of the assertion that stops a step whose loss is not finite.
NON_FINITE_MARK = "pargrad: the loss of a replica is not finite"


class SyncTrainer(tf.__internal__.tracking.Trackable):
    """Synchronous data-parallel training: one all-reduce and one update a step.

    Usage::

        strategy = pargrad.sync_strategy(2)        # after pargrad.logical_devices
        with strategy.scope():
            model = pargrad.parabola_model(seed=0)
        trainer = pargrad.SyncTrainer(model, strategy, learning_rate=1e-2)
        history = trainer.fit(x, y, steps=2000)    # full batch every step

    Each step every replica reads the same parameters, computes the gradient
    of its shard of the global batch with the loss scaled by the *global*
    batch size (as ``tf.nn.compute_average_loss`` does), the optimizer
    all-reduces (sums) the gradients once, and applies one update on every
    replica.  The result equals a single device's step on the whole batch,
    up to the order of floating-point additions.

    Arguments:

    * ``model``: a built Keras model whose variables were created inside
      ``strategy.scope()``; otherwise ``ValueError``.  It runs with
      ``training=True`` (dropout on), and its ``model.losses``
      (regularization) are added to the loss, divided by the number of
      replicas (``tf.nn.scale_regularization_loss``) so that the all-reduce
      counts them once.
    * ``strategy``: a ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy``
      (:func:`sync_strategy` makes the right one).
    * ``loss``: ``None`` (squared error summed over outputs, the y = x²
      question's loss), a Keras loss name (``"mse"``), a ``keras.losses.Loss``
      instance, or ``loss(y, prediction)`` returning one loss per example; see
      :func:`pargrad.training.per_example_loss` for how targets are shaped
      (as Keras does: ``y`` of shape ``(N,)`` fits a one-output model).
    * ``optimizer``: a Keras optimizer created inside ``strategy.scope()``;
      default plain gradient descent (``keras.optimizers.SGD``) with
      ``learning_rate``.  Under a ``mixed_float16`` policy it is wrapped in
      ``keras.optimizers.LossScaleOptimizer``, as Keras's ``compile`` does.
      An uncompiled model gets it as ``model.optimizer`` (as after
      ``compile``), for the callbacks that read it.
    * ``accumulation_steps``: ``k`` micro-batches per replica per update;
      their gradients are summed on the replica and all-reduced once, so an
      update sees ``micro-batch x k x replicas`` examples
      (``SyncHistory.effective_batch_size``).
    * ``sample_weight``: None (every example weighs 1: the loss is the mean
      over the global batch's examples), or a function ``sample_weight(x,
      y)`` returning the weights of a micro-batch, one per value of the loss
      before any reduction: per example ``(batch,)``, or per token ``(batch,
      time)`` for a loss per time step (a padding mask such as
      ``lambda x, y: tf.cast(y != 0, "float32")``).  The loss is then
      ``sum(weights * losses) / W`` over the update's micro-batches and
      replicas, with ``W`` the total weight of the whole global batch: each
      replica adds up its micro-batches' weights and one all-reduce of that
      one number per update sums them over the replicas, before the
      gradients.  So an update equals the big batch's weighted mean (its
      mean over real tokens), not the mean of the micro-batches' means.
      Taught in the chapter "Accumulating sequences".
    * ``progress``: show a progress bar (tqdm, notebook-aware) during fit.
    * ``jit_compile``: compile each replica's forward and backward pass
      (all its ``accumulation_steps`` micro-batches) with XLA into one
      computation on the replica's device, traced once per replica.  The
      all-reduce and the update stay outside XLA: under ``MirroredStrategy``
      the optimizer sums the gradients with a ``merge_call`` into the
      strategy, which reaches every replica's device, and an XLA
      computation runs on one device (Keras ``fit(jit_compile=True)`` fails
      under ``MirroredStrategy`` for that reason).  The result equals the
      uncompiled step up to the order of floating-point additions.  It
      pays when a step is many small ops (tiny models on a GPU are
      launch-bound); ``benchmarks/sync.py`` measures it against the plain
      step on your machine.  Not with ``metrics``.
    * ``metrics``: Keras metric objects (``keras.metrics.SparseCategoricalAccuracy()``)
      created inside ``strategy.scope()``, updated by every replica on its
      shard in every step and read summed over the replicas, as in Keras's
      ``compile(metrics=...)``; ``fit`` reports them per epoch.
    * ``stop_on_non_finite``: stop with :class:`pargrad.NonFiniteLossError`,
      naming the step and the replica, when a replica's loss is NaN or
      infinite, before that step's update (default True).  The check costs
      one extra all-reduce of one number per replica each step; pass
      False to train on (Keras's behaviour; ``keras.callbacks.TerminateOnNaN``
      then stops after the update).

    Where training stands (the next batch, the step and epoch counts, the
    shuffling seed) lives in variables (:class:`pargrad.training.TrainingPosition`,
    ``trainer.position``) that the trainer hands to ``tf.train.Checkpoint``::

        checkpoint = tf.train.Checkpoint(model=model, optimizer=trainer.optimizer,
                                         trainer=trainer)

    Restoring that into a new trainer and fitting on continues exactly where
    the saved run stopped: 10 steps, save, restore, 10 steps equal 20 steps
    bit for bit.

    The book's instruments (each replica's timestamps, stragglers, emulated
    devices, backup workers) are not here: they are a subclass,
    :class:`pargrad.book.instruments.InstrumentedSyncTrainer`, that wraps
    them around the same lines of :meth:`_replica_step`.

    Bad input: a global batch that the replicas (times ``accumulation_steps``)
    cannot split evenly raises ``ValueError`` and names the nearest sizes
    that work; there is no silent padding or dropping, because either would
    change the update that the book compares with the single-device one.
    Every other bad argument raises an error that says what to pass.

    Taught in the chapters "Synchronous training" and "Your own model".
    """

    record_times = False  # the core keeps no timestamps (InstrumentedSyncTrainer does)

    def __init__(self, model, strategy, loss=None, optimizer=None, learning_rate=1e-2,
                 accumulation_steps=1, progress=True, jit_compile=False, metrics=None,
                 stop_on_non_finite=True, sample_weight=None):
        if not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(
                f"SyncTrainer needs a tf.distribute strategy, got {strategy!r}; "
                "make one with pargrad.sync_strategy(replicas)."
            )
        if not isinstance(model, keras.Model):
            raise TypeError(f"SyncTrainer needs a Keras model, got {type(model).__name__}; "
                            "pass a keras.Model (Sequential, functional or subclassed).")
        variables = model.trainable_variables
        if not variables:
            raise ValueError(
                "The model has no trainable variables yet; build it (give it a "
                "keras.Input) inside `with strategy.scope():`."
            )
        outside = [v.path for v in variables
                   if not strategy.extended.variable_created_in_scope(_tf_variable(v))]
        if outside:
            raise ValueError(
                f"The model's variables {outside} were created outside this "
                "strategy's scope, so they are not mirrored on its replicas. "
                "Build the model inside `with strategy.scope():` and pass that "
                "model."
            )
        accumulation_steps = check_whole_number("accumulation_steps", accumulation_steps,
                                                advice="Pass 1 for no accumulation.")
        check_flag("stop_on_non_finite", stop_on_non_finite)
        if sample_weight is not None and not callable(sample_weight):
            raise TypeError(
                f"sample_weight must be None or a function sample_weight(x, y) returning a "
                f"micro-batch's weights, got {type(sample_weight).__name__}; pass for example "
                "lambda x, y: tf.cast(y != 0, 'float32') for a padding mask.")
        metrics = self._check_metrics(metrics, strategy)
        if metrics and jit_compile:
            raise ValueError(
                "metrics are updated inside the step, which jit_compile=True compiles with "
                "XLA on each replica; pass jit_compile=False to use metrics, or evaluate "
                "the metrics yourself after fit."
            )

        self.model = model
        self.strategy = strategy
        self.loss = per_example_loss(loss)
        self.sample_weight = sample_weight
        self._loss_values = self.loss.values if sample_weight is not None else None
        self.accumulation_steps = int(accumulation_steps)
        self.progress = progress
        self.jit_compile = bool(jit_compile)
        self.metrics = metrics
        self.stop_on_non_finite = stop_on_non_finite
        with strategy.scope():
            if optimizer is None:
                optimizer = keras.optimizers.SGD(learning_rate)
            if not isinstance(optimizer, keras.optimizers.Optimizer):
                raise TypeError(
                    f"optimizer must be a Keras optimizer instance, got {optimizer!r}; pass "
                    "for example keras.optimizers.Adam(1e-3), created inside strategy.scope()."
                )
            inner = getattr(optimizer, "inner_optimizer", optimizer)
            if getattr(inner, "_distribution_strategy", strategy) is not strategy:
                raise ValueError(
                    "The optimizer was created outside this strategy's scope; "
                    "create it inside `with strategy.scope():` or leave "
                    "optimizer=None for plain gradient descent."
                )
            if (getattr(model.dtype_policy, "name", None) == "mixed_float16"
                    and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
                # As Keras's compile does: float16 gradients underflow without it.
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(variables)
            # What a failing step leaves behind (each replica's loss, the
            # steps that ran): read to name the step and replica in the error.
            on_read = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self._seen_losses = tf.Variable(tf.zeros([self.replicas], tf.float64), **on_read)
            self._seen_steps = tf.Variable(tf.constant(0, tf.int64), **on_read)
        self.optimizer = optimizer
        if getattr(model, "optimizer", None) is None:
            # As after Keras's compile: callbacks read model.optimizer (TensorBoard).
            model.optimizer = optimizer
        # Where training stands, saved by tf.train.Checkpoint(..., trainer=self).
        self.position = TrainingPosition()
        self._track_trackable(self.position, name="position")
        # The host of this process's replicas, where the data are kept, and
        # what the last fit read (to tell whether the next one continues it).
        self._host = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0]).replace(
            device_type="CPU", device_index=0).to_string()
        self._last_data = None
        self._iterator = None
        # No AutoGraph: the step is plain TensorFlow, so nothing depends on
        # source transformation (and its caches) of this class's methods.
        # With jit_compile, a replica's forward and backward passes (all k
        # micro-batches) are one XLA computation, traced once per replica;
        # the all-reduce and the update stay outside it (see the docstring).
        self._replica_gradients = (
            tf.function(self._local_gradients, autograph=False, jit_compile=True)
            if self.jit_compile else self._local_gradients)
        if sample_weight is not None:
            # The total weight is all-reduced first, outside any XLA computation.
            local = self._weighted_local_gradients
            self._shard_gradients = (
                tf.function(local, autograph=False, jit_compile=True) if self.jit_compile
                else local)
            self._replica_gradients = self._weighted_replica_gradients
        self._step_function = tf.function(self._distributed_step, autograph=False)
        self._steps_function = tf.function(self._distributed_steps, autograph=False)
        self._evaluate_function = tf.function(self._distributed_evaluation, autograph=False)

    @property
    def replicas(self):
        """Replicas taking part in every update, over all processes."""
        return self.strategy.num_replicas_in_sync

    @staticmethod
    def _check_metrics(metrics, strategy):
        checked = keras_metrics(metrics, ", created inside `with strategy.scope():`")
        for metric in checked:
            outside = [v.path for v in metric.variables
                       if not strategy.extended.variable_created_in_scope(_tf_variable(v))]
            if outside:
                raise ValueError(
                    f"The metric {metric.name!r} was created outside this strategy's scope, so "
                    "its replicas cannot add up their counts; create it inside "
                    "`with strategy.scope():`."
                )
        return checked

    # -- one step --------------------------------------------------------------

    def _replica_step(self, x, y, global_batch_size):
        """One replica's part of a step (runs in replica context); returns its loss.

        ``x, y`` are this replica's shard.  Its loss is its examples' losses
        summed and divided by the *global* batch size, so the sum over the
        replicas is the mean over the whole batch.
        """
        variables = self.model.trainable_variables
        loss, grads = self._replica_gradients(x, y, global_batch_size)  # no communication
        grads = self._stop_if_not_finite(loss, grads)    # with stop_on_non_finite
        # One all-reduce (a sum over replicas) and one update, inside Keras.
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss

    def _local_gradients(self, x, y, global_batch_size):
        """This replica's loss and gradient sum, before any communication."""
        variables = self.model.trainable_variables
        if self.accumulation_steps == 1:
            return self._gradients(x, y, variables, global_batch_size)
        return self._accumulated_gradients(x, y, variables, global_batch_size)

    def _gradients(self, x, y, variables, global_batch_size):
        """The loss of ``(x, y)`` divided by the *global* batch size, and its gradients."""
        with tf.GradientTape() as tape:
            prediction = self.model(x, training=True)
            loss = tf.nn.compute_average_loss(
                self.loss(y, prediction), global_batch_size=global_batch_size
            )
            loss = self._with_regularization(loss)      # + model.losses / replicas
            scaled = self.optimizer.scale_loss(loss)    # loss scaling (mixed precision)
        self._update_metrics(y, prediction)
        return loss, tape.gradient(scaled, variables)

    def _with_regularization(self, loss):
        """``loss`` plus the model's regularization losses, counted once over the replicas.

        Every replica adds ``sum(model.losses) / replicas`` (and ``/ k`` for
        each of ``k`` accumulated micro-batches), so the all-reduced sum
        holds them once, as TensorFlow's custom-training guide does with
        ``tf.nn.scale_regularization_loss``.
        """
        penalties = self.model.losses
        if not penalties:
            return loss
        penalty = tf.nn.scale_regularization_loss(
            tf.add_n([tf.cast(p, loss.dtype) for p in penalties]))
        if self.accumulation_steps > 1:
            penalty = penalty / self.accumulation_steps
        return loss + penalty

    def _update_metrics(self, y, prediction):
        for metric in self.metrics:
            metric.update_state(y, prediction)

    def _stop_if_not_finite(self, loss, grads):
        """The gradients, released only if every replica's loss is finite.

        Every replica learns every replica's loss (one small all-reduce), so
        all of them stop at the same step, before the update, and the error
        can name the replica (from ``_seen_losses``).  Without
        ``stop_on_non_finite``, the gradients unchanged.
        """
        if not self.stop_on_non_finite:
            return grads
        context = tf.distribute.get_replica_context()
        mine = tf.equal(tf.range(self.replicas), context.replica_id_in_sync_group)
        losses = context.all_reduce(
            tf.distribute.ReduceOp.SUM,
            tf.where(mine, tf.cast(loss, tf.float64), tf.zeros([self.replicas], tf.float64)))
        noted = [self._seen_losses.assign(losses), self._seen_steps.assign_add(1)]
        with tf.control_dependencies(noted):
            check = tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(losses)),
                                        [NON_FINITE_MARK])
        with tf.control_dependencies([check]):
            return [tf.identity(g) for g in grads]

    def _weighted_replica_gradients(self, x, y, global_batch_size):
        """With ``sample_weight``: the replica's loss and gradients over the global total weight.

        Each replica adds up the weights of its micro-batches; one all-reduce
        of that one number (per update) gives the total weight ``W`` of the
        global batch, by which every replica divides its weighted loss sum.
        """
        local = tf.add_n([tf.reduce_sum(tf.cast(self.sample_weight(xb, yb), tf.float64))
                          for xb, yb in self._micro_batches(x, y)])
        context = tf.distribute.get_replica_context()
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
        check = tf.debugging.assert_positive(
            total, message="sample_weight: the whole global batch has weight 0 (only padding?); "
                           "pass batches with at least one weighted value")
        with tf.control_dependencies([check]):
            total = tf.identity(total)
        return self._shard_gradients(x, y, total)

    def _micro_batches(self, x, y):
        """This replica's shard as a list of ``accumulation_steps`` micro-batches."""
        if self.accumulation_steps == 1:
            return [(x, y)]
        return [(x[i], y[i]) for i in range(self.accumulation_steps)]

    def _weighted_local_gradients(self, x, y, total_weight):
        """With ``sample_weight``: this replica's loss and gradient sum, before any communication.

        As :meth:`_gradients` and :meth:`_accumulated_gradients`, with each
        micro-batch's loss its weighted sum divided by ``total_weight``, the
        global batch's total weight.
        """
        variables = self.model.trainable_variables
        loss, grads = None, None
        for xb, yb in self._micro_batches(x, y):
            with tf.GradientTape() as tape:
                prediction = self.model(xb, training=True)
                micro_loss = self._weighted_loss(xb, yb, prediction, total_weight)
                micro_loss = self._with_regularization(micro_loss)
                scaled = self.optimizer.scale_loss(micro_loss)
            self._update_metrics(yb, prediction)
            micro_grads = tape.gradient(scaled, variables)
            if grads is None:
                loss, grads = micro_loss, micro_grads
                continue
            loss += micro_loss
            # Dense sums: an embedding's gradient is sparse (IndexedSlices), which has no +.
            grads = [tf.convert_to_tensor(g) + tf.convert_to_tensor(m)
                     for g, m in zip(grads, micro_grads)]
        return loss, grads

    def _weighted_loss(self, x, y, prediction, total_weight):
        """``sum(sample_weight(x, y) * losses) / total_weight`` for one micro-batch."""
        values = self._loss_values(y, prediction)
        weights = tf.convert_to_tensor(self.sample_weight(x, y))
        if not weights.shape.is_compatible_with(values.shape):
            raise ValueError(
                f"sample_weight(x, y) returned weights of shape {weights.shape}, but the loss "
                f"gives values of shape {values.shape} (before any reduction); return one "
                "weight per value: per example (batch,) or per token (batch, time).")
        weighted = tf.reduce_sum(tf.cast(weights, values.dtype) * values)
        return weighted / tf.cast(total_weight, values.dtype)

    def _accumulated_gradients(self, x, y, variables, global_batch_size):
        """Sum the gradients of k micro-batches on this replica, no communication."""
        loss, grads = self._gradients(x[0], y[0], variables, global_batch_size)
        for i in range(1, self.accumulation_steps):     # unrolled: k is a Python int
            micro_loss, micro_grads = self._gradients(x[i], y[i], variables, global_batch_size)
            loss += micro_loss
            # Dense sums: an Embedding's sparse gradients (IndexedSlices) cannot be added.
            grads = [tf.convert_to_tensor(g) + tf.convert_to_tensor(m)
                     for g, m in zip(grads, micro_grads)]
        return loss, grads

    def _shard(self, x, y, position, global_batch_size):
        """This replica's slice of the global batch that starts at ``position``.

        The data stay in memory on the host; each replica gathers its own
        contiguous rows (wrapping around the end of ``x``), cut into
        ``accumulation_steps`` micro-batches.  No ``tf.data`` iterator: its
        multi-device buffers run background threads, and TF 2.21 can hang
        for good when such an iterator is garbage collected.
        """
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        per_replica = global_batch_size // self.replicas
        start = tf.cast(position, tf.int32) + tf.cast(replica, tf.int32) * per_replica
        with tf.device(self._host):
            rows = (start + tf.range(per_replica)) % tf.shape(x)[0]
            xb, yb = tf.gather(x, rows), tf.gather(y, rows)
        k = self.accumulation_steps
        if k > 1:
            xb = tf.reshape(xb, [k, -1] + list(x.shape[1:]))
            yb = tf.reshape(yb, [k, -1] + list(y.shape[1:]))
        return tf.identity(xb), tf.identity(yb)   # on the replica's own device

    def _distributed_step(self, x, y, position, global_batch_size):
        """One step on every replica: the batch's loss, and no replica times (NaN)."""
        def replica_step():
            xb, yb = self._shard(x, y, position, global_batch_size)
            return self._replica_step(xb, yb, global_batch_size)

        losses = self.strategy.run(replica_step)
        loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        local = len(self.strategy.extended.worker_devices)
        return tf.cast(loss, tf.float64), tf.fill([local, 3], tf.constant(np.nan, tf.float64))

    def _distributed_steps(self, x, y, position, global_batch_size, steps):
        """``steps`` synchronous steps in one call (a graph loop, no Python between)."""
        def body(i, losses, times):
            loss, step_times = self._distributed_step(
                x, y, position + i * global_batch_size, global_batch_size)
            return i + 1, losses.write(i, loss), times.write(i, step_times)

        _, losses, times = tf.while_loop(
            lambda i, *_: i < steps, body,
            (tf.constant(0), tf.TensorArray(tf.float64, size=steps),
             tf.TensorArray(tf.float64, size=steps)))
        return losses.stack(), times.stack()

    def _distributed_evaluation(self, x, y):
        """The summed per-example loss of ``(x, y)`` over all replicas (metrics updated).

        Evaluation needs no equal shards: replica ``r`` of ``R`` takes rows
        ``n r / R`` to ``n (r + 1) / R`` (possibly none), in inference mode.
        """
        def replica_evaluation():
            replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                              tf.int32)
            n = tf.shape(x)[0]
            low, high = n * replica // self.replicas, n * (replica + 1) // self.replicas
            with tf.device(self._host):
                xb, yb = x[low:high], y[low:high]
            xb, yb = tf.identity(xb), tf.identity(yb)
            prediction = self.model(xb, training=False)
            self._update_metrics(yb, prediction)
            return tf.reduce_sum(tf.cast(self.loss(yb, prediction), tf.float64))

        losses = self.strategy.run(replica_evaluation)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    # -- the loop --------------------------------------------------------------

    def fit(self, x, y=None, steps=None, batch_size=None, steps_per_call=1, progress=None, *,
            epochs=None, shuffle=None, seed=None, validation_data=None,
            validation_batch_size=None, callbacks=None):
        """Train on ``(x, y)`` or a ``tf.data.Dataset``; return a :class:`SyncHistory`.

        How long: exactly one of

        * ``steps``: that many updates.  Arrays are read in order, batch after
          batch, wrapping around at the end (no shuffling), and ``fit`` again
          with the same arrays and batch size continues with the next batch,
          so ``fit(x, y, 10)`` twice equals ``fit(x, y, 20)``; a dataset is
          read the same way, starting again when it ends.  The whole call
          counts as one epoch for the history and the callbacks.
        * ``epochs``: that many more passes over the data (Keras's epochs).
          An epoch of arrays is ``ceil(len(x) / batch_size)`` steps; its last,
          smaller batch must split over the replicas too.  ``shuffle``
          (default True, as in Keras) reorders the arrays each epoch with a
          permutation drawn from ``seed`` and the epoch's number, so a run is
          reproducible (``seed=None`` draws one from NumPy's global
          generator, which ``keras.utils.set_random_seed`` seeds, once per
          trainer, and keeps it in the trainer's position).  An epoch of a
          dataset is one pass over it (shuffle it in the pipeline).

        The data:

        * arrays ``x, y`` (NumPy arrays or lists): ``batch_size`` is the
          global batch of one update, over all replicas and micro-batches
          (default: all of ``x``, full-batch gradient descent as in the
          y = x² question); each batch is cut into equal contiguous shards,
          one a replica (and ``accumulation_steps`` micro-batches within a
          shard).  Features are cast to the model's input dtype, float
          targets to its output dtype (:func:`pargrad.training.prepare_arrays`).
        * a ``tf.data.Dataset`` of ``(features, targets)`` global batches as
          ``x`` (no ``y``, no ``batch_size``): every batch is read on this
          process's host by a plain iterator and cut into shards the same
          way, so a dataset of the same batches trains exactly as the arrays
          do.  No ``tf.distribute`` distributed iterator: its multi-device
          buffers run background threads, and a garbage-collected one can
          block TensorFlow 2.21 for good; the iterator lives only inside this
          call and is deleted in a ``finally``.  Under
          ``MultiWorkerMirroredStrategy`` every worker must produce the same
          batches (seed the pipeline).

        ``validation_data``: ``(x_val, y_val)`` arrays or a dataset of
        batches, evaluated at the end of every epoch in inference mode
        (``training=False``): ``val_loss`` (regularization included, as
        Keras does) and ``val_<metric>`` in the history and the callbacks'
        logs, in batches of ``validation_batch_size`` (default 1024).

        ``callbacks``: Keras callbacks (``keras.callbacks.Callback``); they get
        ``set_model``/``set_params``, ``on_train_begin/end``,
        ``on_epoch_begin/end`` (logs with ``loss``, metrics, ``val_*``) and
        ``on_train_batch_begin/end`` (logs with the epoch's running
        ``loss``); setting ``model.stop_training = True``
        (``EarlyStopping``, ``TerminateOnNaN``) ends the fit after the step.

        ``steps_per_call`` runs that many steps in one ``tf.function`` call
        (like Keras's ``steps_per_execution``): every step is still one
        all-reduce and one update, but Python launches the graph once per
        call (callbacks see the call's last batch).  With 1, ``step_time`` is
        measured in Python around each step (launch and fetching included);
        with more, and the replicas' times recorded
        (:class:`pargrad.book.instruments.InstrumentedSyncTrainer`), a step
        lasts from the end of the previous update (or the call's start) to
        the end of its own update; without them, each step of a call gets
        the call's mean.
        """
        if (steps is None) == (epochs is None):
            raise ValueError(
                "fit needs exactly one of steps= (a number of updates) and epochs= (a "
                f"number of passes over the data); got steps={steps!r}, epochs={epochs!r}."
            )
        if steps is not None:
            steps = check_whole_number("steps", steps)
        else:
            epochs = check_whole_number("epochs", epochs)
        steps_per_call = check_whole_number("steps_per_call", steps_per_call)
        dataset = isinstance(x, tf.data.Dataset)
        if shuffle is None:
            shuffle = epochs is not None and not dataset
        check_flag("shuffle", shuffle)
        if seed is not None:
            seed = check_whole_number("seed", seed, minimum=0, advice="Pass None to draw one.")
        if dataset:
            source = self._dataset_source(x, y, batch_size, shuffle)
        else:
            if shuffle and steps is not None:
                raise ValueError(
                    "shuffle=True needs epochs=: with steps= the arrays are read in order, "
                    "so that a later fit continues with the next batch. Pass epochs=N with "
                    "shuffle=True, or shuffle the arrays yourself once."
                )
            source = self._array_source(x, y, batch_size, epochs is not None)
        validation = self._validation(validation_data, validation_batch_size)
        if epochs is not None and getattr(source, "infinite", False):
            raise ValueError(
                "The dataset repeats forever, so an epoch never ends; pass steps=N instead "
                "of epochs=, or a dataset without .repeat().")
        if shuffle:
            self._draw_seed(seed)
        return self._train(source, steps, epochs, steps_per_call, shuffle, validation,
                           callbacks, progress)

    # -- the data ------------------------------------------------------------------

    def _array_source(self, x, y, batch_size, by_epoch):
        """Checked arrays, with the batch size and where they continue."""
        originals = (x, y)
        x, y = prepare_arrays(x, y, self.model, finite_hint=self._data_hint())
        if batch_size is None:
            batch_size = len(x)
        batch_size = check_whole_number("batch_size", batch_size)
        if batch_size > len(x):
            raise ValueError(
                f"batch_size must be between 1 and len(x) = {len(x)}, got {batch_size}; "
                f"pass {len(x)} (or less) or leave batch_size=None for the whole data.")
        self._check_split(batch_size)
        if by_epoch and len(x) % batch_size:
            last = len(x) % batch_size
            parts = self.replicas * self.accumulation_steps
            if last % parts:
                raise ValueError(
                    f"{len(x)} examples in batches of {batch_size} leave a last batch of "
                    f"{last}, which does not split over {self.replicas} replicas x "
                    f"{self.accumulation_steps} micro-batches; pass x and y with "
                    f"{len(x) - last % parts} examples (drop {last % parts}), or a batch_size "
                    "that divides the data into batches that split evenly."
                )
        return _ArraySource(x, y, batch_size, by_epoch, originals)

    def _data_hint(self):
        """How to opt out of the data check in messages; None when it is off."""
        if not self.stop_on_non_finite:
            return None
        return "To train on regardless, pass stop_on_non_finite=False to SyncTrainer."

    def _check_split(self, batch_size):
        parts = self.replicas * self.accumulation_steps
        if batch_size % parts:
            lower = batch_size // parts * parts
            hint = (f"{lower} or {lower + parts}" if lower else f"{parts}")
            raise ValueError(
                f"A global batch of {batch_size} examples does not split evenly over "
                f"{self.replicas} replicas x {self.accumulation_steps} micro-batches; "
                f"pass a batch_size that is a multiple of {parts} (such as {hint}). "
                "SyncTrainer neither pads nor drops examples, so that an update "
                "stays equal to the single-device one."
            )

    def _dataset_source(self, dataset, y, batch_size, shuffle):
        if y is not None:
            raise ValueError(
                "x is a tf.data.Dataset, which holds the targets too; pass no y (a dataset "
                "of (features, targets) batches), or pass arrays x and y.")
        if batch_size is not None:
            raise ValueError(
                "x is a tf.data.Dataset, whose batches are the global batches; pass no "
                "batch_size and batch the dataset instead (dataset.batch(64)).")
        if shuffle:
            raise ValueError(
                "shuffle=True works on arrays; shuffle a dataset in its pipeline "
                "(dataset.shuffle(buffer_size, seed=...)) and pass shuffle=False.")
        spec = dataset.element_spec
        if not isinstance(spec, tuple) or len(spec) != 2:
            raise TypeError(
                f"The dataset must yield (features, targets) batches, but yields {spec}; "
                "map it to pairs, e.g. dataset.map(lambda x, y, w: (x, y)).")
        if any(isinstance(part, dict) or isinstance(part, tuple) for part in spec):
            raise TypeError(
                "The dataset's features and targets must be single tensors (one input, one "
                f"output), got {spec}.")
        if spec[0].shape.rank == 0 or spec[1].shape.rank == 0:
            raise ValueError(
                "The dataset yields single examples, not batches; batch it "
                "(dataset.batch(batch_size)) so that each element is a global batch.")
        if int(dataset.cardinality()) == 0:
            raise ValueError("The dataset holds no batches; pass a dataset with at least one "
                             "(features, targets) batch.")
        return _DatasetSource(dataset)

    def _validation(self, data, batch_size):
        if data is None:
            return None
        batch_size = check_whole_number("validation_batch_size",
                                        1024 if batch_size is None else batch_size)
        if isinstance(data, tf.data.Dataset):
            return self._dataset_source(data, None, None, False)
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError(
                "validation_data takes (x_val, y_val) arrays or a tf.data.Dataset of "
                f"(features, targets) batches, got {type(data).__name__}.")
        x, y = prepare_arrays(data[0], data[1], self.model)
        return _ArraySource(x, y, min(batch_size, len(x)), False, data)

    def _draw_seed(self, seed):
        """The shuffling seed: ``seed``, or the one this trainer (or its checkpoint) has."""
        if seed is not None:
            self.position.seed.assign(int(seed))
        elif not self.position.has_seed():
            self.position.seed.assign(int(np.random.randint(0, 2**31 - 1)))

    def _host_tensors(self, x, y):
        with tf.device(self._host):
            return tf.convert_to_tensor(x), tf.convert_to_tensor(y)

    def _batch_tensors(self, batch, split=True):
        """One dataset element as host tensors, cast as arrays are; checked against the replicas."""
        xb, yb = batch
        xb, yb = tf.convert_to_tensor(xb), tf.convert_to_tensor(yb)
        features = input_dtype(self.model)
        if features is not None and features != tf.string and xb.dtype != features:
            if not (xb.dtype.is_floating or xb.dtype.is_integer or xb.dtype.is_bool):
                raise TypeError(f"The dataset's features are {xb.dtype.name}, not numbers; map "
                                "them to numbers, or give the model a keras.Input(dtype='string').")
            xb = tf.cast(xb, features)
        if yb.dtype.is_floating and yb.dtype != loss_dtype(self.model):
            yb = tf.cast(yb, loss_dtype(self.model))
        size = int(xb.shape[0])
        if int(yb.shape[0]) != size:
            raise ValueError(f"A dataset batch has {size} features but {int(yb.shape[0])} "
                             "targets; pass (features, targets) with one target row per example.")
        parts = self.replicas * self.accumulation_steps
        if split and size % parts:
            raise ValueError(
                f"The dataset yielded a batch of {size} examples, which does not split evenly "
                f"over {self.replicas} replicas x {self.accumulation_steps} micro-batches; "
                f"batch it with a multiple of {parts} and drop_remainder=True "
                f"(dataset.batch({max(parts, size // parts * parts)}, drop_remainder=True)). "
                "SyncTrainer neither pads nor drops examples."
            )
        with tf.device(self._host):
            return tf.identity(xb), tf.identity(yb)

    def _dataset_calls(self, source, steps_per_call, skip):
        """Yield ``(x, y, position, batch, n)`` calls from a dataset, ``skip`` batches in.

        The iterator is ``self._iterator`` while it runs and is deleted when
        the generator ends or is closed (fit closes it in a ``finally``).
        """
        with tf.device(self._host):
            self._iterator = iter(source.dataset.skip(skip) if skip else source.dataset)
        try:
            pending = []
            while True:
                try:
                    batch = next(self._iterator)
                except StopIteration:
                    break
                xb, yb = self._batch_tensors(batch)
                if self._data_hint() is not None and not _finite_batch(xb, yb):
                    yield from self._flush(pending)      # the steps before it still run
                    _raise_non_finite_batch(xb, yb, int(self.position.step.numpy()),
                                            self._data_hint())
                if pending and int(pending[0][0].shape[0]) != int(xb.shape[0]):
                    yield from self._flush(pending)
                    pending = []
                pending.append((xb, yb))
                if len(pending) == steps_per_call:
                    yield from self._flush(pending)
                    pending = []
            yield from self._flush(pending)
        finally:
            self._iterator = None       # deleted here, in this thread, not by the GC later

    def _flush(self, pending):
        if not pending:
            return
        size = int(pending[0][0].shape[0])
        if len(pending) == 1:
            yield pending[0][0], pending[0][1], 0, size, 1
            return
        with tf.device(self._host):
            xs = tf.concat([p[0] for p in pending], 0)
            ys = tf.concat([p[1] for p in pending], 0)
        yield xs, ys, 0, size, len(pending)

    # -- the loop ------------------------------------------------------------------

    def _epoch_calls(self, source, steps_per_call, by_epoch, steps, shuffle):
        """Yield the calls of the current epoch (``by_epoch``) or of ``steps`` steps.

        Each call is ``(x, y, position, global_batch, n, advance)``: run ``n``
        steps on host tensors ``x, y`` from ``position``; ``advance(i)`` moves
        the trainer's position by ``i`` completed steps.
        """
        state = self.position
        if isinstance(source, _ArraySource):
            n_examples, batch = len(source.x), source.batch_size
            if not by_epoch:
                x, y = self._host_tensors(source.x, source.y)
                done = 0
                while done < steps:
                    n = min(steps_per_call, steps - done)
                    start = int(state.position.numpy())

                    def advance(i, start=start):
                        state.position.assign((start + i * batch) % n_examples)
                    yield x, y, start, batch, n, advance
                    done += n
                return
            order = np.arange(n_examples)
            if shuffle:
                order = np.random.default_rng([int(state.seed.numpy()),
                                               int(state.epoch.numpy())]).permutation(n_examples)
            x, y = self._host_tensors(source.x[order], source.y[order])
            full = n_examples // batch
            sizes = [batch] * full + ([n_examples % batch] if n_examples % batch else [])
            step = int(state.epoch_step.numpy())
            while step < len(sizes):
                size = sizes[step]
                n = 1 if size != batch else min(steps_per_call, full - step)
                yield x, y, step * batch, size, n, lambda i: None
                step += n
            return
        # A dataset: by epoch, one pass from the epoch's next batch; by
        # steps, read on from the position and start again at its end.
        if by_epoch:
            start = int(state.epoch_step.numpy())
            calls = self._dataset_calls(source, steps_per_call, start)
            produced = False
            try:
                for x, y, position, size, n in calls:
                    produced = True
                    yield x, y, position, size, n, lambda i: None
            finally:
                calls.close()
            if not produced and start == 0:
                raise ValueError("The dataset yielded no batches; pass a dataset with "
                                 "at least one (features, targets) batch.")
            return
        done, restarted = 0, False
        while done < steps:
            skip = int(state.position.numpy())
            calls = self._dataset_calls(source, min(steps_per_call, steps - done), skip)
            produced = False
            try:
                for x, y, position, size, n in calls:
                    n_here = min(n, steps - done)
                    produced = True

                    def advance(i):
                        state.position.assign_add(i)
                    yield x, y, position, size, n_here, advance
                    done += n_here
                    if done >= steps:
                        break
            finally:
                calls.close()
            if done < steps:                       # the dataset ended: start again
                if not produced and (restarted or skip == 0):
                    raise ValueError("The dataset yielded no batches; pass a dataset with "
                                     "at least one (features, targets) batch.")
                state.position.assign(0)
                restarted = not produced

    def _train(self, source, steps, epochs, steps_per_call, shuffle, validation, callbacks,
               progress):
        state = self.position
        # The same data (and batch size) as the last fit continue where it
        # ended; other data start from their first batch (a new or restored
        # trainer continues from its position).
        key = source.key(bool(epochs))
        if self._last_data is not None and not _same(self._last_data, key):
            state.position.assign(0)
            state.epoch_step.assign(0)
        self._last_data = key
        local = len(self.strategy.extended.worker_devices)
        rows = {"loss": [], "start": [], "step_time": [], "times": []}
        history = SyncHistory(
            loss=None, start=None, step_time=None, compute_start=None, compute_end=None,
            update_end=None, replicas=self.replicas, accumulation_steps=self.accumulation_steps,
            micro_batch_size=(source.batch_size or 0) // (self.replicas * self.accumulation_steps),
        )
        n_epochs = epochs or 1
        history.params = {"epochs": n_epochs, "steps": steps if steps else source.steps(),
                          "verbose": 0}
        hooks = keras.callbacks.CallbackList(callbacks, model=self.model, **history.params)
        show = self.progress if progress is None else progress
        total = steps or (source.steps() and source.steps() * n_epochs)
        bar = _progress_bar(total, show, f"sync x{self.replicas}")
        self.model.stop_training = False
        done, first_batch = 0, None
        try:
            hooks.on_train_begin()
            for _ in range(n_epochs):
                epoch = int(state.epoch.numpy())
                hooks.on_epoch_begin(epoch)
                for metric in self.metrics:
                    metric.reset_state()
                epoch_losses = []
                calls = self._epoch_calls(source, steps_per_call, bool(epochs), steps, shuffle)
                try:
                    for x, y, position, batch, n, advance in calls:
                        hooks.on_train_batch_begin(int(state.epoch_step.numpy()))
                        loss, times, start, step_time = self._run(
                            x, y, position, batch, n, done, advance, epochs is not None)
                        advance(n)
                        state.step.assign_add(n)
                        if epochs is not None:
                            state.epoch_step.assign_add(n)
                        done += n
                        first_batch = first_batch or batch
                        rows["loss"].append(loss)
                        rows["start"].append(start)
                        rows["step_time"].append(step_time)
                        rows["times"].append(times)
                        epoch_losses.extend(loss.tolist())
                        if bar is not None:
                            bar.update(n)
                            bar.set_postfix(loss=f"{loss[-1]:.4g}", refresh=False)
                        hooks.on_train_batch_end(int(state.epoch_step.numpy()) - 1,
                                                 {"loss": float(np.mean(epoch_losses))})
                        if self.model.stop_training:
                            break
                finally:
                    calls.close()
                logs = {"loss": float(np.mean(epoch_losses)) if epoch_losses else float("nan")}
                logs.update({metric.name: float(metric.result()) for metric in self.metrics})
                if validation is not None:
                    logs.update(self._evaluate_source(validation))
                if epochs is not None and not self.model.stop_training:
                    state.epoch.assign_add(1)
                    state.epoch_step.assign(0)
                history.epoch.append(epoch)
                for name, value in logs.items():
                    history.history.setdefault(name, []).append(value)
                hooks.on_epoch_end(epoch, logs)
                if self.model.stop_training:
                    break
            hooks.on_train_end(logs if history.epoch else None)
        finally:
            if bar is not None:
                bar.close()
            self._iterator = None
        empty = np.empty((0, local))
        times = np.concatenate(rows["times"]) if rows["times"] else np.empty((0, local, 3))
        history.loss = np.concatenate(rows["loss"]) if rows["loss"] else np.empty(0)
        history.start = np.concatenate(rows["start"]) if rows["start"] else np.empty(0)
        history.step_time = (np.concatenate(rows["step_time"]) if rows["step_time"]
                             else np.empty(0))
        history.compute_start = times[:, :, 0] if len(times) else empty
        history.compute_end = times[:, :, 1] if len(times) else empty
        history.update_end = times[:, :, 2] if len(times) else empty
        if source.batch_size is None and first_batch:
            history.micro_batch_size = first_batch // (self.replicas * self.accumulation_steps)
        return history

    def _run(self, x, y, position, batch, n, done, advance, by_epoch):
        """Run one call of ``n`` steps; return losses, replica times, starts and step times."""
        self._before_step(done)
        seen = int(self._seen_steps.numpy()) if self.stop_on_non_finite else 0
        start = time.time()
        try:
            if n == 1:
                loss, times = self._step_function(x, y, tf.constant(position, tf.int32), batch)
                loss, times = loss.numpy()[None], times.numpy()[None]
                return loss, times, np.array([start]), np.array([time.time() - start])
            loss, times = self._steps_function(x, y, tf.constant(position, tf.int32), batch,
                                               tf.constant(n))
        except tf.errors.InvalidArgumentError as error:
            if NON_FINITE_MARK not in str(error):
                raise
            self._raise_non_finite(seen, advance, by_epoch)
        loss, times = loss.numpy(), times.numpy()
        if self.record_times:
            ends = times[:, :, 2].max(axis=1)
        else:                    # no timestamps: the call's mean step
            ends = start + (time.time() - start) * np.arange(1, n + 1) / n
        starts = np.concatenate([[start], ends[:-1]])
        return loss, times, starts, ends - starts

    def _raise_non_finite(self, seen, advance, by_epoch):
        """After a step stopped on a non-finite loss: keep the position right, then raise."""
        completed = int(self._seen_steps.numpy()) - seen - 1   # steps of the call before it
        advance(completed)
        self.position.step.assign_add(completed)
        if by_epoch:
            self.position.epoch_step.assign_add(completed)
        losses = self._seen_losses.numpy()
        replica = int(np.flatnonzero(~np.isfinite(losses))[0])
        raise NonFiniteLossError(
            int(self.position.step.numpy()), f"replica {replica}", losses[replica],
            "To train on regardless, pass stop_on_non_finite=False to SyncTrainer.") from None

    def _evaluate_source(self, source):
        """``{"val_loss": ..., "val_<metric>": ...}`` of a validation source."""
        for metric in self.metrics:
            metric.reset_state()
        total, count = 0.0, 0
        if isinstance(source, _ArraySource):
            for low in range(0, len(source.x), source.batch_size):
                x, y = self._host_tensors(source.x[low:low + source.batch_size],
                                          source.y[low:low + source.batch_size])
                total += float(self._evaluate_function(x, y))
                count += int(x.shape[0])
        else:
            with tf.device(self._host):
                iterator = iter(source.dataset)
            try:
                for batch in iterator:
                    x, y = self._batch_tensors(batch, split=False)
                    total += float(self._evaluate_function(x, y))
                    count += int(x.shape[0])
            finally:
                del iterator
        if count == 0:
            raise ValueError("validation_data holds no examples; pass at least one.")
        penalties = self.model.losses
        loss = total / count + sum(float(p) for p in penalties)
        logs = {"val_loss": loss}
        logs.update({f"val_{metric.name}": float(metric.result()) for metric in self.metrics})
        return logs

    def _before_step(self, step):
        """Called before each call of the step function; nothing to do in the core.

        (The book's instrumented trainer sets its backup-worker plan here.)
        """


class _ArraySource:
    """In-memory arrays (checked and cast), their global batch size, and what was passed."""

    def __init__(self, x, y, batch_size, by_epoch, originals):
        self.x, self.y, self.batch_size = x, y, batch_size
        self._originals = originals

    def steps(self):
        return -(-len(self.x) // self.batch_size)

    def key(self, by_epoch):
        """What a later fit must pass to continue this one: the same objects, batch, mode."""
        return (by_epoch, self.batch_size) + tuple(self._originals)


class _DatasetSource:
    """A tf.data.Dataset of global batches."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.batch_size = None
        cardinality = int(dataset.cardinality())
        self._steps = cardinality if cardinality >= 0 else None
        self.infinite = cardinality == tf.data.INFINITE_CARDINALITY

    def steps(self):
        return self._steps

    def key(self, by_epoch):
        return (by_epoch, None, self.dataset)


def _finite_batch(x, y):
    """Whether every float value of a dataset batch's features and targets is finite."""
    return all(bool(tf.reduce_all(tf.math.is_finite(t))) for t in (x, y) if t.dtype.is_floating)


def _raise_non_finite_batch(x, y, step, hint):
    """Raise NonFiniteDataError for the batch that step ``step`` would have used."""
    for label, tensor in (("features", x), ("targets", y)):
        found = first_non_finite_row(tensor.numpy())
        if found is not None:
            raise NonFiniteDataError(
                f"row {found[0]} of the dataset batch's {label} for step {step}", found[1], hint)


def _same(a, b):
    """Two data keys name the same data: equal mode and batch size, identical objects."""
    return a[:2] == b[:2] and len(a) == len(b) and all(p is q for p, q in zip(a[2:], b[2:]))


def _tf_variable(variable):
    """The tf.Variable behind a Keras variable (or the variable itself)."""
    inner = getattr(variable, "value", None)   # a tf.Variable's own .value is a method
    return inner if isinstance(inner, tf.Variable) else variable


def _progress_bar(total, show, description):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, mininterval=0.5, leave=True)


# ----------------------------------------------------------------------------
# All-reduce, step by step (for the picture)
# ----------------------------------------------------------------------------

def ring_all_reduce(vectors):
    """Sum ``vectors`` (one row per replica) with the ring algorithm, in NumPy.

    Each of the n replicas cuts its vector into n chunks.  In n - 1
    *reduce-scatter* steps every replica sends one chunk to its right
    neighbour, which adds it to its own; afterwards replica r holds the full
    sum of chunk (r + 1) mod n.  In n - 1 *all-gather* steps the finished
    chunks travel once more around the ring.  Each replica sends
    2 (n - 1) / n of its vector in total, however many replicas there are.

    Returns ``(result, states, sent)``: the final (n, length) array (every
    row the sum), the array after each of the 2 (n - 1) steps, and for each
    step the list of ``(sender, receiver, chunk)`` transfers.  Taught in the
    chapter "Synchronous training".
    """
    data = np.array(vectors, dtype=np.float64, copy=True)
    if data.ndim != 2 or len(data) < 2:
        raise ValueError("ring_all_reduce needs a 2-D array with one row per replica (at least 2).")
    n, length = data.shape
    if length % n:
        raise ValueError(f"Each vector's length ({length}) must be a multiple of the replicas ({n}).")
    chunk = length // n
    piece = lambda c: slice(c * chunk, (c + 1) * chunk)  # noqa: E731
    states, sent = [data.copy()], []
    for step in range(2 * (n - 1)):
        transfers = []
        outgoing = data.copy()            # every replica sends at the same time
        for sender in range(n):
            receiver = (sender + 1) % n
            if step < n - 1:              # reduce-scatter: add the incoming chunk
                c = (sender - step) % n
                data[receiver, piece(c)] += outgoing[sender, piece(c)]
            else:                         # all-gather: overwrite with the finished chunk
                c = (sender + 1 - (step - (n - 1))) % n
                data[receiver, piece(c)] = outgoing[sender, piece(c)]
            transfers.append((sender, receiver, c))
        states.append(data.copy())
        sent.append(transfers)
    return data, states, sent
