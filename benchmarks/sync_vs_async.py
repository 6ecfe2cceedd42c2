"""The races of the chapter "Sync vs async in the same time", stored for the chapter.

``--clock virtual``: every method of ``pargrad.book.race`` swept in every
scenario on the virtual clock (rates a factor 2^(1/4) apart, on 10 tuning
seeds, scored by the median time to the higher target; medians within one
checkpoint interval tie, and the grid grows until the plateau lies inside
it), then run at its best rate *in that scenario* on 30 other seeds; writes ``pargrad/book/data/sync_vs_async_virtual.json``, with
how long it took and the machine's load.  Deterministic; the (scenario,
method) pairs are shared among ``--jobs`` processes (2); ``--cache DIR``
keeps each finished pair, so an interrupted run resumes.  ``--first-seed
1000 --first-tuning-seed 1100 --output .../sync_vs_async_virtual_held_out.json``
makes the held-out file, swept again on its own tuning seeds.  Each stored
file took about 85 minutes in 2 processes, the two made at once on two cores
shared with other work (each file records its time and load).
``--extend`` reuses the runs of the ``--output`` file and makes only those
it lacks: the rates a grid needs under the current rule and, with
``--density 2``, the midpoints of the density check (the rates halfway
between the four gaps nearest each best, and the races at a best they
move); ``--only 'scenario/method'`` limits it to some pairs.  Extending
the two files with ``--density 2`` took about 48 minutes each for 14 and
13 of the 16 pairs, the two at once on two cores shared with other work
(load average 4 to 7); the last three pairs (the staleness-aware rate
with equal devices and with the slow device, bounded staleness with equal
devices) took 5 and 9 minutes with ``--jobs 1``, the two files at once.
Each file records every extension with its load.

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


def tune_and_race(scenario, method, budget, every, tuning, seeds, known=None, density=1):
    """One (scenario, method): its own rate sweep on ``tuning``, then ``seeds`` at the best rate.

    The sweep scores a rate by the median time to the higher target over the
    tuning seeds (``pargrad.book.experiments.sweep``; medians within one
    checkpoint interval ``every`` tie, the resolution the methods page
    states, and the sweep refuses a plateau at an edge of the grid; the grid
    grows until it lies inside).  ``known`` (from ``--extend``): the grid,
    the sweep runs and the races a stored file already holds, reused rather
    than run again.  With ``density=2``, the rates are then swept again
    twice as dense around the best (``experiments.denser``: the midpoints of
    the four gaps nearest it), and the seeds are raced at that sweep's best
    too when it differs.  Returns ``(sweep entries, grid, best rate,
    results, dense sweep entries, dense best rate, dense results)``.  Runs
    in a worker process.
    """
    from pargrad.book import experiments

    data = race.digits_data(seed=0)
    options = dict(budget=budget, every=every, data=data, devices=DEVICES)
    target = max(TARGETS)
    known = known or {}
    ran = {(round(rate, 6), seed): times for (rate, seed), times in known.get("sweep", {}).items()}
    raced = {(round(rate, 6), seed): r for (rate, seed), r in known.get("results", {}).items()}
    fresh = set()

    def run(rate, run_seeds):
        times = []
        for seed in run_seeds:
            key = (round(rate, 6), int(seed))
            if key not in ran:
                result = race.race(method, scenario, seed=int(seed), learning_rate=rate, **options)
                ran[key] = [race.digits_time_to_target(result, t) for t in TARGETS]
                fresh.add(key)
            times.append(ran[key][TARGETS.index(target)])
        return times

    def race_at(rate):
        out = []
        for seed in seeds:
            key = (round(rate, 6), int(seed))
            if key not in raced:
                raced[key] = {**rounded(race.race(method, scenario, seed=seed, learning_rate=rate,
                                                  **options)), "learning_rate": rate}
            out.append(raced[key])
        return out

    grid = list(known["grid"]) if "grid" in known else [
        CENTRES[method] * SWEEP_STEP ** k for k in FIRST_GRID]
    for _ in range(MAX_GROWTH):
        swept = experiments.Method(method, run, grid, resolution=every, step=None)
        try:
            best = experiments.sweep(swept, tuning).best
            break
        except ValueError as error:
            if "smaller" in str(error):
                grid.insert(0, grid[0] / SWEEP_STEP)
            elif "larger" in str(error):
                grid.append(grid[-1] * SWEEP_STEP)
            else:
                raise
    else:
        raise RuntimeError(f"{scenario}, {method}: no interior optimum in {grid}")
    on_grid = {round(rate, 6) for rate in grid}

    def entries(keep):
        return [{"scenario": scenario, "method": method, "learning_rate": rate, "seed": seed,
                 "time_to_target": [None if t == float("inf") else round(t, 4) for t in times]}
                for (rate, seed), times in sorted(ran.items()) if keep(rate)]

    results = race_at(best)
    dense, dense_best, dense_results = [], None, []
    if density == 2:
        dense_best = experiments.sweep(experiments.denser(swept, best), tuning).best
        if round(dense_best, 6) != round(best, 6):
            dense_results = race_at(dense_best)
        dense = entries(lambda rate: rate not in on_grid)
    return (entries(lambda rate: rate in on_grid), grid, best, results, dense, dense_best,
            dense_results)


def known_runs(stored, scenario, method):
    """What a stored file holds of one (scenario, method): its grid, sweep runs and races
    (no grid where the file does not hold the pair: the sweep starts from the first grid)."""
    pick = lambda r: (r["scenario"], r["method"]) == (scenario, method)  # noqa: E731
    inf = float("inf")
    sweep = {(r["learning_rate"], r["seed"]): [inf if t is None else t for t in r["time_to_target"]]
             for r in stored["sweep"] + stored.get("dense_sweep", []) if pick(r)}
    results = {(r["learning_rate"], r["seed"]): r
               for r in stored["results"] + stored.get("dense_results", []) if pick(r)}
    grid = stored["settings"]["grids"].get(scenario, {}).get(method)
    return {**({"grid": grid} if grid is not None else {}), "sweep": sweep, "results": results}


def virtual(arguments):
    """The race on the virtual clock: every method swept in every scenario, then run on many seeds.

    For each scenario and method: a sweep of learning rates on the tuning
    seeds (:func:`tune_and_race`), then the method at its best rate *in that
    scenario* on ``--seeds`` other seeds.  The (scenario, method) pairs are
    shared among ``--jobs`` processes.  Deterministic (seeded), so the file it
    writes can be checked: the chapter re-runs some of these races live.
    With ``--extend``, the output file's runs are reused, only the pairs
    named by ``--only`` are swept again (the others are copied), and only
    the runs the file lacks are made.
    """
    import concurrent.futures
    import datetime
    import multiprocessing
    import os

    started, load_before = time.perf_counter(), [round(v, 2) for v in os.getloadavg()]
    previous = json.loads(arguments.output.read_text()) if arguments.extend else None
    if previous:
        tuning, seeds = previous["settings"]["tuning_seeds"], previous["settings"]["seed_list"]
    else:
        tuning = list(range(arguments.first_tuning_seed, arguments.first_tuning_seed
                            + arguments.sweep_seeds))
        seeds = list(range(arguments.first_seed, arguments.first_seed + arguments.seeds))
    if set(tuning) & set(seeds):
        raise SystemExit(f"the tuning seeds {tuning} and the seeds {seeds} overlap; pass "
                         "--first-tuning-seed beyond the seeds.")
    tasks = [(scenario, method) for scenario in race.SCENARIOS for method in methods_of(scenario)]
    # The slow scenarios first: the longest tasks start early.
    tasks.sort(key=lambda task: -BUDGETS[task[0]])
    chosen = tasks if not arguments.only else [  # in the order given
        tuple(only.split("/", 1)) for only in arguments.only]
    unknown = set(chosen) - set(tasks)
    if unknown:
        raise SystemExit(f"--only names no (scenario, method) of the race: {sorted(unknown)}.")
    sweep, dense_sweep, grids, best, dense_best, results, dense_results = [], [], {}, {}, {}, {}, {}
    done = {}
    if previous:  # the pairs not chosen: as the file holds them (a file may hold only some)
        held = previous["settings"]["grids"]
        for scenario, method in tasks:
            if (scenario, method) not in chosen and method in held.get(scenario, {}):
                pick = lambda r: (r["scenario"], r["method"]) == (scenario, method)  # noqa: E731
                done[scenario, method] = (
                    [r for r in previous["sweep"] if pick(r)],
                    previous["settings"]["grids"][scenario][method],
                    previous["settings"]["best_rates"][scenario][method],
                    [r for r in previous["results"] if pick(r)],
                    [r for r in previous.get("dense_sweep", []) if pick(r)],
                    previous["settings"].get("dense_best_rates", {}).get(scenario, {}).get(method),
                    [r for r in previous.get("dense_results", []) if pick(r)])
    if arguments.cache:  # tasks finished by an earlier, interrupted run
        arguments.cache.mkdir(parents=True, exist_ok=True)
        for scenario, method in chosen:
            path = arguments.cache / f"{scenario}-{method}.json".replace(" ", "_")
            if path.exists():
                done[scenario, method] = json.loads(path.read_text())
    with concurrent.futures.ProcessPoolExecutor(
            arguments.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(tune_and_race, scenario, method, BUDGETS[scenario],
                               arguments.virtual_every, tuning, seeds,
                               previous and known_runs(previous, scenario, method),
                               arguments.density): (scenario, method)
                   for scenario, method in chosen if (scenario, method) not in done}
        for future in concurrent.futures.as_completed(futures):
            scenario, method = futures[future]
            done[scenario, method] = future.result()
            if arguments.cache:
                path = arguments.cache / f"{scenario}-{method}.json".replace(" ", "_")
                path.write_text(json.dumps(done[scenario, method]))
            grid, rate = done[scenario, method][1:3]
            print(f"{time.perf_counter() - started:6.0f} s  {scenario:22s} {method:26s} best rate "
                  f"{rate:.4g} of {[round(r, 4) for r in grid]}; twice as dense: "
                  f"{done[scenario, method][5]}", flush=True)
    for (scenario, method), (runs, grid, rate, races, dense, dense_rate, dense_races) in done.items():
        sweep += runs
        dense_sweep += dense
        grids.setdefault(scenario, {})[method] = grid
        best.setdefault(scenario, {})[method] = rate
        if dense_rate is not None:
            dense_best.setdefault(scenario, {})[method] = dense_rate
        results[scenario, method] = races
        dense_results[scenario, method] = dense_races
    order = [(s, m) for s in race.SCENARIOS for m in methods_of(s) if (s, m) in done]
    ordered = [run for key in order for run in results[key]]
    dense_ordered = [run for key in order for run in dense_results[key]]
    for runs in (sweep, dense_sweep):
        runs.sort(key=lambda r: (list(race.SCENARIOS).index(r["scenario"]), r["method"],
                                 r["learning_rate"], r["seed"]))
    seconds = time.perf_counter() - started
    run = {"seconds": round(seconds), "jobs": arguments.jobs, "cores": os.cpu_count(),
           "load_average_before": load_before,
           "load_average_after": [round(v, 2) for v in os.getloadavg()],
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    script = (f"benchmarks/sync_vs_async.py --clock virtual --jobs {arguments.jobs} "
              f"--virtual-every {arguments.virtual_every:g} --first-seed {seeds[0]} "
              f"--first-tuning-seed {tuning[0]}")
    stored = {
        "script": script,
        "run": run,
        "settings": {"budgets": BUDGETS, "every": arguments.virtual_every,
                     "seeds": len(seeds), "seed_list": seeds, "tuning_seeds": tuning,
                     "targets": list(TARGETS), "sweep_target": max(TARGETS),
                     "grid_step": SWEEP_STEP, "batch_size": race.BATCH_SIZE,
                     "resolution": arguments.virtual_every,
                     "best_rates": {s: {m: best[s][m] for m in methods_of(s) if m in best[s]}
                                    for s in race.SCENARIOS if s in best},
                     "dense_best_rates": dense_best,
                     "grids": {s: {m: grids[s][m] for m in methods_of(s) if m in grids[s]}
                               for s in race.SCENARIOS if s in grids},
                     "methods": {**race.METHODS, **race.CONTROLS}},
        "sweep": sweep,
        "results": ordered,
        "dense_sweep": dense_sweep,
        "dense_results": dense_ordered,
    }
    if previous:  # what made the file before, and this extension
        extensions = previous["settings"].get("grid_extensions", {})
        for scenario, methods in grids.items():
            for method, grid in methods.items():
                before = {round(r, 6) for r in
                          previous["settings"]["grids"].get(scenario, {}).get(method, grid)}
                added = [r for r in grid if round(r, 6) not in before]
                if added:  # the rates a plateau tied at the resolution needed
                    extensions.setdefault(scenario, {})[method] = sorted(
                        extensions.get(scenario, {}).get(method, []) + added)
        stored["settings"]["grid_extensions"] = extensions
        stored["script"] = previous["script"]
        stored["run"] = previous["run"]
        stored["extensions"] = previous.get("extensions", []) + [{
            "script": f"{script} --extend --density {arguments.density} "
                      + " ".join(f"--only '{only}'" for only in arguments.only or []),
            **run}]
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(stored, indent=None) + "\n")
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
    parser.add_argument("--extend", action="store_true",
                        help="virtual: reuse the runs of the --output file, sweep again only the "
                             "pairs named by --only, and make only the runs it lacks")
    parser.add_argument("--only", action="append", default=None, metavar="SCENARIO/METHOD",
                        help="virtual, with --extend: a (scenario, method) to sweep again, as "
                             "'heavy-tailed delays/async'; repeat it (default: every pair)")
    parser.add_argument("--density", type=int, choices=(1, 2), default=1,
                        help="virtual: 2 also sweeps each method twice as dense around its "
                             "best rate (experiments.denser) and races the seeds at that best")
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
