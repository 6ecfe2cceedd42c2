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
:meth:`SyncTrainer._replica_step`, is two lines: the replica's gradients,
then one all-reduce and one update.  What the book adds to *show* a step
(each replica's timestamps, stragglers, emulated devices, backup workers)
is a subclass in the book's layer,
:class:`pargrad.book.instruments.InstrumentedSyncTrainer`, which wraps those
instruments around the same two lines and sets its per-step plan in the one
hook of the loop, :meth:`SyncTrainer._before_step`.  This module never
imports the book.

A reader's map: where ``learning_rate`` goes, from the call to the update.

1. ``SyncTrainer(model, strategy, learning_rate=0.01)``: ``__init__`` makes
   ``keras.optimizers.SGD(learning_rate)`` inside ``strategy.scope()`` (or
   takes your ``optimizer``, which carries its own rate), builds it for the
   model's variables and keeps it as ``self.optimizer``.  Nothing else in
   this module reads the rate.
2. ``trainer.fit(x, y, steps, batch_size)``: checks that ``batch_size``
   splits over replicas x ``accumulation_steps``, then per step calls
   ``self._step_function``, the ``tf.function`` of :meth:`_distributed_step`
   (or ``_steps_function``, a graph loop of it, with ``steps_per_call``).
3. :meth:`_distributed_step`: ``strategy.run`` runs, on every replica,
   :meth:`_shard` (its rows of the batch) and :meth:`_replica_step`.
4. :meth:`_replica_step`: :meth:`_local_gradients` -> :meth:`_gradients`
   computes the loss summed over the shard and divided by the *global*
   batch size (``tf.nn.compute_average_loss``) and its gradients; then
   ``self.optimizer.apply_gradients(...)``.
5. Inside Keras (``keras/src/backend/tensorflow/optimizer.py``):
   ``_backend_update_step`` sums the replicas' gradients with one all-reduce
   (``_all_reduce_sum_gradients``) and calls ``SGD.update_step`` on each
   mirrored variable: ``variable -= learning_rate * gradient``, the same
   update on every replica.

``batch_size`` takes the same road: ``fit`` passes it to every step as a
Python int (so shapes are static), :meth:`_shard` cuts ``batch_size /
replicas`` rows per replica and :meth:`_gradients` divides the loss by it.
"""

import dataclasses
import json
import numbers
import os
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)


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
    if isinstance(replicas, bool) or not isinstance(replicas, numbers.Integral) or replicas < 1:
        raise ValueError(f"sync_strategy(replicas) needs a whole number >= 1, got {replicas!r}.")
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
      NVIDIA's library for summing across GPUs.
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
    if kind not in ("CPU", "GPU"):
        raise ValueError(f"kind must be 'CPU' or 'GPU', got {kind!r}.")
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
    """What :meth:`SyncTrainer.fit` measured, one row per step (update).

    Times are seconds on the wall clock of this process (``time.time()`` and
    ``tf.timestamp()`` read the same clock).  For each local replica ``r`` and
    step ``i``:

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

def squared_error_per_example(y, prediction):
    """The y = x² question's loss for each example: the squared error summed over outputs."""
    return tf.reduce_sum(tf.square(y - prediction), axis=-1)


class SyncTrainer:
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
      ``strategy.scope()``; otherwise ``ValueError``.
    * ``strategy``: a ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy``
      (:func:`sync_strategy` makes the right one).
    * ``loss``: ``loss(y, prediction)`` returning one loss per example
      (default: squared error summed over outputs, the y = x² question's loss).
    * ``optimizer``: a Keras optimizer created inside ``strategy.scope()``;
      default plain gradient descent (``keras.optimizers.SGD``) with
      ``learning_rate``.
    * ``accumulation_steps``: ``k`` micro-batches per replica per update;
      their gradients are summed on the replica and all-reduced once, so an
      update sees ``micro-batch x k x replicas`` examples
      (``SyncHistory.effective_batch_size``).
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
      step on your machine.

    The book's instruments (each replica's timestamps, stragglers, emulated
    devices, backup workers) are not here: they are a subclass,
    :class:`pargrad.book.instruments.InstrumentedSyncTrainer`, that wraps
    them around the same two lines of :meth:`_replica_step`.

    Bad input: a global batch that the replicas (times ``accumulation_steps``)
    cannot split evenly raises ``ValueError`` and names the nearest sizes
    that work; there is no silent padding or dropping, because either would
    change the update that the book compares with the single-device one.

    Taught in the chapter "Synchronous training".
    """

    record_times = False  # the core keeps no timestamps (InstrumentedSyncTrainer does)

    def __init__(self, model, strategy, loss=None, optimizer=None, learning_rate=1e-2,
                 accumulation_steps=1, progress=True, jit_compile=False):
        if not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(
                f"SyncTrainer needs a tf.distribute strategy, got {strategy!r}; "
                "make one with pargrad.sync_strategy(replicas)."
            )
        if not isinstance(model, keras.Model):
            raise TypeError(f"SyncTrainer needs a Keras model, got {type(model).__name__}.")
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
        if (isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, numbers.Integral)
                or accumulation_steps < 1):
            raise ValueError(
                f"accumulation_steps must be a whole number >= 1, got {accumulation_steps!r}; "
                "pass 1 for no accumulation."
            )

        self.model = model
        self.strategy = strategy
        self.loss = loss or squared_error_per_example
        self.accumulation_steps = int(accumulation_steps)
        self.progress = progress
        self.jit_compile = bool(jit_compile)
        with strategy.scope():
            if optimizer is None:
                optimizer = keras.optimizers.SGD(learning_rate)
            if getattr(optimizer, "_distribution_strategy", strategy) is not strategy:
                raise ValueError(
                    "The optimizer was created outside this strategy's scope; "
                    "create it inside `with strategy.scope():` or leave "
                    "optimizer=None for plain gradient descent."
                )
            optimizer.build(variables)
        self.optimizer = optimizer
        # The host of this process's replicas, where the data are kept, and
        # the arrays of the last fit with the start of their next batch.
        self._host = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0]).replace(
            device_type="CPU", device_index=0).to_string()
        self._last_data, self._position = None, 0
        # No AutoGraph: the step is plain TensorFlow, so nothing depends on
        # source transformation (and its caches) of this class's methods.
        # With jit_compile, a replica's forward and backward passes (all k
        # micro-batches) are one XLA computation, traced once per replica;
        # the all-reduce and the update stay outside it (see the docstring).
        self._replica_gradients = (
            tf.function(self._local_gradients, autograph=False, jit_compile=True)
            if self.jit_compile else self._local_gradients)
        self._step_function = tf.function(self._distributed_step, autograph=False)
        self._steps_function = tf.function(self._distributed_steps, autograph=False)

    @property
    def replicas(self):
        """Replicas taking part in every update, over all processes."""
        return self.strategy.num_replicas_in_sync

    # -- one step --------------------------------------------------------------

    def _replica_step(self, x, y, global_batch_size):
        """One replica's part of a step (runs in replica context); returns its loss.

        ``x, y`` are this replica's shard.  Its loss is its examples' losses
        summed and divided by the *global* batch size, so the sum over the
        replicas is the mean over the whole batch.
        """
        variables = self.model.trainable_variables
        loss, grads = self._replica_gradients(x, y, global_batch_size)  # no communication
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
        return loss, tape.gradient(loss, variables)

    def _accumulated_gradients(self, x, y, variables, global_batch_size):
        """Sum the gradients of k micro-batches on this replica, no communication."""
        loss, grads = self._gradients(x[0], y[0], variables, global_batch_size)
        for i in range(1, self.accumulation_steps):     # unrolled: k is a Python int
            micro_loss, micro_grads = self._gradients(x[i], y[i], variables, global_batch_size)
            loss += micro_loss
            grads = [g + m for g, m in zip(grads, micro_grads)]
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

    # -- the loop --------------------------------------------------------------

    def fit(self, x, y, steps, batch_size=None, steps_per_call=1, progress=None):
        """Train for ``steps`` updates on ``(x, y)``; return a :class:`SyncHistory`.

        ``batch_size`` is the global batch of one update, over all replicas
        and micro-batches (default: all of ``x``, full-batch gradient descent
        as in the y = x² question).  Batches are taken from ``x`` in order, wrapping
        around at the end; each is cut into equal contiguous shards, one a
        replica (and ``accumulation_steps`` micro-batches within a shard).
        Calling ``fit`` again with the same arrays and batch size continues
        with the next batch, so ``fit(x, y, 10)`` twice equals ``fit(x, y, 20)``.

        ``steps_per_call`` runs that many steps in one ``tf.function`` call
        (like Keras's ``steps_per_execution``): every step is still one
        all-reduce and one update, but Python launches the graph once per
        call.  With 1, ``step_time`` is measured in Python around each step
        (launch and fetching included); with more, and the replicas' times
        recorded (:class:`pargrad.book.instruments.InstrumentedSyncTrainer`),
        a step lasts from the end of the previous update (or the call's
        start) to the end of its own update; without them, each step of a
        call gets the call's mean.
        """
        x = np.asarray(x)
        y = np.asarray(y)
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} examples but y has {len(y)}.")
        _check_whole_numbers(steps=steps, steps_per_call=steps_per_call)
        batch_size = len(x) if batch_size is None else batch_size
        if not 1 <= batch_size <= len(x):
            raise ValueError(f"batch_size must be between 1 and len(x) = {len(x)}, got {batch_size}.")
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

        x_host, y_host = self._data(x, y, batch_size)
        local = len(self.strategy.extended.worker_devices)
        history = SyncHistory(
            loss=np.empty(steps), start=np.empty(steps), step_time=np.empty(steps),
            compute_start=np.empty((steps, local)), compute_end=np.empty((steps, local)),
            update_end=np.empty((steps, local)), replicas=self.replicas,
            accumulation_steps=self.accumulation_steps,
            micro_batch_size=batch_size // parts,
        )
        show = self.progress if progress is None else progress
        # A Python int: the step is traced for this batch size, so every
        # shape in it is static (fewer ops a step, and XLA sees fixed shapes).
        global_batch = int(batch_size)
        bar = _progress_bar(steps, show, f"sync x{self.replicas}")
        done = 0
        try:
            while done < steps:
                n = min(steps_per_call, steps - done)
                rows = slice(done, done + n)
                self._before_step(done)
                position = tf.constant(self._position, tf.int32)
                start = time.time()
                if steps_per_call == 1:
                    loss, times = self._step_function(x_host, y_host, position, global_batch)
                    loss, times = loss.numpy()[None], times.numpy()[None]
                    history.step_time[rows] = time.time() - start
                    history.start[rows] = start
                else:
                    loss, times = self._steps_function(x_host, y_host, position, global_batch,
                                                       tf.constant(n))
                    loss, times = loss.numpy(), times.numpy()
                    if self.record_times:
                        ends = times[:, :, 2].max(axis=1)
                    else:                    # no timestamps: the call's mean step
                        ends = start + (time.time() - start) * np.arange(1, n + 1) / n
                    starts = np.concatenate([[start], ends[:-1]])
                    history.start[rows] = starts
                    history.step_time[rows] = ends - starts
                self._position = (self._position + n * batch_size) % len(x)
                history.loss[rows] = loss
                history.compute_start[rows] = times[:, :, 0]
                history.compute_end[rows] = times[:, :, 1]
                history.update_end[rows] = times[:, :, 2]
                done += n
                if bar is not None:
                    bar.update(n)
                    bar.set_postfix(loss=f"{loss[-1]:.4g}", refresh=False)
        finally:
            if bar is not None:
                bar.close()
        return history

    def _before_step(self, step):
        """Called before each call of the step function; nothing to do in the core.

        (The book's instrumented trainer sets its backup-worker plan here.)
        """

    def _data(self, x, y, batch_size):
        """The data as host tensors; sets ``self._position``, the next batch's start.

        The same arrays and batch size as the last call continue where it
        ended; anything else starts from the first example.  The arrays are
        copied again on every call, so changes made to them in between count.
        """
        last = self._last_data
        if last is None or last[0] is not x or last[1] is not y or last[2] != batch_size:
            self._last_data = (x, y, batch_size)
            self._position = 0
        with tf.device(self._host):
            return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


def _check_whole_numbers(**values):
    """Raise ValueError naming the first of ``values`` that is not a whole number >= 1."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")


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
