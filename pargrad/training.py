"""What every trainer needs before its first step: checked input, a per-example loss, finite losses.

Taught in the chapter "Your own model".  The book's trainers
(:class:`pargrad.sync.SyncTrainer`, :class:`pargrad.asynchronous.AsyncTrainer`)
compute exactly what they claim on the book's inputs; this module makes a
reader's own model and data reach them in the form they expect, as Keras's
``fit`` would, or stops with an error that says what to pass instead.  It is
part of the library and never imports the book.

The interface (stable; both trainers use it):

``NonFiniteLossError(step, who, loss, hint="")``
    A ``FloatingPointError`` raised when a loss is NaN or infinite.  Its
    attributes ``step`` (the update that produced it, counted from 0),
    ``who`` (for example ``"replica 1"`` or ``"worker 0"``) and ``loss`` (the
    value) name the culprit; its message says what to check (learning
    rate, data) and ``hint`` how to opt out of the check in that trainer.

``check_finite_loss(loss, step, who, hint="")``
    Raise :class:`NonFiniteLossError` unless the number ``loss`` is finite.

``per_example_loss(loss)``
    Resolve a trainer's ``loss=`` argument into a function
    ``f(y, prediction)`` that returns one loss per example, shape ``(batch,)``.
    Accepted: ``None`` (the book's squared error summed over outputs), a
    string that ``keras.losses.get`` knows (``"mse"``,
    ``"sparse_categorical_crossentropy"``, ...), a ``keras.losses.Loss``
    instance (its unreduced values, from its ``call``), or any callable
    ``loss(y, prediction)``.  See its docstring for the shape rules.

``align_targets(y, prediction)``
    Keras's rank rule: when ``y`` and ``prediction`` differ in rank by one
    and the larger has a trailing axis of size 1, expand (a rank-1 ``y``)
    or squeeze it, so ``y`` of shape ``(N,)`` and a one-output model train as
    Keras ``fit(loss="mse")`` does.

``prepare_arrays(x, y, model)`` -> ``(x, y)``
    NumPy arrays checked and cast: features to the model's input dtype,
    floating-point targets to the dtype the loss is computed in (the
    model's output dtype, float32 for float16/bfloat16 outputs), integer and
    boolean targets kept (sparse losses want them).  Clear errors for empty
    data, a length mismatch, non-numeric features (unless the model takes
    strings), and structures it cannot read.

``NonFiniteDataError(where, value, hint="")``, ``check_finite_data(x, y, hint="")``
    A ``ValueError`` for a NaN or inf in the data themselves, raised before
    any update uses them; ``where`` names the row (arrays) or the step (a
    dataset's batch).  ``prepare_arrays(..., finite_hint=...)`` checks arrays.

``input_dtype(model)``, ``loss_dtype(model)``
    The dtypes :func:`prepare_arrays` casts to (``input_dtype`` is None for a
    model without a ``keras.Input``: then float features go to ``loss_dtype``).

``keras_metrics(metrics, advice="")`` -> ``list``
    The one check of a ``metrics=`` argument: Keras metric objects (one
    alone becomes a list), anything else a ``TypeError`` saying what to pass.

``TrainingPosition(name)`` (in :mod:`pargrad.data`)
    A ``tf.Module`` of int64 variables that say where training stands:
    ``step`` (updates applied), ``epoch`` (epochs completed), ``epoch_step``
    (updates into the current epoch), ``position`` (examples into the
    current pass over in-memory arrays, or batches into a dataset read by
    steps) and ``seed`` (the shuffling seed, -1 until one is drawn).  A trainer keeps one and tracks it,
    so ``tf.train.Checkpoint(model=..., optimizer=..., trainer=trainer)``
    saves where the next batch starts, and a resumed run continues exactly.
"""

import math

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)


# ----------------------------------------------------------------------------
# Metrics and finite losses
# ----------------------------------------------------------------------------

def keras_metrics(metrics, advice=""):
    """``metrics`` as a list of Keras metric objects; ``TypeError`` saying what to pass otherwise.

    One metric object alone is taken as a list of one; ``advice`` is added to
    the error (where to create the metrics, what they are computed on).
    """
    if metrics is None:
        return []
    if isinstance(metrics, (str, keras.metrics.Metric)) or not isinstance(metrics, (list, tuple)):
        metrics = [metrics]
    for metric in metrics:
        if not isinstance(metric, keras.metrics.Metric):
            raise TypeError(
                f"metrics takes Keras metric objects, got {metric!r}; pass for example "
                f"[keras.metrics.SparseCategoricalAccuracy(name='accuracy')]{advice}."
            )
    return list(metrics)


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or infinite; training stopped before applying its update.

    ``step``: the update that produced it (counted from 0 over the trainer's
    life); ``who``: where (``"replica 1"``, ``"worker 0"``); ``loss``: the
    value.  Taught in the chapter "Your own model".
    """

    def __init__(self, step, who, loss, hint=""):
        self.step, self.who, self.loss = int(step), str(who), float(loss)
        message = (
            f"The loss of {self.who} is {self.loss} at step {self.step}; training "
            "stopped before applying that step's update. Check the learning rate "
            "(too large a rate makes the loss overflow), the data (NaN or inf in x "
            "or y) and the loss function (log of 0, division by 0)."
        )
        super().__init__(message + (f" {hint}" if hint else ""))


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
    """Raise :class:`NonFiniteDataError` naming the first row of ``x`` or ``y`` with a NaN or inf."""
    for label, array in zip(name, (x, y)):
        found = first_non_finite_row(array)
        if found is not None:
            raise NonFiniteDataError(f"row {found[0]} of {label}", found[1], hint)


def check_finite_loss(loss, step, who, hint=""):
    """Raise :class:`NonFiniteLossError` unless ``loss`` (a number) is finite."""
    if not math.isfinite(float(loss)):
        raise NonFiniteLossError(step, who, loss, hint)


# ----------------------------------------------------------------------------
# The loss: one value per example
# ----------------------------------------------------------------------------

def squared_error_per_example(y, prediction):
    """The y = x² question's loss for each example: the squared error summed over outputs."""
    return tf.reduce_sum(tf.square(y - prediction), axis=-1)


def align_targets(y, prediction):
    """``(y, prediction)`` brought to the same rank by Keras's rule, if they differ by one.

    The same rule as Keras's losses (``squeeze_or_expand_to_same_rank``):
    a trailing axis of size 1 on the larger one is squeezed, or a rank-1
    other side is expanded.  Anything else is returned unchanged.
    """
    y_rank, p_rank = y.shape.rank, prediction.shape.rank
    if y_rank is None or p_rank is None or y_rank == p_rank:
        return y, prediction
    if p_rank == y_rank + 1 and prediction.shape[-1] == 1:
        if y_rank == 1:
            return tf.expand_dims(y, -1), prediction
        return y, tf.squeeze(prediction, -1)
    if y_rank == p_rank + 1 and y.shape[-1] == 1:
        if p_rank == 1:
            return y, tf.expand_dims(prediction, -1)
        return tf.squeeze(y, -1), prediction
    return y, prediction


def _values_as_floats(y, prediction):
    """Integer targets shaped like the predictions are values: cast them to its float dtype.

    Class indices (a sparse loss's labels) lack the predictions' class axis,
    so they differ in shape and stay integers.
    """
    integer = y.dtype.is_integer or y.dtype == tf.bool
    if integer and prediction.dtype.is_floating and y.shape.is_compatible_with(prediction.shape) \
            and y.shape.rank == prediction.shape.rank:
        return tf.cast(y, prediction.dtype)
    return y


def _loss_input(prediction):
    """Losses are computed in float32 at least (as Keras does under mixed precision)."""
    if prediction.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(prediction, tf.float32)
    return prediction


def _default_loss(y, prediction):
    y = tf.convert_to_tensor(y)
    if y.dtype != prediction.dtype:
        y = tf.cast(y, prediction.dtype)
    known = y.shape.rank is not None and prediction.shape.rank is not None
    if known and (y.shape.rank != prediction.shape.rank
                  or not y.shape[1:].is_compatible_with(prediction.shape[1:])):
        raise ValueError(
            f"The targets have shape {tuple(y.shape)} but the model's predictions have "
            f"shape {tuple(prediction.shape)}; the default loss (squared error summed over "
            "outputs) needs one target per output. Reshape y to the predictions' shape, "
            "or pass a loss that takes these shapes (for example "
            "loss='sparse_categorical_crossentropy' for integer class labels)."
        )
    return squared_error_per_example(y, prediction)


def _per_example(values, prediction):
    """Values of a loss brought to one per example: extra axes averaged, a scalar spread."""
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:       # a scalar is the batch's mean: each example's share
        return tf.fill(tf.shape(prediction)[:1], values)
    if values.shape.rank is not None and values.shape.rank > 1:
        return tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values


def per_example_loss(loss):
    """A function ``f(y, prediction)`` giving one loss per example, from a trainer's ``loss=``.

    * ``None``: the squared error summed over outputs (the y = x² question's
      loss), with the targets cast to the prediction's dtype; targets whose
      shape still differs from the prediction's raise ``ValueError`` naming
      both shapes.
    * a string: ``keras.losses.get(name)``, e.g. ``"mse"`` or
      ``"sparse_categorical_crossentropy"``.
    * a ``keras.losses.Loss`` instance: its per-example values (its
      ``call``, before any reduction; ``from_logits`` and the like apply).
    * a callable ``loss(y, prediction)``: called as it is.

    Before any of them, ``y`` is brought to the prediction's rank by Keras's
    rule (:func:`align_targets`), float16/bfloat16 predictions are cast
    to float32, and integer targets of the predictions' shape are cast to
    their float dtype (they are values; class indices, which lack the class
    axis, stay integers for a sparse loss).  What the loss returns is read as Keras reads it: one value
    per example, shape ``(batch,)``; values with more axes (a loss per
    time step) are averaged over the extra axes; a scalar is taken as the
    batch's *mean* loss, i.e. the same value for each example (then a
    trainer's mean over the global batch is the mean of the shards' means).

    Anything else (a number, a loss *class* instead of an instance) raises
    ``TypeError`` saying what to pass.  The returned function's ``values``
    attribute gives the loss's values before any averaging (one per token for
    a loss per time step, for weighting each token).  Taught in the chapter
    "Your own model".
    """
    if loss is None:
        function = _default_loss
    elif isinstance(loss, str):
        try:
            function = keras.losses.get(loss)
        except ValueError:
            raise ValueError(
                f"Keras knows no loss called {loss!r}; pass a name such as 'mse' or "
                "'sparse_categorical_crossentropy', a keras.losses.Loss instance, or a "
                "function loss(y, prediction)."
            ) from None
        if isinstance(function, keras.losses.Loss):
            function = function.call
    elif isinstance(loss, type):
        raise TypeError(
            f"loss must be a loss instance or function, got the class {loss.__name__}; "
            f"pass an instance, for example {loss.__name__}()."
        )
    elif isinstance(loss, keras.losses.Loss):
        function = loss.call              # unreduced: one value per example
    elif callable(loss):
        function = loss
    else:
        raise TypeError(
            f"loss must be None (squared error), a Keras loss name such as 'mse', a "
            f"keras.losses.Loss instance or a function loss(y, prediction); got "
            f"{type(loss).__name__} {loss!r}."
        )

    def values(y, prediction):
        prediction = _loss_input(prediction)
        y, prediction = align_targets(tf.convert_to_tensor(y), prediction)
        return function(_values_as_floats(y, prediction), prediction), prediction

    def loss_per_example(y, prediction):
        return _per_example(*values(y, prediction))

    loss_per_example.wrapped = loss
    loss_per_example.values = lambda y, prediction: values(y, prediction)[0]
    return loss_per_example


# ----------------------------------------------------------------------------
# The data
# ----------------------------------------------------------------------------

def _keras_dtype(dtype):
    return tf.as_dtype(keras.backend.standardize_dtype(dtype))


def input_dtype(model):
    """The dtype of the model's (first) ``keras.Input``, or None if it has none (subclassed)."""
    inputs = getattr(model, "inputs", None)
    try:
        return _keras_dtype(inputs[0].dtype) if inputs else None
    except (AttributeError, ValueError, TypeError):
        return None


def loss_dtype(model):
    """The dtype the loss is computed in: the model's output dtype, float32 for half types."""
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
