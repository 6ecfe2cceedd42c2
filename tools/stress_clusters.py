"""Run the multi-process measurements of the book many times in a row and count failures.

``python tools/stress_clusters.py --runs 50`` runs the chapter "What
communication costs"'s two- and three-worker all-reduce measurements
(``allreduce_timing.time_all_reduce_in_worker`` in a ``pargrad.LocalCluster``,
with the chapter's sizes and repeats) ``--runs`` times each, one cluster at a
time, with no retry, and prints every failure's last line and a ``RESULT``
line.  ``--quick`` uses small payloads and one repeat (the pass that
``make test`` runs).  Exits with status 1 if any run failed.
"""

import argparse
import os
import sys
import time

from pargrad.book import allreduce_timing
from pargrad.cluster import ClusterError, LocalCluster


def one_run(workers, quick):
    sizes = [4, 2 ** 10, 2 ** 16] if quick else allreduce_timing.DEFAULT_SIZES
    kwargs = {"sizes": sizes, "repeats": 1 if quick else 3,
              "packing_tensors": 16 if workers == 2 else 0}
    with LocalCluster(allreduce_timing.time_all_reduce_in_worker, workers=workers,
                      kwargs=kwargs, timeout=240) as cluster:
        results = cluster.wait()
    if [r["replicas"] for r in results] != [workers] * workers:
        raise ClusterError(f"expected {workers} replicas in every worker, got {results}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs of each cluster size")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--quick", action="store_true", help="small payloads, one repeat")
    args = parser.parse_args()
    if args.runs < 1 or any(w < 1 for w in args.workers):
        parser.error("--runs and --workers must be whole numbers >= 1")
    started = time.monotonic()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    failures = {w: 0 for w in args.workers}
    for run in range(1, args.runs + 1):
        for workers in args.workers:
            try:
                one_run(workers, args.quick)
            except ClusterError as error:
                failures[workers] += 1
                last = str(error).strip().splitlines()[-1]
                print(f"run {run}, {workers} workers FAILED: {last}", flush=True)
        if run % 10 == 0 or run == args.runs:
            print(f"{run} runs of each done, {time.monotonic() - started:.0f} s, "
                  f"failures {failures}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("RESULT " + " ".join(f"failures_{w}_workers={failures[w]}/{args.runs}"
                               for w in args.workers)
          + f" seconds={time.monotonic() - started:.0f}")
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
