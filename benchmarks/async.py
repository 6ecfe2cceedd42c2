"""Benchmark of the asynchronous trainer (chapter "Asynchronous training").

Prints, in one run:

1. updates per second of free-running ``AsyncTrainer`` with 1 and 2 workers
   on a model big enough to keep a core busy (target on 2 cores: 2 workers
   at least 1.7x one worker);
2. asynchronous against synchronous (``pargrad.sync.SyncTrainer``) on 2
   devices when device 1 is made 2x slower (target: async at least 1.3x the
   synchronous updates per second).

Part 1 runs twice.  With ``AsyncTrainer(jit_compile=True)`` XLA runs each
worker's gradient step, and each update, as one computation on the
worker's own thread, so a worker uses one core, as a worker with its own
device would: this is the run the target is about.  Plain TensorFlow (the default) runs a layer's
independent backward products on both cores through its inter-op threads,
so one worker alone already borrows the second core and two workers cannot
double it; that run is printed for comparison, in absolute numbers too.
Each part alternates the 1- and 2-worker runs in rounds and also prints the
machine's ceiling at that moment: the same gradient computations in 1 and 2
bare threads, with nothing shared.  On a machine that others share, that
ceiling, not the trainer, is what limits the ratio.  The synchronous numbers
include ``SyncTrainer``'s own per-step overhead.

Run with ``.venv/bin/python benchmarks/async.py``; about two minutes.  Each
worker runs its TensorFlow ops on one intra-op thread, set before TensorFlow
starts: otherwise two workers fight over the same two cores.
"""

import argparse
import threading
import time

import numpy as np

import pargrad
from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
tf.config.threading.set_intra_op_parallelism_threads(1)
DEVICES = pargrad.logical_devices(2)

import keras  # noqa: E402

from pargrad.asynchronous import AsyncTrainer  # noqa: E402
from pargrad.sync import SyncTrainer, sync_strategy  # noqa: E402

INPUTS, HIDDEN, BATCH = 512, 1024, 256
ROUNDS = 3


def big_model(seed=0):
    """An MLP of 512 -> 1024 -> 1024 -> 1: a few ms of matrix products a step."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input(shape=(INPUTS,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(1),
    ])


def data(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, INPUTS)).astype(np.float32)
    y = np.tanh(x[:, :1] * x[:, 1:2]).astype(np.float32)
    return x, y


def mse(y, predictions):
    return tf.reduce_mean(tf.square(y - predictions))


def async_trainer(workers, jit_compile):
    """A free-running AsyncTrainer on the first ``workers`` devices, already traced."""
    x, y = data()
    trainer = AsyncTrainer(big_model(), mse, DEVICES[:workers], learning_rate=1e-3,
                           progress=False, jit_compile=jit_compile)
    trainer.fit(x, y, updates=4 * workers, batch_size=BATCH, mode="free-running")
    return trainer


def async_rate(trainer, seconds, speeds=None):
    """Updates per second of a free-running run of ``seconds``; and its history."""
    x, y = data()
    started = time.perf_counter()
    history = trainer.fit(x, y, updates=10**9, batch_size=BATCH, mode="free-running",
                          speeds=speeds, time_limit=seconds)
    return len(history["loss"]) / (time.perf_counter() - started), history


def bare_rate(trainer, seconds):
    """Gradient computations per second of the trainer's workers with nothing shared:
    no lock, no reads, no updates.  What the machine allows at this moment."""
    parameters, _ = trainer._read()
    counts = [0] * len(trainer.devices)
    deadline = time.perf_counter() + seconds

    def compute(worker):
        while time.perf_counter() < deadline:
            trainer._gradients(worker, parameters)[0].numpy()
            counts[worker] += 1

    threads = [threading.Thread(target=compute, args=(w,)) for w in range(len(counts))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


def sync_rate(seconds, stragglers):
    """Steps (= updates) per second of SyncTrainer on both devices, after a warm-up."""
    x, y = data()
    strategy = sync_strategy(2)
    with strategy.scope():
        model = big_model()
    trainer = SyncTrainer(model, strategy, learning_rate=1e-3, stragglers=stragglers,
                          progress=False)
    trainer.fit(x, y, steps=4, batch_size=2 * BATCH)  # trace
    started = time.perf_counter()
    trainer.fit(x, y, steps=10, batch_size=2 * BATCH)  # how many steps fill `seconds`?
    steps = max(10, int(seconds * 10 / (time.perf_counter() - started)))
    started = time.perf_counter()
    trainer.fit(x, y, steps=steps, batch_size=2 * BATCH)
    return steps / (time.perf_counter() - started)


def main():
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of training per configuration")
    parser.add_argument("--batch", type=int, default=BATCH, help="examples per worker and update")
    arguments = parser.parse_args()
    seconds, BATCH = arguments.seconds, arguments.batch

    print(f"devices: {DEVICES}; intra-op threads: "
          f"{tf.config.threading.get_intra_op_parallelism_threads()}; batch {BATCH} a worker")
    print("\n1. free-running workers, equal devices (rounds alternate 1 and 2 workers, "
          "because the machine's load changes)")
    trainers_by_jit = {}
    for jit_compile in (True, False):
        trainers = {workers: async_trainer(workers, jit_compile) for workers in (1, 2)}
        trainers_by_jit[jit_compile] = trainers
        rates, bare = {1: [], 2: []}, {1: [], 2: []}
        for _ in range(ROUNDS):
            for workers, trainer in trainers.items():
                rate, history = async_rate(trainer, seconds / ROUNDS)
                rates[workers].append(rate)
                bare[workers].append(bare_rate(trainer, seconds / ROUNDS / 2))
        one, two = np.median(rates[1]), np.median(rates[2])
        print(f"  AsyncTrainer(jit_compile={jit_compile}): "
              + ("XLA, one core a worker" if jit_compile else
                 "plain TF, one worker may also use the other core through inter-op threads"))
        print(f"    1 worker : {one:7.1f} updates/s (median of {', '.join(f'{r:.1f}' for r in rates[1])})")
        print(f"    2 workers: {two:7.1f} updates/s (median of {', '.join(f'{r:.1f}' for r in rates[2])})")
        print(f"    2 workers / 1 worker = {two / one:.2f}x (target >= 1.7x); best round "
              f"{max(b / a for a, b in zip(rates[1], rates[2])):.2f}x; mean staleness with 2: "
              f"{history['staleness'].mean():.2f}")
        print(f"    the machine right now, bare gradient computations in 1 and 2 threads (no lock, "
              f"no updates): {np.median(bare[1]):.1f} and {np.median(bare[2]):.1f} a second = "
              f"{np.median(bare[2]) / np.median(bare[1]):.2f}x")

    print("\n2. device 1 made 2x slower (it sleeps as long again as it computed)")
    # Plain TF workers, like SyncTrainer's replicas (no XLA on either side).
    slow_async, history = async_rate(trainers_by_jit[False][2], seconds, speeds=[1.0, 0.5])
    slow_sync = sync_rate(seconds, stragglers={1: 2.0})
    shares = np.bincount(history["worker"], minlength=2) / len(history["worker"])
    print(f"  async: {slow_async:7.1f} updates/s ({BATCH} examples each); updates by device: "
          f"{shares[0]:.0%} / {shares[1]:.0%}; mean staleness of the slow device "
          f"{history['staleness'][history['worker'] == 1].mean():.2f}")
    print(f"  sync : {slow_sync:7.1f} updates/s ({2 * BATCH} examples each, waits for device 1; "
          f"{sync_rate(seconds, stragglers={}):.1f} updates/s with equal devices)")
    print(f"  async / sync = {slow_async / slow_sync:.2f}x updates/s (target >= 1.3x), "
          f"{slow_async * BATCH / (slow_sync * 2 * BATCH):.2f}x examples/s")


if __name__ == "__main__":
    main()
