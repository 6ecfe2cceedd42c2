"""What the benchmarks share: the machine line, the perceptron and its data on mirrored replicas, interleaved best-of rounds, the RESULT line.

Not a benchmark itself.  A benchmark imports it after ``pargrad`` (which
imports TensorFlow quietly).
"""

import argparse
import os
import platform
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

import keras  # noqa: E402  (after TensorFlow, imported quietly)

FEATURES, WIDTH, PER_REPLICA, EXAMPLES = 64, 256, 256, 8192


def perceptron():
    """The synchronous and sharded benchmarks' model: 64 -> 256 -> 256 -> 1, seeded."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(WIDTH, activation="relu"),
        keras.layers.Dense(WIDTH, activation="relu"),
        keras.layers.Dense(1),
    ])


def data():
    """``EXAMPLES`` seeded standard-normal examples and targets, float32."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((EXAMPLES, FEATURES)).astype(np.float32),
            rng.standard_normal((EXAMPLES, 1)).astype(np.float32))


def replica_parser(doc, rounds):
    """The step-time benchmarks' parser: ``--replicas`` (2), ``--steps`` (100), ``--rounds``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100, help="steps a contender trains a round")
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def mirrored_perceptron_data(replicas):
    """``replicas`` logical devices, a MirroredStrategy over them, the data and the global batch.

    Prints the machine line.  Returns ``(devices, strategy, x, y, batch)``:
    ``PER_REPLICA`` examples a replica.  Call it before TensorFlow has
    placed anything (the devices are split here).
    """
    import pargrad
    from pargrad.strategies import sync_strategy

    devices = pargrad.logical_devices(replicas)
    strategy = sync_strategy(replicas)
    x, y = data()
    print(describe_machine(devices))
    return devices, strategy, x, y, PER_REPLICA * replicas


def describe_machine(devices):
    """One line: the devices used, the cores, the load average, the versions."""
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    gpus = tf.config.list_physical_devices("GPU")
    return (f"devices used: {list(devices)}; physical GPUs: {len(gpus)}; "
            f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}); "
            f"load average {load}; TensorFlow {tf.__version__}")


def best_of_rounds(runners, rounds, steps):
    """Seconds per step of each runner: the best of ``rounds`` interleaved rounds.

    ``runners`` maps a name to ``run(steps)``, which trains ``steps`` steps
    and returns the seconds it took.  The rounds go runner by runner, so
    that a busy moment of a shared machine hits all of them; the best round
    is what the runner can do.  Returns ``({name: best}, {name: [all]},
    {name: cpu})``: ``cpu`` is the process's CPU seconds a step (all its
    threads) in the least busy round, the work the step costs however
    loaded the machine is.
    """
    every = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            started = time.process_time()
            every[name].append(run(steps) / steps)
            cpu[name].append((time.process_time() - started) / steps)
    return ({name: min(times) for name, times in every.items()}, every,
            {name: min(seconds) for name, seconds in cpu.items()})


def timed(function, *args):
    """Seconds that ``function(*args)`` took."""
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def verdict(value, target, at_least=True):
    met = value >= target if at_least else value <= target
    return f"target {'>=' if at_least else '<='} {target}: {'met' if met else 'NOT met'}"


def result_line(**ratios):
    """The machine-readable last line: ``RESULT name=value ...``."""
    return "RESULT " + " ".join(f"{name}={np.round(value, 3):.3f}" for name, value in ratios.items())
