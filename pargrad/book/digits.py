"""A real classification task that runs offline: scikit-learn's 8×8 handwritten digits.

Taught in the chapter "Sync vs async in the same time", where synchronous and
asynchronous training race to a target test accuracy.  The 1,797 images ship
inside scikit-learn, so nothing is downloaded.
"""

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

from pargrad.checks import check_share  # noqa: E402

CLASSES = 10
FEATURES = 64


def digits_data(test_fraction=0.25, seed=0):
    """``(x_train, y_train, x_test, y_test)``: pixels scaled to [0, 1], integer labels.

    The split is stratified by class and fixed by ``seed``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    check_share("test_fraction", test_fraction, strict=True, advice="Pass 0.25 for a quarter.")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return x_train, y_train, x_test, y_test


def digits_model(hidden=64, seed=0):
    """A small MLP for the digits: 64 → ``hidden`` (ReLU) → 10 logits, seeded."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input(shape=(FEATURES,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])


def cross_entropy_per_example(y, logits):
    """The digits task's loss: the cross-entropy of each example, integer labels ``y``.

    ``SyncTrainer`` takes it as it is (it divides by the global batch
    itself); :func:`cross_entropy` is its mean, for a trainer that takes a
    mean loss.
    """
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(tf.reshape(y, [-1]), tf.int32), logits=logits)


def cross_entropy(y, logits):
    """The mean of :func:`cross_entropy_per_example` over the batch."""
    return tf.reduce_mean(cross_entropy_per_example(y, logits))


def accuracy(model_or_logits, x, y):
    """Share of examples whose largest logit is the true label."""
    logits = model_or_logits(x) if callable(model_or_logits) else model_or_logits
    predicted = np.argmax(np.asarray(logits), axis=1)
    return float(np.mean(predicted == np.asarray(y).reshape(-1)))


def time_to_target(times, accuracies, target):
    """First time at which ``accuracies`` reaches ``target`` (DAWNBench's metric), or ``inf``.

    ``times`` and ``accuracies`` are measured at the same evaluation points, in
    increasing time order.
    """
    times, accuracies = np.asarray(times, float), np.asarray(accuracies, float)
    if times.shape != accuracies.shape:
        raise ValueError(f"times and accuracies need the same length, got {times.shape} and {accuracies.shape}.")
    if np.any(np.diff(times) < 0):
        raise ValueError("times must be in increasing order; sort the evaluation points first.")
    reached = np.flatnonzero(accuracies >= target)
    return float(times[reached[0]]) if reached.size else float("inf")
