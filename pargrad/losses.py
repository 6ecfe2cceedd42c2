"""Losses and their checks: one loss per example, the batch's mean, metrics, finite values.

Taught in the chapter "Your own model".  Every trainer
(:class:`pargrad.SyncTrainer`, :class:`pargrad.ShardedTrainer`,
:class:`pargrad.AsyncTrainer`, :class:`pargrad.LocalSGDTrainer`) resolves
its ``loss=`` here, checks its ``metrics=`` here, and stops here on a NaN or
an infinity in a loss, with an error that says what to do.  How data are
read, cast and checked for NaN and infinity before they reach a loss is in
:mod:`pargrad.data`.

* :func:`per_example_loss`: a trainer's ``loss=`` (None, a Keras loss name
  or object, a function) as ``f(y, prediction)`` with one value per
  example, targets aligned by Keras's rule (:func:`align_targets`);
  :func:`mean_loss`: the batch's mean, from the same forms;
  :func:`squared_error_per_example`: the y = x² question's loss.
* :func:`keras_metrics`: the one check of a ``metrics=`` argument.
* :class:`NonFiniteLossError` (a ``FloatingPointError`` naming the
  ``step``, ``who`` and ``loss``) and :func:`check_finite_loss`.

Part of the library; it never imports the book.
"""

import math

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


def check_finite_loss(loss, step, who, hint=""):
    """Raise :class:`NonFiniteLossError` unless ``loss`` (a number) is finite.

    Taught in the chapter "Your own model".
    """
    if not math.isfinite(float(loss)):
        raise NonFiniteLossError(step, who, loss, hint)


# ----------------------------------------------------------------------------
# The loss: one value per example
# ----------------------------------------------------------------------------

def squared_error_per_example(y, prediction):
    """The y = x² question's loss for each example: the squared error summed over outputs.

    Taught in the chapter "The training loop".
    """
    return tf.reduce_sum(tf.square(y - prediction), axis=-1)


def align_targets(y, prediction):
    """``(y, prediction)`` brought to the same rank by Keras's rule, if they differ by one.

    The same rule as Keras's losses (``squeeze_or_expand_to_same_rank``):
    a trailing axis of size 1 on the larger one is squeezed, or a rank-1
    other side is expanded.  Anything else is returned unchanged.  Taught in
    the chapter "Your own model".
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


def mean_loss(loss):
    """A function ``f(y, predictions)``: the batch's mean loss, from any ``loss=`` form.

    The forms are :func:`per_example_loss`'s (None, a Keras
    loss name or object, a function), with its rule for target shapes.  A
    function that returns a scalar, the batch's mean already (the book's
    ``pargrad.book.parabola.squared_error``), is used as it returned it: the mean of
    ``batch`` copies of a float32 number is not always that number to the
    last bit, and the chapters' runs repeat bit for bit.  Taught in the chapter
    "Asynchronous training".
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
