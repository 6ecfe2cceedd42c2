"""Tune "Communicating rarely"'s stated methods inside the experiment, and store the runs.

Each seed set (pargrad.book.rare_communication.TUNED_SETS: 100 test seeds and
a pool of 40 tuning seeds of its own) runs every stated method's whole coarse
grid on its pool, picks the best on the pool and on every tuning draw
(pargrad.book.tuning.tuning_draws: the pool cut into the old draws of 10, and
20 bootstrap resamples of the pool), and runs the test seeds at each setting
a draw picked.  The chapter reads the pool's best; the draws measure how far
the tuning moves each verdict (rare_communication.tuning_shift_in_errors).
Writes pargrad/book/data/rare_communication_tuned.json; with SEED_SET
arguments, only those sets (and with SET::METHOD arguments, only those
methods) are measured again and merged in.  About ten
minutes a seed set on one core:

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python tools/measure_tuned_rare_communication.py [SEED_SET ...] [SET::METHOD ...]

tests/claims/test_rare_communication_tuned_conclusions.py re-runs a sample of it.
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
        / f"{rc.TUNED}.json")
COST = {"dial": 0, f"race, {rc.SLOW.name}": 1, f"race, {rc.FAST.name}": 2}


def dumped(stored):
    """JSON with every list of numbers on one line, numbers to 7 significant digits."""
    text = json.dumps(stored, indent=1)
    text = re.sub(r"\[\s+([-\d.eE+,\s]+?)\s+\]",
                  lambda m: "[" + ",".join(v.strip() for v in m.group(1).split(",")) + "]", text)
    return re.sub(r"-?\d+\.\d{8,}(e[-+]\d+)?", lambda m: f"{float(m.group(0)):.7g}", text)


def measure(job):
    began = time.perf_counter()
    return job, rc.measure_tuned(*job), time.perf_counter() - began


def main(arguments):
    only = [a.split("::") for a in arguments if "::" in a]
    wanted = [a for a in arguments if "::" not in a] or list(rc.TUNED_SETS)
    jobs = sorted(((seed_set, set_name, name) for seed_set in wanted
                   for set_name, names in rc.STATED_METHODS.items() for name in names
                   if not only or [set_name, name] in only),
                  key=lambda job: (COST[job[1]], "DiLoCo" not in job[2]))
    stored = json.loads(PATH.read_text()) if PATH.exists() else {"sets": {}, "runs": []}
    began, load = time.perf_counter(), os.getloadavg()
    workers = int(os.environ.get("WORKERS", "2"))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for (seed_set, set_name, name), result, seconds in pool.map(measure, jobs):
            stored["sets"].setdefault(seed_set, {}).setdefault(set_name, {})[name] = result
            print(f"{seed_set} | {set_name} | {name}: pool best "
                  f"{result['settings'][result['picked']['pool']]} ({seconds:.0f} s)", flush=True)
    stored["sets"] = {k: stored["sets"][k] for k in rc.TUNED_SETS if k in stored["sets"]}
    stored["tuned_sets"] = {k: {"test": v[0].tolist(), "pool": v[1].tolist()}
                            for k, v in rc.TUNED_SETS.items()}
    stored["runs"].append({
        "command": " ".join(["python tools/measure_tuned_rare_communication.py", *arguments]),
        "measured": len(jobs), "seconds": round(time.perf_counter() - began, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "workers": workers, "python": platform.python_version(), "numpy": np.__version__,
        "load_average_before": [round(x, 2) for x in load]})
    PATH.write_text(dumped(stored) + "\n")


def report(pairs):
    """One RESULT line a stated pair: verdict, median ratio, spread, tuning shifts, power, false
    "ahead" (normal and skewed null) and the third set's p-value and lean."""
    from pargrad.book import experiments
    stored = rc.stored_tuned()
    for set_name, first, second in pairs:
        verdict = rc.tuned_replication(set_name, stored).compare(first, second).pooled
        shifts = {(kind, which): rc.tuning_shift_in_errors(set_name, first, second, which, kind,
                                                           stored)[0]
                  for kind in ("disjoint", "bootstrap") for which in ("page", "held_out")}
        false = [experiments.power_at(verdict.spread, verdict.set_sizes,
                                      tuning_sd=verdict.tuning_sd, effect=1.0, null=null)
                 for null in ("normal", "skewed")]
        third = rc.tuned_experiment(set_name, "third", stored=stored).compare(first, second,
                                                                            min_seeds=1)
        print(f"RESULT {set_name} | {first} vs {second}: {verdict.text}; ratio "
              f"{verdict.effect:.3g}, p {verdict.p_value:.2g}, spread {verdict.spread:.2f}, "
              f"tuning shift (SE) draws of 10 {shifts['disjoint', 'page']:.2f}/"
              f"{shifts['disjoint', 'held_out']:.2f}, pool of 40 {shifts['bootstrap', 'page']:.2f}/"
              f"{shifts['bootstrap', 'held_out']:.2f}, power {verdict.power:.2f}, false ahead "
              f"{false[0]:.3f} (skewed {false[1]:.3f}); third p {third.p_value:.2g} lean "
              f"{third.lean:+d}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        import measure_stated_verdicts
        report([k for k in measure_stated_verdicts.RARE])
    else:
        main(sys.argv[1:])
