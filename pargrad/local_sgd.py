"""Local SGD and DiLoCo: replicas that train alone for H steps, then average their changes once.

Taught in the chapter "Communicating rarely".  Synchronous training all-reduces
the gradients after every step.  Local SGD (Lin et al. 2020)
lets every replica take ``H`` steps alone on its own shard of the data,
from the same start, and only then averages what the replicas did: one
all-reduce every ``H`` steps instead of every step.  DiLoCo (Douillard et
al. 2023) keeps the idea and treats the average change as a gradient for
an *outer* optimizer, SGD with Nesterov momentum.

A round of :class:`LocalSGDTrainer`:

1. every replica copies the shared parameters ``w`` into its own copy
   ``w_r`` and takes ``H`` steps with its *inner* optimizer (any Keras
   optimizer; each replica keeps its own optimizer state across rounds)
   on its shard of ``H`` global batches, without any communication;
2. one all-reduce averages the replicas' changes
   ``delta = mean_r (w - w_r)`` (``tf.distribute``'s cross-device ops in one
   process, ``MultiWorkerMirroredStrategy``'s collectives across the
   processes of a :class:`pargrad.LocalCluster`);
3. the *outer* optimizer applies ``delta`` to ``w`` as if it were a
   gradient.  ``keras.optimizers.SGD(1.0)`` gives ``w - delta = mean_r
   w_r``: plain local SGD, model averaging.  ``SGD(0.7, momentum=0.9,
   nesterov=True)`` is DiLoCo's outer step.

With ``H = 1``, an inner SGD and the outer SGD of rate 1, a round is one
step of synchronous SGD.  Every round records the bytes each replica sends
and receives in a ring all-reduce of the parameters and, given a link of
:mod:`pargrad.cost`, the modelled seconds of that communication, so a run
on logical devices can be charged for a slow network; :func:`round_seconds`
is the one formula of a round's virtual time.  This module is part of the
library and never imports the book.
"""

import dataclasses
import time
from typing import NamedTuple

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad import cost  # noqa: E402
from pargrad.allreduce import ring_bytes  # noqa: E402
from pargrad.checks import (  # noqa: E402
    check_flag, check_instance, check_positive, check_whole_number,
)
from pargrad.data import (  # noqa: E402
    EpochReader,
    Feed,
    TrainingPosition,
    array_source,
    host_rows,
    dataset_source,
    validation_source,
)
from pargrad.loop import KerasHistory, StoppedCall, fit_loop  # noqa: E402
from pargrad.scenario import check_scenario  # noqa: E402
from pargrad.strategies import (  # noqa: E402
    ReplicaEvaluation,
    check_model_and_strategy,
    check_optimizer_in_scope,
    check_rate_or_optimizer,
    gather_from_replicas,
    host_device,
)
from pargrad.losses import NonFiniteLossError, per_example_loss  # noqa: E402

DATA_HINT = "LocalSGDTrainer checks the data before the first round."
LINK_EXAMPLE = "Pass for example pargrad.cost.Link(latency=5e-6, bandwidth=25e9)."


# ----------------------------------------------------------------------------
# A round on the virtual clock
# ----------------------------------------------------------------------------

class RoundSeconds(NamedTuple):
    """A round's modelled seconds: ``compute`` and ``communication`` (NaN: not modelled).

    What :func:`round_seconds` returns.  Taught in the chapter "Communicating rarely".
    """

    compute: float
    communication: float

    @property
    def total(self):
        """Compute plus communication, what is not modelled counting 0 (NaN when neither is)."""
        if np.isnan(self.compute) and np.isnan(self.communication):
            return float("nan")
        return float(np.nansum([self.compute, self.communication]))


def round_seconds(local_steps, parameter_bytes, replicas, *, link=None, step_seconds=None,
                  scenario=None):
    """One round's time on the virtual clock: H steps of the slowest replica, then one all-reduce.

    ``compute`` is ``local_steps x step_seconds /`` the slowest speed of
    ``scenario`` (a :class:`pargrad.Scenario`, one speed a replica, no
    jitter; None: all 1), NaN without ``step_seconds``; ``communication`` is
    a ring all-reduce of ``parameter_bytes`` over ``replicas`` on ``link``
    (:func:`pargrad.cost.ring_all_reduce_time`), NaN without a link.  The
    one formula of a round's time: :class:`LocalSGDTrainer`'s history,
    :meth:`LocalSGDHistory.clock_on` and the book's curves use it.  Returns
    a :class:`RoundSeconds`.  Taught in the chapter "Communicating rarely".
    """
    check_instance("link", link, cost.Link, "a pargrad.cost.Link", optional=True,
                   advice=LINK_EXAMPLE)
    if step_seconds is not None:
        step_seconds = check_positive("step_seconds (the virtual time of one local step)",
                                      step_seconds, unit="seconds", advice="Or None: no compute.")
    speeds = check_scenario(scenario, replicas, jitter=False,
                            advice="the virtual clock of a round has no random delays").speeds
    compute = float("nan") if step_seconds is None else local_steps * step_seconds / min(speeds)
    communication = (float("nan") if link is None
                     else cost.ring_all_reduce_time(parameter_bytes, replicas, link))
    return RoundSeconds(compute, communication)


# ----------------------------------------------------------------------------
# What a run records
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class LocalSGDHistory(KerasHistory):
    """What :meth:`LocalSGDTrainer.fit` recorded, one entry a round.

    * ``loss[k]``: the mean over replicas and local steps of the replicas'
      losses in round ``k`` (each replica's loss on its own shard, before
      its local update); ``replica_loss[k, r, h]`` holds them all.
    * ``bytes_sent[k]``, ``bytes_received[k]``: what each replica sends and
      receives in the round's ring all-reduce of the parameters,
      ``2 (R - 1) / R`` times their bytes (:func:`ring_bytes`).  It is the
      model of a ring: in one process TensorFlow reduces on one device
      instead, but the chapter charges what a ring over a network would.
    * ``communication_seconds[k]``: that all-reduce's modelled time on the
      trainer's ``link`` (:func:`pargrad.cost.ring_all_reduce_time`); NaN
      without a link.
    * ``compute_seconds[k]``: the round's modelled compute time on the
      virtual clock, ``H x step_seconds / `` the slowest replica's speed
      (its :class:`pargrad.scenario.Scenario`): the average waits for the
      slowest replica.  NaN without ``step_seconds``.
    * ``round_seconds[k]``: compute plus communication (what is not
      modelled counts 0; NaN when neither is); ``clock`` is their running sum.
    * ``wall_seconds[k]``: the round as measured on this machine (a
      slow replica does not make it longer: the scenario moves only the
      virtual clock).

    Per epoch, as Keras's ``History`` (the fields of
    :class:`pargrad.loop.KerasHistory`; a fit is one epoch): ``history``
    (``loss``, ``val_loss`` with ``validation_data``), ``epoch``, ``params``.

    Taught in the chapter "Communicating rarely".
    """

    loss: np.ndarray
    replica_loss: np.ndarray
    bytes_sent: np.ndarray
    bytes_received: np.ndarray
    communication_seconds: np.ndarray
    compute_seconds: np.ndarray
    round_seconds: np.ndarray
    wall_seconds: np.ndarray
    replicas: int
    local_steps: int
    batch_size: int
    parameter_bytes: int

    @property
    def updates(self):
        """Local steps taken by each replica by the end of each round: H, 2H, ..."""
        return self.local_steps * np.arange(1, len(self.loss) + 1)

    @property
    def clock(self):
        """The virtual clock at the end of each round: the running sum of ``round_seconds``."""
        return np.cumsum(self.round_seconds)

    def clock_on(self, link, step_seconds=None, scenario=None):
        """The virtual clock of this run charged on another ``link``, without running it again.

        Each round costs :func:`round_seconds`: ``H x step_seconds /`` the
        slowest speed of ``scenario`` (None: all 1; ``step_seconds`` None:
        no compute) plus a ring all-reduce of the parameters on ``link``;
        returns the running sum at the end of each round, so one run can be
        drawn against a fast and a slow network.
        """
        check_instance("link", link, cost.Link, "a pargrad.cost.Link", advice=LINK_EXAMPLE)
        one_round = round_seconds(self.local_steps, self.parameter_bytes, self.replicas,
                                  link=link, step_seconds=step_seconds, scenario=scenario)
        return one_round.total * np.arange(1, len(self.loss) + 1)


# ----------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------

class LocalSGDTrainer(tf.Module):
    """Local SGD (outer SGD of rate 1) or DiLoCo (outer Nesterov) on a ``tf.distribute`` strategy.

    ``model`` holds the shared parameters: build it inside
    ``strategy.scope()`` of a :func:`pargrad.sync_strategy` (a
    ``MirroredStrategy`` over logical devices, or a
    ``MultiWorkerMirroredStrategy`` in each process of a
    :class:`pargrad.LocalCluster`); create the trainer outside that scope.
    Each of this process's replicas gets its own copy of the model
    (``keras.models.clone_model``, so a Sequential or functional model, or
    one with ``get_config``), placed on its device, and its own copy of
    ``inner_optimizer`` (made from its config; default
    ``keras.optimizers.SGD(learning_rate)``, 0.01 without one; an optimizer
    carries its own rate, so ``learning_rate`` beside it raises
    ``ValueError``, as in :class:`pargrad.SyncTrainer`).  ``outer_optimizer``
    (default ``SGD(1.0)``, plain model averaging) must be created inside
    ``strategy.scope()``.  Only trainable variables are averaged, so a model
    with non-trainable state (BatchNormalization's statistics) is refused.

    ``local_steps``: ``H``, the steps each replica takes alone between two
    averages (a whole number >= 1); a round is one call of ``H`` steps of
    the shared fit loop (:func:`pargrad.loop.fit_loop`).  ``loss``: as
    :class:`pargrad.SyncTrainer` takes it (:func:`pargrad.per_example_loss`);
    each replica minimises the mean over its shard.  Every argument after
    ``local_steps`` is keyword-only.

    The price of communication, on the virtual clock of
    :class:`LocalSGDHistory`: ``link`` (a :class:`pargrad.cost.Link`)
    prices each round's all-reduce; ``step_seconds`` is the virtual time of
    one local step of a device of speed 1, and ``scenario`` (a
    :class:`pargrad.scenario.Scenario` with one speed a replica, over all
    processes, and no jitter) makes replica ``r`` take ``1 / speeds[r]``
    times as long, so a straggler makes every round late by its own ``H``
    slow steps.  Only the virtual clock: no replica is slowed down on the
    wall clock (nothing sleeps and no core is held), so ``wall_seconds`` is
    the same with or without a straggler, and the results do not depend on it.
    These three are constructor arguments (as in the book's
    ``InstrumentedSyncTrainer``), because they price every round of this
    trainer and never change what it computes; :class:`pargrad.AsyncTrainer`
    takes its ``scenario`` in ``fit``, where it orders one fit's updates.

    A run's length is ``fit(rounds=...)``, not ``steps=`` as in the other three
    trainers, on purpose: a round (``H`` local steps on every replica, then
    one average) is one update of the shared parameters, and ``steps`` would
    read as either the updates or the local steps, which differ by the
    factor ``H`` that the chapter varies.  The history has one entry a
    round.  ``progress`` shows a progress bar during ``fit`` (a constructor
    argument, as in the other three trainers).

    Where training stands (the next batch, the local steps taken) is
    ``trainer.position``, a :class:`pargrad.data.TrainingPosition`;
    ``tf.train.Checkpoint(trainer=trainer)`` saves it with the shared model,
    the outer optimizer and every replica's inner optimizer, so a restored
    run continues exactly.

    A NaN or infinite loss of any replica stops :meth:`fit` with
    :class:`pargrad.NonFiniteLossError` naming the round, the replica and
    its local step, before the round's average is applied: the shared
    parameters stay those of the round's start (the replicas' inner
    optimizers may hold non-finite state afterwards; make a new trainer).

    Taught in the chapter "Communicating rarely".
    """

    def __init__(self, model, strategy, local_steps, *, inner_optimizer=None, outer_optimizer=None,
                 learning_rate=None, loss=None, link=None, step_seconds=None, scenario=None,
                 progress=True):
        super().__init__(name="local_sgd_trainer")
        _check_model_and_strategy(model, strategy)
        check_rate_or_optimizer("LocalSGDTrainer", inner_optimizer, learning_rate,
                                name="inner_optimizer", example="keras.optimizers.AdamW(1e-3)",
                                in_scope=False)
        self.local_steps = check_whole_number("local_steps", local_steps)
        self.model, self.strategy = model, strategy
        self.loss = per_example_loss(loss)
        self.progress = check_flag("progress", progress)
        self.parameter_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                                   for v in model.trainable_variables)
        # Checks link, step_seconds and scenario; the history's compute/communication split.
        self.round_seconds = round_seconds(self.local_steps, self.parameter_bytes, self.replicas,
                                           link=link, step_seconds=step_seconds, scenario=scenario)
        self.link, self.step_seconds = link, step_seconds
        self.scenario = check_scenario(scenario, self.replicas, jitter=False)
        self.outer_optimizer = _outer_optimizer(outer_optimizer, strategy, model)
        self.metrics = []       # the loop's protocol: no training metrics (each replica's differ)
        self.position = TrainingPosition()
        self._devices = list(strategy.extended.worker_devices)
        self._host = host_device(strategy)
        self._feed = Feed.for_model(model, host=self._host, replicas=self.replicas,
                                    finite_hint=DATA_HINT, trainer="LocalSGDTrainer")
        self._first_replica = _first_replica_of_this_process(strategy, len(self._devices))
        rate = 0.01 if learning_rate is None else learning_rate
        self._copies = [_replica_copy(model, inner_optimizer, rate, device)
                        for device in self._devices]
        self._evaluation = ReplicaEvaluation(strategy, model, self.loss, [], self._feed)
        self._local_function = tf.function(self._local_phase, autograph=False)
        self._loss_function = tf.function(self._gather_losses, autograph=False)
        self._average_function = tf.function(self._average_and_apply, autograph=False)

    @property
    def replicas(self):
        """Replicas averaged in every round, over all processes."""
        return self.strategy.num_replicas_in_sync

    @property
    def inner_optimizers(self):
        """This process's replicas' inner optimizers, one a local replica."""
        return [optimizer for _, optimizer in self._copies]

    # -- one round -------------------------------------------------------------

    def _local_phase(self, x, y, position, batch_size):
        """Every local replica's H steps: ``(changes, losses)``, one entry a local replica."""
        changes, losses = [], []
        for index, (copy, optimizer) in enumerate(self._copies):
            with tf.device(self._devices[index]):
                change, replica_losses = self._replica_steps(
                    index, copy, optimizer, x, y, position, batch_size)
            changes.append(change)
            losses.append(replica_losses)
        return changes, losses

    def _replica_steps(self, index, copy, optimizer, x, y, position, batch_size):
        """One replica's H local steps from the shared parameters; its change and its losses.

        Shown in the chapter "Communicating rarely".
        """
        start = [self._shared_component(v, index) for v in self.model.trainable_variables]
        start = [tf.identity(value) for value in start]
        with tf.control_dependencies(start):
            reset = [mine.assign(value) for mine, value in zip(copy.trainable_variables, start)]
        per_replica = batch_size // self.replicas
        offset = position + (self._first_replica + index) * per_replica

        def body(h, losses):
            xb, yb = host_rows(x, y, offset + h * batch_size, per_replica, self._host)
            loss = self._local_step(copy, optimizer, tf.identity(xb), tf.identity(yb))
            return h + 1, losses.write(h, tf.cast(loss, tf.float64))

        with tf.control_dependencies(reset):
            _, losses = tf.while_loop(
                lambda h, _: h < self.local_steps, body,
                (tf.constant(0), tf.TensorArray(tf.float64, size=self.local_steps)))
            stacked = losses.stack()
        with tf.control_dependencies([stacked]):
            change = [s - tf.identity(v) for s, v in zip(start, copy.trainable_variables)]
        return change, stacked

    def _local_step(self, copy, optimizer, x, y):
        """One step of the inner optimizer on a replica's copy; returns its loss before the step."""
        variables = copy.trainable_variables
        with tf.GradientTape() as tape:
            prediction = copy(x, training=True)
            loss = tf.reduce_mean(self.loss(y, prediction))
            if copy.losses:
                loss += tf.add_n([tf.cast(p, loss.dtype) for p in copy.losses])
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    def _shared_component(self, variable, index):
        """This process's ``index``-th replica's component of a shared (mirrored) variable."""
        inner = getattr(variable, "value", variable)
        return self.strategy.experimental_local_results(inner)[index]

    def _per_replica(self, values):
        """A list of this process's values, one a local replica, as strategy input."""
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: values[context.replica_id_in_sync_group - self._first_replica])

    def _gather_losses(self, losses):
        """Every replica's H losses, on every replica: a small all-reduce for the check."""
        if self.replicas == 1:                 # nothing to communicate
            return self.strategy.experimental_local_results(losses)[0][None, :]
        gathered = self.strategy.run(lambda mine: gather_from_replicas(mine, self.replicas),
                                     args=(losses,))
        return self.strategy.experimental_local_results(gathered)[0]

    def _average_and_apply(self, changes):
        """The one all-reduce of the round (the mean change), then the outer step.

        Shown in the chapter "Communicating rarely".
        """
        def average(change):
            context = tf.distribute.get_replica_context()
            # identity: on the replica's device (collectives need a device to reduce to)
            change = [tf.identity(c) for c in change]
            return context.all_reduce(tf.distribute.ReduceOp.MEAN, change)

        if self.replicas == 1:                 # nothing to communicate
            mean = [self.strategy.experimental_local_results(c)[0] for c in changes]
        else:
            mean = self.strategy.run(average, args=(changes,))
            mean = [self.strategy.experimental_local_results(m)[0] for m in mean]
        self.outer_optimizer.apply_gradients(zip(mean, self.model.trainable_variables))
        return mean

    # -- the loop --------------------------------------------------------------

    def fit(self, x, y, *, rounds, batch_size=None, validation_data=None,
            validation_batch_size=None, callbacks=None):
        """Train ``rounds`` rounds on arrays ``(x, y)``; return a :class:`LocalSGDHistory`.

        Each round reads ``H`` global batches of ``batch_size`` rows (default:
        all of ``x``) in order, wrapping around the end, and cuts each into
        equal contiguous shards, one a replica, as :class:`pargrad.SyncTrainer`
        does; a later ``fit`` on the same data continues with the next
        batch (other arrays, or another batch size, start from their first
        batch).  Under ``MultiWorkerMirroredStrategy`` every process passes
        the same arrays.  ``rounds`` is the length word because a round is
        this trainer's unit (one average); a fit is one epoch of
        ``rounds x H`` steps for the callbacks, who see a round as one
        batch.  ``validation_data`` (arrays or a dataset) is evaluated after
        the fit as :meth:`evaluate` does (``history.history["val_loss"]``).
        """
        rounds = check_whole_number("rounds", rounds)
        if isinstance(x, tf.data.Dataset):
            raise TypeError("LocalSGDTrainer.fit takes arrays x and y; read the dataset into "
                            "NumPy arrays first (or train it with pargrad.SyncTrainer).")
        source = array_source(x, y, batch_size, by_epoch=False, model=self.model, feed=self._feed)
        validation = validation_source(validation_data, validation_batch_size, self.model)
        reader = EpochReader(source, self.position, self._feed, steps_per_call=self.local_steps,
                             steps=rounds * self.local_steps)
        records, keras_history = fit_loop(
            self, reader, epochs=1, callbacks=callbacks, validation=validation,
            progress=f"local SGD x{self.replicas}" if self.progress else None)
        return self._history(records, source.batch_size, keras_history)

    def run_call(self, call, done):
        """One round: local steps, the loss check, the average; its rows, one a local step.

        What :func:`pargrad.loop.fit_loop` asks of a trainer.  ``outputs``
        holds ``loss`` (the replicas' mean) and ``replica_loss`` for each
        local step; a non-finite loss raises :class:`pargrad.loop.StoppedCall`
        before the average.

        Shown in the chapter "Communicating rarely".
        """
        begin = time.perf_counter()
        changes, losses = self._local_function(call.x, call.y, tf.constant(call.first_row),
                                               call.batch_size)
        every_loss = self._loss_function(self._per_replica(losses)).numpy()
        if not np.isfinite(every_loss).all():
            raise StoppedCall(0, lambda step: self._non_finite_error(every_loss, step))
        self._average_function(self._per_replica(changes))
        seconds = time.perf_counter() - begin
        steps = every_loss.shape[1]
        starts = begin + seconds * np.arange(steps) / steps
        return ({"loss": every_loss.mean(axis=0), "replica_loss": every_loss.T},
                starts, np.full(steps, seconds / steps))

    def _non_finite_error(self, losses, step):
        """NonFiniteLossError for the first replica and local step whose loss is NaN or inf."""
        replica, local = (int(i) for i in np.argwhere(~np.isfinite(losses))[0])
        round_ = step // self.local_steps
        return NonFiniteLossError(
            round_, f"replica {replica} (its local step {local} of round {round_})",
            losses[replica, local],
            f"The round's average was not applied: the shared parameters are those "
            f"before round {round_}.")

    def _history(self, records, batch_size, keras_history):
        """The rounds' records as a :class:`LocalSGDHistory`."""
        steps = records.stacked("replica_loss")
        losses = steps.reshape(-1, self.local_steps, self.replicas).transpose(0, 2, 1)
        rounds = len(losses)
        sent = np.full(rounds, ring_bytes(self.parameter_bytes, self.replicas))
        communication = np.full(rounds, self.round_seconds.communication)
        compute = np.full(rounds, self.round_seconds.compute)
        total = np.full(rounds, self.round_seconds.total)
        wall = records.stacked("step_time").reshape(rounds, self.local_steps).sum(axis=1)
        return LocalSGDHistory(
            loss=losses.mean(axis=(1, 2)), replica_loss=losses, bytes_sent=sent,
            bytes_received=sent.copy(), communication_seconds=communication,
            compute_seconds=compute, round_seconds=total, wall_seconds=wall,
            replicas=self.replicas, local_steps=self.local_steps, batch_size=batch_size,
            parameter_bytes=self.parameter_bytes, history=keras_history.history,
            epoch=keras_history.epoch, params=keras_history.params)

    def evaluate(self, x, y=None, *, batch_size=None):
        """The loss of the shared parameters on ``(x, y)`` (or a dataset), as a dict ``{"loss": ...}``.

        The same contract as :meth:`pargrad.SyncTrainer.evaluate`: inference
        mode, the mean over every example plus the model's regularization
        losses.  What the replicas' round losses are not: the loss of the
        averaged model, the one the chapter "Communicating rarely" plots
        against updates, bytes and time.
        """
        if isinstance(x, tf.data.Dataset):
            return self.evaluate_source(dataset_source(x, y, batch_size))
        return self.evaluate_source(validation_source((x, y), batch_size, self.model))

    def evaluate_source(self, source, prefix=""):
        """``{prefix + "loss": ...}`` of a checked source (the loop's validation)."""
        return self._evaluation(source, prefix)


# ----------------------------------------------------------------------------
# Checks and the replicas' copies
# ----------------------------------------------------------------------------

def _check_model_and_strategy(model, strategy):
    """The trainers' one model and strategy check, then LocalSGDTrainer's own two."""
    check_model_and_strategy("LocalSGDTrainer", model, strategy)
    if tf.distribute.has_strategy():
        raise ValueError("Create the LocalSGDTrainer outside `with strategy.scope():` (build "
                         "only the model and the outer optimizer inside it): each replica's "
                         "own copy of the model must not be mirrored.")
    if model.non_trainable_variables:
        raise ValueError(
            "LocalSGDTrainer averages trainable variables only, and the model has non-trainable "
            f"state {[v.path for v in model.non_trainable_variables]} (BatchNormalization's "
            "statistics?) that each replica would keep apart; use a model without it, for "
            "example with LayerNormalization instead of BatchNormalization.")


def _outer_optimizer(optimizer, strategy, model):
    """The outer optimizer, built for the model's variables (default: SGD(1.0), model averaging)."""
    with strategy.scope():
        if optimizer is None:
            optimizer = keras.optimizers.SGD(1.0)
        check_optimizer_in_scope("outer_optimizer", optimizer, strategy,
                                 example="keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)",
                                 default="outer_optimizer=None for plain averaging")
        optimizer.build(model.trainable_variables)
    return optimizer


def _replica_copy(model, inner_optimizer, learning_rate, device):
    """A replica's own model and inner optimizer (checked before), on ``device``, outside any strategy."""
    with tf.device(device):
        try:
            copy = keras.models.clone_model(model)
        except Exception as error:  # noqa: BLE001  (Keras raises many kinds here)
            raise TypeError(
                f"LocalSGDTrainer could not copy the model for each replica ({error}); pass a "
                "Sequential or functional model, or give your model get_config().") from None
        _check_same_variables(model, copy)
        if inner_optimizer is None:
            optimizer = keras.optimizers.SGD(learning_rate)
        else:
            optimizer = type(inner_optimizer).from_config(inner_optimizer.get_config())
        optimizer.build(copy.trainable_variables)
    return copy, optimizer


def _check_same_variables(model, copy):
    """ValueError unless a replica's copy has the model's trainable variables, shape for shape."""
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    if [tuple(v.shape) for v in copy.trainable_variables] != shapes:
        raise ValueError(
            "The copy of the model made for a replica (keras.models.clone_model) does not have "
            f"the model's trainable variables {shapes}; pass a Sequential or functional model "
            "built with a keras.Input.")


def _first_replica_of_this_process(strategy, local_replicas):
    """The global index of this process's first replica (0 outside a cluster of workers)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return 0
    return int(resolver.task_id or 0) * local_replicas
