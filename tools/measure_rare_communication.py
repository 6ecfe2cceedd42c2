"""Measure the sweeps of the chapter "Communicating rarely" and store them with the package.

Every method of the chapter (the dial: local SGD, and DiLoCo with its inner
rate, outer rate and momentum tuned at every H; the uneven race on two links,
with H tuned) is swept over its grid with the float64 replay of
pargrad.book.replay, twice: on the page's tuning seeds and on the held-out
tuning seeds (the experiment sets are in pargrad.book.rare_communication).
Each sweep keeps its grid, limits, per-seed scores, medians, best setting and
tied plateau (and a message if the plateau touches a grid edge that is not a
limit) in pargrad/book/data/rare_communication_sweeps.json, with the command,
the machine and its load.  The chapter then runs only the test seeds, at these
settings; tests/book/test_rare_communication.py checks that a sweep measured now
repeats the stored one and that no stored plateau touches an edge.

    cd tools && ../.venv/bin/python measure_rare_communication.py [SET | SET::METHOD ...]

With arguments, only those sets (or single methods) are measured again and
merged into the stored file.
"""

import concurrent.futures
import datetime
import json
import os
import pathlib
import platform
import re
import sys
import time

import numpy as np

from pargrad.book import rare_communication as rc

PATH = (pathlib.Path(__file__).resolve().parent.parent / "pargrad" / "book" / "data"
        / f"{rc.STORED}.json")


def dumped(stored):
    """The sweeps as JSON, every list of numbers on one line (the file ships with the package)."""
    text = json.dumps(stored, indent=1)
    return re.sub(r"\[\s+([-\d.eE+,\s]+?)\s+\]",
                  lambda m: "[" + ",".join(v.strip() for v in m.group(1).split(",")) + "]", text)


def measure(job):
    began = time.perf_counter()
    seed_set, set_name, name = job
    return job, rc.measure_sweep(seed_set, set_name, name), time.perf_counter() - began


def jobs_for(arguments):
    sets = rc.experiment_sets()
    wanted = [a.split("::") for a in arguments] or [[s] for s in sets]
    jobs = [(seed_set, want[0], method.name) for want in wanted for method in sets[want[0]]
            if len(want) == 1 or method.name == want[1] for seed_set in rc.MEASURED_SETS]
    heavy = lambda job: len(sets[job[1]][[m.name for m in sets[job[1]]].index(job[2])].settings())
    return sorted(jobs, key=lambda job: (-("between" in job[1]), -heavy(job)))


def main(arguments):
    began = time.perf_counter()
    stored = json.loads(PATH.read_text()) if arguments and PATH.exists() else {
        "sweeps": {seed_set: {} for seed_set in rc.MEASURED_SETS}}
    runs = stored.setdefault("runs", [])
    load_before = os.getloadavg()
    jobs = jobs_for(arguments)
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        for (seed_set, set_name, name), kept, seconds in pool.map(measure, jobs):
            stored["sweeps"][seed_set].setdefault(set_name, {})[name] = kept
            print(f"done {seed_set} | {set_name} | {name}: best {kept['best']} in {seconds:.0f} s"
                  f"{'  AT THE EDGE' if kept['edge'] else ''}", flush=True)
    stored.update({"grid": list(rc.GRID), "updates": rc.UPDATES,
                   "tuning_seeds": {k: v[1].tolist() for k, v in rc.MEASURED_SETS.items()},
                   "test_seeds": {k: v[0].tolist() for k, v in rc.MEASURED_SETS.items()}})
    runs.append({"command": "cd tools && python measure_rare_communication.py "
                 + " ".join(f"'{a}'" for a in arguments), "measured": len(jobs),
                 "seconds": round(time.perf_counter() - began, 1),
                 "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                     "%Y-%m-%d %H:%M UTC"),
                 "cores": os.cpu_count(), "python": platform.python_version(),
                 "numpy": np.__version__, "load_average_before": [round(v, 2) for v in load_before],
                 "load_average_after": [round(v, 2) for v in os.getloadavg()],
                 "note": "a shared machine: the load is other processes; the float64 replay's "
                         "results do not depend on it, only the seconds do"})
    PATH.write_text(dumped(stored) + "\n")
    print(f"wrote {PATH} in {runs[-1]['seconds']} s")


if __name__ == "__main__":
    main(sys.argv[1:])
