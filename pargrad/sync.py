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
hook of a call, :meth:`SyncTrainer._before_step`.  What a reader's own
model and data need before the first step (targets shaped as Keras shapes
them, the loss by name, clear errors) is in :mod:`pargrad.losses`,
shared with the other trainers; the casts of the data, which batches come
next, and where training stands, in :mod:`pargrad.data`; the callbacks, the records and the
progress bar in :mod:`pargrad.loop`; the strategy in
:mod:`pargrad.strategies`.  This module never imports the book.

A reader's map: where ``learning_rate`` goes, from the call to the update.

1. ``SyncTrainer(model, strategy, learning_rate=0.01)``: ``__init__`` makes
   ``keras.optimizers.SGD(learning_rate)`` inside ``strategy.scope()`` (or
   takes your ``optimizer``, which carries its own rate; under a
   ``mixed_float16`` policy it wraps it in a ``LossScaleOptimizer``), builds
   it for the model's variables and keeps it as ``self.optimizer``.
   Nothing else in this module reads the rate.
2. ``trainer.fit(x, y, steps=..., batch_size=...)``: checks the data and
   casts it (:func:`pargrad.data.fit_source`), checks that ``batch_size``
   splits over replicas x ``accumulation_steps``;
   :func:`pargrad.loop.fit_loop` runs the epochs inside Keras's callback
   protocol, :func:`pargrad.loop.train_epoch` one epoch, whose calls
   :class:`pargrad.data.EpochReader` says; per call :meth:`run_call` calls
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
import time
import types

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import check_flag, check_whole_number  # noqa: E402
from pargrad.strategies import (  # noqa: E402
    ReplicaEvaluation,
    check_model_and_strategy,
    check_optimizer_in_scope,
    check_rate_or_optimizer,
    gather_from_replicas,
    host_device,
    tf_variable,
    variables_outside_scope,
)
from pargrad.data import (  # noqa: E402
    EpochReader,
    Feed,
    TrainingPosition,
    dataset_source,
    fit_source,
    host_rows,
    validation_source,
)
from pargrad.loop import KerasHistory, StoppedCall, fit_loop  # noqa: E402
from pargrad.losses import (  # noqa: E402
    NonFiniteLossError,
    keras_metrics,
    per_example_loss,
)


# ----------------------------------------------------------------------------
# What a run records
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class SyncHistory(KerasHistory):
    """What :meth:`SyncTrainer.fit` measured: per step (update), and per epoch as Keras does.

    Per epoch, as Keras's ``History`` (the fields of
    :class:`pargrad.loop.KerasHistory`): ``history["loss"]`` (the mean of the
    epoch's step losses, regularization included), one entry per metric,
    ``val_*`` with ``validation_data``; ``epoch``, ``params``.  A fit with
    ``steps=`` is one epoch.

    Per step, one entry a step: ``loss`` (the global batch's), ``start``
    and ``step_time`` (seconds on this process's wall clock; with
    ``steps_per_call`` > 1 each step of a call gets the call's mean).  The
    book's instrumented trainer records more per replica (its subclass
    :class:`pargrad.book.instruments.InstrumentedSyncHistory`).
    """

    loss: np.ndarray
    start: np.ndarray
    step_time: np.ndarray
    replicas: int
    accumulation_steps: int
    micro_batch_size: int

    @property
    def effective_batch_size(self):
        """Examples per update: micro-batch x accumulation steps x replicas."""
        return self.micro_batch_size * self.accumulation_steps * self.replicas

    @property
    def steps_per_second(self):
        """Updates per second over the whole run."""
        return len(self.step_time) / float(np.sum(self.step_time))

    def __len__(self):
        return len(self.loss)


# ----------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------

# The texts of the assertions that stop a step: a loss that is not finite, a
# global batch whose sample weights are not positive in sum (or hold a negative one).
NON_FINITE_MARK = "pargrad: the loss of a replica is not finite"
WEIGHT_MARK = "pargrad: the total weight of the global batch is not positive"

# The private names of SyncTrainer that a subclass may use (see "The subclass
# contract" in SyncTrainer's docstring): what it overrides, and what it calls.
SUBCLASS_CONTRACT = {
    "overrides": ("_make_optimizer", "_replica_step", "_distributed_step", "_history",
                  "_evaluation_model", "_before_fit", "_before_step", "_step_ends"),
    "calls": ("_shard", "_gradients", "_local_gradients", "_replica_gradients",
              "_stop_if_not_finite", "_finite_check"),
}


class SyncTrainer(tf.Module):
    """Synchronous data-parallel training: one all-reduce and one update a step.

    Usage::

        strategy = pargrad.sync_strategy(2)        # after pargrad.logical_devices
        with strategy.scope():
            model = parabola_model(seed=0)  # pargrad.book.parabola
        trainer = pargrad.SyncTrainer(model, strategy, learning_rate=1e-2)
        history = trainer.fit(x, y, steps=2000)    # full batch every step

    Each step every replica reads the same parameters, computes the gradient
    of its shard of the global batch with the loss scaled by the *global*
    batch size (as ``tf.nn.compute_average_loss`` does), the optimizer
    all-reduces (sums) the gradients once, and applies one update on every
    replica.  The result equals a single device's step on the whole batch,
    up to the order of floating-point additions.

    Arguments (keyword-only after ``strategy``):

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
      :func:`pargrad.losses.per_example_loss` for how targets are shaped
      (as Keras does: ``y`` of shape ``(N,)`` fits a one-output model).
    * ``optimizer``: a Keras optimizer created inside ``strategy.scope()``;
      default plain gradient descent (``keras.optimizers.SGD``) with
      ``learning_rate`` (0.01 when not given).  An optimizer carries its own
      rate, so passing ``learning_rate`` beside it raises ``ValueError``.
      Under a ``mixed_float16`` policy it is wrapped in
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
    * ``progress``: show a progress bar (tqdm, notebook-aware) during fit;
      a constructor argument in all four trainers.
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
    shuffling seed) lives in variables (:class:`pargrad.data.TrainingPosition`,
    ``trainer.position``) that the trainer hands to ``tf.train.Checkpoint``::

        checkpoint = tf.train.Checkpoint(model=model, optimizer=trainer.optimizer,
                                         trainer=trainer)

    Restoring that into a new trainer and fitting on continues exactly where
    the saved run stopped: 10 steps, save, restore, 10 steps equal 20 steps
    bit for bit.

    The book's instruments (each replica's timestamps, stragglers, emulated
    devices, backup workers) are not here: they are a subclass,
    :class:`pargrad.book.instruments.InstrumentedSyncTrainer`, that wraps
    them around the same lines of :meth:`_replica_step`; its ``scenario``
    and ``step_seconds`` are constructor arguments there, as in
    :class:`pargrad.LocalSGDTrainer` (:class:`pargrad.AsyncTrainer` takes
    them in ``fit``).

    Bad input: a global batch that the replicas (times ``accumulation_steps``)
    cannot split evenly raises ``ValueError`` and names the nearest sizes
    that work; there is no silent padding or dropping, because either would
    change the update that the book compares with the single-device one.
    Every other bad argument raises an error that says what to pass.

    **The subclass contract.**  A trainer built on this one (the book's
    :class:`pargrad.book.instruments.InstrumentedSyncTrainer`,
    :class:`pargrad.ShardedTrainer`) uses only these names of it, listed in
    :data:`SUBCLASS_CONTRACT` (a repository test,
    ``tests/repository/test_trainer_contract.py``, fails on any other
    private name of the parent used by a subclass).  It may *override*:

    * :meth:`_make_optimizer` (the optimizer's construction; returns it),
    * :meth:`_replica_step` (one replica's part of a step) or
      :meth:`_distributed_step` (the whole step, in cross-replica context),
    * :meth:`_history` (what ``fit`` returns, from the step records),
    * :meth:`_evaluation_model` (the model that ``evaluate`` and validation run),
    * :meth:`variables_by_component` (the variables holding training state,
      by component, for :func:`pargrad.memory.bytes_by_device`),
    * the hooks :meth:`_before_fit` (once at the start of every ``fit``),
      :meth:`_before_step` (before each call of the step function) and
      :meth:`_step_ends` (when each step of a call ended);

    and it may *call*: :meth:`_shard` (this replica's rows),
    :meth:`_gradients`, :meth:`_local_gradients`, ``_replica_gradients``
    (the loss and gradients before any communication),
    :meth:`_stop_if_not_finite` (in replica context) and
    :meth:`_finite_check` (on every replica's loss at once, in cross-replica
    context).  ``fit``, ``run_call``, ``evaluate`` and the errors are the
    parent's; every message names ``type(self).__name__``.

    Taught in the chapters "Synchronous training" and "Your own model".
    """

    # What one step returns, one row a step: the core, the loss (the book's
    # instrumented trainer adds each replica's times).
    step_outputs = ("loss",)

    def __init__(self, model, strategy, *, loss=None, optimizer=None, learning_rate=None,
                 accumulation_steps=1, progress=True, jit_compile=False, metrics=None,
                 stop_on_non_finite=True, sample_weight=None):
        super().__init__(name="sync_trainer")
        released = getattr(model, "_pargrad_released", None)     # set by ShardedTrainer
        if isinstance(released, str):
            raise ValueError(f"{released}, so {type(self).__name__} cannot train it; call "
                             "unshard() on that trainer first.")
        check_model_and_strategy(type(self).__name__, model, strategy)
        self.accumulation_steps = check_whole_number(
            "accumulation_steps", accumulation_steps, advice="Pass 1 for no accumulation.")
        self.stop_on_non_finite = check_flag("stop_on_non_finite", stop_on_non_finite)
        if sample_weight is not None and not callable(sample_weight):
            raise TypeError(
                f"sample_weight must be None or a function sample_weight(x, y) returning a "
                f"micro-batch's weights, got {type(sample_weight).__name__}; pass for example "
                "lambda x, y: tf.cast(y != 0, 'float32') for a padding mask.")
        self.metrics = self._check_metrics(metrics, strategy)
        if self.metrics and jit_compile:
            raise ValueError(
                "metrics are updated inside the step, which jit_compile=True compiles with "
                "XLA on each replica; pass jit_compile=False to use metrics, or evaluate "
                "the metrics yourself after fit."
            )
        self.model, self.strategy = model, strategy
        self.loss = per_example_loss(loss)
        self.sample_weight = sample_weight
        self._loss_values = self.loss.values if sample_weight is not None else None
        self.progress = check_flag("progress", progress)
        self.jit_compile = bool(jit_compile)
        self.optimizer = self._make_optimizer(optimizer, learning_rate)
        if getattr(self.model, "optimizer", None) is None:
            # As after Keras's compile: callbacks read model.optimizer (TensorBoard).
            self.model.optimizer = self.optimizer
        with strategy.scope():
            # What a failing step leaves behind (each replica's loss, the
            # steps that ran): read to name the step and replica in the error.
            on_read = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            # A plain namespace, so that tf.train.Checkpoint leaves these scratch records out
            # (their shape depends on the replicas; a checkpoint restores on any count).
            self._failures = types.SimpleNamespace(
                losses=tf.Variable(tf.zeros([self.replicas], tf.float64), **on_read),
                steps=tf.Variable(tf.constant(0, tf.int64), **on_read),
                weight=tf.Variable(tf.constant(0, tf.float64), **on_read),
                weighed=tf.Variable(tf.constant(0, tf.int64), **on_read))
        # Where training stands, saved by tf.train.Checkpoint(..., trainer=self).
        self.position = TrainingPosition()
        # The host of this process's replicas, where the data are kept, and how
        # batches must look.
        self._host = host_device(strategy)
        hint = (f"To train on regardless, pass stop_on_non_finite=False to {type(self).__name__}."
                if self.stop_on_non_finite else None)
        self._feed = Feed.for_model(model, host=self._host, replicas=self.replicas,
                                    accumulation_steps=self.accumulation_steps, finite_hint=hint,
                                    trainer=type(self).__name__)
        self._evaluation = ReplicaEvaluation(strategy, self._evaluation_model(), self.loss,
                                             self.metrics, self._feed)
        self._compile_step()

    def _make_optimizer(self, optimizer, learning_rate):
        """The optimizer, built in the strategy's scope (part of the subclass contract).

        Default: ``keras.optimizers.SGD(learning_rate)`` (0.01 without one).
        Under ``mixed_float16`` it is wrapped in a ``LossScaleOptimizer``, as
        Keras's ``compile`` does.  An uncompiled model then gets it as
        ``model.optimizer``, for the callbacks that read it.
        """
        check_rate_or_optimizer(type(self).__name__, optimizer, learning_rate)
        with self.strategy.scope():
            if optimizer is None:
                optimizer = keras.optimizers.SGD(1e-2 if learning_rate is None else learning_rate)
            check_optimizer_in_scope("optimizer", optimizer, self.strategy)
            if (getattr(self.model.dtype_policy, "name", None) == "mixed_float16"
                    and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
                # As Keras's compile does: float16 gradients underflow without it.
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(self.model.trainable_variables)
        return optimizer

    def _evaluation_model(self):
        """The model that ``evaluate`` and ``validation_data`` run (part of the subclass contract).

        Called once, when the trainer is made: anything called as
        ``model(x, training=False)`` with a ``losses`` attribute.
        """
        return self.model

    def variables_by_component(self):
        """``[(component, tf.Variable)]``: the variables holding training state, by component.

        What :func:`pargrad.memory.bytes_by_device` counts, one row per
        device's copy.  Components as :func:`pargrad.memory.state_bytes`:
        ``parameters`` (the model's mirrored variables, one copy a replica),
        ``optimizer_state`` (the optimizer's slots) and ``gradients``: this
        trainer keeps no gradient variables (its gradients are tensors that
        live from the backward pass to the update, one full set a
        replica), so each parameter's copy is listed again as its
        gradient's size, so that the stages compare like for like.
        Counters (the iteration count, the learning rate, the position)
        are left out.  Taught in the chapter "When the model does not fit".
        """
        rows = []
        for variable in self.model.trainable_variables:
            rows += [("parameters", v) for v in _copies(variable)]
            rows += [("gradients", v) for v in _copies(variable)]   # the transient gradient
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        rows += [("optimizer_state", v) for slot in optimizer_slots(optimizer)
                 for v in _copies(slot)]
        return rows

    def _compile_step(self):
        """The ``tf.function`` s of one step, of a graph loop of steps, and of evaluation.

        No AutoGraph: the step is plain TensorFlow, so nothing depends on
        source transformation (and its caches) of this class's methods.
        With jit_compile, a replica's forward and backward passes (all k
        micro-batches) are one XLA computation, traced once per replica;
        the all-reduce and the update stay outside it (see the docstring).
        """
        def compiled(function):
            return (tf.function(function, autograph=False, jit_compile=True)
                    if self.jit_compile else function)

        self._replica_gradients = compiled(self._local_gradients)
        if self.sample_weight is not None:
            # The total weight is all-reduced first, outside any XLA computation.
            self._shard_gradients = compiled(self._weighted_local_gradients)
            self._replica_gradients = self._weighted_replica_gradients
        self._step_function = tf.function(self._distributed_step, autograph=False)
        self._steps_function = tf.function(self._distributed_steps, autograph=False)

    @property
    def replicas(self):
        """Replicas taking part in every update, over all processes."""
        return self.strategy.num_replicas_in_sync

    @staticmethod
    def _check_metrics(metrics, strategy):
        checked = keras_metrics(metrics, ", created inside `with strategy.scope():`")
        for metric in checked:
            if variables_outside_scope(strategy, metric.variables):
                raise ValueError(
                    f"The metric {metric.name!r} was created outside this strategy's scope, so "
                    "its replicas cannot add up their counts; create it inside "
                    "`with strategy.scope():`."
                )
        return checked

    # -- one step --------------------------------------------------------------

    def _replica_step(self, x, y, global_batch_size):
        """One replica's part of a step (runs in replica context); returns ``{"loss": its loss}``.

        ``x, y`` are this replica's shard.  Its loss is its examples' losses
        summed and divided by the *global* batch size, so the sum over the
        replicas is the mean over the whole batch.

        Shown in the chapter "Synchronous training in depth".
        """
        variables = self.model.trainable_variables
        loss, grads = self._replica_gradients(x, y, global_batch_size)  # no communication
        grads = self._stop_if_not_finite(loss, grads)    # with stop_on_non_finite
        # One all-reduce (a sum over replicas) and one update, inside Keras.
        self.optimizer.apply_gradients(zip(grads, variables))
        return {"loss": loss}

    def _local_gradients(self, x, y, global_batch_size):
        """This replica's loss and gradient sum, before any communication."""
        variables = self.model.trainable_variables
        if self.accumulation_steps == 1:
            return self._gradients(x, y, variables, global_batch_size)
        return self._accumulated_gradients(x, y, variables, global_batch_size)

    def _gradients(self, x, y, variables, global_batch_size):
        """The loss of ``(x, y)`` divided by the *global* batch size, and its gradients.

        Shown in the chapter "Synchronous training in depth".
        """
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
        can name the replica (from ``_failures.losses``).  Without
        ``stop_on_non_finite``, the gradients unchanged.
        """
        if not self.stop_on_non_finite:
            return grads
        losses = gather_from_replicas(tf.cast(loss, tf.float64), self.replicas)
        with tf.control_dependencies([self._finite_check(losses)]):
            return [tf.identity(g) for g in grads]

    def _finite_check(self, losses):
        """The op that stops a step whose replicas' ``losses`` (float64, one a replica) are not
        all finite, after noting them for the error (part of the subclass contract).

        Called in replica context by :meth:`_stop_if_not_finite`, or once in
        cross-replica context by a trainer that holds every replica's loss.
        """
        noted = [self._failures.losses.assign(losses), self._failures.steps.assign_add(1)]
        with tf.control_dependencies(noted):
            return tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(losses)),
                                       [NON_FINITE_MARK])

    def _weighted_replica_gradients(self, x, y, global_batch_size):
        """With ``sample_weight``: the replica's loss and gradients over the global total weight.

        Each replica adds up the weights of its micro-batches; one all-reduce
        of that one number (per update) gives the total weight ``W`` of the
        global batch, by which every replica divides its weighted loss sum.

        Shown in the chapter "Accumulating sequences".
        """
        weights = [tf.cast(self.sample_weight(xb, yb), tf.float64)
                   for xb, yb in self._micro_batches(x, y)]
        local = tf.add_n([tf.reduce_sum(w) for w in weights])
        # A negative weight spoils the sum (NaN), so that every replica stops at the check.
        negative = tf.reduce_any([tf.reduce_any(w < 0) for w in weights])
        local = tf.where(negative, tf.constant(np.nan, tf.float64), local)
        context = tf.distribute.get_replica_context()
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
        noted = [self._failures.weight.assign(total), self._failures.weighed.assign_add(1)]
        with tf.control_dependencies(noted):
            check = tf.debugging.Assert(total > 0, [WEIGHT_MARK])   # False for NaN too
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
        """Sum the gradients of k micro-batches on this replica, no communication.

        Shown in the chapter "Accumulation in TF2 and across replicas".
        """
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

        Shown in the chapter "Synchronous training in depth".
        """
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        per_replica = global_batch_size // self.replicas
        start = tf.cast(position, tf.int32) + tf.cast(replica, tf.int32) * per_replica
        xb, yb = host_rows(x, y, start, per_replica, self._host)   # on the host
        k = self.accumulation_steps
        if k > 1:
            xb = tf.reshape(xb, [k, -1] + list(x.shape[1:]))
            yb = tf.reshape(yb, [k, -1] + list(y.shape[1:]))
        return tf.identity(xb), tf.identity(yb)   # on the replica's own device

    def _distributed_step(self, x, y, position, global_batch_size):
        """One step on every replica; returns what :meth:`_replica_step` returns, reduced.

        ``"loss"``: the global batch's loss (the replicas' sum); any other
        output: this process's replicas' values, stacked (one row a replica).
        """
        def replica_step():
            xb, yb = self._shard(x, y, position, global_batch_size)
            return self._replica_step(xb, yb, global_batch_size)

        outputs = self.strategy.run(replica_step)
        loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, outputs.pop("loss"), axis=None)
        return {"loss": tf.cast(loss, tf.float64),
                **{name: tf.stack(self.strategy.experimental_local_results(value))
                   for name, value in outputs.items()}}

    def _distributed_steps(self, x, y, position, global_batch_size, steps):
        """``steps`` synchronous steps in one call (a graph loop, no Python between).

        Returns what :meth:`_distributed_step` returns, stacked: one row a step.
        """
        def body(i, rows):
            outputs = self._distributed_step(
                x, y, position + i * global_batch_size, global_batch_size)
            return i + 1, {name: rows[name].write(i, outputs[name]) for name in rows}

        _, rows = tf.while_loop(
            lambda i, _: i < steps, body,
            (tf.constant(0), {name: tf.TensorArray(tf.float64, size=steps)
                              for name in self.step_outputs}))
        return {name: row.stack() for name, row in rows.items()}

    # -- the loop --------------------------------------------------------------

    def fit(self, x, y=None, *, batch_size=None, epochs=None, steps=None, shuffle=None,
            seed=None, validation_data=None, validation_batch_size=None, callbacks=None,
            steps_per_call=1):
        """Train in global batches of ``batch_size`` (across all replicas); return a SyncHistory.

        ``batch_size`` is the *global* batch of one update, over all replicas
        and micro-batches (default: all of ``x``, full-batch gradient descent
        as in the y = x² question); each replica takes ``batch_size /
        replicas`` of its rows.  Every argument after ``y`` is keyword-only:
        ``fit(x, y, 64)`` is refused rather than read as 64 updates.

        How long: exactly one of

        * ``steps``: that many updates.  Arrays are read in order, batch after
          batch, wrapping around at the end (no shuffling), and ``fit`` again
          with the same arrays and batch size continues with the next batch,
          so ``fit(x, y, steps=10)`` twice equals ``fit(x, y, steps=20)``; a
          dataset is read the same way, starting again when it ends.  The
          whole call counts as one epoch for the history and the callbacks,
          whose batch indices run 0 ... steps - 1.
        * ``epochs``: that many more passes over the data (Keras's epochs).
          An epoch of arrays is ``ceil(len(x) / batch_size)`` steps; its last,
          smaller batch must split over the replicas too.  ``shuffle``
          (default True, as in Keras) reorders the arrays each epoch with a
          permutation drawn from ``seed`` and the epoch's number
          (:func:`pargrad.data.epoch_permutation`), so a run is reproducible
          (``seed=None`` draws one from NumPy's global generator, which
          ``keras.utils.set_random_seed`` seeds, once per trainer, and keeps
          it in the trainer's position).  An epoch of a dataset is one pass
          over it (shuffle it in the pipeline).

        The data:

        * arrays ``x, y`` (NumPy arrays or lists), cut into equal contiguous
          shards, one a replica (and ``accumulation_steps`` micro-batches
          within a shard).  Features are cast to the model's input dtype,
          float targets to its output dtype
          (:func:`pargrad.data.prepare_arrays`).
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
        batches, evaluated at the end of every epoch as :meth:`evaluate`
        does: ``val_loss`` and ``val_<metric>`` in the history and the
        callbacks' logs, in batches of ``validation_batch_size`` (default 1024).

        ``callbacks``: Keras callbacks, called in Keras's order
        (:func:`pargrad.loop.fit_loop`): ``on_train_begin/end``,
        ``on_epoch_begin/end`` (logs with ``loss``, metrics, ``val_*``) and
        ``on_train_batch_begin/end`` (the batch's index in the epoch; logs
        with the epoch's running ``loss`` and metrics); setting
        ``model.stop_training = True`` (``EarlyStopping``,
        ``TerminateOnNaN``) ends the fit after the step.

        ``steps_per_call`` runs that many steps in one ``tf.function`` call
        (like Keras's ``steps_per_execution``): every step is still one
        all-reduce and one update, but Python launches the graph once per
        call (callbacks see a call as one batch, indexed by its last step, as
        Keras does).  With 1, ``step_time`` is measured in Python around each
        step (launch and fetching included); with more, each step of a call
        gets the call's mean (the instrumented trainer of the book times
        each step on the replicas).  The progress bar is the constructor's
        ``progress``, as for every trainer of the package.
        """
        self._before_fit()
        steps, epochs = _fit_length(steps, epochs)
        by_epoch = epochs is not None
        shuffle = check_flag("shuffle", (by_epoch and not isinstance(x, tf.data.Dataset))
                             if shuffle is None else shuffle)
        source = fit_source(x, y, batch_size, by_epoch=by_epoch, shuffle=shuffle,
                            model=self.model, feed=self._feed)
        validation = validation_source(validation_data, validation_batch_size, self.model)
        reader = EpochReader(source, self.position, self._feed, steps_per_call=steps_per_call,
                             steps=steps, shuffle=shuffle, seed=seed)
        records, keras_history = fit_loop(self, reader, epochs=epochs or 1, callbacks=callbacks,
                                          validation=validation,
                                          progress=f"sync x{self.replicas}" if self.progress else None)
        return self._history(records, keras_history, source)

    def run_call(self, call, done):
        """Run one :class:`pargrad.data.Call` (``done`` steps into the fit); return its
        outputs (a row a step), the steps' starts and lengths.

        What :func:`pargrad.loop.fit_loop` asks of a trainer; a step whose loss is
        not finite raises :class:`pargrad.loop.StoppedCall` with the steps before it.
        """
        self._before_step(done)
        seen = self._counts()
        start = time.time()
        try:
            position = tf.constant(call.first_row, tf.int32)
            if call.steps == 1:
                outputs = self._step_function(call.x, call.y, position, call.batch_size)
                outputs = {name: value.numpy()[None] for name, value in outputs.items()}
                return outputs, np.array([start]), np.array([time.time() - start])
            outputs = self._steps_function(call.x, call.y, position, call.batch_size,
                                           tf.constant(call.steps))
        except tf.errors.InvalidArgumentError as error:
            stop = self._stopped(str(error), seen)
            if stop is None:
                raise
            raise stop from None
        outputs = {name: value.numpy() for name, value in outputs.items()}
        ends = self._step_ends(outputs, start)
        starts = np.concatenate([[start], ends[:-1]])
        return outputs, starts, ends - starts

    def _step_ends(self, outputs, start):
        """When each step of a call ended: the call's time shared out evenly."""
        n = len(outputs["loss"])
        return start + (time.time() - start) * np.arange(1, n + 1) / n

    def _counts(self):
        """Steps that reached the finite-loss check, and the weight check, so far.

        Each is read only when its check is on: a read of a replica variable
        costs a step of the one-step-a-call loop a measurable share.
        """
        seen = int(self._failures.steps.numpy()) if self.stop_on_non_finite else 0
        weighed = int(self._failures.weighed.numpy()) if self.sample_weight is not None else 0
        return seen, weighed

    def _stopped(self, message, seen):
        """The :class:`pargrad.loop.StoppedCall` of a step stopped by one of the trainer's
        checks (the steps of the call before it completed), or None for another error."""
        if WEIGHT_MARK in message:
            return StoppedCall(self._counts()[1] - seen[1] - 1, self._weight_error)
        if NON_FINITE_MARK in message:
            return StoppedCall(self._counts()[0] - seen[0] - 1, self._non_finite_error)
        return None

    def _weight_error(self, step):
        """The error of step ``step``, whose global batch's weights were refused."""
        if np.isnan(self._failures.weight.numpy()):
            return ValueError(
                f"sample_weight must be >= 0 (a mask of 0s and 1s, or weights), but the global "
                f"batch of step {step} holds a negative (or NaN) weight; nothing was applied. "
                "Return weights >= 0 from sample_weight(x, y).")
        return ValueError(
            f"sample_weight: the global batch of step {step} has total weight 0 (only "
            "padding?), so its weighted mean is undefined; nothing was applied. Pass batches "
            "with at least one weighted value.")

    def _non_finite_error(self, step):
        """The error of step ``step``, which stopped on a replica's non-finite loss."""
        losses = self._failures.losses.numpy()
        replica = int(np.flatnonzero(~np.isfinite(losses))[0])
        return NonFiniteLossError(
            step, f"replica {replica}", losses[replica],
            f"To train on regardless, pass stop_on_non_finite=False to {type(self).__name__}.")

    def _history(self, records, keras_history, source):
        """The :class:`SyncHistory` of a fit: its step records and Keras's History."""
        batches = records.stacked("batch_size")
        batch = source.batch_size or (int(batches[0]) if len(batches) else 0)
        return SyncHistory(
            loss=records.stacked("loss"), start=records.stacked("start"),
            step_time=records.stacked("step_time"), replicas=self.replicas, accumulation_steps=self.accumulation_steps,
            micro_batch_size=batch // (self.replicas * self.accumulation_steps),
            history=keras_history.history, epoch=keras_history.epoch,
            params=keras_history.params)

    # -- evaluation ----------------------------------------------------------------

    def evaluate(self, x, y=None, *, batch_size=None):
        """The loss and metrics of ``(x, y)`` (or a dataset of batches), as a dict.

        As Keras's ``evaluate(..., return_dict=True)``: ``{"loss": ...,
        "<metric name>": ...}``, in inference mode (``training=False``), the
        loss the mean over every example plus the model's regularization
        losses, the metrics over all of them.  A dict rather than Keras's
        default list, so that each number carries its name.  Arrays are
        evaluated in batches of ``batch_size`` (default 1024; the result
        does not depend on it beyond rounding); the replicas share each batch.
        Taught in the chapter "Your own model".
        """
        if isinstance(x, tf.data.Dataset):
            source = dataset_source(x, y, batch_size)
        else:
            source = validation_source((x, y), batch_size, self.model)
        return self.evaluate_source(source)

    def evaluate_source(self, source, prefix=""):
        """``{prefix + "loss": ..., prefix + metric: ...}`` of a checked source."""
        return self._evaluation(source, prefix)

    def _before_fit(self):
        """Called at the start of every ``fit``, before its arguments are read; nothing in
        the core (part of the subclass contract: raise here to refuse a fit)."""

    def _before_step(self, step):
        """Called before each call of the step function; nothing to do in the core.

        (The book's instrumented trainer sets its backup-worker plan here.)
        """


def _copies(variable):
    """The per-device ``tf.Variable`` s behind ``variable`` (a Keras, mirrored or plain one)."""
    inner = tf_variable(variable)
    values = getattr(inner, "values", None)      # a MirroredVariable's components
    return list(values) if values is not None else [inner]


def optimizer_slots(optimizer):
    """A Keras optimizer's per-parameter variables (its moments), without its counters.

    Taught in the chapter "When the model does not fit".
    """
    counters = {id(optimizer.iterations), id(getattr(optimizer, "_learning_rate", None))}
    return [v for v in optimizer.variables if id(v) not in counters and len(v.shape) > 0]


def _fit_length(steps, epochs):
    """``(steps, epochs)`` checked: exactly one of them a whole number, the other None."""
    if (steps is None) == (epochs is None):
        raise ValueError(
            "fit needs exactly one of steps= (a number of updates) and epochs= (a "
            f"number of passes over the data); got steps={steps!r}, epochs={epochs!r}."
        )
    if steps is not None:
        return check_whole_number("steps", steps), None
    return None, check_whole_number("epochs", epochs)

