"""Sharded data parallelism (ZeRO stages 1-3) on ``tf.distribute``, equal to the mirrored run.

Taught in the chapter "When the model does not fit".  Data parallelism
(:class:`pargrad.SyncTrainer`) keeps the whole training state on every
replica; :class:`ShardedTrainer` splits it into N shards, one per replica
(the shard's *owner*), as ZeRO (Rajbhandari et al. 2019) and PyTorch's FSDP
do:

* stage 1: each owner keeps the optimizer state (Adam's two moments,
  momentum) of its 1/N of the parameters.  Every replica computes the
  gradient of its rows of the batch (a full-size gradient, kept in a
  buffer on its device), the gradients are reduce-scattered (the owner of
  shard s receives the sum of shard s), each owner updates its shard, and
  the updated shards are all-gathered into every replica's full copy of
  the weights;
* stage 2: also the gradients: each replica's gradient is reduce-scattered
  as soon as it is computed, and only the owner's shard is kept (with
  ``accumulation_steps`` > 1 the accumulators hold 1/N of the sums);
* stage 3: also the parameters: each replica stores only its shard, and
  the model runs one *unit* at a time (a layer with weights, or the layers
  you group with ``units=``, as FSDP's wrapping policy does): a unit's
  weights are gathered onto each replica before its forward pass and freed
  after it, gathered again for its backward pass and freed after it, and
  its gradient is reduce-scattered to the owners as soon as the backward
  pass has produced it.  No replica ever holds the whole model's
  parameters or gradient.

The arithmetic is the mirrored run's: every gradient is summed in the same
order (replica 0, 1, ...) and every update is element-wise, so stages 1 and
2 equal ``SyncTrainer`` with the same optimizer bit for bit (in float64 and
float32 alike), and so does stage 3, whose units compute the same
products on the same (gathered) values and whose gradients flow from unit
to unit as the mirrored run's flow from layer to layer (one path, no sum).
A layer without weights runs in the unit before it: split off, the last
layer of a unit and its activation are not fused by Grappler as in the
mirrored run, and float32 came out one ulp away.  With ``accumulation_steps`` > 1
stages 2 and 3 add each micro-batch's reduced shard into the accumulator
(sum over replicas first, then over micro-batches) where ``SyncTrainer``
adds the micro-batches on each replica first: the same sum in another
order, equal within :func:`pargrad.rounding_tolerance`; so is a
regularization penalty at stage 3 (each unit adds its penalty's gradient
to its weights' in its own backward pass, the mirrored tape adds them once).

Design choices, and why:

* **One flat vector, padded.**  The trainable variables are flattened, in
  the model's order, into one vector padded with zeros to N x
  ``ceil(P / N)`` values; owner s keeps values ``s L .. (s + 1) L``.  So
  every owner holds the same number of values whatever the layer sizes
  (whole variables, as PyTorch's ``ZeroRedundancyOptimizer`` assigns them,
  leave the owner of the largest layer with the most: a one-layer model
  cannot be split at all), and the bytes a device holds are exactly
  :func:`pargrad.memory.state_bytes`.  The padding's gradient is zero, so
  its optimizer state and its parameters stay zero (tested).
* **Owners' optimizers, outside the replica context.**  Keras 3 optimizers
  all-reduce their gradients by themselves when they run in a replica
  context (``_backend_update_step``; keras-team/keras#19308): an owner's
  shard gradient applied inside ``strategy.run`` would be summed with the
  other owners' (different) shards.  So each owner has its own copy of the
  optimizer (made from your optimizer's config), created outside the
  strategy under ``tf.device(owner's device)`` so that its variables (its
  moments, its step counter) live on the owner's device, and the step
  calls it in cross-replica context under the same device: a plain
  one-device update of one variable, the owner's shard.
* **No master copy.**  A Keras optimizer updates a variable, and Keras 3's
  ``stateless_apply`` (update values, not variables) is refused by its
  TensorFlow backend.  So each replica's copy of the parameters is held as
  N variables, the *pieces* of the flat vector (``replica_parameters[r]``),
  and owner s's shard is piece s of its own copy: its optimizer updates it
  in place, and the all-gather copies it into the other replicas' piece s.
  Each replica holds its 1/N once, so stage 1 on one device holds exactly
  what data parallelism holds (:func:`pargrad.memory.state_bytes`, ZeRO's
  (P + G) Psi + K Psi / N).  The model runs on the concatenated pieces
  (``stateless_call``) at every stage, so its own variables are released
  (below).
* **Reduce-scatter, emulated.**  TensorFlow has none on a CPU
  (``CollectiveReduceScatterV2`` has no CPU kernel, and ``ReplicaContext``
  offers only ``all_reduce`` and ``all_gather``).  pargrad sends each
  replica's slice s of its gradient to owner s (a copy between devices)
  and the owner adds the N slices with one ``tf.add_n`` in replica order,
  the order in which ``tf.distribute.ReductionToOneDevice`` (what
  :func:`pargrad.sync_strategy` uses on one machine) adds the mirrored
  run's gradients.  Each replica sends (N - 1)/N of its gradient, as in a
  ring; unlike a ring, all pieces travel at once (N - 1 messages in one
  round, not N - 1 rounds), and the owner holds N slices before adding
  them (a ring holds two chunks).  At stages 1 and 2 every replica first
  holds its whole gradient (one ``GradientTape`` returns all of a model's
  gradients at once); at stage 3 each unit's gradient is sent as soon as
  its backward pass ends.  The all-gather is a copy of every shard (at
  stage 3, of the parts of the owners' shards in a unit) to every replica,
  then one ``tf.concat``.
* **Stage 3, a unit at a time.**  Units keep the one flat layout: unit u
  is the range ``[a_u, b_u)`` of the flat vector, so the owners' shards,
  the checkpoints and resharding do not depend on the units.  Gathering
  unit u copies onto the replica the parts of the owners' shards that
  overlap its range (a variable at a time), and the unit's layers run on
  them in a ``keras.StatelessScope``.  Only the unit's input activation
  is kept for the backward pass.  TensorFlow's tape keeps what it
  watched, so freeing the weights between the forward and the backward
  pass means recomputing the unit's forward pass from its stored input
  under a tape, as ``tf.recompute_grad`` does: about one extra forward
  pass a step.  The backward pass goes in reverse unit order: gather
  again, recompute, get the gradients of the unit's weights and of its
  input (the upstream gradient as ``output_gradients``), reduce-scatter
  the weights' gradient to the owners' buffers (each owner adds its
  part, summed over the replicas in replica order).  So the bytes sent
  are ZeRO's 1.5 x an all-reduce (two gathers and one reduce-scatter,
  :func:`pargrad.allreduce.sharded_step_bytes`), and the history counts
  what the emulation copies (``bytes_moved``).  Control dependencies keep
  the executor from gathering everything at once: unit u + 1's gather
  waits for unit u's output, the backward gather of unit u for its
  upstream gradient and for the previous unit's gradient writes.  No
  prefetch: FSDP gathers the next unit while the current one computes,
  which costs one more unit's weights in memory and hides the gather's
  time behind the compute; on one process of logical devices the
  copies and the compute share the same cores, so there is nothing to
  hide them behind.  The model must be a chain (a ``keras.Sequential``);
  at stage 3 any other model is refused (train it at stage 2).
* **Gradient buffers are variables.**  At stage 1 each replica keeps its
  full-size gradient in a variable on its device; at stages 2 and 3 each
  owner keeps its reduced shard in a variable on its device (with
  accumulation, the accumulator).  So :func:`pargrad.memory.bytes_by_device`
  counts the gradient memory from what TensorFlow holds, as for
  PyTorch's ``.grad``.
* **The trainer frees the model's own variables** (every stage): after it
  copies them into the pieces it releases each Keras variable's storage, so
  that only the pieces hold parameters; the model runs on their values
  (``stateless_call``; at stage 3 gathered from the owners).
  :meth:`ShardedTrainer.gathered_weights` returns the weights;
  :meth:`ShardedTrainer.unshard` puts them back into the model (after which
  the trainer no longer trains it).

Mixed precision: under Keras's ``mixed_bfloat16`` policy the model's
variables are float32 and each layer casts them to bfloat16 where it
computes, as FSDP's mixed precision computes in bfloat16 on float32
shards.  So the pieces, the owners' shards (the master weights) and the
optimizer state are float32; the parameters are gathered in float32 and
cast to bfloat16 per layer (FSDP gathers them already in bfloat16, half the
bytes: not done here, to keep the update equal to the mirrored run's);
the gradients, of float32 values, are reduced in float32.  It equals
``SyncTrainer`` under the same policy bit for bit (the same casts on the
same values), and holds ``state_bytes(..., precision="float32")``: 4 + 4 +
8 bytes a parameter with Adam, where ZeRO's 2 + 2 + 12 keeps 16-bit
parameters and gradients and a float32 master (the same 16 bytes at stage
0; ZeRO shards 12 of them at stage 1, this trainer 8).  ``mixed_float16``
is refused: it needs loss scaling.

Not supported (refused with the reason): a model with non-trainable state
(BatchNorm's moving statistics are updated on every replica by Keras's
mirrored machinery, which a sharded update bypasses), variables of several
dtypes, at stage 3 a model that is not a chain of layers, ``mixed_float16``,
``sample_weight``, ``jit_compile``, ``metrics``, and
``MultiWorkerMirroredStrategy`` (the owners' optimizers are one process's
devices).
"""

import dataclasses

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.allreduce import sharded_step_bytes  # noqa: E402
from pargrad.checks import check_flag  # noqa: E402
from pargrad.memory import check_stage, sharded_components  # noqa: E402
from pargrad.strategies import (  # noqa: E402
    check_optimizer_in_scope,
    check_rate_or_optimizer,
    tf_variable,
)
from pargrad.sync import SyncHistory, SyncTrainer, optimizer_slots  # noqa: E402


@dataclasses.dataclass
class ShardedHistory(SyncHistory):
    """What :meth:`ShardedTrainer.fit` recorded: :class:`pargrad.SyncHistory`'s fields, plus

    * ``bytes_sent[k]``: the bytes each replica sends in step ``k`` by a
      ring's count: each reduce-scatter of the gradients and each all-gather
      of the parameters ``(N - 1) / N`` of the (padded) parameters' bytes
      (:func:`pargrad.allreduce.sharded_step_bytes` with
      :attr:`ShardedTrainer.collectives_per_step`): at stages 1 and 2 an
      all-reduce's bytes, at stage 3 1.5 x (gathered for the forward and
      again for the backward pass);
    * ``bytes_moved[k]``: what the emulation copies between devices in a
      step, summed over the replicas, counted where the step cuts its
      slices: at stage 3, ``N x sharded_step_bytes`` of the unpadded
      parameters (``N x bytes_sent`` when N divides them);
    * ``gathered_values_max``: the most parameter values a replica held
      gathered at once (recorded by every gather the trainer built): the
      largest unit at stage 3, all P (the replica's joined copy) at
      stages 1 and 2;
    * ``stage``, ``parameter_bytes`` (the padded flat vector's bytes).

    Taught in the chapter "When the model does not fit".
    """

    bytes_sent: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    bytes_moved: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    stage: int = 1
    parameter_bytes: int = 0
    gathered_values_max: int = 0


class ShardedTrainer(SyncTrainer):
    """Sharded data-parallel training (ZeRO stage 1, 2 or 3), the same updates as SyncTrainer.

    Usage::

        strategy = pargrad.sync_strategy(2)
        with strategy.scope():
            model = parabola_model(seed=0)
            optimizer = keras.optimizers.Adam(1e-2)
        trainer = pargrad.ShardedTrainer(model, strategy, stage=2, optimizer=optimizer)
        history = trainer.fit(x, y, steps=100)
        weights = trainer.gathered_weights()

    Arguments as :class:`pargrad.SyncTrainer`'s (``loss``, ``optimizer``
    or ``learning_rate``, ``accumulation_steps``, ``progress``,
    ``stop_on_non_finite``), plus ``stage``: 1 (optimizer state sharded),
    2 (and gradients) or 3 (and parameters), and at stage 3 ``units``:
    None (each layer with weights is a unit) or a list of lists of the
    model's layers (or their names), in the order the model runs them,
    each a run of consecutive layers, every layer with weights in exactly
    one (FSDP's wrapping policy); ``trainer.units`` lists them
    (:class:`Unit`).  Your optimizer, created in
    ``strategy.scope()`` as for SyncTrainer, is the template: each owner
    gets a copy of it (``trainer.owner_optimizers``), built on its shard
    on its device; the template itself holds no state.  Make the trainer
    outside ``strategy.scope()``.

    ``fit``, ``evaluate``, callbacks, validation and exact resume are
    SyncTrainer's; ``fit`` returns a :class:`ShardedHistory`.  Checkpoint
    with ``tf.train.Checkpoint(trainer=trainer)``: it holds the pieces, the
    owners' optimizers and the position (not the released model);
    restored into a new trainer, training continues bit for bit.  The model
    is released at every stage: its ``get_weights``, ``predict``, ``save``
    (and Keras's other methods that read weights) raise a ``ValueError``
    that says to call :meth:`unshard` (or read :meth:`gathered_weights`),
    as does a second trainer made on it; after ``unshard()`` the model
    saves and loads as any Keras model.

    What it holds: ``replica_parameters[r]`` (the pieces of replica r's
    copy: all N at stages 1 and 2, its own at stage 3),
    ``parameter_shards[s]`` (owner s's piece), ``owner_optimizers[s]`` and
    ``gradient_buffers[s]`` (on device s), ``parameter_count`` (P) and
    ``shard_size`` (``ceil(P / N)``); :meth:`gathered_weights`,
    :meth:`gathered_slots`, :meth:`replica_weights` and :meth:`padding`
    read them back as NumPy arrays, :meth:`variables_by_component` lists
    them for :func:`pargrad.memory.bytes_by_device`.  Since the owners'
    copies do the updates, a callback that changes
    ``model.optimizer.learning_rate`` (the template's) changes nothing, and
    the template's ``iterations`` stays 0: use a learning-rate schedule in
    the optimizer instead (each owner's copy runs it on its own, equal,
    step count).

    Taught in the chapter "When the model does not fit".
    """

    def __init__(self, model, strategy, *, stage, optimizer=None, learning_rate=None, loss=None,
                 accumulation_steps=1, progress=True, stop_on_non_finite=True, metrics=None,
                 jit_compile=False, sample_weight=None, units=None):
        name = type(self).__name__
        stage = check_stage(stage, allowed=(1, 2, 3), advice=(
            "Pass 1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters); "
            "for stage 0, plain data parallelism, use pargrad.SyncTrainer."))
        check_flag("stop_on_non_finite", stop_on_non_finite)
        _refuse(name, "metrics", metrics, None, (
            "The metrics would be updated by every replica on its shard, but the sharded "
            "step runs the model on gathered weights outside Keras's metric machinery; "
            "evaluate them after fit (trainer.evaluate) or train with pargrad.SyncTrainer."))
        _refuse(name, "jit_compile", jit_compile, False, (
            "The sharded step's reduce-scatter and all-gather are copies between the "
            "replicas' devices, and an XLA computation runs on one device; pass "
            "jit_compile=False."))
        _refuse(name, "sample_weight", sample_weight, None, (
            "The sharded step divides every replica's loss by the global batch size, not "
            "by a total weight all-reduced first; use pargrad.SyncTrainer for a weighted "
            "loss."))
        if not isinstance(strategy, tf.distribute.MirroredStrategy):
            raise TypeError(
                f"{name} needs a tf.distribute.MirroredStrategy over this process's "
                f"devices, got {type(strategy).__name__}; make one with pargrad.sync_strategy(n) "
                "(without TF_CONFIG).")
        if isinstance(model, keras.Model) and model.non_trainable_variables:
            names = [v.path for v in model.non_trainable_variables]
            raise ValueError(
                f"{name} trains models whose every variable is trainable; this model "
                f"holds non-trainable state {names[:4]} (BatchNormalization's moving "
                "statistics?), which Keras updates on every replica outside the optimizer, "
                "so a sharded update would leave it out. Use pargrad.SyncTrainer for this "
                "model, or a normalization without state (LayerNormalization).")
        if tf.distribute.has_strategy():
            raise ValueError(
                f"Make the {name} outside `with strategy.scope():` (build the model and "
                "the optimizer inside it): the owners' shards and optimizers live on one "
                "device each, not mirrored.")
        if units is not None and stage != 3:
            raise ValueError(
                f"units are a stage-3 argument (what is gathered at once), got units with "
                f"stage={stage}; at stages 1 and 2 every replica holds the whole parameters. "
                "Pass stage=3, or leave units out.")
        self._units_argument = units
        self._stage = stage
        # What this stage splits over the replicas (read as components, never as a number).
        self._sharded = sharded_components(stage)
        self._unsharded = False
        super().__init__(model, strategy, loss=loss, optimizer=optimizer,
                         learning_rate=learning_rate, accumulation_steps=accumulation_steps,
                         progress=progress, stop_on_non_finite=stop_on_non_finite)
        self._build_shards()

    # -- what the trainer holds -------------------------------------------------

    @property
    def stage(self):
        """1, 2 or 3: which state is sharded (see the module's docstring)."""
        return self._stage

    @property
    def sharded(self):
        """The components this stage splits over the replicas (:func:`pargrad.memory.sharded_components`)."""
        return self._sharded

    def _make_optimizer(self, optimizer, learning_rate):
        """The template optimizer, checked and left unbuilt: the owners build copies of it."""
        check_rate_or_optimizer(type(self).__name__, optimizer, learning_rate)
        with self.strategy.scope():
            if optimizer is None:
                optimizer = keras.optimizers.SGD(1e-2 if learning_rate is None else learning_rate)
        check_optimizer_in_scope("optimizer", optimizer, self.strategy)
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or (
                getattr(self.model.dtype_policy, "name", None) == "mixed_float16"):
            raise ValueError(f"{type(self).__name__} does not train in mixed_float16: float16 "
                             "gradients underflow without loss scaling, which the owners' "
                             "shard updates do not do; use the mixed_bfloat16 policy (bfloat16 "
                             "has float32's range, no loss scaling needed), or float32.")
        return optimizer

    def _evaluation_model(self):
        """The model run on the replica's parameters (gathered at stage 3): the model's own
        variables are released at every stage."""
        return _GatheredModel(self)

    def _before_fit(self):
        if self._unsharded:
            raise ValueError(f"This trainer's model was unsharded (unshard()); make a new "
                             f"{type(self).__name__} to train it again.")

    def _host_device(self):
        return tf.DeviceSpec.from_string(self.strategy.extended.worker_devices[0]).replace(
            device_type="CPU", device_index=0).to_string()

    def _build_shards(self):
        """The flat layout, the owners' shards, optimizers and gradient buffers."""
        variables = self.model.trainable_variables
        dtypes = {v.dtype for v in variables}
        if len(dtypes) > 1:
            raise ValueError(f"{type(self).__name__} flattens the trainable variables into one vector, "
                             f"so they must share one dtype; this model's hold {sorted(dtypes)}.")
        self._dtype = tf.as_dtype(variables[0].dtype)
        self._shapes = [tuple(v.shape) for v in variables]
        self._sizes = [int(np.prod(shape)) for shape in self._shapes]
        self.parameter_count = sum(self._sizes)
        self._offsets = [int(o) for o in np.cumsum([0] + self._sizes)]
        n = self.replicas
        self.shard_size = -(-self.parameter_count // n)
        # Stage 3's units (refused before any state is built); what the step gathers, logged.
        self.units = self._unit_plan(self._units_argument) if "parameters" in self._sharded else ()
        for name in ("gather_log", "_moved_log"):
            object.__setattr__(self, name, [])
        self._devices = list(self.strategy.extended.worker_devices)
        L = self.shard_size
        config = self.optimizer.get_config()
        whole = "parameters" not in self._sharded
        # replica_parameters[r]: the pieces of the flat vector that replica r holds, on its
        # device: all N at stages 1 and 2 (its full copy), only its own at stage 3.  Owner
        # s's shard is piece s of its own copy: the variable its optimizer updates in place.
        # Plain lists (object.__setattr__), not tracked: the checkpoint holds the state in a
        # layout that does not depend on the stage or the replicas (_ShardedState).
        for name in ("replica_parameters", "owner_optimizers", "gradient_buffers"):
            object.__setattr__(self, name, [])
        for r in range(n):
            self.replica_parameters.append([])
        # Piece by piece from the model's variables (no second copy of the whole model), and
        # the model released before the optimizer state is built: building never holds much
        # more than the trainer will.
        for s in range(n):
            values = self._flat_piece(variables, s * L, (s + 1) * L)
            for r, device in enumerate(self._devices):
                if whole or s == r:
                    with tf.device(device):
                        self.replica_parameters[r].append(keras.Variable(
                            values, dtype=self._dtype.name, trainable=False,
                            name=f"parameters_{r}_piece_{s}"))
            del values
        self._release_model()
        for r, device in enumerate(self._devices):
            with tf.device(device):
                owner = type(self.optimizer).from_config(config)
                owner.build([self._own_piece(r)])
                self.owner_optimizers.append(owner)
                # Stage 1: each replica's full-size gradient; 2 and 3: the owner's reduced shard.
                size = L if "gradients" in self._sharded else self.parameter_count
                self.gradient_buffers.append(tf.Variable(
                    tf.zeros([size], self._dtype), trainable=False, name=f"gradients_{r}"))
        self.state = _ShardedState(self)      # what tf.train.Checkpoint(trainer=...) saves

    def _flat_piece(self, variables, start, stop):
        """Values ``[start, stop)`` of the variables flattened in order, zero-padded."""
        piece = np.zeros(stop - start, self._dtype.as_numpy_dtype)
        offset = 0
        for variable, size in zip(variables, self._sizes):
            lo, hi = max(start, offset), min(stop, offset + size)
            if lo < hi:
                piece[lo - start:hi - start] = np.asarray(variable.numpy()).ravel()[
                    lo - offset:hi - offset]
            offset += size
        return piece

    def transient_bytes(self):
        """``{"gathered_parameters": bytes, "gradients": bytes}`` a replica holds as tensors
        during a step, on top of its variables (:meth:`variables_by_component`).

        At stages 1 and 2 the model runs on a tensor copy of the replica's
        pieces: P values, kept from the forward pass to the end of the
        backward pass by the tape, and the replica's gradient is P values
        too, until it is written to its buffer (stage 1) or reduce-scattered
        (stage 2).  At stage 3 a replica holds one unit at a time: the
        largest unit's gathered weights, its gradient and the slices of it
        cut for the owners (TensorFlow's slice of a range copies it; a real
        reduce-scatter sends from the gradient itself; measured in the
        chapter).  For predicting a step's peak: variables +
        these + the activations.  Taught in the chapter "When the model
        does not fit".
        """
        if not self.units:
            nbytes = self.parameter_count * self._dtype.size
            return {"gathered_parameters": nbytes, "gradients": nbytes}
        nbytes = max(u.size for u in self.units) * self._dtype.size
        return {"gathered_parameters": nbytes, "gradients": nbytes, "gradient_slices": nbytes}

    def _own_piece(self, r):
        """Replica ``r``'s own shard of the parameters (piece ``r`` of its copy)."""
        pieces = self.replica_parameters[r]
        return pieces[r] if len(pieces) > 1 else pieces[0]

    @property
    def parameter_shards(self):
        """The owners' shards of the parameters, ``[owner]`` (each a variable on its device)."""
        return [self._own_piece(r) for r in range(len(self._devices))]

    def _release_model(self):
        """Drop the storage of the model's variables (the replicas' pieces hold the parameters)
        and leave the model out of the trainer's checkpoint (the pieces are in it)."""
        for variable in self.model.trainable_variables:
            variable._value = None      # Keras's own "uninitialized" state (see the docstring)
        self._released = True
        model = self.model
        del self.model                            # untracked: not saved by tf.train.Checkpoint
        object.__setattr__(self, "model", model)
        # The released model's own methods would fail on storage that is gone (TypeError:
        # 'NoneType' object is not callable): they say what to do instead, until unshard().
        where = (f"This model's weights live in a {type(self).__name__}'s shards (stage "
                 f"{self.stage}, {self.replicas} replicas), not in its variables")
        for method in RELEASED_METHODS:
            object.__setattr__(model, method, _released_method(method, where))
        object.__setattr__(model, "_pargrad_released", where)

    def variables_by_component(self):
        """``[(component, tf.Variable)]``: every variable holding training state, by component.

        What :func:`pargrad.memory.bytes_by_device` counts: ``parameters``
        (every replica's pieces: its padded full copy at stages 1 and 2, its
        shard at stage 3), ``optimizer_state`` (the owners' slots) and
        ``gradients`` (the gradient buffers); no ``master_weights`` (the
        owner's shard is a piece of its copy).  Counters (step counts,
        learning rates) are left out.
        """
        rows = []
        rows += [("parameters", tf_variable(piece)) for pieces in self.replica_parameters
                 for piece in pieces]
        for owner in self.owner_optimizers:
            rows += [("optimizer_state", tf_variable(v)) for v in optimizer_slots(owner)]
        rows += [("gradients", buffer) for buffer in self.gradient_buffers]
        return rows

    # -- gathered views ---------------------------------------------------------

    def _flat_parameters(self):
        return np.concatenate([np.asarray(s.numpy()) for s in self.parameter_shards])

    def _unflatten(self, flat):
        pieces, start = [], 0
        for shape, size in zip(self._shapes, self._sizes):
            pieces.append(np.asarray(flat[start:start + size]).reshape(shape))
            start += size
        return pieces

    def gathered_weights(self):
        """The weights, gathered from the shards: NumPy arrays in the model's variable order."""
        return self._unflatten(self._flat_parameters())

    def gathered_slots(self):
        """The optimizer state gathered from the owners: ``{slot name: [arrays, model's order]}``.

        Slot names as Keras calls them (Adam: ``"momentum"``, ``"velocity"``;
        SGD with momentum: ``"momentum"``), comparable with
        :func:`mirrored_slots` of the mirrored optimizer.
        """
        by_name = {}
        for owner in self.owner_optimizers:
            for slot in optimizer_slots(owner):
                name = slot.name.rsplit("_", 1)[-1]
                by_name.setdefault(name, []).append(np.asarray(slot.numpy()))
        return {name: self._unflatten(np.concatenate(parts)) for name, parts in by_name.items()}

    def padding(self):
        """The padded tail of the flat vector: parameters, gradient shard and slots (all zero)."""
        tail = slice(self.parameter_count, None)
        out = {"parameters": self._flat_parameters()[tail]}
        for owner_slots in zip(*[optimizer_slots(o) for o in self.owner_optimizers]):
            name = owner_slots[0].name.rsplit("_", 1)[-1]
            out[name] = np.concatenate([np.asarray(v.numpy()) for v in owner_slots])[tail]
        return out

    def replica_weights(self):
        """Stages 1 and 2: each replica's full copy, ``[replica][variable]`` as NumPy arrays."""
        if "parameters" in self._sharded:
            raise ValueError(f"At stage {self._stage} the replicas hold no full copy of the "
                             "parameters; read gathered_weights().")
        return [self._unflatten(np.concatenate([np.asarray(p.numpy()) for p in pieces]))
                for pieces in self.replica_parameters]

    def unshard(self):
        """Put the gathered weights back into the model (mirrored); return the model.

        After it the model predicts and saves as any Keras model; this
        trainer no longer trains it.
        """
        if getattr(self, "_released", False):
            with self.strategy.scope():
                for variable, value in zip(self.model.trainable_variables,
                                           self.gathered_weights()):
                    variable._initialize(value)
            for method in RELEASED_METHODS + ("_pargrad_released",):
                object.__delattr__(self.model, method)
            self._released = False
            self._unsharded = True
        return self.model

    # -- one step ----------------------------------------------------------------

    def _slice(self, s):
        """The flat vector's values ``[start, stop)`` that owner ``s`` holds (clipped to P)."""
        start = min(s * self.shard_size, self.parameter_count)
        return start, min((s + 1) * self.shard_size, self.parameter_count)

    def _gathered(self):
        """The full flat parameters (unpadded) on the current replica's device: its own copy
        (stages 1 and 2; stage 3 gathers one unit at a time, :meth:`_gather_unit`), or the
        owners' shards joined outside replica context."""
        pieces = self.parameter_shards
        context = tf.distribute.get_replica_context()
        if "parameters" not in self._sharded and context is not None:
            replica = tf.get_static_value(context.replica_id_in_sync_group)
            pieces = self.replica_parameters[int(replica)]
        full = tf.concat([tf.identity(tf_variable(p)) for p in pieces], 0)
        return full[:self.parameter_count]

    def _values(self, flat):
        """The flat vector cut into the model's variables' shapes (tensors)."""
        pieces = tf.split(flat, self._sizes)
        return [tf.reshape(p, shape) for p, shape in zip(pieces, self._shapes)]

    # -- stage 3: one unit at a time ----------------------------------------------

    def _unit_plan(self, units):
        """Stage 3's units, in the order the model runs them (a tuple of :class:`Unit`).

        ``units`` is None (each layer with weights is a unit) or a list of
        lists of the model's layers or layer names.  A layer without weights
        runs in the unit before it (leading ones in the first), wherever it
        is named.
        """
        name = type(self).__name__
        model = self.model
        if not isinstance(model, keras.Sequential):
            raise ValueError(
                f"{name} at stage 3 runs the model one unit (a layer, or layers you group) at "
                f"a time, so the model must be a chain of layers, a keras.Sequential; got a "
                f"{type(model).__name__}. Rebuild it as a keras.Sequential, or train it at "
                "stage=2 (the parameters then stay whole on every replica).")
        layers = list(model.layers)
        weighted = [i for i, layer in enumerate(layers) if layer.trainable_variables]
        groups = ([[i] for i in weighted] if units is None
                  else _named_units(name, units, layers, weighted))
        # A unit runs from its first layer with weights to the next unit's: the layers without
        # weights after it (an Activation) run with it, as Grappler fuses them with its last
        # layer in the mirrored run (split off, float32 comes out one ulp away).
        starts = [0] + [min(i for i in group if i in weighted) for group in groups[1:]]
        stops = starts[1:] + [len(layers)]
        index = {id(v): i for i, v in enumerate(model.trainable_variables)}
        offsets = self._offsets
        plan, covered = [], []
        for u, (start, stop) in enumerate(zip(starts, stops)):
            span = tuple(layers[start:stop])
            positions = [index.get(id(v)) for layer in span for v in layer.trainable_variables]
            first = positions[0] if positions and None not in positions else None
            if first is None or positions != list(range(first, first + len(positions))):
                raise ValueError(
                    f"{name} at stage 3 gathers a unit's weights as one range of the flat "
                    f"vector, but unit {u}'s layers {[layer.name for layer in span]} hold "
                    "variables that are not consecutive among the model's (a shared layer?); "
                    "group the layers that share weights into one unit, or use stage=2.")
            covered += positions
            plan.append(Unit(layers=span, first=first, last=first + len(positions),
                             start=int(offsets[first]),
                             stop=int(offsets[first + len(positions)])))
        if covered != list(range(len(model.trainable_variables))):
            raise ValueError(
                f"{name} at stage 3 needs every trainable variable in a layer of the chain; "
                "this model holds variables of its own outside its layers. Use stage=2.")
        return tuple(plan)

    def _owner_parts(self, start, stop):
        """``[(owner s, lo, hi)]``: the parts of the flat range ``[start, stop)`` each owner holds."""
        L = self.shard_size
        return [(s, max(start, s * L), min(stop, (s + 1) * L)) for s in range(self.replicas)
                if max(start, s * L) < min(stop, (s + 1) * L)]

    def _moved(self, values):
        """Note ``values`` parameter values copied between two devices (counted when the step
        is traced: :attr:`ShardedHistory.bytes_moved`)."""
        self._moved_log.append(values)

    def _gather_unit(self, unit, replica, after=()):
        """Unit ``unit``'s weights gathered onto the current replica's device (replica context).

        The parts of the owners' shards that overlap the unit's range are
        cut on the owners' devices and joined here (the all-gather of one
        unit), then cut into the unit's variables' shapes: tensors, freed
        when the ops that use them are done.  ``after``: tensors that must
        exist before the gather starts (so that the executor cannot gather
        every unit at once).
        """
        self.gather_log.append(unit.size)
        L = self.shard_size
        values = []
        with tf.control_dependencies(list(after)):
            for i in range(unit.first, unit.last):     # a variable at a time: no flat copy
                parts = []
                for s, lo, hi in self._owner_parts(self._offsets[i], self._offsets[i + 1]):
                    with tf.device(self._devices[s]):
                        parts.append(tf_variable(self.parameter_shards[s])[lo - s * L:hi - s * L])
                    if s != replica:
                        self._moved(hi - lo)
                joined = tf.concat(parts, 0) if len(parts) > 1 else tf.identity(parts[0])
                values.append(tf.reshape(joined, self._shapes[i]))
        return values

    def _run_unit(self, unit, values, h, training):
        """The unit's layers on ``h``, their variables replaced by ``values`` (tensors), as
        Keras's ``stateless_call`` does; returns the output and the layers' penalties."""
        variables = self.model.trainable_variables[unit.first:unit.last]
        with keras.StatelessScope(state_mapping=list(zip(variables, values)),
                                  collect_losses=True):
            for layer in unit.layers:
                h = layer(h, training=training)
            penalties = [loss for layer in unit.layers for loss in layer.losses]
        return h, penalties

    def _units_forward(self, x, training, after=()):
        """Replica context: the model on ``x`` one unit at a time; the output, each unit's input
        and the penalties.  Unit u + 1's gather waits for unit u's output (no prefetch)."""
        replica = _replica_index()
        inputs, penalties, h = [], [], x
        for unit in self.units:
            values = self._gather_unit(unit, replica, after)
            inputs.append(h)
            h, unit_penalties = self._run_unit(unit, values, h, training)
            penalties += unit_penalties
            # The weights die here; the next unit's gather waits for h (through an identity:
            # a control edge on h itself would keep Grappler from fusing the unit's last
            # MatMul, BiasAdd and activation as it does in the mirrored run, one ulp away).
            after = [tf.identity(h)]
        return h, inputs, penalties

    def _unit_backward(self, u, h, upstream, after):
        """Replica context: unit ``u``'s backward pass: gathered again, its forward recomputed
        from its stored input under a tape; the gradient of its input and its flat weight
        gradient (``output_gradients`` = the upstream gradient)."""
        unit = self.units[u]
        values = self._gather_unit(unit, _replica_index(), [upstream, *after])
        with tf.GradientTape() as tape:
            tape.watch(values)
            if u:
                tape.watch(h)
            out, penalties = self._run_unit(unit, values, h, training=True)
            targets, seeds = [out], [upstream]
            if penalties:       # this unit's share of the penalty, as the loss adds it
                penalty = tf.nn.scale_regularization_loss(
                    tf.add_n([tf.cast(p, penalties[0].dtype) for p in penalties]))
                targets.append(penalty / self.accumulation_steps)
                seeds.append(tf.ones_like(targets[-1]))
        grads = tape.gradient(targets, values + ([h] if u else []), output_gradients=seeds)
        grads = [tf.convert_to_tensor(g) for g in grads]
        return (grads[-1] if u else tf.zeros([], grads[0].dtype)), grads[:len(values)]

    def _reduce_scatter_unit(self, unit, grads, add):
        """Unit ``unit``'s gradient (``grads[r]``: replica r's, by variable) sent to the owners as
        soon as it exists: for each part of a variable that owner s holds, s adds the replicas'
        slices in replica order into its buffer.  Returns the writes (for the next gather to
        wait on)."""
        L = self.shard_size
        writes = []
        for j, i in enumerate(range(unit.first, unit.last)):
            offset = self._offsets[i]
            for s, lo, hi in self._owner_parts(offset, self._offsets[i + 1]):
                pieces = []
                for r, device in enumerate(self._devices):
                    with tf.device(device):       # cut where it lives, then sent
                        pieces.append(tf.reshape(grads[r][j], [-1])[lo - offset:hi - offset])
                    if r != s:
                        self._moved(hi - lo)
                with tf.device(self._devices[s]):
                    total = _sum_in_order(*pieces)
                    where = tf.IndexedSlices(total, tf.range(lo - s * L, hi - s * L))
                    buffer = self.gradient_buffers[s]
                    written = buffer.scatter_add(where) if add else buffer.scatter_update(where)
                    # The write's op, not a read: a read of the buffer kept alive would make
                    # the next write copy the whole buffer (TensorFlow copies a shared buffer).
                    writes.append(written.op)
        return writes

    def _unit_step(self, x, y, position, global_batch_size):
        """Stage 3's step: for each micro-batch, the forward pass unit by unit, then the
        backward pass in reverse unit order, each unit's gradient reduce-scattered at once.
        Returns each replica's loss; the owners' buffers hold the reduced gradient.

        Shown in the chapter "When the model does not fit".
        """
        k = self.accumulation_steps
        losses, writes = None, []
        for i in range(k):
            def forward(micro=i, after=tuple(writes)):
                xb, yb = self._shard(x, y, position, global_batch_size)
                if k > 1:
                    xb, yb = xb[micro], yb[micro]
                prediction, inputs, penalties = self._units_forward(xb, True, after)
                with tf.GradientTape() as tape:
                    tape.watch(prediction)
                    loss = tf.nn.compute_average_loss(self.loss(yb, prediction),
                                                      global_batch_size=global_batch_size)
                upstream = tape.gradient(loss, prediction)
                if penalties:
                    penalty = tf.nn.scale_regularization_loss(
                        tf.add_n([tf.cast(p, loss.dtype) for p in penalties]))
                    loss += penalty / k
                return loss, inputs, upstream

            loss, inputs, upstream = self.strategy.run(forward)
            loss = self.strategy.experimental_local_results(loss)
            losses = list(loss) if i == 0 else [a + b for a, b in zip(losses, loss)]
            for u in reversed(range(len(self.units))):
                def backward(h, g, u=u, after=tuple(writes)):
                    return self._unit_backward(u, h, g, after)

                upstream, grads = self.strategy.run(backward, args=(inputs[u], upstream))
                grads = [self.strategy.experimental_local_results(g) for g in grads]
                writes = self._reduce_scatter_unit(
                    self.units[u], [list(g) for g in zip(*grads)], add=i > 0)
        return losses, writes

    def _stateless_gradients(self, x, y, global_batch_size):
        """The loss and gradients of ``(x, y)``, the model run on the replica's flat parameters
        (stages 1 and 2) with Keras's ``stateless_call``."""
        values = self._values(self._gathered())      # the replica's weights, as tensors
        with tf.GradientTape() as tape:
            tape.watch(values)
            prediction, _, penalties = self.model.stateless_call(
                values, [], x, training=True, return_losses=True)
            loss = tf.nn.compute_average_loss(self.loss(y, prediction),
                                              global_batch_size=global_batch_size)
            if penalties:
                penalty = tf.nn.scale_regularization_loss(
                    tf.add_n([tf.cast(p, loss.dtype) for p in penalties]))
                loss += penalty / self.accumulation_steps
        return loss, tape.gradient(loss, values)       # the gathered weights die with the tape

    def _flat(self, grads):
        return tf.concat([tf.reshape(tf.convert_to_tensor(g), [-1]) for g in grads], 0)

    def _replica_gradients_flat(self, x, y, global_batch_size, micro):
        """In replica context: this replica's loss and flat gradient (``micro``: one micro-batch)."""
        micros = [(x[micro], y[micro])] if micro is not None else (
            [(x, y)] if self.accumulation_steps == 1
            else [(x[i], y[i]) for i in range(self.accumulation_steps)])
        loss, flat = None, None
        for xb, yb in micros:      # stage 1's micro-batches added on the replica, as SyncTrainer
            micro_loss, grads = self._stateless_gradients(xb, yb, global_batch_size)
            micro_flat = self._flat(grads)
            loss = micro_loss if loss is None else loss + micro_loss
            flat = micro_flat if flat is None else flat + micro_flat
        return loss, flat

    def _reduce_scatter(self, flats):
        """Emulated reduce-scatter: owner s adds the replicas' slices s, in replica order.

        Each replica's slice is cut on its own device and copied to the
        owner's (the bytes a ring would send); ``tf.add_n`` adds them in
        the order ``ReductionToOneDevice`` adds the mirrored run's.
        Returns each owner's shard sum, padded to the shard size, on its device.
        """
        shards = []
        for s, owner in enumerate(self._devices):
            start, stop = self._slice(s)
            pieces = []
            for r, device in enumerate(self._devices):
                with tf.device(device):
                    pieces.append(flats[r][start:stop])        # cut where it lives, then sent
                if r != s:
                    self._moved(stop - start)
            with tf.device(owner):
                total = _sum_in_order(*pieces)
                shards.append(tf.pad(total, [[0, self.shard_size - (stop - start)]]))
        return shards

    def _distributed_step(self, x, y, position, global_batch_size):
        """One sharded step: gradients, reduce-scatter, owners' updates, all-gather.

        Runs in cross-replica context; the replicas' part (their gradients)
        inside ``strategy.run``, the communication and the owners' updates
        outside it, each on its device.

        Shown in the chapter "When the model does not fit".
        """
        del self._moved_log[:]            # this trace's copies between devices: one step's
        outputs = self._sharded_step(x, y, position, global_batch_size)
        object.__setattr__(self, "_step_moved_values", sum(self._moved_log))
        return outputs

    def _sharded_step(self, x, y, position, global_batch_size):
        """:meth:`_distributed_step`'s work, at any stage.

        Shown in the chapter "When the model does not fit".
        """
        if "parameters" in self._sharded:
            losses, writes = self._unit_step(x, y, position, global_batch_size)
            with tf.control_dependencies(writes):
                shards = [tf.identity(buffer) for buffer in self.gradient_buffers]
            return self._owners_update(losses, shards)
        k = self.accumulation_steps
        # Sharded gradients are reduced a micro-batch at a time; whole ones accumulate first.
        micros = list(range(k)) if ("gradients" in self._sharded and k > 1) else [None]
        losses = 0
        for i, micro in enumerate(micros):
            def replica_step(micro=micro):
                xb, yb = self._shard(x, y, position, global_batch_size)
                return self._replica_gradients_flat(xb, yb, global_batch_size, micro)

            loss, flat = self.strategy.run(replica_step)
            loss = self.strategy.experimental_local_results(loss)
            # Each replica's loss, its micro-batches added first (as SyncTrainer does).
            losses = list(loss) if i == 0 else [a + l for a, l in zip(losses, loss)]
            flats = self.strategy.experimental_local_results(flat)
            if "gradients" not in self._sharded:
                # Each replica keeps its full gradient in its buffer, then reduce-scatter.
                flats = [self._assigned(self.gradient_buffers[r], f, r)
                         for r, f in enumerate(flats)]
            shards = self._reduce_scatter(flats)
            if "gradients" in self._sharded:
                shards = [self._assigned(self.gradient_buffers[s], g, s, add=i > 0)
                          for s, g in enumerate(shards)]
        return self._owners_update(losses, shards)

    def _owners_update(self, losses, shards):
        """Each owner's update of its shard with its reduced gradient (after the finite check),
        the all-gather at stages 1 and 2, and the replicas' summed loss.

        Shown in the chapter "When the model does not fit".
        """
        check = self._check_finite(losses)
        with tf.control_dependencies(check):
            updates = []
            for s, device in enumerate(self._devices):
                with tf.device(device):          # the owner's update, outside replica context
                    self.owner_optimizers[s].apply_gradients([(shards[s],
                                                               self.parameter_shards[s])])
                    updates.append(tf.identity(tf_variable(self.parameter_shards[s])))
            if "parameters" not in self._sharded:
                self._all_gather(updates)
        with tf.device(self._devices[0]):     # the replicas' sum, as strategy.reduce adds it
            total = _sum_in_order(*losses)
        return {"loss": tf.cast(total, tf.float64)}

    def _assigned(self, buffer, value, device_index, add=False):
        """``buffer`` set to (or, with ``add``, increased by) ``value``, on its device; its new value."""
        with tf.device(self._devices[device_index]):
            written = buffer.assign_add(value) if add else buffer.assign(value)
            return tf.identity(written)      # read after the write

    def _all_gather(self, shards):
        """Stages 1 and 2: each owner's updated shard copied into every other replica's copy."""
        for r, device in enumerate(self._devices):
            with tf.device(device):
                for s, piece in enumerate(self.replica_parameters[r]):
                    if s != r:
                        tf_variable(piece).assign(shards[s])
                        self._moved(self.shard_size)

    def _check_finite(self, losses):
        """The finite-loss check (with ``stop_on_non_finite``) on every replica's loss, on the host."""
        if not self.stop_on_non_finite:
            return []
        with tf.device(self._host_device()):
            stacked = tf.stack([tf.cast(loss, tf.float64) for loss in losses])
            return [self._finite_check(stacked)]

    # -- the loop ---------------------------------------------------------------

    @property
    def collectives_per_step(self):
        """``(gathers, reductions)``: the all-gathers of the parameters and reduce-scatters of
        the gradients a step: (1, 1) at stage 1; (1, k) at stage 2 (one reduce-scatter a
        micro-batch); (2k, k) at stage 3 (each micro-batch gathers every unit for its
        forward and again for its backward pass)."""
        k = self.accumulation_steps
        if "parameters" in self._sharded:
            return 2 * k, k
        return 1, (k if "gradients" in self._sharded else 1)

    def _history(self, records, keras_history, source):
        """SyncHistory's fields, plus the bytes sent a step (:func:`pargrad.allreduce.sharded_step_bytes`)."""
        base = super()._history(records, keras_history, source)
        padded_bytes = self.replicas * self.shard_size * self._dtype.size
        gathers, reductions = self.collectives_per_step
        per_step = sharded_step_bytes(padded_bytes, self.replicas, gathers=gathers,
                                      reductions=reductions)
        moved = getattr(self, "_step_moved_values", 0) * self._dtype.size
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(SyncHistory)}
        steps = len(base.loss)
        return ShardedHistory(**fields, bytes_sent=np.full(steps, per_step),
                              bytes_moved=np.full(steps, moved), stage=self._stage,
                              parameter_bytes=padded_bytes,
                              gathered_values_max=max(self.gather_log, default=self.parameter_count))


class _ShardedState(tf.__internal__.tracking.Trackable):
    """A sharded trainer's parameters and optimizer state, saved gathered and unpadded.

    What ``tf.train.Checkpoint(trainer=...)`` writes for a
    :class:`ShardedTrainer`: the flat parameters (P values), each slot of the
    owners' optimizers gathered the same way, the owners' step count, and
    the optimizer's class, stage and replicas that saved them.  Restored,
    each value is cut into the restoring trainer's own shards, so a
    checkpoint restores at another stage or on another number of replicas
    (as PyTorch's distributed checkpoint reshards on load).
    """

    def __init__(self, trainer):
        self._trainer = trainer

    def _slot_groups(self):
        """``{slot name: [owner 0's slot, owner 1's, ...]}``."""
        groups = {}
        for owner in self._trainer.owner_optimizers:
            for slot in optimizer_slots(owner):
                groups.setdefault(slot.name.rsplit("_", 1)[-1], []).append(tf_variable(slot))
        return groups

    def _serialize_to_tensors(self):
        t = self._trainer
        with tf.device(t._host_device()):
            def gathered(pieces):
                return tf.concat([tf.identity(p) for p in pieces], 0)[:t.parameter_count]

            tensors = {"parameters": gathered([tf_variable(p) for p in t.parameter_shards]),
                       "iterations": tf.identity(tf_variable(t.owner_optimizers[0].iterations)),
                       "optimizer": tf.constant(type(t.optimizer).__name__),
                       "stage": tf.constant(t.stage), "replicas": tf.constant(t.replicas)}
            # Every slot in one tensor, so that the keys do not depend on the optimizer (a
            # checkpoint of another optimizer reaches the check below, not a NotFoundError).
            groups = self._slot_groups()
            tensors["slot_names"] = tf.constant(list(groups), tf.string, shape=[len(groups)])
            tensors["slots"] = (tf.stack([gathered(slots) for slots in groups.values()])
                                if groups else tf.zeros([0, t.parameter_count], t._dtype))
        return tensors

    def _restore_from_tensors(self, restored_tensors):
        t = self._trainer
        saved = (f"saved at stage {int(restored_tensors['stage'])} on "
                 f"{int(restored_tensors['replicas'])} replicas")
        here = f"this {type(t).__name__} (stage {t.stage}, {t.replicas} replicas)"
        optimizer = restored_tensors["optimizer"].numpy().decode()
        count = int(restored_tensors["parameters"].shape[0])
        if count != t.parameter_count or optimizer != type(t.optimizer).__name__:
            raise ValueError(
                f"This checkpoint, {saved}, holds {count} parameters and {optimizer}'s state, "
                f"so it cannot restore into {here}, which trains {t.parameter_count} "
                f"parameters with {type(t.optimizer).__name__}; restore it into a trainer of "
                "the same model and optimizer.")
        L, n = t.shard_size, t.replicas
        pad = [[0, n * L - t.parameter_count]]

        def shards(values):
            return tf.split(tf.pad(values, pad), n)

        ops = []
        parameters = shards(restored_tensors["parameters"])
        for r, pieces in enumerate(t.replica_parameters):
            owners = range(n) if len(pieces) == n else [r]
            ops += [tf_variable(piece).assign(parameters[s]) for s, piece in zip(owners, pieces)]
        saved_slots = dict(zip([n.decode() for n in restored_tensors["slot_names"].numpy()],
                               tf.unstack(restored_tensors["slots"])))
        for name, slots in self._slot_groups().items():
            ops += [slot.assign(value) for slot, value in zip(slots, shards(saved_slots[name]))]
        ops += [tf_variable(owner.iterations).assign(restored_tensors["iterations"])
                for owner in t.owner_optimizers]
        return tf.group(ops)


# The methods of a released model that say to call unshard() (instance attributes).
RELEASED_METHODS = ("get_weights", "set_weights", "predict", "evaluate", "fit", "save",
                    "save_weights", "predict_on_batch", "train_on_batch", "test_on_batch")


def _released_method(method, where):
    def refused(*args, **kwargs):
        raise ValueError(f"{where}, so model.{method} cannot run; call trainer.unshard() to "
                         "put them back into the model first (the trainer then stops "
                         "training it), or read trainer.gathered_weights().")
    refused.__name__ = method
    return refused


@dataclasses.dataclass(frozen=True)
class Unit:
    """One stage-3 unit: the layers it runs (in order), its variables
    ``model.trainable_variables[first:last]`` and its flat range ``[start, stop)``.

    Taught in the chapter "When the model does not fit".
    """

    layers: tuple
    first: int
    last: int
    start: int
    stop: int

    @property
    def size(self):
        """Its parameter values."""
        return self.stop - self.start


def _replica_index():
    """The current replica's index (a Python int: MirroredStrategy traces each replica)."""
    context = tf.distribute.get_replica_context()
    return int(tf.get_static_value(context.replica_id_in_sync_group))


def _named_units(trainer, units, layers, weighted):
    """``units`` (lists of layers or layer names) checked, as lists of layer positions."""
    advice = ("Pass units as a list of lists of the model's layers (or their names), in the "
              "order the model runs them, each list a run of consecutive layers and every "
              "layer with weights in exactly one list, e.g. units=[[model.layers[0], "
              "model.layers[1]], [model.layers[2]]].")
    if (not isinstance(units, (list, tuple)) or not units
            or any(not isinstance(g, (list, tuple)) or not g for g in units)):
        raise TypeError(f"units must be a non-empty list of non-empty lists of layers or "
                        f"layer names for {trainer}, got {units!r}. {advice}")
    by_name = {layer.name: i for i, layer in enumerate(layers)}
    by_id = {id(layer): i for i, layer in enumerate(layers)}
    groups, seen = [], {}
    for u, group in enumerate(units):
        positions = []
        for item in group:
            i = by_name.get(item) if isinstance(item, str) else by_id.get(id(item))
            if i is None:
                raise ValueError(f"units[{u}] holds {item!r}, which is not a layer of this model "
                                 f"(its layers: {list(by_name)}). {advice}")
            if i in seen:
                raise ValueError(f"layer {layers[i].name!r} is in units[{seen[i]}] and units[{u}]; "
                                 f"a layer belongs to one unit. {advice}")
            seen[i] = u
            positions.append(i)
        groups.append(sorted(positions))
    missing = [layers[i].name for i in weighted if i not in seen]
    if missing:
        raise ValueError(f"the layers with weights {missing} are in no unit. {advice}")
    for u, positions in enumerate(groups):
        inside = [i for i in weighted if positions[0] <= i <= positions[-1]]
        if (any(seen[i] != u for i in inside) or not inside
                or (u and positions[0] <= groups[u - 1][-1])):
            raise ValueError(f"units[{u}] ({[layers[i].name for i in positions]}) is not a run "
                             "of consecutive layers with weights after the previous unit's. "
                             f"{advice}")
    return groups


def _refuse(trainer, name, value, default, reason):
    """``ValueError`` in :mod:`pargrad.checks`' voice unless ``value`` is ``default``."""
    if value is default:
        return
    raise ValueError(f"{name} must be {default!r} for {trainer}, got {value!r}. {reason}")


def _add_in_order(*pieces):
    return tf.add_n(pieces) if len(pieces) > 1 else tf.identity(pieces[0])


# The owner's sum as a function call that Grappler does not inline: inlined, its
# arithmetic optimizer rewrote the add_n of the slices (measured: some sums of 4
# replicas came out in another order, one ulp away from the mirrored run's).
_sum_in_order = tf.function(_add_in_order, autograph=False,
                            experimental_attributes={"_noinline": True})


class _GatheredModel:
    """The model for evaluation: run on the replica's copy of the weights (stages 1 and 2) or
    one unit at a time, each gathered onto the replica (stage 3)."""

    def __init__(self, trainer):
        self._trainer = trainer

    def __call__(self, x, training=False):
        if self._trainer.units:        # stage 3: one unit at a time
            return self._trainer._units_forward(x, training)[0]
        values = self._trainer._values(self._trainer._gathered())
        prediction, _ = self._trainer.model.stateless_call(values, [], x, training=training)
        return prediction

    @property
    def losses(self):
        values = self._trainer._values(tf.constant(self._trainer._flat_parameters()
                                                   [:self._trainer.parameter_count]))
        _, _, losses = self._trainer.model.stateless_call(
            values, [], tf.zeros([1] + list(self._trainer.model.inputs[0].shape[1:]),
                                 self._trainer._dtype), return_losses=True)
        return losses


def mirrored_slots(optimizer):
    """A mirrored (or any Keras) optimizer's slots: ``{slot name: [arrays, in build order]}``.

    The same layout as :meth:`ShardedTrainer.gathered_slots`, for comparing
    a sharded run with a ``SyncTrainer`` run.  Taught in the chapter "When
    the model does not fit".
    """
    by_name = {}
    for slot in optimizer_slots(optimizer):
        by_name.setdefault(slot.name.rsplit("_", 1)[-1], []).append(np.asarray(slot.numpy()))
    return by_name
