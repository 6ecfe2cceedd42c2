"""What gradient accumulation costs in time (chapter "Accumulation in TF2 and across replicas").

    .venv/bin/python benchmarks/accumulation.py [--micro-batch 64] [--steps 8] [--rounds 5]

One run, one model (a 784-512-512-10 perceptron with softmax cross-entropy),
one device, everything compiled with ``tf.function``.  Prints:

1. one accumulate call of ``pargrad.GradientAccumulator`` (forward, backward,
   add the weighted gradients to the sums) against one plain training step
   (forward, backward, ``optimizer.apply_gradients``) on the same micro-batch
   (target: at most 1.15x); the non-finite check runs once per update, in
   ``apply``, so it is not in this call;
2. the same call weighted by a mask (``sample_weight=``, the chapter
   "Accumulating sequences"): a per-example weight vector summed per call;
3. a whole window (``--steps`` accumulate calls and one ``apply``) against one
   plain step on the ``--steps``-times larger batch, and the same window with
   ``stop_on_non_finite=False``: what the once-per-update check costs.

Contenders are traced first, then timed in interleaved rounds so that a busy
moment of a shared machine hits all of them; the best round counts.  Both
sides of a ratio run on the same device (the first of
``pargrad.logical_devices(1)``, a GPU if there is one), uncompiled by XLA.
The last line, ``RESULT accumulate_vs_plain=... weighted_vs_plain=...
check_cost=...``, gives ratios 1 and 2 and the window with the check over the
window without it, for a script.
"""

import argparse
import time

import pargrad  # first: it imports TensorFlow quietly
from _common import describe_machine, result_line, verdict

import keras
import numpy as np
import tensorflow as tf

from pargrad.accumulate import GradientAccumulator

INPUTS, HIDDEN, CLASSES = 784, 512, 10


def perceptron(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input(shape=(INPUTS,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])


def loss_of(model, x, y):
    logits = model(x, training=True)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def time_round(function, repeats, rounds_results):
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    rounds_results.append((time.perf_counter() - start) / repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    k, b = args.steps, args.micro_batch
    device = pargrad.logical_devices(1)[0]
    with tf.device(device):
        run(args, k, b, device)


def run(args, k, b, device):
    """Time the contenders on ``device`` and print the results."""
    rng = np.random.default_rng(0)
    x_big = tf.constant(rng.standard_normal((k * b, INPUTS)).astype(np.float32))
    y_big = tf.constant(rng.integers(0, CLASSES, k * b).astype(np.int32))
    micro = [(x_big[i * b:(i + 1) * b], y_big[i * b:(i + 1) * b]) for i in range(k)]

    plain_model, plain_optimizer = perceptron(), keras.optimizers.SGD(1e-3)
    plain_optimizer.build(plain_model.trainable_variables)
    acc_model = perceptron()
    accumulator = GradientAccumulator(acc_model.trainable_variables, k,
                                      keras.optimizers.SGD(1e-3))
    unchecked = GradientAccumulator(acc_model.trainable_variables, k,
                                    keras.optimizers.SGD(1e-3), stop_on_non_finite=False)

    @tf.function
    def plain_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(plain_model, x, y)
        variables = plain_model.trainable_variables
        plain_optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    @tf.function
    def accumulate_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(acc_model, x, y)
        accumulator.accumulate(tape.gradient(loss, acc_model.trainable_variables), tf.shape(x)[0])

    @tf.function
    def weighted_step(x, y, weights):
        with tf.GradientTape() as tape:
            loss = loss_of(acc_model, x, y)     # all weights 1: the same mean
        accumulator.accumulate(tape.gradient(loss, acc_model.trainable_variables),
                               sample_weight=weights)

    @tf.function
    def unchecked_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(acc_model, x, y)
        unchecked.accumulate(tape.gradient(loss, acc_model.trainable_variables), tf.shape(x)[0])

    apply = tf.function(accumulator.apply)
    apply_unchecked = tf.function(unchecked.apply)

    def window():
        for x, y in micro:
            accumulate_step(x, y)
        apply()

    def window_unchecked():
        for x, y in micro:
            unchecked_step(x, y)
        apply_unchecked()

    x0, y0 = micro[0]
    ones = tf.ones([b])
    contenders = {
        "plain step, micro-batch": lambda: plain_step(x0, y0),
        "accumulate, micro-batch": lambda: accumulate_step(x0, y0),
        "weighted, micro-batch": lambda: weighted_step(x0, y0, ones),
        f"window of {k} micro-batches": window,
        "window, no check": window_unchecked,
        f"plain step, batch {k}x": lambda: plain_step(x_big, y_big),
    }
    repeats = {name: args.repeats if "micro-batch" in name and "window" not in name
               else max(1, args.repeats // k) for name in contenders}
    accumulators = (accumulator, unchecked)
    for function in contenders.values():  # trace every shape first
        function()
        function()
    for each in accumulators:
        each.reset()
    results = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, function in contenders.items():
            time_round(function, repeats[name], results[name])
            for each in accumulators:          # half-full windows: start the next empty
                each.reset()
    best = {name: min(times) for name, times in results.items()}

    print(describe_machine([device]))
    print(f"model {INPUTS}-{HIDDEN}-{HIDDEN}-{CLASSES} on {device}, micro-batch {b}, {k} steps, "
          f"best of {args.rounds} rounds")
    for name, seconds in best.items():
        print(f"  {name:28s} {1000 * seconds:8.2f} ms")
    ratio = best["accumulate, micro-batch"] / best["plain step, micro-batch"]
    print(f"accumulate / plain step on the same micro-batch: {ratio:.2f}x "
          f"({verdict(ratio, 1.15, at_least=False)})")
    weighted = best["weighted, micro-batch"] / best["plain step, micro-batch"]
    print(f"weighted by a mask / plain step on the same micro-batch: {weighted:.2f}x")
    check_cost = best[f"window of {k} micro-batches"] / best["window, no check"]
    print(f"window with the once-per-update non-finite check / without: {check_cost:.2f}x")
    window_ratio = best[f"window of {k} micro-batches"] / best[f"plain step, batch {k}x"]
    print(f"window of {k} micro-batches / one step on the {k}x batch: {window_ratio:.2f}x")
    print(result_line(accumulate_vs_plain=ratio, weighted_vs_plain=weighted,
                      check_cost=check_cost))


if __name__ == "__main__":
    main()
