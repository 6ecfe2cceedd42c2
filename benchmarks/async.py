"""Asynchronous against synchronous training, examples per second (chapter "Asynchronous training").

    .venv/bin/python benchmarks/async.py [--seconds 6] [--batch 256] [--rounds 3]

Prints, in one run, on two logical devices:

1. updates per second of free-running ``AsyncTrainer`` with 1 and 2 workers
   on a model big enough to keep a core busy (target on 2 cores: 2 workers
   at least 1.9x one worker);
2. equal devices: examples per second of 2 asynchronous workers against
   ``SyncTrainer`` on the same 2 devices, with the same batch a device and
   the same compile mode (target: synchronous at least 0.9x asynchronous);
3. device 1 made 2x slower, busy on its core as a slower core would be, on
   both sides: the asynchronous worker works as long again after computing
   (``pargrad.asynchronous.hold_core``); the synchronous straggler computes
   its gradients twice a step and applies the first
   (``InstrumentedSyncTrainer(scenario=Scenario((1, 1 / 2)))``, in the step's graph,
   compiled by XLA like the rest):
   asynchronous over synchronous examples per second, printed beside its
   limit.  With N equal devices of which one is s times slower, the
   asynchronous workers together do (N - 1) + 1/s device-steps in the time
   the synchronous run does one step on all N, which waits for the slow
   one, s device-times long: so async / sync is at most (s(N - 1) + 1) / N,
   1.5 for N = 2, s = 2.  A ratio above that limit means the two sides were
   not measured alike: a bug in the benchmark, flagged as such.
4. the synchronous straggler alone, one replica: its step time with the
   straggler against without, and the CPU time a step costs, the slow-down
   it really has (target: about 2x, the factor asked for; the CPU time
   holds on a busy machine, the wall time only on an idle one).

Every comparison is like with like: the same model, the same batch a device,
the same compile mode (XLA on both sides, then plain TensorFlow on both
sides).  With ``jit_compile=True`` XLA runs each worker's gradient step (and
for ``AsyncTrainer`` each update; for ``SyncTrainer`` each replica's forward
and backward pass, around the all-reduce) as one computation on one core,
as a worker with its own device would.  Every TensorFlow op runs on one
intra-op thread, set before TensorFlow starts: otherwise two workers (or
replicas) fight over the same two cores.  ``SyncTrainer`` runs
``--steps-per-call`` steps a ``tf.function`` call, its fastest setting.
Rounds alternate the contenders, because a shared machine's load changes;
each part prints every round and the median, and the machine's ceiling at
that moment: the same gradient computations in 1 and 2 bare threads, with
nothing shared.

The last line holds ``async_2_vs_1`` (XLA) and its limit now,
``async_2_vs_1_limit`` (the bare ceiling), ``sync_vs_async_examples``
(XLA), ``straggler_async_vs_sync`` (XLA), ``straggler_limit``,
``straggler_step_factor`` and ``straggler_cpu_factor`` (XLA) for a script.
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

from _common import describe_machine, result_line, verdict  # noqa: E402
from pargrad.asynchronous import AsyncTrainer  # noqa: E402
from pargrad.scenario import Scenario  # noqa: E402
from pargrad.book.instruments import InstrumentedSyncTrainer  # noqa: E402
from pargrad.strategies import sync_strategy  # noqa: E402
from pargrad.sync import SyncTrainer  # noqa: E402

INPUTS, HIDDEN = 512, 1024
SLOW = 2  # the straggler's slow-down factor s (a whole number: sync computes s times a step)


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


class Async:
    """A free-running AsyncTrainer on the first ``workers`` devices, already traced."""

    def __init__(self, workers, jit_compile, batch, speeds=None):
        self.x, self.y = data()
        self.batch, self.speeds, self.workers = batch, speeds, workers
        self.trainer = AsyncTrainer(big_model(), mse, DEVICES[:workers], learning_rate=1e-3,
                                    progress=False, jit_compile=jit_compile)
        self.trainer.fit(self.x, self.y, steps=4 * workers, batch_size=batch, mode="free-running")
        self.history = None

    def examples_per_second(self, seconds):
        started = time.perf_counter()
        self.history = self.trainer.fit(self.x, self.y, steps=10**9, batch_size=self.batch,
                                        mode="free-running", time_limit=seconds,
                                        scenario=Scenario(self.speeds or (1.0,) * self.workers))
        return len(self.history.loss) * self.batch / (time.perf_counter() - started)


class Sync:
    """SyncTrainer on both devices, ``batch`` examples a replica, already traced."""

    def __init__(self, jit_compile, batch, steps_per_call, stragglers=None, replicas=2):
        self.x, self.y = data()
        self.batch, self.steps_per_call = replicas * batch, steps_per_call
        strategy = sync_strategy(replicas)
        with strategy.scope():
            model = big_model()
        trainer_class = InstrumentedSyncTrainer if stragglers else SyncTrainer  # no timestamps
        self.trainer = trainer_class(model, strategy, learning_rate=1e-3, progress=False,
                                     jit_compile=jit_compile,
                                     **({"scenario": Scenario(tuple(
                                         1 / stragglers.get(r, 1) for r in range(replicas)))}
                                        if stragglers else {}))
        self._fit(2 * steps_per_call)
        started = time.perf_counter()
        self._fit(steps_per_call)
        self.step_seconds = (time.perf_counter() - started) / steps_per_call

    def _fit(self, steps):
        return self.trainer.fit(self.x, self.y, steps=steps, batch_size=self.batch,
                                steps_per_call=self.steps_per_call)

    def examples_per_second(self, seconds):
        calls = self.calls = max(1, round(seconds / (self.step_seconds * self.steps_per_call)))
        started = time.perf_counter()
        self._fit(calls * self.steps_per_call)
        elapsed = time.perf_counter() - started
        self.step_seconds = elapsed / (calls * self.steps_per_call)
        return calls * self.steps_per_call * self.batch / elapsed


def bare_rate(trainer, seconds):
    """Gradient computations per second of the trainer's workers with nothing shared:
    no lock, no reads, no updates.  What the machine allows at this moment."""
    parameters = trainer._read(0.0).parameters
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


def alternate(contenders, rounds, seconds):
    """Examples per second of each contender in every round, rounds interleaved."""
    rates = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, contender in contenders.items():
            rates[name].append(contender.examples_per_second(seconds))
    return rates


def show(rates, unit="examples/s"):
    for name, values in rates.items():
        print(f"    {name:34s} {np.median(values):9.0f} {unit} "
              f"(median of {', '.join(f'{v:.0f}' for v in values)})")


def mode_name(jit_compile):
    return "XLA" if jit_compile else "plain TF"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="seconds of training per contender and part, over all rounds")
    parser.add_argument("--batch", type=int, default=256, help="examples per device and step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps-per-call", type=int, default=10,
                        help="SyncTrainer steps a tf.function call")
    args = parser.parse_args()
    batch, rounds, seconds = args.batch, args.rounds, args.seconds / args.rounds
    limit = (SLOW * (2 - 1) + 1) / 2
    results = {}

    print(describe_machine(DEVICES))
    print(f"intra-op threads: {tf.config.threading.get_intra_op_parallelism_threads()}; "
          f"batch {batch} a device; SyncTrainer: {args.steps_per_call} steps a call; "
          f"{rounds} rounds of {seconds:.1f} s a contender")

    print("\n1. free-running asynchronous workers, equal devices")
    asyncs, ones = {}, {}
    for jit in (True, False):
        one, two = Async(1, jit, batch), Async(2, jit, batch)
        asyncs[jit], ones[jit] = two, one
        rates, bare = {1: [], 2: []}, {1: [], 2: []}
        for _ in range(rounds):
            for workers, contender in ((1, one), (2, two)):
                rates[workers].append(contender.examples_per_second(seconds) / batch)
                bare[workers].append(bare_rate(contender.trainer, seconds / 2))
        ratio = np.median(rates[2]) / np.median(rates[1])
        ceiling = np.median(bare[2]) / np.median(bare[1])
        if jit:
            results["async_2_vs_1"], results["async_2_vs_1_limit"] = ratio, ceiling
        print(f"  AsyncTrainer(jit_compile={jit}), {mode_name(jit)}:")
        show({"1 worker": rates[1], "2 workers": rates[2]}, "updates/s")
        print(f"    2 workers / 1 worker = {ratio:.2f}x"
              + (f" ({verdict(ratio, 1.9)})" if jit else " (for comparison)")
              + f"; best round {max(b / a for a, b in zip(rates[1], rates[2])):.2f}x; "
              f"mean staleness with 2: {two.history.staleness.mean():.2f}")
        print(f"    the machine's ceiling now, bare gradient computations in 1 and 2 threads: "
              f"{np.median(bare[1]):.1f} and {np.median(bare[2]):.1f} a second = "
              f"{ceiling:.2f}x, the limit of 2 workers / 1 on this machine now (2.00x: a core each)")

    print("\n2. equal devices: synchronous against asynchronous, examples per second")
    syncs = {}
    for jit in (True, False):
        syncs[jit] = Sync(jit, batch, args.steps_per_call)
        rates = alternate({"async, 2 workers": asyncs[jit], "SyncTrainer, 2 replicas": syncs[jit]},
                          rounds, seconds)
        ratio = np.median(rates["SyncTrainer, 2 replicas"]) / np.median(rates["async, 2 workers"])
        print(f"  both {mode_name(jit)}, {batch} examples a device and step:")
        show(rates)
        print(f"    sync / async = {ratio:.2f}x examples/s"
              + (f" ({verdict(ratio, 0.9)})" if jit else " (for comparison)"))
        if jit:
            results["sync_vs_async_examples"] = ratio

    print(f"\n3. device 1 made {SLOW:g}x slower, busy on its core (async: it works {SLOW - 1:g}x as "
          f"long again as it computed; sync: it computes its gradients {SLOW:g} times a step); "
          "equal devices again in the same rounds")
    kept_async, kept_sync = (2 - 1 + 1 / SLOW) / 2, 1 / SLOW
    for jit in (True, False):
        slow_async = Async(2, jit, batch, speeds=[1.0, 1.0 / SLOW])
        rates = alternate({"async, 2 workers, equal": asyncs[jit],
                           "async, 2 workers, one slow": slow_async,
                           "SyncTrainer, equal": syncs[jit],
                           "SyncTrainer, one slow": Sync(jit, batch, args.steps_per_call,
                                                         stragglers={1: SLOW})},
                          rounds, seconds)
        ceiling = np.median([bare_rate(asyncs[jit].trainer, seconds / 2) for _ in range(2)]) / \
            np.median([bare_rate(ones[jit].trainer, seconds / 2) for _ in range(2)])
        median = {name: np.median(values) for name, values in rates.items()}
        ratio = median["async, 2 workers, one slow"] / median["SyncTrainer, one slow"]
        async_kept = median["async, 2 workers, one slow"] / median["async, 2 workers, equal"]
        sync_kept = median["SyncTrainer, one slow"] / median["SyncTrainer, equal"]
        history = slow_async.history
        shares = np.bincount(history.worker, minlength=2) / len(history.worker)
        print(f"  both {mode_name(jit)}:")
        show(rates)
        print(f"    async updates by device: {shares[0]:.0%} / {shares[1]:.0%}; mean staleness "
              f"of the slow device {history.staleness[history.worker == 1].mean():.2f}")
        print(f"    of its equal-devices rate, async keeps {async_kept:.2f} (with a core a device: "
              f"{kept_async:.2f}), sync keeps {sync_kept:.2f} (with a core a device: {kept_sync:.2f})")
        flag = ("within the limit" if ratio <= limit else
                "ABOVE THE LIMIT: the two sides were not measured alike (a bug in the benchmark), "
                "or the devices did not have a core each (ceiling below 2x)")
        print(f"    async / sync = {ratio:.2f}x examples/s; limit (s(N-1)+1)/N = {limit:.2f}x: {flag}")
        print(f"    the machine's ceiling now, bare gradient computations in 2 threads / 1: "
              f"{ceiling:.2f}x (2.00x: a core a device)")
        if jit:
            results["straggler_async_vs_sync"] = ratio
    results["straggler_limit"] = limit

    print(f"\n4. the synchronous straggler alone: one replica, {SLOW:g}x straggler against none")
    for jit in (True, False):
        alone = {"SyncTrainer, 1 replica": Sync(jit, batch, args.steps_per_call, replicas=1),
                 f"SyncTrainer, 1 replica, {SLOW:g}x straggler":
                     Sync(jit, batch, args.steps_per_call, stragglers={0: SLOW}, replicas=1)}
        rates, cpu = {name: [] for name in alone}, {name: [] for name in alone}
        for _ in range(rounds):  # interleaved, with the CPU time each step costs
            for name, contender in alone.items():
                started = time.process_time()
                rates[name].append(contender.examples_per_second(seconds))
                steps = contender.calls * contender.steps_per_call
                cpu[name].append((time.process_time() - started) / steps)
        first, second = (np.median(values) for values in rates.values())
        factor = first / second
        cpu_factor = np.median(list(cpu.values())[1]) / np.median(list(cpu.values())[0])
        print(f"  {mode_name(jit)}:")
        show(rates)
        print(f"    the straggler's step takes {factor:.2f}x as long and {cpu_factor:.2f}x the CPU "
              f"time (asked for: {SLOW:g}x; the CPU time does not depend on the machine's load, "
              f"and a step's launch and update are not repeated)")
        if jit:
            results["straggler_step_factor"], results["straggler_cpu_factor"] = factor, cpu_factor

    print(f"\nload average at the end: {describe_machine(DEVICES).split('load average ')[1].split(';')[0]}")
    print(result_line(**results))


if __name__ == "__main__":
    main()
