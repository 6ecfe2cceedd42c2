"""The synchronous trainer with the book's instruments around its core step.

Taught in the chapters "Synchronous training" (timing, stragglers) and
"Sync vs async in the same time" (emulated devices, backup workers).

:class:`pargrad.sync.SyncTrainer` holds only the idea of a synchronous step:
take the shard, compute its gradients with the loss scaled by the global
batch, all-reduce, apply.  To *show* what that step costs, the book needs
more: when each replica started, finished computing and had its update; a
replica made slower on purpose (a straggler); devices whose step lasts a
chosen number of seconds (emulated devices); and backup workers, whose late
gradients count zero times.  :class:`InstrumentedSyncTrainer` is a subclass
that adds exactly that, and nothing else:

* its :meth:`~InstrumentedSyncTrainer._replica_step` is the core step with
  ``tf.timestamp()`` ops, the straggler's extra work, the emulated device's
  sleep and the backup weights wrapped around the same lines
  (``self._replica_gradients``, the finite-loss check
  ``self._stop_if_not_finite`` and ``self.optimizer.apply_gradients``); it
  returns the replica's three timestamps beside its loss (the core's
  :meth:`~pargrad.sync.SyncTrainer._distributed_step` stacks them), and
  ``fit`` returns them in an :class:`InstrumentedSyncHistory`;
* its :meth:`~InstrumentedSyncTrainer.fit` takes ``replica_times`` (the
  virtual clock), decides before every step who is a backup and how long
  each emulated device works, and sets that plan in the core loop's one
  hook, :meth:`~InstrumentedSyncTrainer._before_step`.

With no instrument switched on it computes the same update as the core
trainer, bit for bit.
"""

import dataclasses
import functools
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly
from pargrad.checks import check_flag, check_positive, check_whole_number
from pargrad.scenario import Scenario, check_scenario
from pargrad.strategies import sync_strategy, tf_variable as _tf_variable
from pargrad.sync import SyncHistory, SyncTrainer

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)


def backup_worker_mask(replica_times, backup_workers):
    """Which gradients a step with ``backup_workers`` backups uses (Chen et al. 2016).

    ``replica_times[i, r]`` is how long replica ``r`` takes in step ``i``.
    With N replicas the step uses the first N - b gradients to arrive and
    drops the b slowest; a tie goes to the lower replica index.  Returns a
    boolean array shaped like ``replica_times``.  Taught in the chapter
    "Sync vs async in the same time".

    Shown in the chapter "The race in depth".
    """
    times = np.asarray(replica_times, float)
    if times.ndim != 2:
        raise ValueError(f"replica_times needs one row a step and one column a replica, "
                         f"got shape {times.shape}.")
    backup_workers = check_whole_number("backup_workers", backup_workers, 0,
                                        maximum=times.shape[1] - 1,
                                        advice="A step needs at least one replica.")
    order = np.argsort(times, axis=1, kind="stable")
    used = np.zeros(times.shape, bool)
    np.put_along_axis(used, order[:, :times.shape[1] - backup_workers], True, axis=1)
    return used


def sync_step_times(replica_times, backup_workers=0):
    """How long each synchronous step lasts: until its (N - b)-th gradient arrives.

    Without backup workers, the slowest replica's time; with ``b``, the
    (N - b)-th smallest of the step's ``replica_times``.  Taught in the
    chapter "Sync vs async in the same time".
    """
    times = np.asarray(replica_times, float)
    used = backup_worker_mask(times, backup_workers)
    return np.where(used, times, -np.inf).max(axis=1)


@dataclasses.dataclass
class InstrumentedSyncHistory(SyncHistory):
    """A :class:`pargrad.sync.SyncHistory` with each replica's times, stragglers and backups.

    Times are seconds on the wall clock of this process (``time.time()`` and
    ``tf.timestamp()`` read the same clock).  For each local replica ``r``
    and step ``i``:

    * ``compute_start[i, r]``: the replica's input is on its device; its
      forward pass waits for this timestamp (without that tie the runtime
      may run the timestamp after the pass; on a busy machine the replica
      may still queue for a core, which then counts as compute);
    * ``compute_end[i, r]``: its gradients are computed (for a straggler:
      after its extra work);
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
    that replica.  NaN without ``record_times``.  Under
    ``MultiWorkerMirroredStrategy`` only this process's replicas are recorded.

    When ``fit`` was given ``replica_times`` (the virtual clock, backup
    workers): ``used[i, r]`` tells whether replica ``r``'s gradient counted in
    step ``i``, and ``virtual_step_time[i]`` is the step's length on that
    clock (:func:`sync_step_times`); otherwise both are None.
    ``stragglers`` is ``{replica: factor}`` of a run with stragglers.
    Taught in the chapters "Synchronous training" and "Sync vs async in the
    same time".
    """

    compute_start: np.ndarray = None
    compute_end: np.ndarray = None
    update_end: np.ndarray = None
    stragglers: dict = dataclasses.field(default_factory=dict)
    used: np.ndarray = None
    virtual_step_time: np.ndarray = None

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


class InstrumentedSyncTrainer(SyncTrainer):
    """:class:`pargrad.sync.SyncTrainer` with per-replica timing, stragglers,
    emulated devices and backup workers.

    Its step returns each replica's times beside the loss
    (``step_outputs``), which ``fit`` stacks into the
    :class:`InstrumentedSyncHistory`'s ``compute_start``, ``compute_end``
    and ``update_end``.

    Takes every argument of :class:`~pargrad.sync.SyncTrainer` and these:

    * ``record_times``: record each replica's times (see
      :class:`pargrad.sync.SyncHistory`), for a device timeline.  The
      forward pass then waits for a timestamp, which costs about a tenth of
      a step as small as the book's (0.4 ms on two CPU cores).  The default
      (None) records them only when the run needs them: with ``step_seconds``.
    * ``scenario``: a :class:`pargrad.scenario.Scenario` of the replicas'
      speeds (one a replica, no jitter), each ``1 / factor`` with a whole
      ``factor``: a replica of speed 1/3 is a straggler three times slower.
      After computing its gradients, a straggler of factor ``k`` computes
      them ``k - 1`` more times, inside the step
      (:meth:`_straggler_work`), and its update still uses the first ones,
      unchanged bit for bit.  Busy work, not a sleep: a slower device does
      not lend its core to the others, so a straggler must not either (a
      sleep would, and on a machine with fewer cores than replicas the
      others would run faster beside it than beside a real slow device).
    * ``backup_workers``: ``b`` backup workers (Chen et al. 2016): each step
      uses the gradients of the first N - b replicas to finish and drops the
      rest; who finishes when is given by ``fit(replica_times=...)``; see
      :meth:`fit` for what is real and what is decided from those times.
    * ``step_seconds``: emulated devices: the seconds of one step of a
      device of speed 1; every replica's step is stretched by sleeping to
      ``step_seconds`` times its ``replica_times`` entry (in units of such a
      step; default 1), and a dropped backup replica is cut off (no sleep).

    ``scenario`` and ``step_seconds`` are constructor arguments, as in
    :class:`pargrad.LocalSGDTrainer`: they build this trainer's step (a
    straggler's extra passes, an emulated device's sleep);
    :class:`pargrad.AsyncTrainer` takes them in ``fit``, where they order
    one fit's updates.  ``fit`` takes every option of
    :meth:`pargrad.sync.SyncTrainer.fit`, and ``replica_times``.

    How the times are measured: the step is one ``tf.function``; inside each
    replica's part, ``tf.timestamp()`` ops tied by control dependencies run
    when the replica's input is ready, when its gradients exist and when
    the update has been applied to its parameters.  Those are the times the
    runtime executed those ops on the host.  On a GPU, kernels are launched
    asynchronously, so there the timestamps tell when work was issued and
    the waiting shows up wherever the runtime synchronises.

    Taught in the chapters "Synchronous training" and "Sync vs async in the
    same time".
    """

    step_outputs = ("loss", "times")

    def __init__(self, model, strategy, *, record_times=None, scenario=None, backup_workers=0,
                 step_seconds=None, **options):
        super().__init__(model, strategy, **options)
        replicas = self.replicas
        stragglers = _stragglers(scenario, replicas)
        if record_times is None:
            record_times = step_seconds is not None
        self.backup_workers = check_whole_number(
            "backup_workers", backup_workers, 0, maximum=replicas - 1,
            advice=f"A step needs at least one of the {replicas} replicas.")
        if step_seconds is not None:
            step_seconds = check_positive(
                "step_seconds (emulated devices: the seconds of one step of a device of speed 1)",
                step_seconds, unit="seconds")
            if stragglers or not record_times:
                raise ValueError(
                    "step_seconds needs record_times=True and no scenario of stragglers (give "
                    f"slow replicas larger replica_times instead); got record_times={record_times!r}"
                    f" and scenario={scenario!r}.")
        self.record_times = check_flag("record_times", record_times)
        self.stragglers = stragglers
        self.step_seconds = step_seconds
        self._plan = None
        # A straggler's extra passes, compiled like the gradients they repeat.
        self._straggler_passes = (
            tf.function(self._straggler_work, autograph=False, jit_compile=True)
            if self.jit_compile else self._straggler_work)
        if self.backup_workers or self.step_seconds:
            # The plan of the next step, set by fit from replica_times: each
            # replica's gradient weight and its emulated seconds.
            self._gradient_weights = tf.Variable(tf.ones([replicas]), trainable=False)
            self._planned_seconds = tf.Variable(tf.zeros([replicas], tf.float64), trainable=False)

    # -- one step, with the instruments -----------------------------------------

    def _replica_step(self, x, y, global_batch_size):
        """The core replica step with timestamps, a straggler's extra work, an emulated
        device's sleep and backup weights around it.

        Returns ``{"loss": the replica's loss, "times": its [compute_start,
        compute_end, update_end]}`` (NaN times without ``record_times``).

        Shown in the chapter "Synchronous training".
        """
        variables = self.model.trainable_variables
        if self.record_times:
            with tf.control_dependencies([x, y]):
                compute_start = tf.timestamp()       # the input is here
            with tf.control_dependencies([compute_start]):
                x, y = tf.identity(x), tf.identity(y)  # work starts after the stamp

        loss, grads = self._replica_gradients(x, y, global_batch_size)
        factor = self._straggler_factor()
        if factor is not None:                       # factor - 1 more passes, then the update
            finite = self._straggler_passes(x, y, grads, factor - 1)
            # The first gradients, selected by a flag the passes compute: unchanged bit
            # for bit, and the update cannot start before the passes are done.
            grads = [_kept_if(finite, g) for g in grads]

        if self.record_times:
            with tf.control_dependencies(grads):
                compute_end = tf.timestamp()
            if self.step_seconds is not None:        # an emulated device: sleep until
                # its planned time is up, and return when it woke (the clock of
                # tf.timestamp).  Stateless on purpose: tf.function chains stateful
                # ops in program order, so the replicas would sleep one by one.
                compute_end = tf.numpy_function(
                    _sleep_until, [compute_start + self._replica_value(self._planned_seconds),
                                   compute_end], tf.float64, stateful=False)
                grads = [g + 0 * tf.cast(compute_end, g.dtype) for g in grads]  # after it

        grads = self._stop_if_not_finite(loss, grads)  # with stop_on_non_finite
        if self.backup_workers:  # backup workers: a late gradient counts zero times
            grads = [g * self._replica_value(self._gradient_weights) for g in grads]
        # One all-reduce (a sum over replicas) and one update, inside Keras.
        self.optimizer.apply_gradients(zip(grads, variables))

        if not self.record_times:
            return {"loss": loss, "times": tf.fill([3], tf.constant(np.nan, tf.float64))}
        with tf.control_dependencies([tf.identity(_tf_variable(v)) for v in variables]):
            update_end = tf.timestamp()
        return {"loss": loss, "times": tf.stack([compute_start, compute_end, update_end])}

    def _step_ends(self, outputs, start):
        """When each step of a call ended: its last replica's update (with ``record_times``)."""
        if not self.record_times:
            return super()._step_ends(outputs, start)
        return outputs["times"][:, :, 2].max(axis=1)

    def _straggler_factor(self):
        """This replica's slow-down factor (an int32 tensor), or None if it is no straggler."""
        if not self.stragglers:
            return None
        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        if replica is not None:
            factor = self.stragglers.get(int(replica))
            return None if factor is None else tf.constant(factor, tf.int32)
        table = [self.stragglers.get(r, 1) for r in range(self.replicas)]
        return tf.gather(tf.constant(table, tf.int32), context.replica_id_in_sync_group)

    def _straggler_work(self, x, y, grads, passes):
        """A straggler's extra work: its forward and backward pass on ``(x, y)``, ``passes`` times.

        Real work in the graph, which XLA compiles with ``jit_compile`` like the
        gradients it repeats.  Nothing can skip it: each pass starts from a
        number the previous one computed (0 when its gradients are finite, so
        its input is ``x`` again), the first from ``grads``, and the result is
        whether the last pass's gradients were finite, which the step needs
        before its update.  The passes call the model statelessly
        (``stateless_call``): no metric, no batch statistics, no variable
        changes.  Returns that flag (a boolean scalar).
        """
        variables = self.model.trainable_variables
        trainable = [tf.convert_to_tensor(_tf_variable(v)) for v in variables]
        fixed = [tf.convert_to_tensor(_tf_variable(v)) for v in self.model.non_trainable_variables]

        def shift_from(gradients):  # 0 when the gradients are finite, 1 otherwise
            total = tf.add_n([tf.reduce_sum(tf.cast(_dense_part(g), tf.float32))
                              for g in gradients if g is not None])
            return tf.where(tf.math.is_finite(total), 0.0, 1.0)

        def one_pass(done, shift):
            inputs = tf.nest.map_structure(lambda t: t + tf.cast(shift, t.dtype), x)
            with tf.GradientTape() as tape:
                tape.watch(trainable)
                prediction, _ = self.model.stateless_call(trainable, fixed, inputs, training=True)
                loss = tf.reduce_sum(self.loss(y, prediction))
            return done + 1, shift_from(tape.gradient(loss, trainable))

        _, shift = tf.while_loop(lambda done, shift: done < passes, one_pass,
                                 (tf.constant(0), shift_from(grads)))
        return tf.equal(shift, 0.0)

    def _replica_value(self, plan):
        """This replica's entry of a per-replica plan variable (backup workers)."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.gather(plan, replica)

    def _set_plan(self, used, replica_times):
        """Before a step: weights N / (N - b) for the used replicas and 0 for the
        dropped ones (so the sum over replicas is the mean over the used
        examples), and each used replica's emulated seconds (0: cut off).

        Shown in the chapter "The race in depth".
        """
        if self.backup_workers:
            self._gradient_weights.assign(
                used.astype(np.float32) * self.replicas / (self.replicas - self.backup_workers))
        if self.step_seconds is not None:
            self._planned_seconds.assign(np.where(used, replica_times * self.step_seconds, 0.0))

    def _before_step(self, step):
        """The core loop's hook: set step ``step``'s plan, if this run has one."""
        if self._plan is not None:
            used, replica_times = self._plan
            self._set_plan(used[step], replica_times[step])  # steps_per_call is 1

    # -- the loop ------------------------------------------------------------------

    def fit(self, x, y=None, *, replica_times=None, **options):
        """SyncTrainer's ``fit`` (every option), on a virtual clock when given ``replica_times``.

        ``replica_times`` (shape ``(steps, replicas)``) says how long each
        replica takes in each step, in units of a normal step: the virtual
        clock of the chapter "Sync vs async in the same time".  The history
        then records each step's ``virtual_step_time`` (the slowest replica,
        or with ``backup_workers=b`` the (N - b)-th fastest) and which
        replicas' gradients were ``used``.  What is real and what is not:
        every replica really computes its gradient, and the update really is
        one all-reduce, in which a dropped replica's gradient is multiplied
        by 0 and the others by N / (N - b), so the update is the mean
        gradient over the examples of the replicas that arrived first.  Who
        arrives first is decided from ``replica_times`` before the step, not
        by a race inside the all-reduce: ``MirroredStrategy``'s all-reduce
        waits for every replica.  With ``step_seconds`` the used replicas
        also sleep until ``step_seconds`` times their time is up and the
        dropped ones are cut off (no sleep), so the measured step lasts
        about as long as the (N - b)-th fastest.  A plan (``replica_times``,
        backup workers, ``step_seconds``) has one row a step, so it needs
        ``steps=`` (not ``epochs=``), and ``steps_per_call=1`` when it
        changes the graph (backup workers or ``step_seconds``); the reported
        loss is the whole batch's.  Every other option (``epochs``,
        ``shuffle``, ``seed``, ``validation_data``, ``callbacks``, ...) is
        :meth:`pargrad.sync.SyncTrainer.fit`'s.
        """
        used = virtual_step_time = None
        if replica_times is not None or self.backup_workers or self.step_seconds is not None:
            used, virtual_step_time = self._plan_steps(replica_times, options.get("steps"),
                                                       options.get("steps_per_call", 1))
        try:
            history = super().fit(x, y, **options)
        finally:
            self._plan = None
        history.used, history.virtual_step_time = used, virtual_step_time
        return history

    def _plan_steps(self, replica_times, steps, steps_per_call):
        """Check ``replica_times`` for ``steps`` steps, set the plan; ``(used, virtual_step_time)``."""
        if steps is None:
            raise ValueError(
                "replica_times, backup workers and step_seconds plan each step: pass steps=N "
                "(a number of updates), not epochs=, to this fit.")
        steps = check_whole_number("steps", steps)
        steps_per_call = check_whole_number("steps_per_call", steps_per_call)
        if replica_times is None and self.step_seconds is not None:
            replica_times = np.ones((steps, self.replicas))
        if replica_times is None:   # backup workers
            raise ValueError(
                "Backup workers need to know who finishes first: pass replica_times, "
                f"shape (steps, replicas) = ({steps}, {self.replicas}), how long each "
                "replica takes in each step (for example pargrad.book.race.replica_times)."
            )
        replica_times = np.asarray(replica_times, float)
        if replica_times.shape != (steps, self.replicas) or not (replica_times > 0).all():
            raise ValueError(
                f"replica_times needs shape (steps, replicas) = ({steps}, {self.replicas}) "
                f"and positive times, got shape {replica_times.shape}."
            )
        if (self.backup_workers or self.step_seconds) and steps_per_call != 1:
            raise ValueError("With backup workers or step_seconds, pass steps_per_call=1: "
                             "the plan is set before every step.")
        used = backup_worker_mask(replica_times, self.backup_workers)
        if self.backup_workers or self.step_seconds:
            self._plan = (used, replica_times)
        return used, sync_step_times(replica_times, self.backup_workers)

    def _history(self, records, keras_history, source):
        """The core's history with each replica's times: an :class:`InstrumentedSyncHistory`."""
        core = super()._history(records, keras_history, source)
        local = len(self.strategy.extended.worker_devices)
        times = records.stacked("times").reshape(len(core.loss), local, 3)
        return InstrumentedSyncHistory(
            **{field.name: getattr(core, field.name) for field in dataclasses.fields(core)},
            compute_start=times[:, :, 0], compute_end=times[:, :, 1], update_end=times[:, :, 2],
            stragglers={r: f for r, f in self.stragglers.items() if f > 1})


def _stragglers(scenario, replicas):
    """``{replica: whole slow-down factor}`` of every replica of a scenario ({} without one).

    A replica of speed 1 gets factor 1: it runs the same straggler step
    and repeats its pass 0 times, so the replicas' steps differ only in the
    repeats, and a timing against speed 1 compares like with like.
    """
    if scenario is None:
        return {}
    scenario = check_scenario(scenario, replicas, jitter=False,
                              advice="a straggler's speed says how many passes it repeats")
    factors = {r: 1.0 / speed for r, speed in enumerate(scenario.speeds)}
    for replica, factor in factors.items():
        if factor < 1 - 1e-9 or abs(factor - round(factor)) > 1e-9:
            raise ValueError(
                f"A straggler's slow-down factor must be a whole number >= 1 (it computes its "
                f"gradients that many times a step): a speed 1/k, got the speed "
                f"{scenario.speeds[replica]!r} (factor {factor:.4g}) for replica {replica}; "
                "1 means no slow-down.")
    return {r: int(round(f)) for r, f in factors.items()}


def _dense_part(gradient):
    """A gradient's values: itself, or an ``IndexedSlices``' (sparse) values."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _kept_if(flag, gradient):
    """``gradient`` unchanged, bit for bit, when the scalar ``flag`` is true; NaN otherwise."""
    if gradient is None:
        return None
    values = _dense_part(gradient)
    kept = tf.where(flag, values, tf.fill(tf.shape(values), tf.constant(np.nan, values.dtype)))
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(kept, gradient.indices, gradient.dense_shape)
    return kept


def _sleep_until(deadline, computed):
    """Sleep until ``deadline`` (seconds of time.time()); return when it woke."""
    time.sleep(max(0.0, float(deadline) - time.time()))
    return np.float64(max(time.time(), float(computed)))


# -- the chapters' timed perceptron ---------------------------------------------------

@functools.lru_cache(maxsize=1)
def perceptron_data():
    """The timed runs' data: 4096 random rows of 64 features and one target (seeded)."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((4096, 64)).astype(np.float32),
            rng.standard_normal((4096, 1)).astype(np.float32))


def perceptron_trainer(replicas, speeds=None):
    """A seeded 64-256-256-1 perceptron under :class:`InstrumentedSyncTrainer` on ``replicas``
    devices, recording each replica's times; ``speeds`` makes a :class:`Scenario` of stragglers.

    Used in the chapters "Synchronous training" and "Synchronous training in depth".
    """
    strategy = sync_strategy(replicas)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ])
    scenario = None if speeds is None else Scenario(speeds)
    return InstrumentedSyncTrainer(model, strategy, scenario=scenario, record_times=True,
                                   progress=False)


def measure(trainer, steps=20):
    """Trace ``trainer`` on :func:`perceptron_data` (2 steps), then fit ``steps`` steps of 256
    examples a replica; returns that fit's history."""
    features, targets = perceptron_data()
    batch = 256 * trainer.replicas
    trainer.fit(features, targets, steps=2, batch_size=batch)          # trace first
    return trainer.fit(features, targets, steps=steps, batch_size=batch)
