"""Measure the wall-clock race of the chapter "Sync vs async in the same time" and store it.

    .venv/bin/python tools/measure_race_sweep.py            # on an idle machine
    .venv/bin/python tools/measure_race_sweep.py --allow-load  # a provisional file on a busy one

Runs plain synchronous training, synchronous training with one backup worker
and plain asynchronous training in each scenario of ``pargrad.book.race``,
``--seeds`` seeds each (6 by default), free-running on four logical CPU
devices, every run timed by one clock: the elapsed time around the whole
run, bookkeeping included (``pargrad.book.race``), each method at the best
rate of its sweep *in that scenario* on the virtual clock
(``sync_vs_async_virtual.json``).  Stores every seed's
checkpoints, its time to each target, the 1-minute load average before and
after each run, the machine (CPU model, cores, load average before and after
the whole sweep) and the settings in ``pargrad/book/data/sync_vs_async.json``,
which the chapter reads and prints.

A busy machine changes wall-clock times, so the script refuses to store a
measurement when the 1-minute load average exceeds ``--max-load`` (0.5) at the
start, unless ``--allow-load`` is given; the load is stored either way, and
the chapter prints it.  Takes about four minutes with the defaults.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "pargrad" / "book" / "data" / "sync_vs_async.json"
METHODS = ("sync", "sync, 1 backup", "async")
TARGETS = (0.90, 0.93)  # race.TARGETS (not imported here: TensorFlow must start after the check)


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, or what platform knows."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average():
    """The 1, 5 and 15-minute load averages, rounded."""
    return [round(value, 2) for value in os.getloadavg()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6, help="seeds of each scenario and method")
    parser.add_argument("--seconds", type=float, default=3.5, help="wall-clock budget of a run")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between checkpoints")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="milliseconds of one emulated device step at speed 1")
    parser.add_argument("--max-load", type=float, default=0.5,
                        help="refuse to measure above this 1-minute load average")
    parser.add_argument("--allow-load", action="store_true",
                        help="measure and store even on a busy machine (a provisional file)")
    parser.add_argument("--output", type=pathlib.Path, default=OUTPUT)
    arguments = parser.parse_args(argv)
    if arguments.seeds < 6:
        parser.error("--seeds must be at least 6: the page shows every seed and needs several.")
    before = load_average()
    if before[0] > arguments.max_load and not arguments.allow_load:
        sys.exit(f"The 1-minute load average is {before[0]} (> {arguments.max_load}): other work "
                 "would be measured with the race. Run on an idle machine, or pass --allow-load "
                 "to store a provisional measurement (its load is stored and shown on the page).")

    import pargrad
    from pargrad._quiet import import_tensorflow_quietly

    tf = import_tensorflow_quietly()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # before TensorFlow starts
    # Four emulated devices wait inside the synchronous step on inter-op threads.
    tf.config.threading.set_inter_op_parallelism_threads(8)
    devices = pargrad.logical_devices(4)
    import keras

    from pargrad.book import race

    data = race.digits_data(seed=0)
    # Each method at the best rate of its sweep on the virtual clock, in each scenario.
    rates = race.stored_sweep("sync_vs_async_virtual")["settings"]["best_rates"]
    started = time.perf_counter()
    results = []
    for scenario in race.SCENARIOS:
        for method in METHODS:
            for seed in range(arguments.seeds):
                load_before = os.getloadavg()[0]
                result = race.race(method, scenario, seed=seed, budget=arguments.seconds,
                                   every=arguments.every, mode="free-running",
                                   step_seconds=arguments.step_ms / 1000, devices=devices,
                                   data=data, learning_rate=rates[scenario][method])
                reached = {str(t): race.digits_time_to_target(result, t) for t in TARGETS}
                results.append({
                    "scenario": scenario, "method": method, "seed": seed,
                    "time": [round(float(v), 4) for v in result["time"]],
                    "updates": [int(v) for v in result["updates"]],
                    "accuracy": [round(float(v), 4) for v in result["accuracy"]],
                    "time_to_target": {t: (None if v == float("inf") else round(v, 4))
                                       for t, v in reached.items()},
                    "load_before": round(load_before, 2),
                    "load_after": round(os.getloadavg()[0], 2)})
                print(f"{time.perf_counter() - started:6.0f} s  {scenario:22s} {method:16s} "
                      f"seed {seed}: {result['updates'][-1]:5d} updates, to {TARGETS}: "
                      f"{list(reached.values())}", flush=True)
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "system": platform.platform(),
               "python": sys.version.split()[0], "tensorflow": tf.__version__,
               "keras": keras.__version__, "load_average_before": before,
               "load_average_after": load_average(), "allowed_load": arguments.allow_load,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps({
        "script": "tools/measure_race_sweep.py" + (" --allow-load" if arguments.allow_load else ""),
        "machine": machine,
        "settings": {"seconds": arguments.seconds, "every": arguments.every,
                     "step_seconds": arguments.step_ms / 1000, "seeds": arguments.seeds,
                     "targets": list(TARGETS), "batch_size": race.BATCH_SIZE,
                     "methods": {m: race.METHODS[m] for m in METHODS},
                     "learning_rates": {s: {m: rates[s][m] for m in METHODS}
                                        for s in race.SCENARIOS},
                     "scenarios": {name: vars(s) for name, s in race.SCENARIOS.items()}},
        "results": results,
    }, indent=1) + "\n")
    print(f"wrote {arguments.output} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
