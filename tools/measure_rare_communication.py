"""Measure the sweeps of the chapter "Communicating rarely" and store them with the package.

Every method of the chapter (the dial, DiLoCo with its outer step tuned, and
the uneven race on two links, with H fixed and tuned) is swept over its grid
with the float64 replay of pargrad.book.replay, twice: on the page's tuning
seeds and on the held-out tuning seeds (the chapter's experiment sets are in
pargrad.book.rare_communication).  The per-seed scores, the medians and the
best setting of each (and whether it touches a grid edge) are written to
pargrad/book/data/rare_communication_sweeps.json.  The chapter then runs only
the test seeds, at these settings; tests/test_rare_communication.py checks
that a sweep measured now repeats the stored one.

    cd tools && ../.venv/bin/python measure_rare_communication.py
"""

import concurrent.futures
import json
import pathlib
import time

from pargrad.book import rare_communication as rc


def measure(job):
    seed_set, set_name = job
    return seed_set, set_name, rc.measure_sweeps(seed_set, [set_name])[set_name]


def main():
    began = time.perf_counter()
    stored = {"grid": list(rc.GRID), "updates": rc.UPDATES,
              "tuning_seeds": {k: v[1].tolist() for k, v in rc.SEED_SETS.items()},
              "sweeps": {seed_set: {} for seed_set in rc.SEED_SETS}}
    jobs = [(seed_set, set_name) for set_name in rc.experiment_sets() for seed_set in rc.SEED_SETS]
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        for seed_set, set_name, sweeps in pool.map(measure, jobs):
            stored["sweeps"][seed_set][set_name] = sweeps
            print(f"done {seed_set} | {set_name} after {time.perf_counter() - began:.0f} s",
                  flush=True)
    stored["seconds"] = round(time.perf_counter() - began, 1)
    path = (pathlib.Path(__file__).resolve().parent.parent / "pargrad" / "book" / "data"
            / f"{rc.STORED}.json")
    path.write_text(json.dumps(stored, indent=1) + "\n")
    for seed_set, sets in stored["sweeps"].items():
        for set_name, methods in sets.items():
            for name, kept in methods.items():
                print(f"RESULT {seed_set} | {set_name} | {name}: best {kept['best']}"
                      f"{'  AT THE EDGE' if kept['edge'] else ''}")
    print(f"wrote {path} in {stored['seconds']} s")


if __name__ == "__main__":
    main()
