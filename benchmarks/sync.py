"""Steps per second of pargrad.SyncTrainer, Keras fit and a hand-written strategy.run loop.

    .venv/bin/python benchmarks/sync.py [--replicas 2] [--steps 300] [--rounds 3]

One run, one model (a 64-256-256-1 perceptron), one data set, one
MirroredStrategy over ``--replicas`` logical devices, 256 examples a replica.
Each contender is traced first, then timed over ``--steps`` steps; the
rounds are interleaved (SyncTrainer, fit, loop, ...) so that a busy moment
of a shared machine hits all of them, and the best round counts.
SyncTrainer runs three ways: with its defaults (one step a call, no
per-replica timestamps), recording per-replica times (as the chapter's
timelines do), and with ten steps a call.
"""

import argparse
import time

import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np
import tensorflow as tf
from pargrad.sync import SyncTrainer, sync_strategy

FEATURES, WIDTH, PER_REPLICA = 64, 256, 256


def perceptron():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(WIDTH, activation="relu"),
        keras.layers.Dense(WIDTH, activation="relu"),
        keras.layers.Dense(1),
    ])


def data(n=8192):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, FEATURES)).astype(np.float32),
            rng.standard_normal((n, 1)).astype(np.float32))


def sync_trainer_runner(strategy, x, y, batch, steps_per_call=1, record_times=None):
    with strategy.scope():
        model = perceptron()
    trainer = SyncTrainer(model, strategy, learning_rate=0.01, record_times=record_times,
                          progress=False)
    trainer.fit(x, y, steps=2 * steps_per_call, batch_size=batch, steps_per_call=steps_per_call)

    def run(steps):
        start = time.perf_counter()
        trainer.fit(x, y, steps=steps, batch_size=batch, steps_per_call=steps_per_call)
        return time.perf_counter() - start
    return run


def keras_fit_runner(strategy, x, y, batch):
    with strategy.scope():
        model = perceptron()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mean_squared_error")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0, shuffle=False)

    def run(steps):
        start = time.perf_counter()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
        return time.perf_counter() - start
    return run


def hand_written_runner(strategy, x, y, batch):
    """The loop of TensorFlow's custom-training tutorial, nothing more."""
    with strategy.scope():
        model = perceptron()
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def replica_step(features, targets):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(tf.square(targets - model(features, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    train_step(iterator).numpy()

    def run(steps):
        start = time.perf_counter()
        losses = [train_step(iterator) for _ in range(steps)]
        losses[-1].numpy()
        return time.perf_counter() - start
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    pargrad.logical_devices(args.replicas)
    strategy = sync_strategy(args.replicas)
    x, y = data()
    batch = PER_REPLICA * args.replicas
    runners = {
        "SyncTrainer": sync_trainer_runner(strategy, x, y, batch),
        "Keras model.fit": keras_fit_runner(strategy, x, y, batch),
        "hand-written strategy.run loop": hand_written_runner(strategy, x, y, batch),
        "SyncTrainer, record_times=True": sync_trainer_runner(
            strategy, x, y, batch, record_times=True),
        "SyncTrainer, steps_per_call=10": sync_trainer_runner(strategy, x, y, batch, 10),
    }
    best = {name: float("inf") for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            best[name] = min(best[name], run(args.steps))

    kind = strategy.extended.worker_devices[0].split("device:")[-1].split(":")[0]
    print(f"MirroredStrategy over {args.replicas} logical {kind}s, "
          f"global batch {batch}, {args.steps} steps, best of {args.rounds} rounds")
    rate = {name: args.steps / seconds for name, seconds in best.items()}
    for name, steps_per_second in rate.items():
        print(f"  {name:34s} {steps_per_second:8.1f} steps/s  {1e3 / steps_per_second:7.2f} ms/step")
    for name in ("SyncTrainer", "SyncTrainer, record_times=True", "SyncTrainer, steps_per_call=10"):
        print(f"{name}: {rate[name] / rate['Keras model.fit']:.2f}x Keras fit, "
              f"{rate[name] / rate['hand-written strategy.run loop']:.2f}x the hand-written loop")


if __name__ == "__main__":
    main()
