"""Gradient accumulation for TF2 custom loops: sum k micro-batches, apply once.

Taught in the chapter "Accumulation in TF2 and across replicas".  Each micro-batch's
gradient is weighted by its number of examples, so micro-batches of unequal
size still give exactly the gradient of the mean loss over the big batch.
With ``sample_weight`` (a padding mask, per-token weights) each micro-batch
is weighted by its total weight instead, so sequences of unequal lengths
give the big batch's mean over *tokens* (the chapter "Accumulating
sequences").  The state lives in variables, so ``tf.train.Checkpoint`` saves
a half-full window and training resumes where it stopped.

A custom loop::

    accumulator = pargrad.GradientAccumulator(model.trainable_variables, accumulation_steps=4,
                                              optimizer=keras.optimizers.SGD(0.01))

    @tf.function
    def train_micro_batch(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))      # mean over the micro-batch
        gradients = tape.gradient(loss, model.trainable_variables)
        return accumulator.step(gradients, tf.shape(x)[0])  # applies every 4th call

Sequences whose loss is a mean over tokens (``mask`` is 1 on real tokens, 0
on padding)::

        loss = pargrad.accumulate.weighted_mean(per_token_losses, mask)
        ...
        accumulator.step(gradients, sample_weight=mask)
"""

import numbers

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

from pargrad.checks import check_flag, check_whole_number  # noqa: E402

EMPTY_WINDOW_MESSAGE = (
    "GradientAccumulator has nothing accumulated: call accumulate(gradients, "
    "num_examples) at least once after the last apply() or reset()"
)
ZERO_WEIGHT_MESSAGE = (
    "GradientAccumulator: the window's sample_weight sums to 0 (every value of its "
    "micro-batches is padding), so there is no mean gradient to take; call reset() to drop "
    "the window, or accumulate a micro-batch with at least one real (weight > 0) value"
)


def weighted_mean(values, sample_weight):
    """``sum(sample_weight * values) / sum(sample_weight)``, and 0 when the weights sum to 0.

    ``values``: a loss per example ``(batch,)`` or per token ``(batch,
    time)``; ``sample_weight``: weights of the same shape (the accumulator
    sums exactly these weights, so they must be the ones the mean divides
    by: broadcast per-example weights to the tokens yourself).  A padding
    mask (1 for a real token, 0 for padding) makes it the mean over the
    real tokens, as Keras's ``reduction=
    "mean_with_sample_weight"`` does.  A micro-batch of padding only gives
    0 (and gradient 0), not NaN.  Returns a scalar in the values' dtype.

    Taught in the chapter "Accumulating sequences".
    """
    values = tf.convert_to_tensor(values)
    weights = _as_weights(sample_weight, values.dtype)
    if not weights.shape.is_compatible_with(values.shape):
        raise ValueError(
            f"sample_weight of shape {weights.shape} does not match the loss values of shape "
            f"{values.shape}; pass one weight per value (for per-example weights against "
            "per-token losses: tf.broadcast_to(w[:, None], tf.shape(values))).")
    return tf.math.divide_no_nan(tf.reduce_sum(weights * values), tf.reduce_sum(weights))


def _as_weights(sample_weight, dtype):
    """``sample_weight`` as a tensor of ``dtype``; a TypeError for anything but numbers."""
    weights = tf.convert_to_tensor(sample_weight)
    if not (weights.dtype.is_floating or weights.dtype.is_integer or weights.dtype.is_bool):
        raise TypeError(f"sample_weight must hold numbers (a mask or weights), got {weights.dtype}.")
    return tf.cast(weights, dtype)


class _Untracked:
    """Holds references that a checkpoint of the accumulator must not include."""

    def __init__(self, variables, optimizer):
        self.variables = variables
        self.optimizer = optimizer


class GradientAccumulator(tf.Module):
    """Accumulate the gradients of k micro-batches, then apply their mean once.

    ``variables``: the variables the gradients belong to (for example
    ``model.trainable_variables``), in the order the gradients come in.
    ``accumulation_steps``: micro-batches per update (used by :meth:`step`
    and :attr:`ready`; the word of ``SyncTrainer`` and of Keras's
    ``gradient_accumulation_steps``).
    ``optimizer``: a Keras optimizer, needed only by
    :meth:`apply` and :meth:`step`.

    ``accumulate(gradients, num_examples)`` adds ``num_examples * gradient``
    (the gradient of a loss that is a *mean* over the micro-batch's
    ``num_examples`` examples); ``mean_gradients()`` returns the sums divided
    by the total number of examples, the gradient of the mean loss over all
    accumulated examples; ``apply()`` applies it with the optimizer and
    resets; ``step(gradients, num_examples)`` accumulates and applies once
    ``accumulation_steps`` micro-batches are in.  All of them work eagerly and inside
    ``tf.function``.  The sums and counts are variables of this
    ``tf.Module``: ``tf.train.Checkpoint(accumulator=...)`` saves and restores
    them (save the model and optimizer beside it).

    Weights (Keras's ``sample_weight``): ``accumulate(gradients,
    sample_weight=mask)`` takes the gradient of the micro-batch's *weighted*
    mean loss (:func:`weighted_mean`, for example the mean over its real
    tokens) and weights it by ``sum(mask)``; the update is then the gradient
    of the weighted mean over every value of the window (all its tokens),
    not the mean of the micro-batches' means.  ``examples`` then holds the
    total weight (the tokens) rather than the examples.

    ``stop_on_non_finite`` (default True): :meth:`apply` checks the
    accumulated sums once per update and raises
    ``tf.errors.InvalidArgumentError`` naming a variable whose sum
    holds NaN or inf, before the optimizer runs: the weights and the
    optimizer's state are untouched, and the window stays as it is (call
    :meth:`reset` to drop it).  A NaN or inf in any micro-batch reaches the
    sum (inf - inf is NaN, still caught), so one check per update keeps the
    guarantee that a check per micro-batch gave, at a k-th of its cost.

    Under a ``tf.distribute`` strategy, create it in ``strategy.scope()``,
    call :meth:`accumulate` inside ``strategy.run`` with each replica's own
    gradients and micro-batch size, and call :meth:`apply` (or
    :meth:`mean_gradients`) outside ``strategy.run``: each replica sums into
    its own copy, and reading the sums adds them up over the replicas, one
    all-reduce per update; the total weight (examples or tokens) is added
    up over the replicas the same way, an all-reduce of one number.
    :meth:`step` applies inside ``tf.cond`` and so works only without a
    strategy.

    Taught in the chapters "Accumulation in TF2 and across replicas" and
    "Accumulating sequences".
    """

    def __init__(self, variables, accumulation_steps, optimizer=None, *,
                 name="gradient_accumulator", stop_on_non_finite=True):
        super().__init__(name=name)
        accumulation_steps = check_whole_number(
            "accumulation_steps", accumulation_steps,
            advice="Pass an int such as 4 (1 means no accumulation).")
        check_flag("stop_on_non_finite", stop_on_non_finite)
        self.stop_on_non_finite = stop_on_non_finite
        variables = list(variables)
        if not variables:
            raise ValueError(
                "GradientAccumulator got no variables; pass the variables the gradients "
                "belong to, for example model.trainable_variables (build the model first)."
            )
        for variable in variables:
            if not hasattr(variable, "assign_add") or not variable.shape.is_fully_defined():
                raise ValueError(
                    f"GradientAccumulator needs variables with a known shape, got {variable!r}; "
                    "pass model.trainable_variables after the model has been built."
                )
        self.accumulation_steps = int(accumulation_steps)
        self._refs = _Untracked(variables, optimizer)
        with tf.init_scope():
            if optimizer is not None and hasattr(optimizer, "build") and not optimizer.built:
                # Build the optimizer now, so that apply() may run inside tf.cond.
                optimizer.build(variables)
            # ON_READ: under a tf.distribute strategy each replica adds into its
            # own copy, and reading outside strategy.run sums over the replicas
            # (one all-reduce per update).  Without a strategy: plain variables.
            local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ)
            self.sums = [
                tf.Variable(tf.zeros(v.shape, dtype=v.dtype), name=f"sum_{i}",
                            aggregation=tf.VariableAggregation.SUM, **local)
                for i, v in enumerate(variables)
            ]
            # The examples (or, with sample_weight, the total weight) of the
            # window: float64, so that token counts stay exact.
            self.examples = tf.Variable(0, dtype=tf.float64, name="examples",
                                        aggregation=tf.VariableAggregation.SUM, **local)
            self.micro_batches = tf.Variable(
                0, dtype=tf.int64, name="micro_batches",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA, **local)

    @property
    def target_variables(self):
        """The variables the accumulated gradients belong to."""
        return list(self._refs.variables)

    @property
    def optimizer(self):
        """The optimizer :meth:`apply` uses (``None`` if none was given)."""
        return self._refs.optimizer

    @property
    def ready(self):
        """A boolean tensor: ``accumulation_steps`` micro-batches (or more) are accumulated."""
        return self.micro_batches >= self.accumulation_steps

    def accumulate(self, gradients, num_examples=None, sample_weight=None):
        """Add one micro-batch's gradients, weighted by its ``num_examples`` or its weights.

        ``gradients``: one per target variable, in the same order, of a loss
        that is the mean over the micro-batch; ``num_examples``: the
        micro-batch's size (an int or an integer tensor such as
        ``tf.shape(x)[0]``), at least 1.  Or, instead of ``num_examples``,
        ``sample_weight``: the micro-batch's weights (a padding mask of 0s
        and 1s, per example or per token, at least 0), when the loss is
        their weighted mean (:func:`weighted_mean`); the gradients are then
        weighted by ``sum(sample_weight)``.

        Shown in the chapter "Accumulating sequences".
        """
        if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
            raise RuntimeError(
                "GradientAccumulator.accumulate() runs on each replica: call it inside "
                "strategy.run(...), with that replica's gradients and micro-batch size."
            )
        gradients = self._check_gradients(gradients)
        if (num_examples is None) == (sample_weight is None):
            raise ValueError(
                "GradientAccumulator.accumulate needs exactly one of num_examples (the "
                "micro-batch's size, for a loss that is the mean over its examples) and "
                "sample_weight (its mask or weights, for a weighted mean such as the mean "
                "over its real tokens).")
        if sample_weight is None:
            count = tf.cast(self._check_examples(num_examples), tf.float64)
        else:
            count = self._total_weight(sample_weight)
        for total, gradient in zip(self.sums, gradients):
            total.assign_add(gradient * tf.cast(count, total.dtype))
        self.examples.assign_add(count)
        self.micro_batches.assign_add(1)

    def mean_gradients(self):
        """The accumulated gradients divided by the number of accumulated examples.

        Raises ``tf.errors.InvalidArgumentError`` when nothing is accumulated,
        or when the window's ``sample_weight`` sums to 0 (padding only).

        Shown in the chapter "Accumulating sequences".
        """
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            raise RuntimeError(
                "under a tf.distribute strategy, call GradientAccumulator.apply() and "
                "mean_gradients() outside strategy.run(...), where the replicas' sums "
                "are added up; call accumulate() inside it."
            )
        called = tf.debugging.assert_positive(self.micro_batches, message=EMPTY_WINDOW_MESSAGE)
        with tf.control_dependencies([called]):   # first an empty window, then padding only
            weighed = tf.debugging.assert_positive(self.examples, message=ZERO_WEIGHT_MESSAGE)
        with tf.control_dependencies([weighed]):
            return [total / tf.cast(self.examples, total.dtype) for total in self.sums]

    def apply(self):
        """Apply the mean gradient with the optimizer, then reset the window."""
        if self.optimizer is None:
            raise ValueError(
                "GradientAccumulator.apply() needs an optimizer: create it with "
                "GradientAccumulator(variables, accumulation_steps, "
                "optimizer=keras.optimizers.SGD(...)), "
                "or use mean_gradients() and apply them yourself."
            )
        means = self.mean_gradients()
        if self.stop_on_non_finite:
            means = self._finite(means)           # once per update, before the optimizer
        # In a graph, the optimizer's step counter does not read the means:
        # without this tie it could count an update that the check stops.
        with tf.control_dependencies(means):
            self.optimizer.apply_gradients(zip(means, self.target_variables))
        self.reset()

    def reset(self):
        """Forget everything accumulated since the last update."""
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        self.examples.assign(0)
        self.micro_batches.assign(0)

    def step(self, gradients, num_examples=None, sample_weight=None):
        """Accumulate one micro-batch (as :meth:`accumulate`); apply once the window is full.

        Returns a boolean tensor telling whether this call applied an update.
        """
        self.accumulate(gradients, num_examples, sample_weight)
        full = self.ready

        def apply_now():
            self.apply()
            return tf.constant(True)

        return tf.cond(full, apply_now, lambda: tf.constant(False))

    def _check_gradients(self, gradients):
        gradients = list(gradients)
        variables = self.target_variables
        if len(gradients) != len(variables):
            raise ValueError(
                f"GradientAccumulator got {len(gradients)} gradients for {len(variables)} "
                "variables; pass one gradient per variable, in the order of the "
                "variables given to the accumulator (tape.gradient(loss, variables))."
            )
        checked = []
        for gradient, variable in zip(gradients, variables):
            if gradient is None:
                raise ValueError(
                    f"no gradient for variable {variable.name!r}: the loss does not depend "
                    "on it; create the accumulator with only the variables the loss uses."
                )
            if isinstance(gradient, tf.IndexedSlices):
                gradient = tf.convert_to_tensor(gradient)
            gradient = tf.convert_to_tensor(gradient)
            if not gradient.shape.is_compatible_with(variable.shape):
                raise ValueError(
                    f"gradient of shape {gradient.shape} does not match variable "
                    f"{variable.name!r} of shape {variable.shape}; pass the gradients in "
                    "the order of the accumulator's variables."
                )
            checked.append(gradient)
        return checked

    def _finite(self, means):
        """The mean gradients, after checking that none holds NaN or inf (eager and graph mode)."""
        return [
            tf.debugging.assert_all_finite(
                mean,
                f"GradientAccumulator: the accumulated gradient of {variable.name!r} holds "
                "NaN or inf, so a micro-batch of this window had a NaN or inf gradient; "
                "nothing was applied. Check the learning rate (too large?), the data and "
                "the loss, call reset() to drop the window, or pass "
                "stop_on_non_finite=False to apply it anyway")
            for mean, variable in zip(means, self.target_variables)]

    def _total_weight(self, sample_weight):
        """The sum of ``sample_weight`` as a float64 tensor, after checking it is >= 0."""
        weights = _as_weights(sample_weight, tf.float64)
        check = tf.debugging.assert_non_negative(
            weights, message="sample_weight must be >= 0 (a mask of 0s and 1s, or weights)")
        with tf.control_dependencies([check]):
            return tf.reduce_sum(weights)

    def _check_examples(self, num_examples):
        if isinstance(num_examples, (numbers.Real, bool)):   # a Python number: checked now
            advice = "Pass the micro-batch's size, for example tf.shape(x)[0]."
            return tf.constant(check_whole_number("num_examples", num_examples, advice=advice),
                               tf.int64)
        count = tf.cast(num_examples, tf.int64)
        check = tf.debugging.assert_positive(
            count, message="num_examples must be at least 1 (the micro-batch's size)"
        )
        with tf.control_dependencies([check]):
            return tf.identity(count)
