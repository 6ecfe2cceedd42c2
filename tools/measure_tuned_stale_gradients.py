"""Tune "Asynchronous training"'s workers and "Stale gradients in depth"'s remedies inside the
experiment, and store the runs.

Each seed set (pargrad.book.parabola_async.TUNED_SETS: 100 test seeds and a pool of
40 tuning seeds of its own) runs every method's whole fine grid on its pool
(parabola_async.tuned_methods: rates 2^(1/4) apart, DC-ASGD's λ sqrt(2) apart),
picks the best on the pool and on every tuning draw (pargrad.book.tuning.tuning_draws),
and runs the test seeds at each setting a draw picked; the page's and held-out
sets again on grids twice as dense (the density check, under "dense").  The chapters read the
pool's best; the draws measure how far the tuning moves each verdict.  Writes
pargrad/book/data/stale_gradients_tuned.json and prints one RESULT line a
method and set.  About four minutes on two cores:

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python tools/measure_tuned_stale_gradients.py

tests/claims/test_stale_gradients_tuned_conclusions.py re-runs a sample of it.
"""

import concurrent.futures
import datetime
import os
import pathlib
import platform
import time

import numpy as np

from measure_tuned_rare_communication import dumped
from pargrad.book import parabola_async as pa

PATH = (pathlib.Path(__file__).resolve().parent.parent / "pargrad" / "book" / "data"
        / f"{pa.TUNED}.json")
GROUPS = ("workers", "remedies")


def measure(job):
    began = time.perf_counter()
    return job, pa.measure_tuned(*job), time.perf_counter() - began


def main():
    jobs = [(seed_set, group, method.name, density) for density in (1, 2)
            for seed_set in (pa.TUNED_SETS if density == 1 else pa.DENSE_SETS)
            for group in GROUPS for method in pa.tuned_methods(group)]
    stored = {"sets": {}, "dense": {}}
    began, load = time.perf_counter(), os.getloadavg()
    workers = int(os.environ.get("WORKERS", "2"))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for (seed_set, group, name, density), result, seconds in pool.map(measure, jobs):
            kept = stored["sets" if density == 1 else "dense"]
            kept.setdefault(seed_set, {}).setdefault(group, {})[name] = result
            settings = result["settings"]
            print(f"RESULT density {density} | {seed_set} | {group} | {name}: pool best "
                  f"{settings[result['picked']['pool']]}, at grid index "
                  f"{result['picked']['pool']} of {len(settings)}; bootstrap draws pick "
                  f"{len(set(result['picked']['bootstrap']))} settings ({seconds:.0f} s)",
                  flush=True)
    stored["tuned_sets"] = {k: {"test": v[0].tolist(), "pool": v[1].tolist()}
                            for k, v in pa.TUNED_SETS.items()}
    stored["run"] = {
        "command": "python tools/measure_tuned_stale_gradients.py", "measured": len(jobs),
        "seconds": round(time.perf_counter() - began, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "workers": workers, "python": platform.python_version(), "numpy": np.__version__,
        "load_average_before": [round(x, 2) for x in load]}
    PATH.write_text(dumped(stored) + "\n")


if __name__ == "__main__":
    main()
