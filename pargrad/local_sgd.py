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
on logical devices can be charged for a slow network.  This module is part
of the library and never imports the book.
"""

import dataclasses
import numbers
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad import cost  # noqa: E402
from pargrad.allreduce import ring_bytes  # noqa: E402
from pargrad.checks import check_whole_number  # noqa: E402
from pargrad.data import Feed, array_source, same_data  # noqa: E402
from pargrad.strategies import variables_outside_scope  # noqa: E402
from pargrad.training import (  # noqa: E402
    NonFiniteLossError,
    per_example_loss,
    prepare_arrays,
)

DATA_HINT = "LocalSGDTrainer checks the data before the first round."


# ----------------------------------------------------------------------------
# What a run records
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class LocalSGDHistory:
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
      virtual clock, ``H x step_seconds x`` the largest ``slowdown``: the
      average waits for the slowest replica.  NaN without ``step_seconds``.
    * ``round_seconds[k]``: compute plus communication (what is not
      modelled counts 0; NaN when neither is); ``clock`` is their running sum.
    * ``wall_seconds[k]``: the round as measured on this machine (a
      slow replica does not make it longer: ``slowdown`` moves only the
      virtual clock).

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

    def clock_on(self, link, step_seconds=0.0, slowest=1.0):
        """The virtual clock of this run charged on another ``link``, without running it again.

        Each round costs ``H x step_seconds x slowest`` (the slowest
        replica's factor) plus a ring all-reduce of the parameters on
        ``link``; returns the running sum at the end of each round, so one
        run can be drawn against a fast and a slow network.
        """
        if not isinstance(link, cost.Link):
            raise TypeError(f"link must be a pargrad.cost.Link, got {link!r}.")
        step_seconds = _checked_step_seconds(step_seconds, zero=True) or 0.0   # None: no compute
        compute = self.local_steps * step_seconds * float(slowest)
        communication = cost.ring_all_reduce_time(self.parameter_bytes, self.replicas, link)
        return (compute + communication) * np.arange(1, len(self.loss) + 1)


# ----------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------

class LocalSGDTrainer:
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
    ``keras.optimizers.SGD(learning_rate)``).  ``outer_optimizer``
    (default ``SGD(1.0)``, plain model averaging) must be created inside
    ``strategy.scope()``.  Only trainable variables are averaged, so a model
    with non-trainable state (BatchNormalization's statistics) is refused.

    ``local_steps``: ``H``, the steps each replica takes alone between two
    averages (a whole number >= 1).  ``loss``: as
    :class:`pargrad.SyncTrainer` takes it (:func:`pargrad.per_example_loss`);
    each replica minimises the mean over its shard.

    The price of communication, on the virtual clock of
    :class:`LocalSGDHistory`: ``link`` (a :class:`pargrad.cost.Link`)
    prices each round's all-reduce; ``step_seconds`` is the virtual time of
    one local step, and ``slowdown`` (one factor >= 1 a replica, over all
    processes) makes replica ``r`` take ``slowdown[r]`` times as long, so a
    straggler makes every round late by its own ``H`` slow steps.  Only the
    virtual clock: no replica is slowed down on the wall clock (nothing
    sleeps and no core is held), so ``wall_seconds`` is the same with or
    without a straggler, and the results do not depend on it.

    A NaN or infinite loss of any replica stops :meth:`fit` with
    :class:`pargrad.NonFiniteLossError` naming the round, the replica and
    its local step, before the round's average is applied: the shared
    parameters stay those of the round's start (the replicas' inner
    optimizers may hold non-finite state afterwards; make a new trainer).

    Taught in the chapter "Communicating rarely".
    """

    def __init__(self, model, strategy, local_steps, inner_optimizer=None, outer_optimizer=None,
                 learning_rate=0.01, loss=None, link=None, step_seconds=None, slowdown=None):
        _check_model_and_strategy(model, strategy)
        self.local_steps = check_whole_number("local_steps", local_steps)
        self.model, self.strategy = model, strategy
        self.loss = per_example_loss(loss)
        self.link = _checked_link(link)
        self.step_seconds = _checked_step_seconds(step_seconds)
        self.slowdown = _checked_slowdown(slowdown, self.replicas)
        self.outer_optimizer = _outer_optimizer(outer_optimizer, strategy, model)
        self._devices = list(strategy.extended.worker_devices)
        self._first_replica = _first_replica_of_this_process(strategy, len(self._devices))
        self._copies = [_replica_copy(model, inner_optimizer, learning_rate, device)
                        for device in self._devices]
        self.parameter_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                                   for v in model.trainable_variables)
        self._position, self._rounds, self._last_data = 0, 0, None
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
        """One replica's H local steps from the shared parameters; its change and its losses."""
        start = [self._shared_component(v, index) for v in self.model.trainable_variables]
        start = [tf.identity(value) for value in start]
        with tf.control_dependencies(start):
            reset = [mine.assign(value) for mine, value in zip(copy.trainable_variables, start)]
        per_replica = batch_size // self.replicas
        offset = position + (self._first_replica + index) * per_replica

        def body(h, losses):
            with tf.device(self._host()):           # the shard is cut where the data are
                rows = (offset + h * batch_size + tf.range(per_replica)) % tf.shape(x)[0]
                xb, yb = tf.gather(x, rows), tf.gather(y, rows)
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
        def share(mine):
            context = tf.distribute.get_replica_context()
            row = tf.equal(tf.range(self.replicas), context.replica_id_in_sync_group)
            placed = tf.where(row[:, None], mine[None, :], tf.zeros_like(mine)[None, :])
            return context.all_reduce(tf.distribute.ReduceOp.SUM, placed)   # where, not 0 x inf

        if self.replicas == 1:                 # nothing to communicate
            return self.strategy.experimental_local_results(losses)[0][None, :]
        gathered = self.strategy.run(share, args=(losses,))
        return self.strategy.experimental_local_results(gathered)[0]

    def _average_and_apply(self, changes):
        """The one all-reduce of the round (the mean change), then the outer step."""
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

    def fit(self, x, y, *, rounds, batch_size=None):
        """Train ``rounds`` rounds on arrays ``(x, y)``; return a :class:`LocalSGDHistory`.

        Each round reads ``H`` global batches of ``batch_size`` rows (default:
        all of ``x``) in order, wrapping around the end, and cuts each into
        equal contiguous shards, one a replica, as :class:`pargrad.SyncTrainer`
        does; a later ``fit`` on the same data continues with the next
        batch (other arrays, or another batch size, start from their first
        batch).  Under ``MultiWorkerMirroredStrategy`` every process passes
        the same arrays.
        """
        rounds = check_whole_number("rounds", rounds)
        if isinstance(x, tf.data.Dataset):
            raise TypeError("LocalSGDTrainer.fit takes arrays x and y; read the dataset into "
                            "NumPy arrays first (or train it with pargrad.SyncTrainer).")
        feed = Feed(replicas=self.replicas, finite_hint=DATA_HINT, trainer="LocalSGDTrainer")
        source = array_source(x, y, batch_size, by_epoch=False, model=self.model, feed=feed)
        batch_size = source.batch_size
        if self._last_data is None or not same_data(self._last_data, source.key(False)):
            self._position = 0                  # other data start from their first batch
        self._last_data = source.key(False)
        with tf.device(self._host()):
            x, y = tf.constant(source.x), tf.constant(source.y)
        records = [self._round(x, y, batch_size) for _ in range(rounds)]
        return self._history(records, batch_size)

    def _round(self, x, y, batch_size):
        """One round: local steps, the loss check, the average; returns (losses, wall seconds)."""
        begin = time.perf_counter()
        changes, losses = self._local_function(x, y, tf.constant(self._position), batch_size)
        every_loss = self._loss_function(self._per_replica(losses)).numpy()
        self._raise_if_not_finite(every_loss)
        self._average_function(self._per_replica(changes))
        self._position = (self._position + self.local_steps * batch_size) % int(x.shape[0])
        self._rounds += 1
        return every_loss, time.perf_counter() - begin

    def _raise_if_not_finite(self, losses):
        """NonFiniteLossError for the first replica and local step whose loss is NaN or inf."""
        bad = np.argwhere(~np.isfinite(losses))
        if len(bad):
            replica, step = (int(i) for i in bad[0])
            raise NonFiniteLossError(
                self._rounds, f"replica {replica} (its local step {step} of round {self._rounds})",
                losses[replica, step],
                f"The round's average was not applied: the shared parameters are those "
                f"before round {self._rounds}.")

    def _history(self, records, batch_size):
        """The rounds' records as a :class:`LocalSGDHistory`."""
        rounds = len(records)
        losses = np.stack([loss for loss, _ in records])
        sent = np.full(rounds, ring_bytes(self.parameter_bytes, self.replicas))
        communication = np.full(rounds, self.communication_seconds())
        compute = np.full(rounds, self.compute_seconds())
        both = np.stack([communication, compute])
        total = np.where(np.isnan(both).all(axis=0), np.nan, np.nansum(both, axis=0))
        return LocalSGDHistory(
            loss=losses.mean(axis=(1, 2)), replica_loss=losses, bytes_sent=sent,
            bytes_received=sent.copy(), communication_seconds=communication,
            compute_seconds=compute, round_seconds=total,
            wall_seconds=np.array([seconds for _, seconds in records]),
            replicas=self.replicas, local_steps=self.local_steps, batch_size=batch_size,
            parameter_bytes=self.parameter_bytes)

    def evaluate(self, x, y):
        """The mean per-example loss (no regularization) of the shared parameters on ``(x, y)``.

        What the replicas' round losses are not: the loss of the averaged
        model, the one the chapter "Communicating rarely" plots against
        updates, bytes and time.
        """
        x, y = prepare_arrays(x, y, self.model, finite_hint=DATA_HINT)
        with tf.device(self._host()):
            losses = self.loss(tf.constant(y), self.model(tf.constant(x), training=False))
        return float(tf.reduce_mean(tf.cast(losses, tf.float64)))

    def communication_seconds(self):
        """Modelled seconds of one round's all-reduce on ``link`` (NaN without a link).

        :func:`pargrad.cost.ring_all_reduce_time` of the parameters' bytes over
        the replicas.
        """
        if self.link is None:
            return float("nan")
        return cost.ring_all_reduce_time(self.parameter_bytes, self.replicas, self.link)

    def compute_seconds(self):
        """Modelled seconds of one round's local steps: H x step_seconds x the largest slowdown.

        NaN without ``step_seconds``.
        """
        if self.step_seconds is None:
            return float("nan")
        return self.local_steps * self.step_seconds * float(np.max(self.slowdown))

    # -- the data ----------------------------------------------------------------

    def _host(self):
        """This process's CPU, where the data are kept."""
        return tf.DeviceSpec.from_string(self._devices[0]).replace(
            device_type="CPU", device_index=0).to_string()


# ----------------------------------------------------------------------------
# Checks and the replicas' copies
# ----------------------------------------------------------------------------

def _check_model_and_strategy(model, strategy):
    """TypeError or ValueError saying what to pass, unless the model is the strategy's."""
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"LocalSGDTrainer needs a tf.distribute strategy, got {strategy!r}; "
                        "make one with pargrad.sync_strategy(replicas).")
    if not isinstance(model, keras.Model):
        raise TypeError(f"LocalSGDTrainer needs a Keras model, got {type(model).__name__}.")
    if tf.distribute.has_strategy():
        raise ValueError("Create the LocalSGDTrainer outside `with strategy.scope():` (build "
                         "only the model and the outer optimizer inside it): each replica's "
                         "own copy of the model must not be mirrored.")
    variables = model.trainable_variables
    if not variables:
        raise ValueError("The model has no trainable variables yet; build it (give it a "
                         "keras.Input) inside `with strategy.scope():`.")
    if model.non_trainable_variables:
        raise ValueError(
            "LocalSGDTrainer averages trainable variables only, and the model has non-trainable "
            f"state {[v.path for v in model.non_trainable_variables]} (BatchNormalization's "
            "statistics?) that each replica would keep apart; use a model without it, for "
            "example with LayerNormalization instead of BatchNormalization.")
    if variables_outside_scope(strategy, variables):
        raise ValueError("The model's variables were created outside this strategy's scope; "
                         "build the model inside `with strategy.scope():` and pass that model.")


def _outer_optimizer(optimizer, strategy, model):
    """The outer optimizer, built for the model's variables (default: SGD(1.0), model averaging)."""
    with strategy.scope():
        if optimizer is None:
            optimizer = keras.optimizers.SGD(1.0)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"outer_optimizer must be a Keras optimizer, got {optimizer!r}; pass for example "
                "keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True) created inside "
                "strategy.scope(), or None for plain averaging.")
        if getattr(optimizer, "_distribution_strategy", strategy) is not strategy:
            raise ValueError("The outer optimizer was created outside this strategy's scope; "
                             "create it inside `with strategy.scope():`.")
        optimizer.build(model.trainable_variables)
    return optimizer


def _replica_copy(model, inner_optimizer, learning_rate, device):
    """A replica's own model and inner optimizer, on ``device``, outside any strategy."""
    if inner_optimizer is not None and not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"inner_optimizer must be a Keras optimizer, got {inner_optimizer!r}; pass for "
            "example keras.optimizers.AdamW(1e-3) (each replica gets a copy of it), or None "
            "for SGD(learning_rate).")
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


def _checked_link(link):
    if link is not None and not isinstance(link, cost.Link):
        raise TypeError(f"link must be a pargrad.cost.Link or None, got {link!r}; pass for "
                        "example pargrad.cost.Link(latency=5e-6, bandwidth=25e9).")
    return link


def _checked_step_seconds(seconds, zero=False):
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) \
            or not (seconds >= 0 if zero else seconds > 0) or not np.isfinite(seconds):
        raise ValueError(f"step_seconds must be a positive number of seconds (the virtual time "
                         f"of one local step) or None, got {seconds!r}.")
    return float(seconds)


def _checked_slowdown(slowdown, replicas):
    if slowdown is None:
        return np.ones(replicas)
    factors = np.asarray(slowdown, dtype=float)
    if factors.shape != (replicas,) or not np.all(np.isfinite(factors)) or np.any(factors < 1):
        raise ValueError(f"slowdown needs one factor >= 1 for each of the {replicas} replicas "
                         f"(1 for full speed, 3 for three times slower), got {slowdown!r}.")
    return factors
