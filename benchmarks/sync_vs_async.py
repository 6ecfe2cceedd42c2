"""The races of the chapter "Sync vs async in the same time", stored for the chapter.

``--clock virtual``: every method of ``pargrad.book.race`` swept on the
virtual clock (rates a factor sqrt 2 apart, the grid grown until the best
lies inside it, on tuning seeds), then run at its best rate in every scenario
on 20 other seeds; writes ``pargrad/book/data/sync_vs_async_virtual.json``.
Deterministic; about 20 minutes on two cores.

``--clock wall`` (the default): the measured race, delegated to
``tools/measure_race_sweep.py`` (one clock for every contender, the machine's
load stored, refused on a busy machine unless ``--allow-load``).
"""

import argparse
import json
import pathlib
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

import numpy as np  # noqa: E402

from pargrad.book import race  # noqa: E402

OUTPUT = pathlib.Path(__file__).resolve().parent.parent / "pargrad" / "book" / "data" / "sync_vs_async.json"
VIRTUAL_OUTPUT = OUTPUT.with_name("sync_vs_async_virtual.json")
# The learning-rate grids of the sweep behind race.METHODS' rates (equal devices).
RATES = {"sync": (0.2, 0.4, 0.8, 1.6, 3.2), "async": (0.05, 0.1, 0.2, 0.4, 0.8)}


def rounded(result):
    return {key: (np.round(np.asarray(value, float), 4).tolist() if key in
                  ("time", "accuracy", "loss") else
                  np.asarray(value).tolist() if isinstance(value, np.ndarray) else value)
            for key, value in result.items()}


TARGETS = race.TARGETS  # two test accuracies below the plateau (about 96 %) of every method
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
    parser.add_argument("--seconds", type=float, default=3.5, help="wall-clock budget of each run")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between checkpoints")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="milliseconds of one emulated device step at speed 1")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds of each (scenario, method): 6 on the wall clock, 20 virtual")
    parser.add_argument("--output", type=pathlib.Path, default=None)
    parser.add_argument("--allow-load", action="store_true",
                        help="wall clock: measure even on a busy machine (provisional)")
    arguments = parser.parse_args()
    if arguments.clock == "virtual":
        arguments.seeds = arguments.seeds or 20
        arguments.output = arguments.output or VIRTUAL_OUTPUT
        return virtual(arguments)
    # The wall clock: tools/measure_race_sweep.py measures and stores it (one
    # clock for every contender, the machine's load recorded, refused when busy).
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
    from measure_race_sweep import main as measure

    forwarded = [f"--seeds={arguments.seeds or 6}", f"--seconds={arguments.seconds}",
                 f"--every={arguments.every}", f"--step-ms={arguments.step_ms}"]
    if arguments.output:
        forwarded.append(f"--output={arguments.output}")
    return measure(forwarded + (["--allow-load"] if arguments.allow_load else []))


if __name__ == "__main__":
    main()
