"""Gradient accumulation in a TF1 graph, the accumulation thread's recipe with its bugs fixed.

Taught in the chapter "Accumulating gradients in TF1 graphs".  The graph gets
one accumulator variable per trained variable and a counter; ``zero_ops``
clears them, ``accum_ops`` adds one micro-batch's gradients and 1 to the
counter, and ``train_step`` applies ``accumulator / counter``, the mean
gradient of the micro-batches, exactly what one step on the big batch would
apply.
"""

import dataclasses

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

EMPTY_WINDOW_MESSAGE = (
    "train_step ran with nothing accumulated (counter = 0): run zero_ops, then "
    "accum_ops once per micro-batch, and only then train_step"
)


@dataclasses.dataclass(frozen=True)
class AccumulationOps:
    """The variables and ops that :func:`accumulation_ops` adds to a graph.

    ``accumulators``: one variable per trained variable, holding the sum of
    the gradients since the last ``zero_ops``.  ``counter``: how many
    micro-batches (or, with ``num_examples``, examples) were added.  ``zero_ops``: zero both.  ``accum_ops``: add
    one micro-batch's gradients (needs the loss's ``feed_dict``).
    ``train_step``: apply the mean gradient; it reads the variables only, so
    it needs no ``feed_dict`` and never re-runs ``accum_ops``.
    ``grads_and_vars``: the optimizer's ``(gradient, variable)`` pairs.
    """

    accumulators: list
    counter: tf.Variable
    zero_ops: list
    accum_ops: list
    train_step: tf.Operation
    grads_and_vars: list


def accumulation_ops(loss, optimizer, var_list=None, num_examples=None, global_step=None):
    """Build the ops that accumulate gradients over micro-batches and apply their mean.

    ``loss`` is a scalar tensor of a ``tf.Graph`` (graph mode, run by a
    ``tf.compat.v1.Session``); ``optimizer`` a ``tf.compat.v1.train``
    optimizer (``GradientDescentOptimizer``, ``MomentumOptimizer``,
    ``AdamOptimizer``, ...); ``var_list`` the variables to train (default: the
    graph's trainable variables).  Run ``global_variables_initializer()``
    after calling it, then for each update::

        session.run(ops.zero_ops)
        for x, y in micro_batches:
            session.run(ops.accum_ops, feed_dict={inputs: x, targets: y})
        session.run(ops.train_step)       # one step with the mean gradient

    By default each micro-batch counts once (answer 3's counter), so the
    result equals one step on the concatenated batch when the micro-batches
    are equally large and the loss is a mean over the micro-batch.  Pass
    ``num_examples`` (the micro-batch's size as a tensor, for example
    ``tf.shape(inputs)[0]``) to weight each micro-batch by its size
    instead: then micro-batches of any sizes give the big batch's step.
    Running ``train_step`` with a counter of 0 raises
    ``tf.errors.InvalidArgumentError`` instead of applying 0 / 0.  Returns
    an :class:`AccumulationOps`.

    Taught in the chapter "Accumulating gradients in TF1 graphs".

    Shown in the chapter "Accumulating gradients in TF1 graphs".
    """
    _check_graph_and_optimizer("accumulation_ops", optimizer, "pargrad.GradientAccumulator")
    if not isinstance(loss, tf.Tensor) or loss.shape.rank not in (0, None):
        raise ValueError(
            f"accumulation_ops needs the scalar loss tensor of a graph, got {loss!r}; "
            "reduce it with tf.reduce_mean first."
        )

    grads_and_vars = [
        (gradient, variable)
        for gradient, variable in optimizer.compute_gradients(loss, var_list=var_list)
        if gradient is not None
    ]
    if not grads_and_vars:
        raise ValueError(
            "the loss depends on none of the variables in var_list; pass the "
            "variables the loss is computed from."
        )

    with tf.name_scope("accumulation"):
        accumulators = [
            tf.Variable(
                tf.zeros(variable.shape, dtype=variable.dtype.base_dtype),
                trainable=False,
                name=variable.name.split(":")[0].replace("/", "_") + "_accumulator",
            )
            for _, variable in grads_and_vars
        ]
        counter = tf.Variable(0.0, trainable=False, name="counter")

        zero_ops = [accumulator.assign(tf.zeros_like(accumulator)) for accumulator in accumulators]
        zero_ops.append(counter.assign(0.0))

        if num_examples is None:
            accum_ops = [
                _add_gradient(accumulator, gradient)
                for accumulator, (gradient, _) in zip(accumulators, grads_and_vars)
            ]
            accum_ops.append(counter.assign_add(1.0))
        else:
            weight = tf.cast(num_examples, tf.float32)
            accum_ops = [
                accumulator.assign_add(
                    tf.convert_to_tensor(gradient) * tf.cast(weight, accumulator.dtype.base_dtype))
                for accumulator, (gradient, _) in zip(accumulators, grads_and_vars)
            ]
            accum_ops.append(counter.assign_add(weight))

        # Read the variables, never the tensors that accum_ops return: a tensor
        # returned by assign_add re-runs the assign_add when fetched (answer 4's trap).
        count = counter.read_value()
        check = tf.debugging.assert_positive(count, message=EMPTY_WINDOW_MESSAGE)
        with tf.control_dependencies([check]):
            mean_gradients = [
                accumulator.read_value() / tf.cast(count, accumulator.dtype.base_dtype)
                for accumulator in accumulators
            ]
        train_step = optimizer.apply_gradients(
            [(mean, variable) for mean, (_, variable) in zip(mean_gradients, grads_and_vars)],
            global_step=global_step,
        )

    return AccumulationOps(
        accumulators=accumulators,
        counter=counter,
        zero_ops=zero_ops,
        accum_ops=accum_ops,
        train_step=train_step,
        grads_and_vars=grads_and_vars,
    )


def _add_gradient(accumulator, gradient):
    """``accumulator += gradient``, also for the sparse gradients of embeddings."""
    if isinstance(gradient, tf.IndexedSlices):
        return accumulator.scatter_add(gradient)
    return accumulator.assign_add(gradient)


# ---------------------------------------------------------------------------
# The y = x² question's answer in TF1: in-graph replication, one tower a device
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MultiTowerOps:
    """What :func:`multi_tower_step` adds to a graph.

    ``train_step``: one update with the mean of the towers' gradients.
    ``tower_losses``: each tower's loss (a mean over its shard).
    ``tower_gradients``: each tower's ``(gradient, variable)`` pairs.
    ``mean_gradients``: the averaged ``(gradient, variable)`` pairs that
    ``train_step`` applies.
    """

    train_step: tf.Operation
    tower_losses: list
    tower_gradients: list
    mean_gradients: list


def average_tower_gradients(tower_gradients):
    """Average lists of ``(gradient, variable)`` pairs, one list per tower, variable by variable.

    Every tower must list the same variables in the same order (the towers
    share the variables).  Returns one list of ``(mean gradient, variable)``.
    Taught in the chapter "Synchronous training in depth".
    """
    if not tower_gradients:
        raise ValueError("average_tower_gradients needs the gradients of at least one tower.")
    averaged = []
    for pairs in zip(*tower_gradients):
        variables = {id(variable) for _, variable in pairs}
        if len(variables) != 1:
            raise ValueError(
                "the towers list different variables at the same position; build every tower "
                "from the same shared variables, in the same order."
            )
        gradients = [tf.convert_to_tensor(gradient) for gradient, _ in pairs]
        averaged.append((tf.add_n(gradients) / float(len(gradients)), pairs[0][1]))
    return averaged


def multi_tower_step(tower_loss, optimizer, inputs, targets, devices, average_on="/cpu:0",
                     var_list=None):
    """One synchronous update from several devices, in one TF1 graph (in-graph replication).

    ``inputs`` and ``targets`` hold the whole batch (placeholders or tensors);
    they are cut into ``len(devices)`` equal shards with ``tf.split``.  For
    each device, under ``tf.device``, ``tower_loss(x_shard, y_shard)`` builds
    that tower's forward pass and mean loss from the graph's *shared*
    variables, and ``optimizer.compute_gradients`` its backward pass.  On
    ``average_on`` (the "master") the towers' gradients are averaged, and one
    ``optimizer.apply_gradients`` applies the mean.  With a loss that is a
    mean over examples and equal shards, the mean of the towers' gradients is
    the full batch's gradient, so the update is the full batch's.
    ``optimizer`` is a ``tf.compat.v1.train`` optimizer.  Returns a
    :class:`MultiTowerOps`.

    Taught in the chapter "Synchronous training in depth" (the y = x²
    question's answer in TensorFlow 1).

    Shown in the chapter "Synchronous training in depth".
    """
    _check_graph_and_optimizer("multi_tower_step", optimizer, "pargrad.SyncTrainer")
    devices = list(devices)
    if not devices:
        raise ValueError("multi_tower_step needs at least one device, e.g. ['/cpu:0'].")
    batch = inputs.shape[0]
    if batch is not None and batch % len(devices):
        raise ValueError(
            f"a batch of {batch} does not split into {len(devices)} equal shards; "
            f"use a batch size that is a multiple of {len(devices)}."
        )

    input_shards = tf.split(inputs, len(devices))
    target_shards = tf.split(targets, len(devices))
    tower_losses, tower_gradients = [], []
    for index, (device, x_shard, y_shard) in enumerate(zip(devices, input_shards, target_shards)):
        with tf.device(device), tf.name_scope(f"tower_{index}"):
            loss = tower_loss(x_shard, y_shard)                        # forward pass and loss
            pairs = optimizer.compute_gradients(loss, var_list=var_list)  # backward pass
        tower_losses.append(loss)
        tower_gradients.append([(g, v) for g, v in pairs if g is not None])

    with tf.device(average_on), tf.name_scope("average"):
        mean_gradients = average_tower_gradients(tower_gradients)    # the master averages
        train_step = optimizer.apply_gradients(mean_gradients)         # one update
    return MultiTowerOps(train_step=train_step, tower_losses=tower_losses,
                         tower_gradients=tower_gradients, mean_gradients=mean_gradients)


def _check_graph_and_optimizer(builder, optimizer, tf2_alternative):
    """Raise a clear error unless a TF1 graph is being built with a TF1 optimizer."""
    if tf.executing_eagerly():
        raise RuntimeError(
            f"{builder} builds a TF1 graph: call it inside `with tf.Graph().as_default():` "
            f"and run its ops with tf.compat.v1.Session; in TensorFlow 2 code use "
            f"{tf2_alternative}."
        )
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            f"{builder} needs a tf.compat.v1.train optimizer, got {type(optimizer).__name__}; "
            "pass for example tf.compat.v1.train.GradientDescentOptimizer(0.01) (Keras "
            f"optimizers belong with {tf2_alternative})."
        )
