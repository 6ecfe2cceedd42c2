"""The measured (free-running) race of the chapter "Sync vs async in the same time".

Runs every method of ``pargrad.race.METHODS`` in every scenario of
``pargrad.race.SCENARIOS`` on 4 logical CPU devices, several seeds each,
on the wall clock: real threads for ``AsyncTrainer``, a real
``MirroredStrategy`` step for ``SyncTrainer``, each device's step stretched
by sleeping to ``--step-ms`` times its ``(1 + delay) / speed`` (emulated
devices: four logical devices on two cores cannot compute side by side).
Writes the test accuracy and loss at each checkpoint, the time-to-target
table and a description of the machine to ``pargrad/book/data/sync_vs_async.json``,
which the chapter reads.  Every contender is warmed up the same way before
its clock starts (``pargrad.race.WARM_UP_STEPS`` untimed steps on the same
arrays, then the weights are reset), so no run pays for tracing on the clock.
At the end it checks the chapter's claims (``pargrad.race.wall_clock_claims``)
and exits with an error if one fails.

Run with ``.venv/bin/python benchmarks/sync_vs_async.py``: 3 scenarios x 5
methods x 3 seeds x ``--seconds`` (default 6) plus start-up, about 10
minutes.  The numbers depend on the machine and on what else runs on it.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import time

import pargrad
from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()
tf.config.threading.set_intra_op_parallelism_threads(1)  # before TensorFlow starts
# Each emulated device sleeps inside the synchronous step, on TensorFlow's
# inter-op threads; with the default (one a core) four replicas' sleeps would
# take turns on two threads.  Enough threads let all four sleep at once.
tf.config.threading.set_inter_op_parallelism_threads(8)
DEVICES = pargrad.logical_devices(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from pargrad.book import race  # noqa: E402

OUTPUT = pathlib.Path(__file__).resolve().parent.parent / "pargrad" / "book" / "data" / "sync_vs_async.json"
VIRTUAL_OUTPUT = OUTPUT.with_name("sync_vs_async_virtual.json")
# The learning-rate grids of the sweep behind race.METHODS' rates (equal devices).
RATES = {"sync": (0.2, 0.4, 0.8, 1.6, 3.2), "async": (0.05, 0.1, 0.2, 0.4, 0.8)}


def machine():
    """What the numbers were measured on."""
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    model = ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(),
            "system": platform.platform(), "python": sys.version.split()[0],
            "tensorflow": tf.__version__, "keras": keras.__version__,
            "load_average_at_start": load,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def rounded(result):
    return {key: (np.round(np.asarray(value, float), 4).tolist() if key in
                  ("time", "accuracy", "loss") else
                  np.asarray(value).tolist() if isinstance(value, np.ndarray) else value)
            for key, value in result.items()}


TARGETS = (0.90, 0.93)  # two test accuracies below the plateau (about 96 %) of every method
SWEEP_STEP = 2 ** 0.5   # the rate grids: factors of sqrt(2)
# Each method's first grid, centred on the rate it had before (the grid grows
# by a step on a side whenever its best rate lies at that edge).
FIRST_GRIDS = {name: [options["learning_rate"] * SWEEP_STEP ** k for k in (-2, -1, 0, 1, 2)]
               for name, options in {**race.METHODS, **race.CONTROLS}.items()}


def virtual(arguments):
    """The race on the virtual clock: every method swept, then run on many seeds.

    For each method (on equal devices): a sweep of learning rates on the
    tuning seeds, scored by the median time to the higher target
    (``pargrad.book.experiments.sweep``, which insists that the best rate
    lies inside the grid; the grid grows until it does).  Then every method at
    its best rate in every scenario on ``--seeds`` other seeds.  Deterministic
    (seeded), so the file it writes can be checked: the chapter re-runs some
    of these races live and compares.
    """
    from pargrad.book import experiments

    data = race.digits_data(seed=0)
    options = dict(budget=arguments.budget, every=arguments.virtual_every, data=data,
                   devices=DEVICES)
    started = time.perf_counter()
    target = max(TARGETS)

    def log(result):
        reached = [race.digits_time_to_target(result, t) for t in TARGETS]
        print(f"{time.perf_counter() - started:6.0f} s  {result['scenario']:22s} "
              f"{result['method']:26s} seed {result['seed']}: {TARGETS} at {reached}", flush=True)
        return result

    tuning = list(range(100, 100 + arguments.sweep_seeds))
    sweep, best = [], {}
    for name in FIRST_GRIDS:
        grid = list(FIRST_GRIDS[name])
        ran = {}

        def run(rate, seeds, name=name):
            times = []
            for seed in seeds:
                key = (round(rate, 6), int(seed))
                if key not in ran:
                    result = log(race.race(name, "equal devices", seed=int(seed),
                                           learning_rate=rate, **options))
                    ran[key] = result
                    sweep.append({**result, "learning_rate": rate})
                times.append(race.digits_time_to_target(ran[key], target))
            return times

        for _ in range(4):
            try:
                best[name] = experiments.sweep(experiments.Method(name, run, grid), tuning).best
                break
            except ValueError as error:
                if "smaller" in str(error):
                    grid.insert(0, grid[0] / SWEEP_STEP)
                elif "larger" in str(error):
                    grid.append(grid[-1] * SWEEP_STEP)
                else:
                    raise
        else:
            sys.exit(f"{name}: no interior optimum in {grid}")
        print(f"{name}: best rate {best[name]:.4g} of {[round(r, 4) for r in grid]}", flush=True)
    results = []
    for scenario in race.SCENARIOS:
        methods = list(race.METHODS) + (list(race.CONTROLS) if scenario == "equal devices" else [])
        for method in methods:
            for seed in range(arguments.seeds):
                result = log(race.race(method, scenario, seed=seed,
                                       learning_rate=best[method], **options))
                results.append({**result, "learning_rate": best[method]})
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps({
        "script": "benchmarks/sync_vs_async.py --clock virtual",
        "settings": {"budget": arguments.budget, "every": arguments.virtual_every,
                     "seeds": arguments.seeds, "tuning_seeds": tuning,
                     "targets": list(TARGETS), "sweep_target": target,
                     "batch_size": race.BATCH_SIZE, "best_rates": best,
                     "methods": {**race.METHODS, **race.CONTROLS}},
        "sweep": [rounded(r) for r in sweep],
        "results": [rounded(r) for r in results],
    }, indent=None) + "\n")
    print(f"wrote {arguments.output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clock", choices=("wall", "virtual"), default="wall",
                        help="the measured race (default) or the virtual-clock sweep")
    parser.add_argument("--budget", type=float, default=80.0, help="virtual: time units a run")
    parser.add_argument("--virtual-every", type=float, default=5.0,
                        help="virtual: time units between checkpoints")
    parser.add_argument("--sweep-seeds", type=int, default=3,
                        help="virtual: seeds of each learning rate in the sweep")
    parser.add_argument("--seconds", type=float, default=6.0, help="wall-clock budget of each run")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between checkpoints")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="milliseconds of one emulated device step at speed 1")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds of each (scenario, method): 3 on the wall clock, 20 virtual")
    parser.add_argument("--target", type=float, default=race.TARGET)
    parser.add_argument("--output", type=pathlib.Path, default=None)
    arguments = parser.parse_args()
    if arguments.clock == "virtual":
        arguments.seeds = arguments.seeds or 20
        arguments.output = arguments.output or VIRTUAL_OUTPUT
        return virtual(arguments)
    arguments.seeds = arguments.seeds or 3
    arguments.output = arguments.output or OUTPUT

    data = race.digits_data(seed=0)
    step_seconds = arguments.step_ms / 1000
    about = machine()
    print(f"{about['cpu']}, {about['cores']} cores, load {about['load_average_at_start']}; "
          f"TensorFlow {about['tensorflow']}", flush=True)
    results = []
    started = time.perf_counter()
    for scenario in race.SCENARIOS:
        for method in race.METHODS:
            for seed in range(arguments.seeds):
                result = race.race(method, scenario, seed=seed, budget=arguments.seconds,
                                   every=arguments.every, mode="free-running",
                                   step_seconds=step_seconds, devices=DEVICES, data=data)
                results.append(result)
                reached = race.digits_time_to_target(result, arguments.target)
                print(f"{time.perf_counter() - started:6.0f} s  {scenario:22s} {method:24s} "
                      f"seed {seed}: {result['updates'][-1]:5d} updates, final accuracy "
                      f"{result['accuracy'][-1]:.3f}, {arguments.target:.0%} after {reached:.2f} s",
                      flush=True)
    table = race.time_to_target_table(results, arguments.target)
    print(race.format_table(table, unit="seconds, wall clock", digits=2))
    # The chapter's claims, checked on this measurement: a new machine can refute them.
    claims = race.wall_clock_claims(table, tie=arguments.every)
    for claim, holds in claims.items():
        print(f"{'holds ' if holds else 'FAILS '} {claim}")
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps({
        "script": "benchmarks/sync_vs_async.py",
        "machine": about,
        "settings": {"seconds": arguments.seconds, "every": arguments.every,
                     "step_seconds": step_seconds, "seeds": arguments.seeds,
                     "target": arguments.target, "batch_size": race.BATCH_SIZE,
                     "methods": race.METHODS,
                     "scenarios": {name: vars(s) for name, s in race.SCENARIOS.items()}},
        "claims": claims,
        "results": [rounded(r) for r in results],
    }, indent=1) + "\n")
    print(f"wrote {arguments.output}")
    if not all(claims.values()):
        sys.exit("Some of the chapter's claims do not hold on this measurement (FAILS above): "
                 "the chapter's text must change with them.")


if __name__ == "__main__":
    main()
