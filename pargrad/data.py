"""A fit's data: arrays cast for the model, where batches come from, and where training stands.

Taught in the chapter "Your own model".  Every cast of a reader's data
happens here: :func:`prepare_arrays` checks arrays and casts features to the
model's input dtype (:func:`input_dtype`) and floating-point targets to the
dtype its loss is computed in (:func:`loss_dtype`), with an error that says
what to pass for anything it cannot read; :class:`NonFiniteDataError`,
:func:`check_finite_data` and :func:`first_non_finite_row` refuse a NaN or
an infinity in them.  The losses those data reach are in
:mod:`pargrad.losses`.

Beyond the casts, this module plays the part of
Keras's ``EpochIterator`` (``keras/src/trainers/epoch_iterator.py``) for the
book's trainers: it turns what ``fit`` was given into the *calls* of a step
function, one :class:`Call` per ``tf.function`` call, and keeps the
:class:`TrainingPosition` that makes a resumed run continue exactly.  It
knows nothing of strategies, optimizers or callbacks, so it is tested
without a strategy (``tests/test_data.py``) and any trainer can read its
batches through it.

A newcomer's map:

1. :func:`fit_source` checks what ``fit`` got (arrays, or a
   ``tf.data.Dataset`` of global batches) and returns an
   :class:`ArraySource` or a :class:`DatasetSource`;
   :func:`validation_source` does the same for ``validation_data`` (the one
   validation-data check).
2. A :class:`Feed` says how a batch must look: cast to the model's dtypes,
   kept on the host, and divisible into ``replicas x accumulation_steps``
   equal parts.
3. :class:`EpochReader` yields the calls of one epoch (or of ``steps``
   steps).  Each input case is a short generator: arrays by steps (in
   order, wrapping around), arrays by epoch (the seeded per-epoch
   permutation, :func:`epoch_permutation`), a dataset by epoch (one pass),
   a dataset by steps (read on, starting again at its end), and batches of
   a dataset grouped ``steps_per_call`` at a time.
4. :meth:`EpochReader.advance` moves the position past the steps of a call
   that ran, :meth:`EpochReader.end_epoch` past an epoch: the reader is the
   only writer of the position, as Keras keeps its iteration state in its
   iterator.  :func:`pargrad.loop.fit_loop` tells it what ran.

Arrays stay in host memory: a call hands the step function the whole
(permuted) arrays and the first row of its batch, and each replica gathers
its own rows.  A dataset's iterator lives only while its generator runs and
is deleted in a ``finally`` in the thread that made it (a garbage-collected
multi-device iterator can block TensorFlow 2.21 for good).
"""

import contextlib
import dataclasses

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import ArgumentTypeError, check_whole_number  # noqa: E402


# ----------------------------------------------------------------------------
# Finite data: a NaN or an infinity refused before any update uses it
# ----------------------------------------------------------------------------

class NonFiniteDataError(ValueError):
    """The data hold a NaN or an infinity; training refused them before any update used them.

    ``where`` names the place (``"row 40 of x"``, ``"the batch of step 3"``).
    Checked in the data itself, before any layer sees them: whether a NaN
    input reaches the loss depends on the kernels (max-pooling on some CPUs
    returns the largest finite value of a window that holds a NaN).  Taught
    in the chapter "Your own model".
    """

    def __init__(self, where, value, hint=""):
        self.where, self.value = str(where), float(value)
        message = (
            f"The data hold {self.value} at {self.where}; no update has used it. Remove or "
            "fill the non-finite values first (np.isfinite(x).all(axis=tuple(range(1, x.ndim))) "
            "marks the rows to keep)."
        )
        super().__init__(message + (f" {hint}" if hint else ""))


def first_non_finite_row(array):
    """``(row, value)`` of the first row of ``array`` holding a NaN or inf, or None.

    Integer and boolean arrays are always finite.  Taught in the chapter
    "Your own model".
    """
    array = np.asarray(array)
    if array.dtype.kind not in "fc" or array.size == 0:
        return None
    finite = np.isfinite(array).reshape(len(array), -1).all(axis=1)
    if finite.all():
        return None
    row = int(np.argmin(finite))
    values = array[row].reshape(-1)
    return row, values[~np.isfinite(values)][0]


def check_finite_data(x, y, hint="", name=("x", "y")):
    """Raise :class:`NonFiniteDataError` naming the first row of ``x`` or ``y`` with a NaN or inf.

    Taught in the chapter "Your own model".
    """
    for label, array in zip(name, (x, y)):
        found = first_non_finite_row(array)
        if found is not None:
            raise NonFiniteDataError(f"row {found[0]} of {label}", found[1], hint)


# ----------------------------------------------------------------------------
# Arrays cast for a model (what every trainer's fit does first)
# ----------------------------------------------------------------------------

def _keras_dtype(dtype):
    return tf.as_dtype(keras.backend.standardize_dtype(dtype))


def input_dtype(model):
    """The dtype of the model's (first) ``keras.Input``, or None if it has none (subclassed).

    Taught in the chapter "Your own model".
    """
    inputs = getattr(model, "inputs", None)
    try:
        return _keras_dtype(inputs[0].dtype) if inputs else None
    except (AttributeError, ValueError, TypeError):
        return None


def loss_dtype(model):
    """The dtype the loss is computed in: the model's output dtype, float32 for half types.

    Taught in the chapter "Your own model".
    """
    outputs = getattr(model, "outputs", None)
    dtype = None
    try:
        if outputs:
            dtype = _keras_dtype(outputs[0].dtype)
    except (AttributeError, ValueError):
        dtype = None
    if dtype is None or not dtype.is_floating:
        dtype = _keras_dtype(model.compute_dtype)
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _as_array(data, name):
    several = isinstance(data, (list, tuple)) and any(
        isinstance(item, (np.ndarray, tf.Tensor)) for item in data)
    if isinstance(data, dict) or several:
        raise TypeError(
            f"{name} must be one array (examples along the first axis), got a "
            f"{type(data).__name__} of arrays; for a model with several inputs or outputs, "
            "pass a tf.data.Dataset of (features, targets) batches."
        )
    if isinstance(data, tf.Tensor):
        data = data.numpy()
    try:
        array = np.asarray(data)
    except ValueError as error:
        raise ValueError(
            f"{name} could not be read as one array ({error}); pass a NumPy array whose "
            "first axis is the examples, with the same shape for every example."
        ) from None
    if array.dtype == object:
        raise TypeError(
            f"{name} holds Python objects (rows of different lengths, or mixed types); pass a "
            "NumPy array of numbers with the same shape for every example."
        )
    if array.ndim == 0:
        raise ValueError(f"{name} is a single number; pass an array with one row per example.")
    return array


def prepare_arrays(x, y, model, finite_hint=None):
    """``(x, y)`` as NumPy arrays the trainers can use, or a clear error.

    Features are cast to the model's input dtype (:func:`input_dtype`);
    floating-point targets to the dtype the loss is computed in
    (:func:`loss_dtype`); integer and boolean targets are kept, because a
    sparse loss wants integer labels (the default squared error casts them
    to the prediction's dtype itself).  Unless ``finite_hint`` is None, a
    NaN or inf in ``x`` or ``y`` raises :class:`NonFiniteDataError` naming
    its row, with ``finite_hint`` (how to opt out) in the message.  Taught in
    the chapter "Your own model".
    """
    x, y = _as_array(x, "x"), _as_array(y, "y")
    if finite_hint is not None:
        check_finite_data(x, y, finite_hint)
    if len(x) == 0:
        raise ValueError("x has no examples; pass at least one example (one row of x and y).")
    if len(x) != len(y):
        raise ValueError(
            f"x has {len(x)} examples but y has {len(y)}; pass one target row per example.")
    features = input_dtype(model)
    if features == tf.string:
        if x.dtype.kind not in "US":
            raise TypeError(f"The model takes strings, but x holds {x.dtype}; pass text.")
        return x, _cast_targets(y, model)
    if x.dtype.kind not in "biuf":
        raise TypeError(
            f"x holds {x.dtype} values, not numbers; convert the features to numbers first "
            "(for example with keras.layers.StringLookup or TextVectorization outside the "
            "model), or give the model a keras.Input(dtype='string')."
        )
    if features is None:             # no keras.Input: floats to the loss's dtype, ints kept
        features = loss_dtype(model) if x.dtype.kind == "f" else tf.as_dtype(x.dtype)
    if x.dtype != features.as_numpy_dtype:
        x = x.astype(features.as_numpy_dtype)
    return x, _cast_targets(y, model)


def _cast_targets(y, model):
    if y.dtype.kind not in "biuf":
        raise TypeError(
            f"y holds {y.dtype} values, not numbers; encode the targets as numbers (class "
            "labels as integers 0..C-1)."
        )
    if y.dtype.kind == "f":
        target = loss_dtype(model).as_numpy_dtype
        if y.dtype != target:
            y = y.astype(target)
    return y


# ----------------------------------------------------------------------------
# Where training stands
# ----------------------------------------------------------------------------

class TrainingPosition(tf.Module):
    """Where a trainer stands, in variables that ``tf.train.Checkpoint`` saves.

    ``step``: updates applied; ``epoch``: epochs completed; ``epoch_step``:
    updates into the current epoch; ``position``: examples into the current
    pass over in-memory arrays (the next batch's first row), or batches into
    a dataset read by steps; ``seed``: the shuffling seed (-1: none yet).  Taught in the
    chapter "Your own model".

    Only :class:`EpochReader` changes it.  It also remembers (outside the
    checkpoint) which data the last fit read, so that the same data
    continue and other data start from their first batch.

    Shown in the chapter "Your own model".
    """

    def __init__(self, name="training_position"):
        super().__init__(name=name)
        with tf.init_scope(), tf.device("/CPU:0"):
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.epoch_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch_step")
            self.position = tf.Variable(0, dtype=tf.int64, trainable=False, name="position")
            self.seed = tf.Variable(-1, dtype=tf.int64, trainable=False, name="seed")
        self._last = _LastData()      # a plain object: not tracked, not checkpointed

    def has_seed(self):
        """Whether a shuffling seed has been set (``seed`` >= 0)."""
        return int(self.seed.numpy()) >= 0

    def numbers(self):
        """The counters (and the seed, -1 if none) as a dict of Python ints."""
        return {name: int(getattr(self, name).numpy())
                for name in ("step", "epoch", "epoch_step", "position", "seed")}

    def draw_seed(self, seed=None):
        """Set the shuffling seed to ``seed``; with None keep the one held, or draw one.

        A drawn seed comes from NumPy's global generator (which
        ``keras.utils.set_random_seed`` seeds), once per position, so a
        checkpoint keeps it.
        """
        if seed is not None:
            self.seed.assign(check_whole_number("seed", seed, minimum=0,
                                                advice="Pass None to draw one."))
        elif not self.has_seed():
            self.seed.assign(int(np.random.randint(0, 2**31 - 1)))

    def follow(self, key):
        """Start a fit on the data of ``key``: the same data (and batch size) as the last fit
        continue where it ended; other data start from their first batch (a new or
        restored position continues from where it stands)."""
        if self._last.key is not None and not same_data(self._last.key, key):
            self.position.assign(0)
            self.epoch_step.assign(0)
        self._last.key = key

    def finish_steps(self, completed, by_epoch):
        """Count ``completed`` more updates (and, by epoch, more steps into the epoch)."""
        self.step.assign_add(completed)
        if by_epoch:
            self.epoch_step.assign_add(completed)

    def finish_epoch(self):
        """Count one more epoch completed; the next one starts at its first step."""
        self.epoch.assign_add(1)
        self.epoch_step.assign(0)


class _LastData:
    """The key of the data a position's last fit read (None before the first)."""

    key = None


def epoch_permutation(seed, epoch, n):
    """The order of ``n`` examples in epoch ``epoch`` of a run shuffled with ``seed``.

    A function of ``(seed, epoch)`` alone, not of a generator's state: a
    run resumed at epoch 3 draws epoch 3's order without replaying epochs 0
    to 2.  Taught in the chapter "Your own model".

    Shown in the chapter "Your own model".
    """
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


# ----------------------------------------------------------------------------
# How a batch must look
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Feed:
    """How a trainer wants its batches: the host they stay on, the dtypes, the split.

    ``host``: the device string of the host (the data stay there, each
    replica gathers its rows); ``features``/``targets``: the dtypes of
    :func:`input_dtype` (None: keep) and
    :func:`loss_dtype`; a global batch must split into
    ``replicas x accumulation_steps`` equal parts; ``finite_hint``: how to
    opt out of the finite-data check, named in its error (None: no check).
    """

    host: str = "/CPU:0"
    features: object = None
    targets: object = tf.float32
    replicas: int = 1
    accumulation_steps: int = 1
    finite_hint: str = None
    trainer: str = "SyncTrainer"

    @classmethod
    def for_model(cls, model, **options):
        """The feed of ``model``'s dtypes, with ``options`` for the rest."""
        return cls(features=input_dtype(model), targets=loss_dtype(model), **options)

    @property
    def parts(self):
        """The equal parts a global batch is cut into: replicas x micro-batches."""
        return self.replicas * self.accumulation_steps

    def check_split(self, batch_size):
        """Raise ``ValueError``, naming sizes that work, unless ``batch_size`` splits evenly."""
        if batch_size % self.parts:
            lower = batch_size // self.parts * self.parts
            hint = (f"{lower} or {lower + self.parts}" if lower else f"{self.parts}")
            raise ValueError(
                f"A global batch of {batch_size} examples does not split evenly over "
                f"{self.replicas} replicas x {self.accumulation_steps} micro-batches; "
                f"pass a batch_size that is a multiple of {self.parts} (such as {hint}). "
                f"{self.trainer} neither pads nor drops examples, so that an update "
                "stays equal to the single-device one."
            )

    def host_tensors(self, x, y):
        """Arrays as tensors on the host."""
        with tf.device(self.host):
            return tf.convert_to_tensor(x), tf.convert_to_tensor(y)

    def batch_tensors(self, batch, split=True):
        """One dataset element as host tensors, cast as arrays are; checked against the split."""
        xb, yb = (tf.convert_to_tensor(part) for part in batch)
        if self.features is not None and self.features != tf.string and xb.dtype != self.features:
            if not (xb.dtype.is_floating or xb.dtype.is_integer or xb.dtype.is_bool):
                raise TypeError(f"The dataset's features are {xb.dtype.name}, not numbers; map "
                                "them to numbers, or give the model a keras.Input(dtype='string').")
            xb = tf.cast(xb, self.features)
        if yb.dtype.is_floating and yb.dtype != self.targets:
            yb = tf.cast(yb, self.targets)
        size = int(xb.shape[0])
        if int(yb.shape[0]) != size:
            raise ValueError(f"A dataset batch has {size} features but {int(yb.shape[0])} "
                             "targets; pass (features, targets) with one target row per example.")
        if split and size % self.parts:
            raise ValueError(
                f"The dataset yielded a batch of {size} examples, which does not split evenly "
                f"over {self.replicas} replicas x {self.accumulation_steps} micro-batches; "
                f"batch it with a multiple of {self.parts} and drop_remainder=True "
                f"(dataset.batch({max(self.parts, size // self.parts * self.parts)}, "
                f"drop_remainder=True)). {self.trainer} neither pads nor drops examples."
            )
        with tf.device(self.host):
            return tf.identity(xb), tf.identity(yb)

    def check_finite_batch(self, x, y, step):
        """Raise :class:`NonFiniteDataError` if a dataset batch holds NaN or inf (unless off)."""
        if self.finite_hint is None:
            return
        for label, tensor in (("features", x), ("targets", y)):
            if not tensor.dtype.is_floating or bool(tf.reduce_all(tf.math.is_finite(tensor))):
                continue
            row, value = first_non_finite_row(tensor.numpy())
            raise NonFiniteDataError(
                f"row {row} of the dataset batch's {label} for step {step}", value,
                self.finite_hint)


# ----------------------------------------------------------------------------
# What fit was given
# ----------------------------------------------------------------------------

class ArraySource:
    """In-memory arrays (checked and cast), their global batch size, and what was passed."""

    def __init__(self, x, y, batch_size, originals=()):
        self.x, self.y, self.batch_size = x, y, batch_size
        self._originals = tuple(originals)

    def steps(self):
        """Steps in one epoch: ``ceil(len(x) / batch_size)``."""
        return -(-len(self.x) // self.batch_size)

    def key(self, by_epoch):
        """What a later fit must pass to continue this one: the same objects, batch, mode."""
        return (by_epoch, self.batch_size) + self._originals


class DatasetSource:
    """A ``tf.data.Dataset`` of global ``(features, targets)`` batches."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.batch_size = None
        cardinality = int(dataset.cardinality())
        self._steps = cardinality if cardinality >= 0 else None
        self.infinite = cardinality == tf.data.INFINITE_CARDINALITY

    def steps(self):
        """Batches in one pass, or None when TensorFlow cannot tell."""
        return self._steps

    def key(self, by_epoch):
        """What a later fit must pass to continue this one: the same dataset and mode."""
        return (by_epoch, None, self.dataset)


def same_data(a, b):
    """Two data keys name the same data: equal mode and batch size, identical objects."""
    return a[:2] == b[:2] and len(a) == len(b) and all(p is q for p, q in zip(a[2:], b[2:]))


def fit_source(x, y, batch_size, *, by_epoch, shuffle, model, feed):
    """What ``fit`` was given, checked: an :class:`ArraySource` or a :class:`DatasetSource`."""
    if isinstance(x, tf.data.Dataset):
        source = dataset_source(x, y, batch_size, shuffle)
        if by_epoch and source.infinite:
            raise ValueError(
                "The dataset repeats forever, so an epoch never ends; pass steps=N instead "
                "of epochs=, or a dataset without .repeat().")
        return source
    if shuffle and not by_epoch:
        raise ValueError(
            "shuffle=True needs epochs=: with steps= the arrays are read in order, "
            "so that a later fit continues with the next batch. Pass epochs=N with "
            "shuffle=True, or shuffle the arrays yourself once."
        )
    return array_source(x, y, batch_size, by_epoch=by_epoch, model=model, feed=feed)


def array_source(x, y, batch_size, *, by_epoch, model, feed):
    """Checked arrays with their global batch size (default: all of ``x``)."""
    originals = (x, y)
    x, y = prepare_arrays(x, y, model, finite_hint=feed.finite_hint)
    batch_size = check_whole_number("batch_size", len(x) if batch_size is None else batch_size)
    if batch_size > len(x):
        raise ValueError(
            f"batch_size must be between 1 and len(x) = {len(x)}, got {batch_size}; "
            f"pass {len(x)} (or less) or leave batch_size=None for the whole data.")
    feed.check_split(batch_size)
    last = len(x) % batch_size
    if by_epoch and last % feed.parts:
        raise ValueError(
            f"{len(x)} examples in batches of {batch_size} leave a last batch of "
            f"{last}, which does not split over {feed.replicas} replicas x "
            f"{feed.accumulation_steps} micro-batches; pass x and y with "
            f"{len(x) - last % feed.parts} examples (drop {last % feed.parts}), or a "
            "batch_size that divides the data into batches that split evenly."
        )
    return ArraySource(x, y, batch_size, originals)


def dataset_source(dataset, y=None, batch_size=None, shuffle=False):
    """A dataset of ``(features, targets)`` batches, checked; no ``y`` or ``batch_size``."""
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
    if any(isinstance(part, (dict, tuple)) for part in spec):
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
    return DatasetSource(dataset)


def validation_source(data, batch_size, model):
    """``validation_data`` checked: ``(x_val, y_val)`` arrays or a dataset; None stays None.

    Arrays are evaluated in batches of ``batch_size`` (default 1024).
    """
    if data is None:
        return None
    batch_size = check_whole_number("validation_batch_size",
                                    1024 if batch_size is None else batch_size)
    if isinstance(data, tf.data.Dataset):
        return dataset_source(data)
    x, y = validation_arrays(data, model, "arrays or a tf.data.Dataset of (features, targets) "
                                          "batches")
    return ArraySource(x, y, min(batch_size, len(x)), data)


def validation_arrays(data, model, accepted="arrays"):
    """``validation_data=(x_val, y_val)`` checked and cast for ``model``: the trainers' one check.

    Anything but a pair raises :class:`pargrad.checks.ArgumentTypeError`
    naming what the trainer takes (``accepted``).  Taught in the chapter
    "Your own model".
    """
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ArgumentTypeError(
            f"validation_data takes a pair (x_val, y_val) of {accepted}, got "
            f"{type(data).__name__}; pass for example (x_test, y_test).")
    return prepare_arrays(data[0], data[1], model)


def host_rows(x, y, start, count, host):
    """Rows ``start`` .. ``start + count - 1`` of ``x`` and ``y`` (wrapping around their end),
    gathered on ``host``, where the data stay: how every replica of a strategy trainer
    takes its shard (``tf.identity`` of them then moves them to the replica's device)."""
    with tf.device(host):
        rows = (start + tf.range(count)) % tf.shape(x)[0]
        return tf.gather(x, rows), tf.gather(y, rows)


def evaluation_batches(source, feed):
    """Yield the host tensors ``(x, y)`` of every batch of a source, in order, once."""
    if isinstance(source, ArraySource):
        for low in range(0, len(source.x), source.batch_size):
            yield feed.host_tensors(source.x[low:low + source.batch_size],
                                    source.y[low:low + source.batch_size])
        return
    with tf.device(feed.host):
        iterator = iter(source.dataset)
    try:
        for batch in iterator:
            yield feed.batch_tensors(batch, split=False)
    finally:
        del iterator


# ----------------------------------------------------------------------------
# The calls of an epoch
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a step function: ``steps`` steps on host tensors ``x, y``.

    Step ``i`` of the call takes the global batch of ``batch_size`` rows
    that starts at row ``first_row + i * batch_size`` (wrapping around the
    end of ``x``).  ``wrap`` says what :meth:`advance` does with the
    position: None (by epoch: the epoch's step counts instead), 0 (a dataset
    read by steps: count batches) or ``len(x)`` (arrays read by steps: the
    next batch's first row).
    """

    x: object
    y: object
    first_row: int
    batch_size: int
    steps: int
    wrap: int = None

    def advance(self, position, completed):
        """Move ``position.position`` past ``completed`` steps of this call."""
        if self.wrap == 0:
            position.position.assign_add(completed)
        elif self.wrap is not None:
            position.position.assign((self.first_row + completed * self.batch_size) % self.wrap)


class EpochReader:
    """The calls of a fit's epochs (or of its ``steps``), read from ``position``.

    ``steps=None`` reads by epoch: :meth:`calls` yields the rest of the
    current epoch, from ``position.epoch_step``, arrays permuted by
    :func:`epoch_permutation` when ``shuffle``.  ``steps=n`` reads ``n``
    steps in order from ``position.position``.  Calls group up to
    ``steps_per_call`` steps of equal batches.  While a dataset is being
    read, its iterator is :attr:`iterator`; it is None otherwise.

    The reader is the only writer of ``position``: made, it follows the
    source (:meth:`TrainingPosition.follow`) and, when ``shuffle``, sets
    the seed (``seed``, or the one held, or a drawn one); the loop then
    tells it what ran (:meth:`advance`, :meth:`end_epoch`).
    """

    def __init__(self, source, position, feed, *, steps_per_call=1, steps=None, shuffle=False,
                 seed=None):
        self.source, self.position, self.feed = source, position, feed
        self.steps_per_call = check_whole_number("steps_per_call", steps_per_call)
        self.steps, self.shuffle = steps, shuffle
        self.iterator = None
        if shuffle:
            position.draw_seed(seed)
        position.follow(source.key(self.by_epoch))

    @property
    def steps_per_epoch(self):
        """Steps of one epoch (of the fit, by steps), or None when a dataset cannot tell."""
        return self.steps or self.source.steps()

    @property
    def epoch(self):
        """Epochs completed so far (the index of the next one)."""
        return int(self.position.epoch.numpy())

    def first_index(self):
        """The index in its epoch of the next step (0 for a fit by steps)."""
        return int(self.position.epoch_step.numpy()) if self.by_epoch else 0

    def advance(self, call, completed):
        """Move the position past ``completed`` steps of ``call`` (all of them, or those
        before a step that stopped)."""
        call.advance(self.position, completed)
        self.position.finish_steps(completed, self.by_epoch)

    def end_epoch(self, stopped):
        """An epoch's calls are done: count it, unless the fit is by steps or stopped in it."""
        if self.by_epoch and not stopped:
            self.position.finish_epoch()

    @property
    def by_epoch(self):
        """Whether the fit counts epochs (else steps)."""
        return self.steps is None

    def calls(self):
        """Yield the :class:`Call` objects of the current epoch (or of the fit's steps)."""
        arrays = isinstance(self.source, ArraySource)
        if self.by_epoch:
            return self._array_epoch() if arrays else self._dataset_epoch()
        return self._array_steps() if arrays else self._dataset_steps()

    def _array_steps(self):
        """Arrays by steps: in order from the position, wrapping around the end."""
        x, y = self.feed.host_tensors(self.source.x, self.source.y)
        done = 0
        while done < self.steps:
            n = min(self.steps_per_call, self.steps - done)
            yield Call(x, y, int(self.position.position.numpy()), self.source.batch_size, n,
                       wrap=len(self.source.x))
            done += n

    def _array_epoch(self):
        """Arrays by epoch: the epoch's permutation, from its next step; a smaller last batch."""
        n_examples, batch = len(self.source.x), self.source.batch_size
        order = np.arange(n_examples)
        if self.shuffle:
            order = epoch_permutation(self.position.seed.numpy(), self.position.epoch.numpy(),
                                      n_examples)
        x, y = self.feed.host_tensors(self.source.x[order], self.source.y[order])
        full = n_examples // batch
        step = int(self.position.epoch_step.numpy())
        while step < self.source.steps():
            n = min(self.steps_per_call, full - step) if step < full else 1
            yield Call(x, y, step * batch, batch if step < full else n_examples % batch, n)
            step += n

    def _dataset_epoch(self):
        """A dataset by epoch: one pass, from the epoch's next batch."""
        start = int(self.position.epoch_step.numpy())
        produced = False
        with contextlib.closing(self._dataset_calls(self.steps_per_call, start)) as calls:
            for call in calls:
                produced = True
                yield call
        if not produced and start == 0:
            raise ValueError("The dataset yielded no batches; pass a dataset with "
                             "at least one (features, targets) batch.")

    def _dataset_steps(self):
        """A dataset by steps: read on from the position, starting again at its end."""
        done, restarted = 0, False
        while done < self.steps:
            skip = int(self.position.position.numpy())
            produced = False
            calls = self._dataset_calls(min(self.steps_per_call, self.steps - done), skip)
            with contextlib.closing(calls):
                for call in calls:
                    produced = True
                    yield dataclasses.replace(call, wrap=0)
                    done += call.steps
                    if done >= self.steps:
                        break
            if done < self.steps:                   # the dataset ended: start again
                if not produced and (restarted or skip == 0):
                    raise ValueError("The dataset yielded no batches; pass a dataset with "
                                     "at least one (features, targets) batch.")
                self.position.position.assign(0)
                restarted = not produced

    def _dataset_calls(self, steps_per_call, skip):
        """Yield calls of up to ``steps_per_call`` equal batches, ``skip`` batches in."""
        dataset = self.source.dataset
        with tf.device(self.feed.host):
            self.iterator = iter(dataset.skip(skip) if skip else dataset)
        try:
            pending = []
            for batch in self.iterator:
                xb, yb = self.feed.batch_tensors(batch)
                if self.feed.finite_hint is not None and not _finite(xb, yb):
                    yield from _grouped(pending, self.feed)   # the steps before it still run
                    self.feed.check_finite_batch(xb, yb, int(self.position.step.numpy()))
                if pending and int(pending[0][0].shape[0]) != int(xb.shape[0]):
                    yield from _grouped(pending, self.feed)
                    pending = []
                pending.append((xb, yb))
                if len(pending) == steps_per_call:
                    yield from _grouped(pending, self.feed)
                    pending = []
            yield from _grouped(pending, self.feed)
        finally:
            self.iterator = None       # deleted here, in this thread, not by the GC later


def _finite(x, y):
    """Whether every float value of a batch's features and targets is finite."""
    return all(bool(tf.reduce_all(tf.math.is_finite(t))) for t in (x, y) if t.dtype.is_floating)


def _grouped(pending, feed):
    """Yield one call of the equal batches in ``pending`` (none if it is empty)."""
    if not pending:
        return
    size = int(pending[0][0].shape[0])
    if len(pending) == 1:
        yield Call(pending[0][0], pending[0][1], 0, size, 1)
        return
    with tf.device(feed.host):
        xs = tf.concat([p[0] for p in pending], 0)
        ys = tf.concat([p[1] for p in pending], 0)
    yield Call(xs, ys, 0, size, len(pending))
