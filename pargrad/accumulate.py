"""Gradient accumulation for TF2 custom loops: sum k micro-batches, apply once.

Taught in the chapter "Accumulation in TF2 and Keras 3".  Each micro-batch's
gradient is weighted by its number of examples, so micro-batches of unequal
size still give exactly the gradient of the mean loss over the big batch.
The state lives in variables, so ``tf.train.Checkpoint`` saves a half-full
window and training resumes where it stopped.

A custom loop::

    accumulator = pargrad.GradientAccumulator(model.trainable_variables, steps=4,
                                              optimizer=keras.optimizers.SGD(0.01))

    @tf.function
    def train_micro_batch(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))      # mean over the micro-batch
        gradients = tape.gradient(loss, model.trainable_variables)
        return accumulator.step(gradients, tf.shape(x)[0])  # applies every 4th call
"""

import json
import numbers
import os
import subprocess
import sys

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

from pargrad.training import check_whole_number  # noqa: E402

EMPTY_WINDOW_MESSAGE = (
    "GradientAccumulator has nothing accumulated: call accumulate(gradients, "
    "num_examples) at least once after the last apply() or reset()"
)


class _Untracked:
    """Holds references that a checkpoint of the accumulator must not include."""

    def __init__(self, variables, optimizer):
        self.variables = variables
        self.optimizer = optimizer


class GradientAccumulator(tf.Module):
    """Accumulate the gradients of ``steps`` micro-batches, then apply their mean once.

    ``variables``: the variables the gradients belong to (for example
    ``model.trainable_variables``), in the order the gradients come in.
    ``steps``: micro-batches per update (used by :meth:`step` and
    :attr:`ready`).  ``optimizer``: a Keras optimizer, needed only by
    :meth:`apply` and :meth:`step`.

    ``accumulate(gradients, num_examples)`` adds ``num_examples * gradient``
    (the gradient of a loss that is a *mean* over the micro-batch's
    ``num_examples`` examples); ``mean_gradients()`` returns the sums divided
    by the total number of examples, the gradient of the mean loss over all
    accumulated examples; ``apply()`` applies it with the optimizer and
    resets; ``step(gradients, num_examples)`` accumulates and applies once
    ``steps`` micro-batches are in.  All of them work eagerly and inside
    ``tf.function``.  The sums and counts are variables of this
    ``tf.Module``: ``tf.train.Checkpoint(accumulator=...)`` saves and restores
    them (save the model and optimizer beside it).

    Under a ``tf.distribute`` strategy, create it in ``strategy.scope()``,
    call :meth:`accumulate` inside ``strategy.run`` with each replica's own
    gradients and micro-batch size, and call :meth:`apply` (or
    :meth:`mean_gradients`) outside ``strategy.run``: each replica sums into
    its own copy, and reading the sums adds them up over the replicas, one
    all-reduce per update.  :meth:`step` applies inside ``tf.cond`` and so
    works only without a strategy.

    Taught in the chapter "Accumulation in TF2 and Keras 3".
    """

    def __init__(self, variables, steps, optimizer=None, name="gradient_accumulator",
                 stop_on_non_finite=True):
        super().__init__(name=name)
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            if isinstance(steps, float) and steps.is_integer() and steps >= 1:
                raise ValueError(f"GradientAccumulator needs steps as an int, got {steps!r}; "
                                 f"pass {int(steps)}.")
            raise ValueError(
                f"GradientAccumulator needs steps >= 1 micro-batches per update, got "
                f"{steps!r}; pass an int such as 4 (1 means no accumulation)."
            )
        if not isinstance(stop_on_non_finite, bool):
            raise TypeError(f"stop_on_non_finite must be True or False, got {stop_on_non_finite!r}.")
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
        self.steps = int(steps)
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
            self.examples = tf.Variable(0, dtype=tf.int64, name="examples",
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
        """A boolean tensor: ``steps`` micro-batches (or more) are accumulated."""
        return self.micro_batches >= self.steps

    def accumulate(self, gradients, num_examples):
        """Add one micro-batch's gradients, weighted by its ``num_examples``.

        ``gradients``: one per target variable, in the same order, of a loss
        that is the mean over the micro-batch; ``num_examples``: the
        micro-batch's size (an int or an integer tensor such as
        ``tf.shape(x)[0]``), at least 1.
        """
        if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
            raise RuntimeError(
                "GradientAccumulator.accumulate() runs on each replica: call it inside "
                "strategy.run(...), with that replica's gradients and micro-batch size."
            )
        gradients = self._check_gradients(gradients)
        count = self._check_examples(num_examples)
        if self.stop_on_non_finite:
            gradients = self._finite(gradients)
        for total, gradient in zip(self.sums, gradients):
            total.assign_add(gradient * tf.cast(count, total.dtype))
        with tf.control_dependencies(gradients):     # counted only after the checks
            self.examples.assign_add(count)
            self.micro_batches.assign_add(1)

    def mean_gradients(self):
        """The accumulated gradients divided by the number of accumulated examples.

        Raises ``tf.errors.InvalidArgumentError`` when nothing is accumulated.
        """
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            raise RuntimeError(
                "under a tf.distribute strategy, call GradientAccumulator.apply() and "
                "mean_gradients() outside strategy.run(...), where the replicas' sums "
                "are added up; call accumulate() inside it."
            )
        check = tf.debugging.assert_positive(self.examples, message=EMPTY_WINDOW_MESSAGE)
        with tf.control_dependencies([check]):
            return [total / tf.cast(self.examples, total.dtype) for total in self.sums]

    def apply(self):
        """Apply the mean gradient with the optimizer, then reset the window."""
        if self.optimizer is None:
            raise ValueError(
                "GradientAccumulator.apply() needs an optimizer: create it with "
                "GradientAccumulator(variables, steps, optimizer=keras.optimizers.SGD(...)), "
                "or use mean_gradients() and apply them yourself."
            )
        means = self.mean_gradients()
        self.optimizer.apply_gradients(zip(means, self.target_variables))
        self.reset()

    def reset(self):
        """Forget everything accumulated since the last update."""
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        self.examples.assign(0)
        self.micro_batches.assign(0)

    def step(self, gradients, num_examples):
        """Accumulate one micro-batch; apply once ``steps`` are in.

        Returns a boolean tensor telling whether this call applied an update.
        """
        self.accumulate(gradients, num_examples)
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

    def _finite(self, gradients):
        """The gradients, after checking that none holds NaN or inf (in eager and graph mode)."""
        checks = [
            tf.debugging.assert_all_finite(
                gradient,
                f"GradientAccumulator: the gradient of {variable.name!r} holds NaN or inf; "
                "check the learning rate (too large?), the data and the loss of this "
                "micro-batch, or pass stop_on_non_finite=False to accumulate it anyway")
            for gradient, variable in zip(gradients, self.target_variables)]
        return checks

    def _check_examples(self, num_examples):
        if isinstance(num_examples, bool):
            raise ValueError("num_examples must be a count of examples, got a bool.")
        if isinstance(num_examples, numbers.Integral):
            if num_examples < 1:
                raise ValueError(
                    f"num_examples must be at least 1, got {num_examples}; pass the "
                    "micro-batch's size, for example tf.shape(x)[0]."
                )
            return tf.constant(num_examples, tf.int64)
        if isinstance(num_examples, numbers.Real):
            check_whole_number("num_examples", num_examples)   # raises, saying what to pass
        count = tf.cast(num_examples, tf.int64)
        check = tf.debugging.assert_positive(
            count, message="num_examples must be at least 1 (the micro-batch's size)"
        )
        with tf.control_dependencies([check]):
            return tf.identity(count)


# --- Peak memory of a growing batch against accumulation (chapter 7) -----------------

MEMORY_FEATURES = 2048
MEMORY_HIDDEN = 512


class _PeakMeter:
    """Peak memory of the current process (MB) since :meth:`reset`.

    GPU: TensorFlow's peak device memory.  Linux CPU: the peak resident set
    (``VmHWM``), reset through ``/proc/self/clear_refs``.  Elsewhere: the peak
    resident set since the process started (``ru_maxrss``), which cannot be
    reset, so measurements must come in increasing order.
    """

    def __init__(self):
        self.gpu = bool(tf.config.list_physical_devices("GPU"))
        self.resettable = self.gpu or self._clear_refs()
        self.device = "GPU" if self.gpu else "CPU"

    @staticmethod
    def _clear_refs():
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            return True
        except OSError:
            return False

    def reset(self):
        if self.gpu:
            tf.config.experimental.reset_memory_stats("GPU:0")
        elif self.resettable:
            self._clear_refs()

    def peak_mb(self):
        if self.gpu:
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        if self.resettable:
            with open("/proc/self/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        import resource  # Unix only; Linux has taken the /proc branch above

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB; bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _memory_probe(batch_sizes, micro_batch_size, features=MEMORY_FEATURES,
                  hidden=MEMORY_HIDDEN):
    """Run in a child process: peak memory (MB) of one update per batch size, both ways.

    First every batch size accumulated from micro-batches (built one at a
    time, as a data pipeline delivers them), then every batch size at once,
    so that even a peak that cannot be reset is measured in increasing order.
    """
    import keras

    keras.utils.set_random_seed(0)
    meter = _PeakMeter()
    model = keras.Sequential([
        keras.Input(shape=(features,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(1),
    ])
    accumulator = GradientAccumulator(model.trainable_variables, 1, keras.optimizers.SGD(1e-3))
    spec = [tf.TensorSpec([None, features]), tf.TensorSpec([None, 1])]

    @tf.function(input_signature=spec)
    def add(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        accumulator.accumulate(tape.gradient(loss, model.trainable_variables), tf.shape(x)[0])

    apply = tf.function(accumulator.apply)

    def update(size, piece):
        for start in range(0, size, piece):
            n = min(piece, size - start)
            generator = tf.random.Generator.from_seed(start)
            add(generator.normal([n, features]), generator.normal([n, 1]))
        apply()

    update(micro_batch_size, micro_batch_size)  # trace and warm up before measuring
    report = {"device": meter.device, "resettable": meter.resettable}
    for name, piece in (("accumulated_mb", micro_batch_size), ("whole_mb", None)):
        report[name] = []
        for size in batch_sizes:
            meter.reset()
            update(size, piece or size)
            report[name].append(round(meter.peak_mb(), 1))
    return report


def peak_memory(batch_sizes, micro_batch_size, timeout=180):
    """Peak memory (MB) of one update per batch size: whole, and accumulated.

    Measured in one fresh process on a model with 2048 inputs and two hidden
    layers of 512: for each batch size, once with the gradients of the
    whole batch computed at once, once accumulated from micro-batches of
    ``micro_batch_size`` (each built only when needed).  Returns
    ``{"device": "CPU" or "GPU", "resettable": bool, "whole_mb": [...],
    "accumulated_mb": [...]}``; on a CPU the figures are peak resident
    memory, TensorFlow itself included.

    Taught in the chapter "Accumulation in TF2 and Keras 3".
    """
    sizes = [int(size) for size in batch_sizes]
    if not sizes or sizes != sorted(sizes) or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive and increasing, got {batch_sizes!r}.")
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, numbers.Integral) \
            or micro_batch_size < 1:
        raise ValueError(
            f"micro_batch_size must be a whole number >= 1, got {micro_batch_size!r}.")
    code = (
        "import json, sys\n"
        "from pargrad.accumulate import _memory_probe\n"
        "print(json.dumps(_memory_probe(json.loads(sys.argv[1]), int(sys.argv[2]))))\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(sizes), str(micro_batch_size)],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the memory probe failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
