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
busy work that holds the core, or with ``step_seconds`` a wait) and, in :meth:`AsyncTrainer._apply`,
the staleness-aware learning rate.
"""

import heapq
import numbers
import threading
import time

import numpy as np
from tqdm.auto import tqdm

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.training import (  # noqa: E402
    check_finite_loss, check_whole_number, keras_metrics, per_example_loss, prepare_arrays,
)

MODES = ("scheduled", "free-running")
DELAY_DISTRIBUTIONS = ("exponential", "pareto")
HISTORY_KEYS = (
    "worker", "read_version", "applied_version", "staleness",
    "learning_rate", "loss", "read_time", "time",
)


class AsyncTrainer:
    """Asynchronous SGD: every device trains on its own, on shared parameters.

    Usage::

        devices = pargrad.logical_devices(4)      # before anything else
        trainer = AsyncTrainer(pargrad.parabola_model(), "mse", devices,
                               learning_rate=0.01)
        history = trainer.fit(x, y, updates=400)  # scheduled: repeatable
        history["staleness"]                      # one entry per update

    ``model`` is a built Keras model; its trainable weights are copied into
    ``tf.Variable`` objects on ``parameter_device`` (default: the first of
    ``devices``), the parameters every worker reads and updates.  One worker
    runs on each of ``devices``, with the model in training mode (Dropout
    active) and its own copy of the model's non-trainable state (Dropout's
    seeds, BatchNorm's statistics; the float state is averaged into the
    model after :meth:`fit`).  ``loss`` takes the forms SyncTrainer takes
    (:func:`pargrad.training.per_example_loss`: a Keras loss name or object,
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
    are the same update.  Updates are applied one at a time under a lock,
    so none is lost and the version counter equals the number of applied
    updates.  A loss that is NaN or infinite stops :meth:`fit` with
    :class:`pargrad.NonFiniteLossError` (naming the update and the worker)
    before it is applied, unless ``stop_on_non_finite=False``.  ``metrics``
    (Keras metric objects) are computed with the loss on ``fit``'s
    ``validation_data``.

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

    def __init__(self, model, loss, devices, learning_rate=None,
                 staleness_aware=False, parameter_device=None, progress=True,
                 staleness_bound=None, jit_compile=False, optimizer=None,
                 stop_on_non_finite=True, metrics=None):
        if not isinstance(model, keras.Model) or not model.built:
            raise ValueError(
                f"AsyncTrainer needs a built keras.Model, got {type(model).__name__}; "
                "build it first, for example keras.Sequential([keras.Input(shape=(1,)), ...])."
            )
        if not model.trainable_variables:
            raise ValueError("AsyncTrainer needs a model with trainable weights; this one has none.")
        if any(getattr(layer.dtype_policy, "compute_dtype", None) == "float16"
               for layer in model._flatten_layers()):
            raise ValueError(
                "AsyncTrainer has no loss scaling, and float16 gradients of a mixed_float16 "
                "model underflow; build the model under a float32 policy "
                "(keras.mixed_precision.set_dtype_policy('float32')), or use "
                "SyncTrainer, or Keras fit, which scale the loss."
            )
        if isinstance(devices, str) or not devices or not all(isinstance(d, str) for d in devices):
            raise ValueError(
                f"devices must be a non-empty list of device names, got {devices!r}; "
                "pass for example pargrad.logical_devices(2)."
            )
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(
                f"optimizer must be None (plain SGD at learning_rate) or a Keras optimizer "
                f"object, got {optimizer!r}; pass for example keras.optimizers.Adagrad(0.1)."
            )
        if optimizer is not None and learning_rate is not None:
            raise ValueError(
                "pass the learning rate to the optimizer, not to AsyncTrainer: "
                f"keras.optimizers.{type(optimizer).__name__}(learning_rate={learning_rate!r})."
            )
        if learning_rate is None:
            learning_rate = 0.01
        if not isinstance(learning_rate, numbers.Real) or not learning_rate > 0:
            raise ValueError(f"learning_rate must be a positive number, got {learning_rate!r}.")
        if staleness_aware and optimizer is not None and isinstance(
                optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                "staleness_aware=True divides the optimizer's learning rate by staleness + 1 "
                "and needs a fixed rate; pass a number as the optimizer's learning_rate, "
                "or staleness_aware=False to keep the schedule."
            )
        if staleness_bound is not None and (
                isinstance(staleness_bound, bool) or not isinstance(staleness_bound, numbers.Integral)
                or staleness_bound < 0):
            raise ValueError(
                f"staleness_bound must be None (never wait) or a whole number >= 0, "
                f"got {staleness_bound!r}; for example 2 lets a worker run 2 updates "
                "ahead of the slowest."
            )
        metrics = keras_metrics(metrics, " (they are computed on fit's validation_data)")

        self.model = model
        self.loss = loss
        mean_loss(loss)  # refuses what is not a loss now, not in fit
        self.devices = list(devices)
        self.optimizer = optimizer
        self._learning_rate = (float(learning_rate) if optimizer is None
                               else float(optimizer.learning_rate))
        self.staleness_aware = bool(staleness_aware)
        self.staleness_bound = None if staleness_bound is None else int(staleness_bound)
        self.parameter_device = parameter_device or self.devices[0]
        self.progress = progress
        self.jit_compile = bool(jit_compile)
        self.stop_on_non_finite = bool(stop_on_non_finite)
        self.metrics = metrics
        # Plain tf.Variables: their assign_sub is one atomic kernel (a Keras
        # variable's is assign(self - value), which can lose updates).  With
        # a Keras optimizer, Keras variables (the optimizer needs them) whose
        # tf.Variables are the parameters; updates go through the lock anyway.
        with tf.device(self.parameter_device):
            if optimizer is None:
                self.parameters = [
                    tf.Variable(v.numpy(), name=v.path.replace("/", "_"), trainable=False)
                    for v in model.trainable_variables
                ]
            else:
                self._optimized = [keras.Variable(v.numpy(), dtype=v.dtype,
                                                  name=v.path.replace("/", "_"))
                                   for v in model.trainable_variables]
                self.parameters = [v.value for v in self._optimized]
                optimizer.build(self._optimized)  # slot variables here, on the parameter device
        # Each worker keeps its own copy of the model's non-trainable state
        # (Dropout's random seeds, BatchNorm's statistics), as a worker on a
        # machine of its own would; worker w's random streams start 2**40
        # draws after worker w - 1's, so the workers drop different units.
        self._state = []
        for worker, device in enumerate(self.devices):
            with tf.device(device):
                self._state.append([
                    tf.Variable(v.numpy() + (np.array([0, worker << 40], v.dtype)
                                             if v.name == "seed_generator_state" else 0),
                                trainable=False)
                    for v in model.non_trainable_variables
                ])
        self.version = 0  # number of updates applied so far
        self.history = {key: np.array([]) for key in HISTORY_KEYS}
        self._lock = threading.Lock()
        self._caught_up = threading.Condition(self._lock)  # for staleness_bound
        self._applied = [0] * len(self.devices)  # updates applied by each worker in a fit
        self._finished = set()                   # workers whose fit is over
        self._gradient_fns = [self._compile_gradients(worker, device)
                              for worker, device in enumerate(self.devices)]
        self._apply_fn = tf.function(self._apply_update, jit_compile=self.jit_compile)
        self._evaluate_fn = None

    @property
    def learning_rate(self):
        """The learning rate of the next update (before staleness_aware divides it)."""
        if self.optimizer is not None and isinstance(
                self.optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return float(self.optimizer.learning_rate)  # the schedule's, at this iteration
        return self._learning_rate

    # -- the three steps of one worker's iteration -------------------------

    def _read(self):
        """The latest parameters and their version, read together."""
        with self._lock:
            return [p.read_value() for p in self.parameters], self.version

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

    def _apply_update(self, gradients, learning_rate):
        if self.optimizer is not None:
            if self.staleness_aware:  # the rate, not the gradient (see the class docstring)
                self.optimizer.learning_rate.assign(learning_rate)
            self.optimizer.apply(gradients, self._optimized)
            return
        for parameter, gradient in zip(self.parameters, gradients):
            parameter.assign_sub(tf.cast(learning_rate, gradient.dtype) * gradient)

    def _apply(self, worker, gradients, read_version, loss, read_time, now):
        """Apply one worker's update atomically and record it."""
        with self._lock:
            staleness = self.version - read_version
            rate = self.learning_rate / (staleness + 1) if self.staleness_aware else self.learning_rate
            with tf.device(self.parameter_device):
                self._apply_fn(gradients, tf.constant(rate, tf.float32))
            self._records.append((worker, read_version, self.version, staleness,
                                  rate, float(loss), read_time, now))
            self.version += 1
            self._applied[worker] += 1
            self._caught_up.notify_all()
            if self._on_update is not None:
                self._on_update(dict(zip(HISTORY_KEYS, self._records[-1])))

    def _gradients(self, worker, parameters):
        """Loss and gradients of ``worker`` on its next batch of its own data."""
        x, y, everything = self._shards[worker]
        if self._batch_size is None:
            batch = everything
        else:
            batch = self._batch_rngs[worker].choice(len(everything), self._batch_size, replace=False)
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
        than the worker with the fewest among those still running.
        """
        if self.staleness_bound is None:
            return True
        running = [n for w, n in enumerate(self._applied) if w not in self._finished]
        return not running or self._applied[worker] - min(running) <= self.staleness_bound

    # -- running the workers ------------------------------------------------

    def fit(self, x, y=None, updates=None, batch_size=None, mode="scheduled", speeds=None,
            jitter=0.0, seed=0, time_limit=None, on_update=None,
            delay_distribution="exponential", step_seconds=None, virtual_time_limit=None,
            validation_data=None, validation_every=None):
        """Run ``updates`` asynchronous updates; return the history of this run.

        The examples are dealt out to the workers (worker ``i`` gets
        ``x[i::workers]``); each step a worker uses ``batch_size`` random
        examples of its shard (all of them when ``None``).  ``speeds`` gives
        each device's relative speed (``[1, 0.5]``: device 1 takes twice as
        long); ``jitter`` adds a random delay with mean ``jitter`` times a step,
        exponential or, with ``delay_distribution="pareto"``, heavy-tailed
        (see :func:`random_delay`).  In ``mode="scheduled"`` these define a
        virtual clock (a step takes ``(1 + delay) / speed`` time units) that
        orders reads and applies; in ``mode="free-running"`` they make the
        real threads sleep: by default a step is stretched to ``(1 + delay)
        / speed`` times what its computation took; with ``step_seconds`` it
        is stretched to last ``step_seconds * (1 + delay) / speed`` seconds
        (an emulated device, the same time model as the virtual clock).
        ``time_limit`` (seconds) stops the run early; in scheduled mode
        ``virtual_time_limit`` stops it before the first update that would
        land after that virtual time (to give every trainer the same time).
        ``on_update(record)`` is called after each update, under the lock.
        With a ``staleness_bound`` a worker that is too far ahead waits
        before it reads (on the virtual clock, or really, on a condition).
        ``x`` and ``y`` are arrays (or lists), cast as
        :func:`pargrad.training.prepare_arrays` casts them; ``validation_data``
        is a pair ``(x_val, y_val)`` on which the loss (in inference mode, with
        ``model.losses``) and the trainer's ``metrics`` are computed at the
        end of the fit and, with ``validation_every=n``, after every n-th
        update (under the lock, so the workers wait for it).

        Returns a dict of arrays, one entry per applied update, in the order
        they were applied: ``worker``, ``read_version``, ``applied_version``,
        ``staleness`` (= applied - read), ``learning_rate``, ``loss`` (of the
        worker's batch, at the parameters it read),
        ``read_time`` and ``time`` (seconds since the start, or virtual time
        units when scheduled).  With ``validation_data`` it also holds, one
        entry per evaluation, ``val_version`` (the updates applied by then),
        ``val_loss`` and ``val_<metric name>``.  The model's weights are set
        to the trained parameters, also when a worker fails.
        """
        workers = len(self.devices)
        if isinstance(x, tf.data.Dataset) or isinstance(y, tf.data.Dataset):
            raise ValueError(
                "AsyncTrainer.fit takes arrays x and y, not a tf.data.Dataset: it deals the "
                "examples out to the workers and draws each worker's batches from its own seeded "
                "generator, so that a scheduled run repeats exactly.  Pass arrays, for example "
                "x, y = (np.concatenate(part) for part in zip(*dataset.as_numpy_iterator())), "
                "or train from a dataset with SyncTrainer."
            )
        if y is None or updates is None:
            raise ValueError(
                "fit needs targets y and a number of updates: fit(x, y, updates=100); "
                f"got y={'None' if y is None else '...'} and updates={updates!r}."
            )
        hint = ("Pass AsyncTrainer(..., stop_on_non_finite=False) to train on regardless."
                if self.stop_on_non_finite else None)
        x, y = prepare_arrays(x, y, self.model, finite_hint=hint)
        updates = check_whole_number("updates", updates)
        if len(x) < workers:
            raise ValueError(
                f"AsyncTrainer needs at least one example per worker ({workers}), got {len(x)}; "
                "pass more examples or fewer devices."
            )
        smallest_shard = len(x) // workers
        if batch_size is not None:
            batch_size = check_whole_number("batch_size", batch_size)
            if not batch_size <= smallest_shard:
                raise ValueError(
                    f"batch_size must be None (whole shard) or between 1 and {smallest_shard} "
                    f"(the smallest worker's shard), got {batch_size!r}."
                )
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
                raise ValueError(
                    f"validation_data must be a pair (x_val, y_val) of arrays, got "
                    f"{type(validation_data).__name__}; pass for example (x_test, y_test)."
                )
            validation_data = prepare_arrays(*validation_data, self.model)
        if validation_every is not None:
            validation_every = check_whole_number("validation_every", validation_every)
            if validation_data is None:
                raise ValueError("validation_every needs validation_data=(x_val, y_val) too.")
        if self.metrics and validation_data is None:
            raise ValueError(
                "the trainer's metrics are computed on validation data; pass "
                "fit(..., validation_data=(x_val, y_val)), or build the trainer without metrics."
            )
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
        speeds = [1.0] * workers if speeds is None else [float(s) for s in speeds]
        if len(speeds) != workers or min(speeds) <= 0:
            raise ValueError(
                f"speeds needs one positive number per worker ({workers}), got {speeds!r}; "
                "for example [1.0, 0.5] makes device 1 twice as slow."
            )
        if jitter < 0:
            raise ValueError(f"jitter must be >= 0 (0 for no random delays), got {jitter!r}.")
        if virtual_time_limit is not None and (mode != "scheduled" or not virtual_time_limit > 0):
            raise ValueError(
                "virtual_time_limit must be a positive number of virtual time units, and "
                f"works only with mode='scheduled'; got {virtual_time_limit!r} with mode={mode!r}. "
                "For free-running runs pass time_limit (seconds) instead."
            )
        if delay_distribution not in DELAY_DISTRIBUTIONS:
            raise ValueError(f"delay_distribution must be one of {DELAY_DISTRIBUTIONS}, "
                             f"got {delay_distribution!r}.")
        if step_seconds is not None and not step_seconds > 0:
            raise ValueError(f"step_seconds must be None or a positive number of seconds, "
                             f"got {step_seconds!r}.")
        if time_limit is not None and not time_limit > 0:
            raise ValueError(f"time_limit must be None or a positive number of seconds, got {time_limit!r}.")

        self._shards = []
        for worker, device in enumerate(self.devices):
            with tf.device(device):
                shard = x[worker::workers], y[worker::workers]
                self._shards.append((tf.constant(shard[0]), tf.constant(shard[1]),
                                     tf.range(len(shard[0]))))
        self._batch_size = batch_size
        self._batch_rngs = [np.random.default_rng([seed, w]) for w in range(workers)]
        self._records = []
        self._on_update = self._after_each_update(on_update, validation_every)
        self._stop = threading.Event()
        self._applied = [0] * workers
        self._finished = set()
        self._delay_distribution = delay_distribution
        self._step_seconds = step_seconds
        self._virtual_time_limit = virtual_time_limit
        self._validation_data = validation_data
        self._validations = []
        run = self._run_scheduled if mode == "scheduled" else self._run_free
        try:
            with tqdm(total=updates, unit="update", disable=not self.progress, mininterval=0.5,
                      desc=f"async, {workers} worker{'s' * (workers > 1)}") as bar:
                run(updates, speeds, jitter, seed, time_limit, bar)
            if validation_data is not None and (
                    not self._validations or self._validations[-1][0] != self.version):
                self._validate()
        finally:  # also when a worker failed: the model holds the parameters applied so far
            self._copy_to_model()
            columns = list(zip(*self._records)) or [[] for _ in HISTORY_KEYS]
            self.history = {key: np.array(column) for key, column in zip(HISTORY_KEYS, columns)}
            if validation_data is not None:
                names = ["val_version", "val_loss"] + [f"val_{m.name}" for m in self.metrics]
                columns = list(zip(*self._validations)) or [[] for _ in names]
                self.history.update({name: np.array(c) for name, c in zip(names, columns)})
        return self.history

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

    def _validate(self):
        """Loss and metrics on the validation data at the current parameters, in inference mode."""
        if self._evaluate_fn is None:
            loss_fn = mean_loss(self.loss)

            def evaluate(parameters, state, x, y):
                loss, predictions, _ = self._loss_and_predictions(
                    loss_fn, parameters, state, x, y, False)
                return loss, predictions
            self._evaluate_fn = tf.function(evaluate)
        x, y = self._validation_data
        with tf.device(self.parameter_device):
            loss, predictions = self._evaluate_fn(
                [p.read_value() for p in self.parameters], self._shared_state(), x, y)
        results = []
        for metric in self.metrics:
            metric.reset_state()
            metric.update_state(y, predictions)
            results.append(float(metric.result()))
        self._validations.append((self.version, float(loss), *results))

    def _after_each_update(self, on_update, validation_every):
        """The hook :meth:`_apply` calls after each update, under the lock, or None.

        With ``validation_every=n`` it validates after every n-th update of
        this fit, then calls the caller's ``on_update(record)``.
        """
        if not validation_every:
            return on_update

        def after_update(record):
            if len(self._records) % validation_every == 0:
                self._validate()
            if on_update is not None:
                on_update(record)

        return after_update

    def _run_scheduled(self, updates, speeds, jitter, seed, time_limit, bar):
        """One thread; a virtual clock decides the order of reads and applies."""
        clock_rng = np.random.default_rng(seed)

        def step_time(worker):
            delay = random_delay(clock_rng, jitter, self._delay_distribution)
            return (1.0 + delay) / speeds[worker]

        started = time.perf_counter()
        finishing = []  # heap of (virtual time the worker's gradient is ready, worker)
        reads = {}
        for worker in range(len(self.devices)):
            reads[worker] = (*self._read(), 0.0)
            heapq.heappush(finishing, (step_time(worker), worker))
        for _ in range(updates):
            if time_limit is not None and time.perf_counter() - started > time_limit:
                break
            if self._virtual_time_limit is not None and finishing[0][0] > self._virtual_time_limit:
                break
            now, worker = heapq.heappop(finishing)
            parameters, version, read_time = reads.pop(worker)
            loss, gradients = self._gradients(worker, parameters)
            self._apply(worker, gradients, version, loss, read_time, now)
            # Read again right away, unless the staleness bound says wait; a
            # waiting worker starts when the slowest catches up (here, now).
            for ready in [worker] + sorted(set(range(len(self.devices))) - {worker}):
                if ready not in reads and self.may_start(ready):
                    reads[ready] = (*self._read(), now)
                    heapq.heappush(finishing, (now + step_time(ready), ready))
            bar.update(1)

    def _trace_gradients(self):
        """Compile every worker's gradient function before the threads start."""
        parameters, _ = self._read()
        for function, (x, y, everything) in zip(self._gradient_fns, self._shards):
            if isinstance(function, tf.types.experimental.PolymorphicFunction):
                batch = everything if self._batch_size is None else tf.range(self._batch_size)
                function.get_concrete_function(parameters, x, y, batch)

    def _run_free(self, updates, speeds, jitter, seed, time_limit, bar):
        """One real thread per worker; any failure stops all and is re-raised."""
        self._claimed = 0
        self._errors = []
        self._trace_gradients()  # here, not in several threads at once
        started = time.perf_counter()
        threads = [
            threading.Thread(target=self._work, name=f"pargrad-async-worker-{w}",
                             args=(w, updates, speeds[w], jitter, seed, started))
            for w in range(len(self.devices))
        ]
        try:
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                self._stop.wait(0.02)
                bar.update(len(self._records) - bar.n)
                if self._errors:
                    break
                if time_limit is not None and time.perf_counter() - started > time_limit:
                    break
        finally:
            self._stop.set()
            for thread in threads:
                thread.join()
        bar.update(len(self._records) - bar.n)
        if self._errors:
            worker, error = self._errors[0]
            error.add_note(f"(raised by async worker {worker} on {self.devices[worker]})")
            raise error

    def _work(self, worker, updates, speed, jitter, seed, started):
        """The single-device training loop, run by one worker's thread."""
        delays = np.random.default_rng([seed, worker, 1])
        try:
            while self._claim_update(worker, updates):
                began = time.perf_counter()
                parameters, version = self._read()
                loss, gradients = self._gradients(worker, parameters)
                # An emulated slower device or a random delay: the extra time.
                if self._wait_as_device(self._extra_time(delays, began, speed, jitter)):
                    return
                self._apply(worker, gradients, version, loss,
                            began - started, time.perf_counter() - started)
        except BaseException as error:  # noqa: BLE001 - handed to fit, which re-raises it
            self._errors.append((worker, error))
            self._stop.set()
        finally:
            self._leave(worker)

    def _claim_update(self, worker, updates):
        """Whether ``worker`` may do one more of the ``updates`` a free-running fit asked for.

        False once the run is stopped or every update is claimed.  With a
        ``staleness_bound`` the worker first waits, on a condition, while it
        is too far ahead of the slowest (:meth:`may_start`).
        """
        with self._lock:
            while not self.may_start(worker):  # staleness bound: too far ahead
                self._caught_up.wait(0.05)
                if self._stop.is_set():
                    return False
            if self._stop.is_set() or self._claimed == updates:
                return False
            self._claimed += 1
            return True

    def _leave(self, worker):
        """Mark ``worker``'s run as over, so that it no longer holds the others back."""
        with self._lock:
            self._finished.add(worker)
            self._caught_up.notify_all()

    def _extra_time(self, delays, began, speed, jitter):
        """Seconds a worker sleeps after computing, to emulate its device (see :meth:`fit`).

        A step is stretched to ``(1 + delay) / speed`` times what its
        computation took, or with ``step_seconds`` to last
        ``step_seconds * (1 + delay) / speed`` seconds.
        """
        busy = time.perf_counter() - began
        stretch = (1.0 + random_delay(delays, jitter, self._delay_distribution)) / speed
        pause = (busy * (stretch - 1.0) if self._step_seconds is None
                 else self._step_seconds * stretch - busy)
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
        if self._step_seconds is not None:
            return self._stop.wait(seconds)
        hold_core(seconds, self._stop)
        return self._stop.is_set()

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


def mean_loss(loss):
    """A function ``f(y, predictions)``: the batch's mean loss, from any ``loss=`` form.

    The forms are :func:`pargrad.training.per_example_loss`'s (None, a Keras
    loss name or object, a function), with its rule for target shapes.  A
    function that returns a scalar, the batch's mean already (the book's
    ``pargrad.squared_error``), is used as it returned it: the mean of
    ``batch`` copies of a float32 number is not always that number to the
    last bit, and the chapters' runs repeat bit for bit.
    """
    per_example = per_example_loss(loss)  # refuses what is not a loss, saying what to pass
    if loss is None or isinstance(loss, (str, keras.losses.Loss)):
        return lambda y, predictions: tf.reduce_mean(per_example(y, predictions))
    returned = []

    def remembered(y, predictions):  # per_example_loss calls it after aligning y
        returned.append(loss(y, predictions))
        return returned[-1]

    per_example = per_example_loss(remembered)

    def mean(y, predictions):
        values = per_example(y, predictions)
        value = tf.convert_to_tensor(returned.pop())
        return value if value.shape.rank == 0 else tf.reduce_mean(values)

    return mean


def random_delay(rng, jitter, distribution="exponential"):
    """One random extra delay, in units of a step, with mean ``jitter`` (0 gives 0.0).

    ``"exponential"``: ``rng.exponential(jitter)``, light-tailed.
    ``"pareto"``: a Lomax (Pareto II) draw of shape 1.5 scaled to the same
    mean, heavy-tailed: its variance is infinite, and now and then a step
    takes many times the mean (a device busy with something else).  Both
    trainers' virtual clocks draw their delays here, so synchronous and
    asynchronous runs see the same kind of delays.

    Used in the chapter "Sync vs async in the same time".
    """
    if not jitter:
        return 0.0
    if distribution == "exponential":
        return float(rng.exponential(jitter))
    if distribution == "pareto":
        shape = 1.5  # numpy's pareto(a) is Lomax, mean 1 / (a - 1) = 2
        return float(rng.pareto(shape) * jitter * (shape - 1.0))
    raise ValueError(f"distribution must be one of {DELAY_DISTRIBUTIONS}, got {distribution!r}.")


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


def lost_updates(variable, threads=2, increments=2000):
    """Add 1 to ``variable`` from several threads at once; return how many adds were lost.

    Each thread calls ``variable.assign_add(1.0)`` ``increments`` times.  A
    native ``tf.Variable`` adds in one kernel and loses none; a Keras
    variable's ``assign_add`` is ``assign(self + value)``, a read, an add and
    a write, and two threads that read the same value both write it back
    plus one.  Every thread is joined before the count is returned.

    Shown in the chapter "Asynchronous training".
    """
    if threads < 1 or increments < 1:
        raise ValueError(f"threads and increments must be >= 1, got {threads} and {increments}.")
    variable.assign(0.0)

    def add_ones():
        for _ in range(increments):
            variable.assign_add(1.0)

    workers = [threading.Thread(target=add_ones, name=f"pargrad-adder-{i}") for i in range(threads)]
    try:
        for worker in workers:
            worker.start()
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.join()
    return threads * increments - int(round(float(variable.numpy())))
