"""The races of the chapter "Sync vs async in the same time", stored for the chapter.

``--clock virtual``: every method of ``pargrad.book.race`` swept in every
scenario on the virtual clock (rates a factor 2^(1/4) apart, the grid grown
until the best lies inside it, on 10 tuning seeds, scored by the median time
to the higher target), then run at its best rate *in that scenario* on 30
other seeds; writes ``pargrad/book/data/sync_vs_async_virtual.json``, with
how long it took and the machine's load.  Deterministic; the (scenario,
method) pairs are shared among ``--jobs`` processes (2); ``--cache DIR``
keeps each finished pair, so an interrupted run resumes.  ``--first-seed
1000 --first-tuning-seed 1100 --output .../sync_vs_async_virtual_held_out.json``
makes the held-out file, swept again on its own tuning seeds.  Each stored
file took about 85 minutes in 2 processes, the two made at once on two cores
shared with other work (each file records its time and load).

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


def rounded(result):
    return {key: (np.round(np.asarray(value, float), 4).tolist() if key in
                  ("time", "accuracy", "loss") else
                  np.asarray(value).tolist() if isinstance(value, np.ndarray) else value)
            for key, value in result.items()}


TARGETS = race.TARGETS  # two test accuracies below the plateau (about 96 %) of every method
SWEEP_STEP = 2 ** 0.25  # the rate grids: factors of 2^(1/4), about 1.19
# Each scenario's time budget: long enough for every method, plain synchronous
# training behind a 3x slower device included, to reach the higher target, so
# that every method can be swept in every scenario by its time to that target.
BUDGETS = {"equal devices": 80.0, "one device 3x slower": 240.0, "heavy-tailed delays": 160.0}
# Where each method's first grid is centred: its best rate on equal devices in
# the sweep before this one (the grid grows a step on a side whenever the best
# rate lies at that edge, so the centre only saves runs).
CENTRES = {"sync": 0.4, "sync, 1 backup": 0.566, "async": 0.2, "async, staleness-aware": 0.8,
           "async, bound 2": 0.2, "sequential, no staleness": 0.283}
FIRST_GRID = range(-3, 4)  # exponents k of centre * SWEEP_STEP**k
MAX_GROWTH = 12            # steps the grid may grow before the sweep gives up


def methods_of(scenario):
    """The methods raced in ``scenario``: every method, and the control on equal devices."""
    return list(race.METHODS) + (list(race.CONTROLS) if scenario == "equal devices" else [])


def tune_and_race(scenario, method, budget, every, tuning, seeds):
    """One (scenario, method): its own rate sweep on ``tuning``, then ``seeds`` at the best rate.

    The sweep scores a rate by the median time to the higher target over the
    tuning seeds (``pargrad.book.experiments.sweep``, which refuses a best rate
    at the edge of the grid; the grid grows until it lies inside).  Returns
    ``(sweep entries, grid, best rate, results)``.  Runs in a worker process.
    """
    from pargrad.book import experiments

    data = race.digits_data(seed=0)
    options = dict(budget=budget, every=every, data=data, devices=DEVICES)
    target = max(TARGETS)
    ran = {}

    def run(rate, run_seeds):
        times = []
        for seed in run_seeds:
            key = (round(rate, 6), int(seed))
            if key not in ran:
                result = race.race(method, scenario, seed=int(seed), learning_rate=rate, **options)
                ran[key] = [race.digits_time_to_target(result, t) for t in TARGETS]
            times.append(ran[key][TARGETS.index(target)])
        return times

    exponents = list(FIRST_GRID)
    for _ in range(MAX_GROWTH):
        grid = [CENTRES[method] * SWEEP_STEP ** k for k in exponents]
        try:
            best = experiments.sweep(experiments.Method(method, run, grid), tuning).best
            break
        except ValueError as error:
            if "smaller" in str(error):
                exponents.insert(0, exponents[0] - 1)
            elif "larger" in str(error):
                exponents.append(exponents[-1] + 1)
            else:
                raise
    else:
        raise RuntimeError(f"{scenario}, {method}: no interior optimum in {grid}")
    sweep = [{"scenario": scenario, "method": method, "learning_rate": rate, "seed": seed,
              "time_to_target": [None if t == float("inf") else round(t, 4) for t in times]}
             for (rate, seed), times in sorted(ran.items())]
    results = [{**rounded(race.race(method, scenario, seed=seed, learning_rate=best, **options)),
                "learning_rate": best} for seed in seeds]
    return sweep, grid, best, results


def virtual(arguments):
    """The race on the virtual clock: every method swept in every scenario, then run on many seeds.

    For each scenario and method: a sweep of learning rates on the tuning
    seeds (:func:`tune_and_race`), then the method at its best rate *in that
    scenario* on ``--seeds`` other seeds.  The (scenario, method) pairs are
    shared among ``--jobs`` processes.  Deterministic (seeded), so the file it
    writes can be checked: the chapter re-runs some of these races live.
    """
    import concurrent.futures
    import datetime
    import multiprocessing
    import os

    started, load_before = time.perf_counter(), [round(v, 2) for v in os.getloadavg()]
    tuning = list(range(arguments.first_tuning_seed, arguments.first_tuning_seed
                        + arguments.sweep_seeds))
    seeds = list(range(arguments.first_seed, arguments.first_seed + arguments.seeds))
    if set(tuning) & set(seeds):
        raise SystemExit(f"the tuning seeds {tuning} and the seeds {seeds} overlap; pass "
                         "--first-tuning-seed beyond the seeds.")
    tasks = [(scenario, method) for scenario in race.SCENARIOS for method in methods_of(scenario)]
    # The slow scenarios first: the longest tasks start early.
    tasks.sort(key=lambda task: -BUDGETS[task[0]])
    sweep, grids, best, results = [], {}, {}, {}
    done = {}
    if arguments.cache:  # tasks finished by an earlier, interrupted run
        arguments.cache.mkdir(parents=True, exist_ok=True)
        for scenario, method in tasks:
            path = arguments.cache / f"{scenario}-{method}.json".replace(" ", "_")
            if path.exists():
                done[scenario, method] = json.loads(path.read_text())
    with concurrent.futures.ProcessPoolExecutor(
            arguments.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(tune_and_race, scenario, method, BUDGETS[scenario],
                               arguments.virtual_every, tuning, seeds): (scenario, method)
                   for scenario, method in tasks if (scenario, method) not in done}
        for future in concurrent.futures.as_completed(futures):
            scenario, method = futures[future]
            done[scenario, method] = future.result()
            if arguments.cache:
                path = arguments.cache / f"{scenario}-{method}.json".replace(" ", "_")
                path.write_text(json.dumps(done[scenario, method]))
            grid, rate = done[scenario, method][1:3]
            print(f"{time.perf_counter() - started:6.0f} s  {scenario:22s} {method:26s} best rate "
                  f"{rate:.4g} of {[round(r, 4) for r in grid]}", flush=True)
    for (scenario, method), (runs, grid, rate, races) in done.items():
        sweep += runs
        grids.setdefault(scenario, {})[method] = grid
        best.setdefault(scenario, {})[method] = rate
        results[scenario, method] = races
    ordered = [run for scenario, method in ((s, m) for s in race.SCENARIOS for m in methods_of(s))
               for run in results[scenario, method]]
    sweep.sort(key=lambda r: (list(race.SCENARIOS).index(r["scenario"]), r["method"],
                              r["learning_rate"], r["seed"]))
    seconds = time.perf_counter() - started
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps({
        "script": (f"benchmarks/sync_vs_async.py --clock virtual --jobs {arguments.jobs} "
                   f"--virtual-every {arguments.virtual_every:g} --first-seed {arguments.first_seed} "
                   f"--first-tuning-seed {arguments.first_tuning_seed}"),
        "run": {"seconds": round(seconds), "jobs": arguments.jobs, "cores": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": [round(v, 2) for v in os.getloadavg()],
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")},
        "settings": {"budgets": BUDGETS, "every": arguments.virtual_every,
                     "seeds": arguments.seeds, "seed_list": seeds, "tuning_seeds": tuning,
                     "targets": list(TARGETS), "sweep_target": max(TARGETS),
                     "grid_step": SWEEP_STEP, "batch_size": race.BATCH_SIZE,
                     "best_rates": {s: {m: best[s][m] for m in methods_of(s)}
                                    for s in race.SCENARIOS},
                     "grids": {s: {m: grids[s][m] for m in methods_of(s)} for s in race.SCENARIOS},
                     "methods": {**race.METHODS, **race.CONTROLS}},
        "sweep": sweep,
        "results": ordered,
    }, indent=None) + "\n")
    print(f"wrote {arguments.output} in {seconds:.0f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clock", choices=("wall", "virtual"), default="wall",
                        help="the measured race (default) or the virtual-clock sweep")
    parser.add_argument("--virtual-every", type=float, default=1.0,
                        help="virtual: time units between checkpoints (fine, so that the times "
                             "to a target of two rates rarely tie)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="virtual: the first of the --seeds seeds (1000: a held-out set)")
    parser.add_argument("--first-tuning-seed", type=int, default=100,
                        help="virtual: the first tuning seed (1100 for a held-out set)")
    parser.add_argument("--sweep-seeds", type=int, default=10,
                        help="virtual: tuning seeds of each learning rate in the sweep")
    parser.add_argument("--jobs", type=int, default=2,
                        help="virtual: processes sharing the (scenario, method) sweeps")
    parser.add_argument("--cache", type=pathlib.Path, default=None,
                        help="virtual: a folder keeping each finished (scenario, method), reused "
                             "by a later run (resumes an interrupted sweep)")
    parser.add_argument("--seconds", type=float, default=3.5, help="wall-clock budget of each run")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between checkpoints")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="milliseconds of one emulated device step at speed 1")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds of each (scenario, method): 6 on the wall clock, 30 virtual")
    parser.add_argument("--output", type=pathlib.Path, default=None)
    parser.add_argument("--allow-load", action="store_true",
                        help="wall clock: measure even on a busy machine (provisional)")
    arguments = parser.parse_args()
    if arguments.clock == "virtual":
        arguments.seeds = arguments.seeds or 30
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
