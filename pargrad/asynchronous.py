"""Asynchronous data-parallel training: one worker per device, shared parameters.

Taught in the chapter "Asynchronous training".  Each worker is the
single-device training loop copied once per device: it reads the latest
shared parameters, computes the loss and the gradients on its own data, and
applies its update without waiting for anyone.  While it computes, other
workers may update the parameters, so its gradient is *stale*: the number of
updates that landed between its read and its apply is its staleness, and the
trainer records it for every update.

Where to read what: a free-running worker's loop, :meth:`AsyncTrainer._work`,
is plain asynchronous SGD (read, gradients, apply).  What the book adds
around it sits in methods of its own: :meth:`AsyncTrainer._claim_update`
(claim one of the requested updates; with ``staleness_bound``, first wait
until :meth:`AsyncTrainer.may_start`, the bounded staleness of the chapter
"Sync vs async in the same time"), :meth:`AsyncTrainer._extra_time` and
:meth:`AsyncTrainer._wait_as_device` (the extra time of a slower device:
busy work that holds the core, or with ``step_seconds`` a wait) and, in
:meth:`AsyncTrainer._apply`, the staleness-aware learning rate and the
delay-compensated gradient (:func:`delay_compensated`).  The constructor's
options are checked in :meth:`AsyncTrainer._check_options`, a fit's in
:class:`_Run` (its settings and its state while it runs) and
:meth:`AsyncTrainer._checked_data`.  A scheduled fit,
:meth:`AsyncTrainer._run_scheduled`, follows
:func:`pargrad.scenario.virtual_clock`, the one clock the book's float64
replays follow too.
"""

import dataclasses
import numbers
import threading
import time
from typing import Callable, NamedTuple

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import (  # noqa: E402
    ArgumentTypeError, check_choice, check_flag, check_instance, check_positive, check_whole_number,
)
from pargrad.data import prepare_arrays, validation_arrays  # noqa: E402
from pargrad.loop import KerasHistory, keras_history, progress_bar, show_progress  # noqa: E402
from pargrad.losses import check_finite_loss, keras_metrics, mean_loss  # noqa: E402
from pargrad.scenario import Scenario, check_scenario, virtual_clock  # noqa: E402
from pargrad.strategies import check_rate_or_optimizer  # noqa: E402

MODES = ("scheduled", "free-running")
HISTORY_KEYS = (
    "worker", "read_version", "applied_version", "staleness",
    "learning_rate", "loss", "read_time", "time",
)


@dataclasses.dataclass
class AsyncHistory(KerasHistory):
    """What :meth:`AsyncTrainer.fit` recorded: per update, in the order applied, and as Keras does.

    Per update (one entry an applied update): ``worker``, ``read_version``
    and ``applied_version`` (the updates applied when it read and when it
    applied), ``staleness`` (their difference), ``learning_rate``, ``loss``
    (of the worker's batch, at the parameters it read), ``read_time`` and
    ``time`` (seconds since the start, or virtual time units when
    scheduled).

    Per evaluation, with ``validation_data``: ``validation`` holds arrays
    ``val_version`` (the updates applied by then), ``val_loss`` and
    ``val_<metric name>``, one entry an evaluation.

    Per fit, as Keras's ``History`` (the fields of
    :class:`pargrad.loop.KerasHistory`; a fit is one epoch, as
    :class:`pargrad.SyncHistory`'s by steps): ``history`` (``loss``, the
    mean of the updates' losses; the last ``val_*``), ``epoch``, ``params``.
    Taught in the chapter "Asynchronous training".
    """

    worker: np.ndarray
    read_version: np.ndarray
    applied_version: np.ndarray
    staleness: np.ndarray
    learning_rate: np.ndarray
    loss: np.ndarray
    read_time: np.ndarray
    time: np.ndarray
    validation: dict = dataclasses.field(default_factory=dict)

    def __len__(self):
        return len(self.loss)


class _Read(NamedTuple):
    """What a worker read: the ``parameters`` (copies), their ``version``, and the ``time`` it read."""

    parameters: list
    version: int
    time: float


@dataclasses.dataclass
class _Run:
    """One fit: its settings, checked here, and its state while it runs (a new one each fit)."""

    workers: int
    steps: int
    scenario: Scenario
    batch_size: int = None
    mode: str = "scheduled"
    seed: int = 0
    time_limit: float = None
    virtual_time_limit: float = None
    step_seconds: float = None
    on_update: Callable = None
    validation_data: tuple = None
    validation_every: int = None
    shards: list = None          # each worker's (x, y, indices), on its device
    records: list = dataclasses.field(default_factory=list)      # one tuple an update
    validations: list = dataclasses.field(default_factory=list)  # one tuple an evaluation
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    claimed: int = 0             # updates claimed by free-running workers
    errors: list = dataclasses.field(default_factory=list)       # (worker, exception)

    def __post_init__(self):
        check_choice("mode", self.mode, MODES)
        if self.virtual_time_limit is not None:
            if self.mode != "scheduled":
                raise ValueError(
                    "virtual_time_limit works only with mode='scheduled', got mode="
                    f"{self.mode!r}. For free-running runs pass time_limit (seconds) instead.")
            self.virtual_time_limit = check_positive("virtual_time_limit", self.virtual_time_limit,
                                                     unit="virtual time units")
        if self.step_seconds is not None:
            self.step_seconds = check_positive("step_seconds (None: stretch the measured step)",
                                               self.step_seconds)
        if self.time_limit is not None:
            self.time_limit = check_positive("time_limit (seconds, or None)", self.time_limit)
        if self.validation_every is not None:
            self.validation_every = check_whole_number("validation_every", self.validation_every)
            if self.validation_data is None:
                raise ValueError("validation_every needs validation_data=(x_val, y_val) too.")
        self.applied = [0] * self.workers   # updates applied by each worker in this fit
        self.finished = set()               # workers whose fit is over
        self.batch_rngs = [np.random.default_rng([self.seed, w]) for w in range(self.workers)]

    def history(self, model, metrics):
        """The records as an :class:`AsyncHistory` (``validation`` with validation data)."""
        columns = list(zip(*self.records)) or [[] for _ in HISTORY_KEYS]
        updates = {key: np.array(column) for key, column in zip(HISTORY_KEYS, columns)}
        validation = {}
        if self.validation_data is not None:
            names = ["val_version", "val_loss"] + [f"val_{m.name}" for m in metrics]
            columns = list(zip(*self.validations)) or [[] for _ in names]
            validation = {name: np.array(c) for name, c in zip(names, columns)}
        logs = {"loss": float(np.mean(updates["loss"])) if self.records else float("nan")}
        logs.update({name: float(values[-1]) for name, values in validation.items()
                     if name != "val_version" and len(values)})
        per_fit = keras_history(model, logs, self.steps)
        return AsyncHistory(**updates, validation=validation, history=per_fit.history,
                            epoch=per_fit.epoch, params=per_fit.params)


class AsyncTrainer:
    """Asynchronous SGD: every device trains on its own, on shared parameters.

    Usage::

        devices = pargrad.logical_devices(4)      # before anything else
        trainer = AsyncTrainer(parabola_model(), "mse", devices,  # pargrad.book.parabola
                               learning_rate=0.01)
        history = trainer.fit(x, y, steps=400)    # scheduled: repeatable
        history.staleness                         # one entry per update (an AsyncHistory)
        trainer.evaluate(x, y)                    # {"loss": ...}, as SyncTrainer's

    ``model`` is a built Keras model; its trainable weights are copied into
    ``tf.Variable`` objects on ``parameter_device`` (default: the first of
    ``devices``), the parameters every worker reads and updates.  One worker
    runs on each of ``devices``, with the model in training mode (Dropout
    active) and its own copy of the model's non-trainable state (Dropout's
    seeds, BatchNorm's statistics; the float state is averaged into the
    model after :meth:`fit`).  ``loss`` takes the forms SyncTrainer takes
    (:func:`pargrad.losses.per_example_loss`: a Keras loss name or object,
    or a function ``loss(y, predictions)`` returning one value per example
    or the batch's mean); targets of shape ``(N,)`` for one output are
    aligned as Keras aligns them.  A worker's loss is the mean over its
    batch plus ``model.losses`` (regularization), at the parameters it read.

    An update is ``parameter -= learning_rate * gradient``, or with a Keras
    ``optimizer`` (for example ``keras.optimizers.Adagrad(0.1)``, as in
    DistBelief's Downpour) the optimizer's update, its slot variables on the
    parameter device.  ``staleness_aware=True`` divides the learning rate by
    ``staleness + 1`` (Zhang et al. 2016); with an optimizer it sets the
    optimizer's rate, not the gradient's size, because adaptive optimizers
    (Adagrad, Adam) divide the size of the gradient away; for SGD the two
    are the same update.  ``delay_compensation=λ`` (a number >= 0; 0 or
    ``None``, the default, leave the gradient as it is) applies Zheng et
    al.'s (2017) delay-compensated gradient ``g + λ·g⊙g⊙(w_now − w_read)``
    instead of the stale ``g``, ``w_read`` the parameters the worker read
    (kept for each worker) and ``w_now`` those it updates: DC-ASGD with a
    constant λ (:func:`delay_compensated`).  Updates are applied one at a
    time under a lock, so none is lost and the version counter equals the
    number of applied updates.  A loss that is NaN or infinite stops
    :meth:`fit` with :class:`pargrad.NonFiniteLossError` (naming the update
    and the worker) before it is applied, unless ``stop_on_non_finite=False``.
    ``metrics`` (Keras metric objects) are computed with the loss on
    ``fit``'s ``validation_data`` and by :meth:`evaluate`.  ``progress``
    shows a progress bar during :meth:`fit` (in the constructor, as for
    the other three trainers).  ``scenario`` and ``step_seconds`` are
    arguments of :meth:`fit`, not of the constructor: here they decide the
    order and the timing of one fit's updates, and one trainer, its
    workers compiled once, runs under many scenarios (the book's races).

    ``staleness_bound=s`` bounds how far the workers drift apart (stale
    synchronous parallel, Ho et al. 2013): a worker that has applied more
    than ``s`` updates beyond the worker with the fewest waits, before it
    reads, until that worker catches up (``s=0``: nobody gets ahead by a
    whole update).  A worker whose run is over no longer holds the others
    back.  ``None`` (the default) never waits.

    :meth:`fit` runs either *scheduled* (one thread; a seeded virtual clock
    decides who reads and applies when, so a run repeats exactly) or
    *free-running* (one real thread per worker, for measured throughput; on
    a CPU set ``tf.config.threading.set_intra_op_parallelism_threads(1)``
    before TensorFlow starts, or the threads fight over the cores).
    ``jit_compile=True`` compiles each worker's gradient step, and the
    update, with XLA into single computations that run on the calling
    thread: a worker then uses one core, as a worker on its own device
    would, instead of also running independent ops (the backward pass's two
    products of a layer) on the other core through TensorFlow's inter-op
    threads.

    Of what SyncTrainer offers a Keras user, left out here: ``tf.data``
    input, epochs and shuffling (each worker draws seeded random batches
    from its own shard of in-memory arrays, which keeps a scheduled run
    repeatable; pass arrays), Keras callbacks (they assume one training
    loop whose model is current after each batch; here updates come from
    several threads and the model is set after :meth:`fit`: use
    ``on_update``, ``validation_data`` and ``stop_on_non_finite``, and save
    the model after :meth:`fit`), mixed float16 (no loss scaling: refused),
    and a checkpointed position (a resumed asynchronous run cannot repeat an
    uninterrupted one: the order of the updates is not part of any state).

    Explained in the chapter "Asynchronous training".
    """

    def __init__(self, model, loss, devices, *, learning_rate=None,
                 staleness_aware=False, parameter_device=None, progress=True,
                 staleness_bound=None, jit_compile=False, optimizer=None,
                 stop_on_non_finite=True, metrics=None, delay_compensation=None):
        check_model(model)
        self.model, self.loss = model, loss
        mean_loss(loss)  # refuses what is not a loss now, not in fit
        self.devices, self.parameter_device, self.optimizer = devices, parameter_device, optimizer
        self.staleness_aware, self.staleness_bound = staleness_aware, staleness_bound
        self.delay_compensation, self.metrics = delay_compensation, metrics
        self.progress, self.jit_compile, self.stop_on_non_finite = (
            progress, jit_compile, stop_on_non_finite)
        self._learning_rate = learning_rate
        self._check_options()
        self._make_parameters()
        self._state = [self._worker_state(worker, device)
                       for worker, device in enumerate(self.devices)]
        self.version = 0  # number of updates applied so far
        self.history = None  # the last fit's AsyncHistory (kept also when a worker failed)
        self._lock = threading.Lock()
        self._caught_up = threading.Condition(self._lock)  # for staleness_bound
        self._run = None  # the fit under way (or the last one): a _Run
        self._gradient_fns = [self._compile_gradients(worker, device)
                              for worker, device in enumerate(self.devices)]
        self._apply_fn = tf.function(self._apply_update, jit_compile=self.jit_compile)
        self._evaluate_fn = None

    def _check_options(self):
        """Check the constructor's options, all here, and keep them in the form used."""
        devices, optimizer = self.devices, self.optimizer
        advice = "Pass for example pargrad.logical_devices(2)."
        check_instance("devices", devices, (list, tuple), "a list of device names", advice=advice)
        for device in devices:
            check_instance("each of devices", device, str, "a device name", advice=advice)
        if not devices:
            raise ValueError(f"devices must hold at least one device name, got {devices!r}. {advice}")
        check_rate_or_optimizer("AsyncTrainer", optimizer, self._learning_rate,
                                example="keras.optimizers.Adagrad(0.1)", in_scope=False)
        self.staleness_aware = check_flag("staleness_aware", self.staleness_aware)
        if self.staleness_aware and optimizer is not None and not _fixed_rate(optimizer):
            raise ValueError(
                "staleness_aware=True divides the optimizer's learning rate by staleness + 1 "
                "and needs a fixed rate; pass a number as the optimizer's learning_rate, "
                "or staleness_aware=False to keep the schedule.")
        self._learning_rate = (check_positive("learning_rate", 0.01 if self._learning_rate is None
                                              else self._learning_rate)
                               if optimizer is None else float(optimizer.learning_rate))
        if self.staleness_bound is not None:  # None: never wait; 2: at most 2 updates ahead
            self.staleness_bound = check_whole_number(
                "staleness_bound (None to never wait)", self.staleness_bound, minimum=0)
        if self.delay_compensation is not None:  # 0: plain asynchronous SGD, where a sweep starts
            self.delay_compensation = 0.0 if _is_zero(self.delay_compensation) else check_positive(
                "delay_compensation (λ; 0 or None to apply the stale gradient as it is)",
                self.delay_compensation)
        self.devices = list(devices)
        self.parameter_device = self.parameter_device or self.devices[0]
        self.progress = check_flag("progress", self.progress)
        self.jit_compile = check_flag("jit_compile", self.jit_compile)
        self.stop_on_non_finite = check_flag("stop_on_non_finite", self.stop_on_non_finite)
        self.metrics = keras_metrics(self.metrics, " (they are computed on fit's validation_data)")

    def _make_parameters(self):
        """The shared parameters on the parameter device, copied from the model.

        Plain tf.Variables: their assign_sub is one atomic kernel (a Keras
        variable's is assign(self - value), which can lose updates).  With a
        Keras optimizer, Keras variables (the optimizer needs them) whose
        tf.Variables are the parameters; updates go through the lock anyway.
        """
        with tf.device(self.parameter_device):
            if self.optimizer is None:
                self.parameters = [
                    tf.Variable(v.numpy(), name=v.path.replace("/", "_"), trainable=False)
                    for v in self.model.trainable_variables]
                return
            self._optimized = [keras.Variable(v.numpy(), dtype=v.dtype,
                                              name=v.path.replace("/", "_"))
                               for v in self.model.trainable_variables]
            self.parameters = [v.value for v in self._optimized]
            self.optimizer.build(self._optimized)  # slot variables here, on the parameter device

    def _worker_state(self, worker, device):
        """``worker``'s own copy of the model's non-trainable state, on its device.

        Dropout's random seeds, BatchNorm's statistics, as a worker on a
        machine of its own would keep them; worker w's random streams start
        2**40 draws after worker w - 1's, so the workers drop different units.
        """
        with tf.device(device):
            return [tf.Variable(v.numpy() + (np.array([0, worker << 40], v.dtype)
                                             if v.name == "seed_generator_state" else 0),
                                trainable=False)
                    for v in self.model.non_trainable_variables]

    @property
    def learning_rate(self):
        """The learning rate of the next update (before staleness_aware divides it)."""
        if self.optimizer is not None and not _fixed_rate(self.optimizer):
            return float(self.optimizer.learning_rate)  # the schedule's, at this iteration
        return self._learning_rate

    # -- the three steps of one worker's iteration -------------------------

    def _read(self, now):
        """The latest parameters and their version, read together, at time ``now``."""
        with self._lock:
            return _Read([p.read_value() for p in self.parameters], self.version, now)

    def _loss_and_predictions(self, loss_fn, parameters, state, x, y, training):
        """Mean loss over the batch plus the model's own losses (regularization), at ``parameters``."""
        predictions, new_state, own_losses = self.model.stateless_call(
            parameters, state, x, training=training, return_losses=True)
        loss = loss_fn(y, predictions)
        if own_losses:  # regularization, at the parameters this worker read
            loss += tf.cast(tf.add_n(own_losses), loss.dtype)
        return loss, predictions, new_state

    def _compile_gradients(self, worker, device):
        """Forward (in training mode), loss and backward on ``device``, as one tf.function."""
        state, loss_fn = self._state[worker], mean_loss(self.loss)  # one each: threads

        @tf.function(jit_compile=self.jit_compile)
        def gradients(parameters, x, y, batch):
            with tf.device(device):
                x, y = tf.gather(x, batch), tf.gather(y, batch)
                with tf.GradientTape() as tape:
                    tape.watch(parameters)
                    loss, _, new_state = self._loss_and_predictions(
                        loss_fn, parameters, state, x, y, True)
                for variable, value in zip(state, new_state):
                    variable.assign(value)
                return loss, tape.gradient(loss, parameters)

        return gradients

    def _apply_update(self, gradients, learning_rate, read=None):
        """The update, in one tf.function; ``read``: the parameters the worker read (DC-ASGD)."""
        if read is not None and self.delay_compensation:  # λ = 0: plain asynchronous SGD
            gradients = delay_compensated(gradients, self.parameters, read,
                                          self.delay_compensation)
        if self.optimizer is not None:
            if self.staleness_aware:  # the rate, not the gradient (see the class docstring)
                self.optimizer.learning_rate.assign(learning_rate)
            self.optimizer.apply(gradients, self._optimized)
            return
        for parameter, gradient in zip(self.parameters, gradients):
            parameter.assign_sub(tf.cast(learning_rate, gradient.dtype) * gradient)

    def _apply(self, worker, read, loss, gradients, now):
        """Apply one worker's update atomically and record it.

        Shown in the chapter "Stale gradients in depth".
        """
        run = self._run
        with self._lock:
            staleness = self.version - read.version
            rate = self.learning_rate / (staleness + 1) if self.staleness_aware else self.learning_rate
            compensate = read.parameters if self.delay_compensation is not None else None
            with tf.device(self.parameter_device):
                self._apply_fn(gradients, tf.constant(rate, tf.float32), compensate)
            run.records.append((worker, read.version, self.version, staleness,
                                rate, float(loss), read.time, now))
            self.version += 1
            run.applied[worker] += 1
            self._caught_up.notify_all()
            if run.on_update is not None:
                run.on_update(dict(zip(HISTORY_KEYS, run.records[-1])))

    def _gradients(self, worker, parameters):
        """Loss and gradients of ``worker`` on its next batch of its own data."""
        run = self._run
        x, y, everything = run.shards[worker]
        if run.batch_size is None:
            batch = everything
        else:
            batch = run.batch_rngs[worker].choice(len(everything), run.batch_size, replace=False)
            batch = tf.constant(np.sort(batch), tf.int32)
        with tf.device(self.devices[worker]):
            loss, gradients = self._gradient_fns[worker](parameters, x, y, batch)
        if self.stop_on_non_finite:  # before it is applied: no NaN reaches the parameters
            check_finite_loss(loss, self.version, f"worker {worker} on {self.devices[worker]}",
                              "Pass AsyncTrainer(..., stop_on_non_finite=False) to go on.")
        return loss, gradients

    # -- bounded staleness (stale synchronous parallel) ---------------------

    def may_start(self, worker):
        """Whether ``worker`` may read and start its next update now.

        Always true without a ``staleness_bound``; with bound ``s``, true
        when the worker has applied at most ``s`` updates more (in this fit)
        than the worker with the fewest among those still running.  Shown in
        the chapter "The race in depth".
        """
        if self.staleness_bound is None:
            return True
        applied, finished = self._run.applied, self._run.finished
        running = [n for w, n in enumerate(applied) if w not in finished]
        return not running or applied[worker] - min(running) <= self.staleness_bound

    # -- running the workers ------------------------------------------------

    def fit(self, x, y=None, *, steps, batch_size=None, mode="scheduled", scenario=None,
            seed=0, time_limit=None, virtual_time_limit=None, step_seconds=None,
            on_update=None, validation_data=None, validation_every=None):
        """Run ``steps`` updates, each on ``batch_size`` examples *per worker*; return the history.

        ``batch_size`` is per worker: each update is one worker's gradient
        on ``batch_size`` random examples of its own shard (the examples are
        dealt out, worker ``i`` gets ``x[i::workers]``; ``None``: its whole
        shard).  Every argument after ``y`` is keyword-only.

        ``scenario`` (a :class:`pargrad.Scenario`; default: equal devices,
        no delays) says how fast each device is: ``Scenario(speeds=(1,
        0.5))`` makes device 1 take twice as long, ``jitter`` adds a random
        delay with mean ``jitter`` times a step, exponential or, with
        ``delay_distribution="pareto"``, heavy-tailed.  In
        ``mode="scheduled"`` the scenario defines a virtual clock
        (:func:`pargrad.scenario.virtual_clock`: a step takes ``(1 +
        delay) / speed`` time units) that orders reads and applies; in
        ``mode="free-running"`` it stretches the real steps: by default to ``(1 + delay) / speed`` times what the computation took,
        with ``step_seconds`` to ``step_seconds * (1 + delay) / speed``
        seconds (an emulated device, the same time model as the virtual
        clock).  ``time_limit`` (seconds) stops the run early; in scheduled
        mode ``virtual_time_limit`` stops it before the first update that
        would land after that virtual time (to give every trainer the same
        time).  ``seed`` fixes the batches and the delays.
        ``on_update(record)`` is called after each update, under the lock.
        With a ``staleness_bound`` a worker that is too far ahead waits
        before it reads (on the virtual clock, or really, on a condition).
        ``x`` and ``y`` are arrays (or lists), cast as
        :func:`pargrad.data.prepare_arrays` casts them;
        ``validation_data`` is a pair ``(x_val, y_val)`` on which the loss
        (in inference mode, with ``model.losses``) and the trainer's
        ``metrics`` are computed at the end of the fit and, with
        ``validation_every=n``, after every n-th update (under the lock, so
        the workers wait for it).

        Returns an :class:`AsyncHistory`: one entry per applied update, in
        the order they were applied (``history.staleness``, ``history.loss``,
        ...), the evaluations of ``validation_data`` in
        ``history.validation``, and Keras's per-fit ``history.history``; it
        is also kept as ``trainer.history``.  The model's weights are set to
        the trained parameters, and ``trainer.history`` to the updates
        applied, also when a worker fails.
        """
        workers = len(self.devices)
        steps = check_whole_number("steps", steps)
        scenario = check_scenario(scenario, workers)
        x, y, validation_data = self._checked_data(x, y, batch_size, validation_data)
        run = _Run(workers=workers, steps=steps, scenario=scenario, batch_size=batch_size,
                   mode=mode, seed=seed, time_limit=time_limit,
                   virtual_time_limit=virtual_time_limit, step_seconds=step_seconds,
                   validation_data=validation_data, validation_every=validation_every)
        run.shards = [self._shard(x, y, worker) for worker in range(workers)]
        run.on_update = self._after_each_update(on_update, run.validation_every)
        self._run = run
        bar = progress_bar(steps, self.progress, f"async, {workers} worker{'s' * (workers > 1)}")
        try:
            (self._run_scheduled if mode == "scheduled" else self._run_free)(bar)
            if validation_data is not None and (
                    not run.validations or run.validations[-1][0] != self.version):
                self._validate()
        finally:  # also when a worker failed: the model holds the parameters applied so far
            if bar is not None:
                bar.close()
            self._copy_to_model()
            self.history = run.history(self.model, self.metrics)
        return self.history

    def _checked_data(self, x, y, batch_size, validation_data):
        """``x``, ``y`` and ``validation_data`` checked and cast; ``batch_size`` checked against the shards."""
        if isinstance(x, tf.data.Dataset) or isinstance(y, tf.data.Dataset):
            raise ArgumentTypeError(
                "AsyncTrainer.fit takes arrays x and y, not a tf.data.Dataset: it deals the "
                "examples out to the workers and draws each worker's batches from its own seeded "
                "generator, so that a scheduled run repeats exactly.  Pass arrays, for example "
                "x, y = (np.concatenate(part) for part in zip(*dataset.as_numpy_iterator())), "
                "or train from a dataset with SyncTrainer.")
        if y is None:
            raise ValueError("fit needs targets y: fit(x, y, steps=100); got y=None.")
        hint = ("Pass AsyncTrainer(..., stop_on_non_finite=False) to train on regardless."
                if self.stop_on_non_finite else None)
        x, y = prepare_arrays(x, y, self.model, finite_hint=hint)
        workers = len(self.devices)
        if len(x) < workers:
            raise ValueError(f"AsyncTrainer needs at least one example per worker ({workers}), "
                             f"got {len(x)}; pass more examples or fewer devices.")
        if batch_size is not None and not check_whole_number(
                "batch_size", batch_size) <= len(x) // workers:
            raise ValueError(f"batch_size must be None (whole shard) or between 1 and "
                             f"{len(x) // workers} (the smallest worker's shard), got {batch_size!r}.")
        if validation_data is not None:
            validation_data = validation_arrays(validation_data, self.model)
        elif self.metrics:
            raise ValueError(
                "the trainer's metrics are computed on validation data; pass "
                "fit(..., validation_data=(x_val, y_val)), or build the trainer without metrics.")
        return x, y, validation_data

    def _shard(self, x, y, worker):
        """Worker ``worker``'s examples ``x[worker::workers]`` (and targets, and their indices), on its device."""
        with tf.device(self.devices[worker]):
            x, y = x[worker::len(self.devices)], y[worker::len(self.devices)]
            return tf.constant(x), tf.constant(y), tf.range(len(x))

    # -- the model, and validation ------------------------------------------

    def _shared_state(self):
        """The model's non-trainable state: the workers' float state averaged, the rest as is."""
        return [tf.reduce_mean(tf.stack([state[i] for state in self._state]), axis=0)
                if tf.as_dtype(variable.dtype).is_floating else variable.value
                for i, variable in enumerate(self.model.non_trainable_variables)]

    def _copy_to_model(self):
        """Set the Keras model's weights to the shared parameters (and averaged state)."""
        for variable, parameter in zip(self.model.trainable_variables, self.parameters):
            variable.assign(parameter)
        for variable, value in zip(self.model.non_trainable_variables, self._shared_state()):
            variable.assign(value)

    def evaluate(self, x, y=None, *, batch_size=None):
        """The loss and metrics of the shared parameters on arrays ``(x, y)``, as a dict.

        The contract of :meth:`pargrad.SyncTrainer.evaluate`: ``{"loss": ...,
        "<metric name>": ...}`` in inference mode, the loss the mean over
        every example plus the model's regularization losses, with the
        workers' non-trainable state averaged.  Arrays are evaluated in
        batches of ``batch_size`` (default: all at once, as ``fit``'s
        validation).  Taught in the chapter "Your own model".
        """
        x, y = validation_arrays((x, y), self.model)
        if batch_size is not None:
            batch_size = check_whole_number("batch_size (None: all at once)", batch_size)
        return self._evaluate_arrays(x, y, batch_size)

    def _evaluate_arrays(self, x, y, batch_size=None):
        """``{"loss": ..., metric: ...}`` of checked arrays at the current parameters."""
        if self._evaluate_fn is None:
            loss_fn = mean_loss(self.loss)

            def evaluate(parameters, state, x, y):
                loss, predictions, _ = self._loss_and_predictions(
                    loss_fn, parameters, state, x, y, False)
                return loss, predictions
            self._evaluate_fn = tf.function(evaluate)
        for metric in self.metrics:
            metric.reset_state()
        parameters = [p.read_value() for p in self.parameters]
        state, total, size = self._shared_state(), 0.0, batch_size or len(x)
        for first in range(0, len(x), size):
            xb, yb = x[first:first + size], y[first:first + size]
            with tf.device(self.parameter_device):
                loss, predictions = self._evaluate_fn(parameters, state, xb, yb)
            total += float(loss) * len(xb)
            for metric in self.metrics:
                metric.update_state(yb, predictions)
        logs = {"loss": total / len(x)}
        logs.update({metric.name: float(metric.result()) for metric in self.metrics})
        return logs

    def _validate(self):
        """Loss and metrics on the validation data at the current parameters, in inference mode."""
        logs = self._evaluate_arrays(*self._run.validation_data)
        self._run.validations.append((self.version, *logs.values()))

    def _after_each_update(self, on_update, validation_every):
        """The hook :meth:`_apply` calls after each update, under the lock, or None.

        With ``validation_every=n`` it validates after every n-th update of
        this fit, then calls the caller's ``on_update(record)``.
        """
        if not validation_every:
            return on_update

        def after_update(record):
            if len(self._run.records) % validation_every == 0:
                self._validate()
            if on_update is not None:
                on_update(record)

        return after_update

    def _run_scheduled(self, bar):
        """One thread; the virtual clock (:func:`pargrad.scenario.virtual_clock`) orders it all."""
        run, started = self._run, time.perf_counter()
        reads = {}  # what each computing worker read: the weights DC-ASGD needs, too
        # may_start: the staleness bound; a waiting worker reads at the apply it waited for.
        for event, worker, now in virtual_clock(run.scenario, run.seed, self.may_start):
            if event == "read":
                reads[worker] = self._read(now)
                continue
            if self._scheduled_fit_over(now, started):
                break
            read = reads.pop(worker)
            loss, gradients = self._gradients(worker, read.parameters)
            self._apply(worker, read, loss, gradients, now)
            _advance(bar, run.records)

    def _scheduled_fit_over(self, now, started):
        """Whether a scheduled fit stops before the update due at virtual time ``now``."""
        run = self._run
        return (len(run.records) == run.steps
                or run.time_limit is not None and time.perf_counter() - started > run.time_limit
                or run.virtual_time_limit is not None and now > run.virtual_time_limit)

    def _trace_gradients(self):
        """Compile every worker's gradient function before the threads start."""
        parameters, batch_size = self._read(0.0).parameters, self._run.batch_size
        for function, (x, y, everything) in zip(self._gradient_fns, self._run.shards):
            if isinstance(function, tf.types.experimental.PolymorphicFunction):
                batch = everything if batch_size is None else tf.range(batch_size)
                function.get_concrete_function(parameters, x, y, batch)

    def _run_free(self, bar):
        """One real thread per worker; any failure stops all and is re-raised."""
        run = self._run
        self._trace_gradients()  # here, not in several threads at once
        started = time.perf_counter()
        threads = [threading.Thread(target=self._work, name=f"pargrad-async-worker-{w}",
                                    args=(w, started))
                   for w in range(len(self.devices))]
        try:
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                run.stop.wait(0.02)
                _advance(bar, run.records)
                if run.errors:
                    break
                if run.time_limit is not None and time.perf_counter() - started > run.time_limit:
                    break
        finally:
            run.stop.set()
            for thread in threads:
                thread.join()
        _advance(bar, run.records)
        if run.errors:
            worker, error = run.errors[0]
            error.add_note(f"(raised by async worker {worker} on {self.devices[worker]})")
            raise error

    def _work(self, worker, started):
        """The single-device training loop, run by one worker's thread.

        Shown in the chapter "Asynchronous training".
        """
        delays = np.random.default_rng([self._run.seed, worker, 1])
        try:
            while self._claim_update(worker):
                began = time.perf_counter()
                read = self._read(began - started)
                loss, gradients = self._gradients(worker, read.parameters)
                # An emulated slower device or a random delay: the extra time.
                if self._wait_as_device(self._extra_time(delays, began, worker)):
                    return
                self._apply(worker, read, loss, gradients, time.perf_counter() - started)
        except BaseException as error:  # noqa: BLE001 - handed to fit, which re-raises it
            self._run.errors.append((worker, error))
            self._run.stop.set()
        finally:
            self._leave(worker)

    def _claim_update(self, worker):
        """Whether ``worker`` may do one more of the updates a free-running fit asked for.

        False once the run is stopped or every update is claimed.  With a
        ``staleness_bound`` the worker first waits, on a condition, while it
        is too far ahead of the slowest (:meth:`may_start`).
        """
        run = self._run
        with self._lock:
            while not self.may_start(worker):  # staleness bound: too far ahead
                self._caught_up.wait(0.05)
                if run.stop.is_set():
                    return False
            if run.stop.is_set() or run.claimed == run.steps:
                return False
            run.claimed += 1
            return True

    def _leave(self, worker):
        """Mark ``worker``'s run as over, so that it no longer holds the others back."""
        with self._lock:
            self._run.finished.add(worker)
            self._caught_up.notify_all()

    def _extra_time(self, delays, began, worker):
        """Seconds a worker waits after computing, to emulate its device (see :meth:`fit`).

        A step is stretched to ``(1 + delay) / speed`` times what its
        computation took, or with ``step_seconds`` to last
        ``step_seconds * (1 + delay) / speed`` seconds.
        """
        busy = time.perf_counter() - began
        stretch = self._run.scenario.step_time(delays, worker)
        step_seconds = self._run.step_seconds
        pause = busy * (stretch - 1.0) if step_seconds is None else step_seconds * stretch - busy
        return max(0.0, pause)

    def _wait_as_device(self, seconds):
        """Spend a slower device's extra ``seconds``; True if the run was stopped meanwhile.

        Without ``step_seconds`` the device *is* this worker's CPU core, made
        slower: the extra time is busy work that holds the core
        (:func:`hold_core`), as a slow core would, instead of a sleep that
        would lend it to the other workers.  With ``step_seconds`` the step
        stands for an accelerator's work, during which the host thread only
        waits: then it sleeps.
        """
        if self._run.step_seconds is not None:
            return self._run.stop.wait(seconds)
        hold_core(seconds, self._run.stop)
        return self._run.stop.is_set()

    def get_weights(self):
        """The shared parameters as a list of NumPy arrays."""
        return [p.numpy() for p in self.parameters]

    def set_weights(self, weights):
        """Set the shared parameters (a list of arrays shaped like :meth:`get_weights`'s).

        For example, to start a timed run from the initial weights after a
        short run that compiled the workers' functions.
        """
        if len(weights) != len(self.parameters):
            raise ValueError(f"set_weights needs {len(self.parameters)} arrays, got {len(weights)}.")
        with self._lock:
            for parameter, weight in zip(self.parameters, weights):
                parameter.assign(np.asarray(weight, parameter.dtype.as_numpy_dtype))


def _advance(bar, records):
    """Move the progress ``bar`` (if any) to the updates recorded, showing the last loss."""
    if bar is not None and len(records) > bar.n:
        show_progress(bar, len(records) - bar.n, records[-1][HISTORY_KEYS.index("loss")])


def check_model(model):
    """Refuse a model AsyncTrainer cannot train, saying what to pass instead.

    A wrong type raises :class:`pargrad.checks.ArgumentTypeError`; a model
    that is not built, has no trainable weights or computes in float16
    raises ``ValueError``.
    """
    build = "for example keras.Sequential([keras.Input(shape=(1,)), ...])."
    check_instance("model", model, keras.Model, "a built keras.Model", advice=f"Pass {build}")
    if not model.built:
        raise ValueError(f"AsyncTrainer needs a built keras.Model; build it first, {build}")
    if not model.trainable_variables:
        raise ValueError("AsyncTrainer needs a model with trainable weights; this one has none.")
    # Private, as Keras 3 lists nested layers publicly only one level deep (Model.layers).
    if any(getattr(layer.dtype_policy, "compute_dtype", None) == "float16"
           for layer in model._flatten_layers()):
        raise ValueError(
            "AsyncTrainer has no loss scaling, and float16 gradients of a mixed_float16 "
            "model underflow; build the model under a float32 policy "
            "(keras.mixed_precision.set_dtype_policy('float32')), or use "
            "SyncTrainer, or Keras fit, which scale the loss.")


def _fixed_rate(optimizer):
    """Whether ``optimizer``'s learning rate is one settable number (not a schedule or a function)."""
    return isinstance(optimizer.learning_rate, keras.Variable)


def _is_zero(value):
    """True for a number equal to 0 (not a bool: ``False`` is refused as λ)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and value == 0


def delay_compensated(gradients, now, read, strength):
    """Zheng et al.'s delay-compensated gradients: ``g + λ·g⊙g⊙(w_now − w_read)``, one a parameter.

    A gradient ``g`` computed at the parameters ``read`` arrives when they
    are ``now``.  Its first-order Taylor correction to ``now`` needs the
    Hessian; DC-ASGD (Zheng et al. 2017) approximates the Hessian by the
    outer product ``g gᵀ`` and keeps its diagonal, scaled by ``λ`` =
    ``strength``, so the correction costs two products an element.  Works
    on TensorFlow tensors and on NumPy arrays.  Shown in the chapter
    "Stale gradients in depth".
    """
    return [g + strength * g * g * (w - r) for g, w, r in zip(gradients, now, read)]


def hold_core(seconds, stop=None):
    """Keep one CPU core busy for ``seconds`` (or until the event ``stop`` is set).

    Busy work, not a sleep: an emulated slow device must not lend its core
    to the other workers.  The work is NumPy arithmetic on a small array,
    which releases Python's global interpreter lock while it runs, so other
    threads' Python code is not held up.  Returns the seconds it held the
    core.  Used in the chapters "Asynchronous training" and "Sync vs async
    in the same time" (and by ``benchmarks/async.py``).
    """
    started = time.perf_counter()
    deadline = started + max(0.0, float(seconds))
    buffer = np.linspace(0.0, 1.0, 4096)
    while time.perf_counter() < deadline and not (stop is not None and stop.is_set()):
        np.sin(buffer, out=buffer)
    return time.perf_counter() - started
