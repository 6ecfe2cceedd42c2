"""The book's sequence task: token sequences of unequal lengths, padded and masked.

Taught in the chapter "Accumulating sequences".  Each example is a sequence
of 2 to ``max_length`` tokens (integers 1 .. ``vocabulary - 1``), padded with
0 to ``max_length``; the target of each token is a fixed function of the
token and the one before it, so a model must read the sequence (a causal
convolution of width 2 can learn it exactly).  The loss is the squared
error per token; padding is masked out (:func:`padding_mask`).  Small
enough that a chapter trains it in seconds on two CPU cores, in float32 or
float64.
"""

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)

VOCABULARY = 16
MAX_LENGTH = 24


def sequence_data(examples, seed=0, max_length=MAX_LENGTH, vocabulary=VOCABULARY,
                  dtype="float32"):
    """``(tokens, targets)``: ``tokens`` (examples, max_length) int32, 0 = padding;
    ``targets`` (examples, max_length, 1) in ``dtype``, 0 on padding.

    Lengths are drawn uniformly from 2 .. ``max_length``, so micro-batches
    hold very different numbers of real tokens.  The target of token t is
    ``sin(token_t) + 0.5 cos(token_{t-1})`` (the first token sees 0 before it).
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, max_length + 1, size=examples)
    tokens = rng.integers(1, vocabulary, size=(examples, max_length))
    tokens = np.where(np.arange(max_length)[None, :] < lengths[:, None], tokens, 0)
    previous = np.concatenate([np.zeros((examples, 1), tokens.dtype), tokens[:, :-1]], axis=1)
    targets = np.sin(tokens) + 0.5 * np.cos(previous)
    targets = np.where(tokens > 0, targets, 0.0)[..., None]
    return tokens.astype(np.int32), targets.astype(dtype)


def padding_mask(tokens, dtype="float32"):
    """1 for a real token, 0 for padding (token 0): the weights of the loss per token."""
    return tf.cast(tf.not_equal(tokens, 0), dtype)


def token_mask(x, y):
    """:func:`padding_mask` as ``sample_weight(x, y)`` for :class:`pargrad.SyncTrainer`."""
    return padding_mask(x, y.dtype)


def squared_error_per_token(y, prediction):
    """The squared error of each token, shape (batch, time): the loss before any reduction."""
    return tf.reduce_sum(tf.square(tf.cast(y, prediction.dtype) - prediction), axis=-1)


def sequence_model(seed=0, dtype="float32", width=8, dropout=0.0, dropout_seed=0,
                   max_length=MAX_LENGTH, vocabulary=VOCABULARY):
    """A small causal model: embedding, causal convolution of width 2, a tanh layer, one output.

    ``seed`` sets the initial weights.  ``dropout`` > 0 adds a dropout layer
    whose masks are drawn from ``dropout_seed`` (the chapter's dropout trap).
    """
    keras.utils.set_random_seed(seed)
    kind = np.dtype(dtype).name
    layers = [
        keras.Input(shape=(max_length,), dtype="int32"),
        keras.layers.Embedding(vocabulary, width, dtype=kind),
        keras.layers.Conv1D(width, 2, padding="causal", activation="tanh", dtype=kind),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, seed=dropout_seed, dtype=kind))
    layers += [keras.layers.Dense(width, activation="tanh", dtype=kind),
               keras.layers.Dense(1, dtype=kind)]
    return keras.Sequential(layers)


def relative_gap(gradients, reference):
    """The largest entry of ``gradients - reference``, relative to the largest entry of
    ``reference`` (lists of arrays, one per variable).

    Taught in the chapter "Accumulating sequences".
    """
    scale = max(float(np.abs(g).max()) for g in reference)
    return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(gradients, reference)) / scale


def mean_of_means_gaps(model, tokens, targets, batch, pieces):
    """For each batch of ``batch`` sequences, cut into ``pieces`` equal micro-batches:
    how far the mean of the micro-batches' token-mean gradients is from the batch's
    token-mean gradient (:func:`relative_gap`).  Returns a numpy array, one gap a batch.

    One pass per micro-batch gives its token count and the gradient of its token
    *sum*, hence both means.  Taught in the chapter "Accumulating sequences".
    """
    dtype = model.trainable_variables[0].dtype

    @tf.function(reduce_retracing=True)
    def token_sum_and_gradients(xm, ym):
        weights = padding_mask(xm, dtype)
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(weights * squared_error_per_token(ym, model(xm, training=True)))
        gradients = tape.gradient(total, model.trainable_variables)
        return tf.reduce_sum(weights), [tf.convert_to_tensor(g) for g in gradients]

    size, gaps = batch // pieces, []
    for start in range(0, len(tokens) - batch + 1, batch):
        counts, sums = zip(*[token_sum_and_gradients(tokens[i:i + size], targets[i:i + size])
                             for i in range(start, start + batch, size)])
        counts = [float(n) for n in counts]
        big = [sum(g.numpy() for g in gs) / sum(counts) for gs in zip(*sums)]
        means = [np.mean([g.numpy() / n for g, n in zip(gs, counts)], axis=0) for gs in zip(*sums)]
        gaps.append(relative_gap(means, big))
    return np.array(gaps)
