"""The y = x² question's problem: a 1-5-1 tanh network fitting y = x² on 50 points.

Taught in the chapter "The training loop"; the synchronous and accumulation
chapters reuse it, always starting from the same initial weights.
"""

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import check_whole_number  # noqa: E402
from pargrad.strategies import sync_strategy  # noqa: E402
from pargrad.sync import SyncTrainer  # noqa: E402

LEARNING_RATE = 1e-2
STEPS = 2000


def parabola_data(n=50, low=-2.0, high=2.0, dtype="float32"):
    """``n`` evenly spaced points x in [low, high] and y = x², as columns of ``dtype``."""
    n = check_whole_number("n", n)
    x = np.linspace(low, high, n, dtype=_float_dtype(dtype))[:, np.newaxis]
    return x, np.square(x)


def _float_dtype(dtype):
    """``dtype`` as a NumPy float type: float32 (the book's default) or float64.

    float64 is for demonstrating equalities that hold in exact arithmetic:
    its rounding (about 1e-16 relative) is small enough that the order in
    which a CPU or GPU adds numbers cannot hide the point.
    """
    try:
        kind = np.dtype(dtype)
    except TypeError:
        kind = None
    if kind not in (np.float32, np.float64):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}; pass 'float64' "
                         "to show an equality that holds in exact arithmetic.")
    return kind.type


def initial_weights(seed=0, hidden=5, dtype="float32"):
    """Random-normal weights, as the y = x² question's ``add_layer`` makes them, and biases of 0.1.

    The question draws its biases from a normal distribution too; the book keeps
    them constant because every claim compares runs from the same initial
    weights, so how they were drawn changes no conclusion.

    Returned in Keras's order ``[W1 (1, hidden), b1 (hidden,), W2 (hidden, 1),
    b2 (1,)]`` so that the TF1 graph, the TF2 loop and Keras start identically.
    The float64 weights are the float32 ones widened, so both start alike.
    """
    kind = _float_dtype(dtype)
    rng = np.random.default_rng(seed)
    weights = [
        rng.standard_normal((1, hidden)).astype(np.float32),
        np.full((hidden,), 0.1, np.float32),
        rng.standard_normal((hidden, 1)).astype(np.float32),
        np.full((1,), 0.1, np.float32),
    ]
    return [w.astype(kind) for w in weights]


def add_layer(inputs, weights, biases, activation=None):
    """One fully connected layer, as the y = x² question writes it: ``activation(x @ W + b)``.

    Shown in the chapter "The training loop".
    """
    outputs = tf.matmul(inputs, weights) + biases
    return outputs if activation is None else activation(outputs)


def parabola_forward(x, variables):
    """The 1-5-1 network: a tanh hidden layer, then a linear output."""
    w1, b1, w2, b2 = variables
    hidden = add_layer(x, w1, b1, activation=tf.tanh)
    return add_layer(hidden, w2, b2)


def squared_error(y, prediction):
    """The y = x² question's loss: the mean over examples of the squared error."""
    return tf.reduce_mean(tf.reduce_sum(tf.square(y - prediction), axis=1))


def parabola_model(seed=0, hidden=5, dtype="float32"):
    """The same network as a Keras model, holding :func:`initial_weights`."""
    kind = np.dtype(_float_dtype(dtype)).name
    model = keras.Sequential([
        keras.Input(shape=(1,), dtype=kind),
        keras.layers.Dense(hidden, activation="tanh", dtype=kind),
        keras.layers.Dense(1, dtype=kind),
    ])
    model.set_weights(initial_weights(seed, hidden, dtype))
    return model


def fit_one_device(x, y, steps=STEPS, learning_rate=LEARNING_RATE, seed=0):
    """Train the network on one device with full-batch gradient descent (TF2).

    Each step is one training iteration: forward pass, loss, gradients by
    backpropagation (``tf.GradientTape``), update ``w -= lr * grad``.
    Returns ``(losses, weights)``: the loss before each update and the final
    weights as NumPy arrays.  The weights take the dtype of ``x`` (float32
    or float64).  Taught in the chapter "The training loop".
    Shown in the chapter "The training loop".
    """
    variables = [tf.Variable(value) for value in initial_weights(seed, dtype=np.asarray(x).dtype)]
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            prediction = parabola_forward(x, variables)   # forward pass
            loss = squared_error(y, prediction)            # loss
        gradients = tape.gradient(loss, variables)         # backward pass
        for variable, gradient in zip(variables, gradients):
            variable.assign_sub(learning_rate * gradient)  # update
        return loss

    losses = np.array([train_step().numpy() for _ in range(steps)])
    return losses, [variable.numpy() for variable in variables]


# ----------------------------------------------------------------------------
# The y = x² question's network, trained synchronously
# ----------------------------------------------------------------------------

def train_parabola(replicas=None, steps=2000, learning_rate=1e-2, seed=0, steps_per_call=100,
                   progress=False, dtype="float32"):
    """Train the y = x² question's network synchronously on the full batch of 50 points.

    In one process the batch is split over ``replicas`` logical devices
    (:func:`pargrad.sync_strategy`); in a worker of :class:`pargrad.LocalCluster`
    (``TF_CONFIG`` set) over the worker processes.  Every run starts from
    :func:`pargrad.initial_weights` with ``seed``, in ``dtype`` (``"float64"``
    makes the equality with one device robust to rounding).  Returns a dict with the
    final ``weights`` (NumPy arrays), the ``loss`` before every update, the
    number of ``replicas`` and the ``seconds`` the steps took; it is JSON
    friendly so that worker processes can hand it back.

    Taught in the chapter "Synchronous training".
    Shown in the chapter "Synchronous training".
    """
    strategy = sync_strategy(replicas)
    with strategy.scope():
        model = parabola_model(seed=seed, dtype=dtype)
    trainer = SyncTrainer(model, strategy, learning_rate=learning_rate, progress=progress)
    x, y = parabola_data(dtype=dtype)
    history = trainer.fit(x, y, steps=steps, steps_per_call=steps_per_call)
    return {
        "weights": [np.asarray(w) for w in model.get_weights()],
        "loss": history.loss.astype(np.dtype(dtype)),
        "replicas": trainer.replicas,
        "seconds": float(np.sum(history.step_time)),
    }
