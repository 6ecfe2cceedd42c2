"""Run the multi-process measurements of the book many times in a row and count failures.

``python tools/stress_clusters.py --runs 50`` runs the chapter "What
communication costs"'s two- and three-worker all-reduce measurements
(``allreduce_timing.time_all_reduce_in_worker`` in a ``pargrad.LocalCluster``,
with the chapter's sizes and repeats) ``--runs`` times each, one cluster at a
time, with no retry, and prints every failure's last line and a ``RESULT``
line.  ``--quick`` uses small payloads and one repeat (the pass that
``make test`` runs).

``--kills K`` also runs, K times, the chapter "Beyond one machine"'s
parameter-server training with a worker killed right after one of its
updates has finished (``parameter_server.kill_worker_after_its_update``): a
run fails if it raises, if an update is missing, or if a record is lost
beyond the one closure the killed worker was running.  ``make test`` runs
``--runs 10 --quick --kills 1``, after its parallel test passes and with no
other test process beside it: the runs time the all-reduces and aim a kill at
a moment of a run, so they run one cluster at a time, alone.
``python tools/stress_clusters.py --runs 0 --kills 30`` is the long form.
Exits with status 1 if any run failed.
"""

import argparse
import os
import sys
import time

from pargrad.book import allreduce_timing
from pargrad.book.parameter_server import kill_worker_after_its_update
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


def one_kill(run_index):
    """One parameter-server run with worker 1 killed right after its k-th update.

    k varies with the run (10 to 39 of 160 updates: worker 1 applies at
    least that many even when worker 0 takes most), so that the kill lands
    at other moments of the run.  Returns the records lost; raises an error
    when the run failed or an update is missing.
    """
    count = 10 + (7 * run_index) % 30
    run, killed = kill_worker_after_its_update(updates=160, count=count)
    kept = len(run["loss"])
    if run["applied"] < run["scheduled"] or kept + run["records_lost"] != run["applied"]:
        raise ClusterError(f"updates missing: scheduled {run['scheduled']}, applied "
                           f"{run['applied']}, records {kept} + lost {run['records_lost']}")
    if run["records_lost"] > 1:
        raise ClusterError(f"{run['records_lost']} records lost with one worker")
    return run["records_lost"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs of each cluster size")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--quick", action="store_true", help="small payloads, one repeat")
    parser.add_argument("--kills", type=int, default=0,
                        help="parameter-server runs with a worker killed right after its update")
    args = parser.parse_args()
    if args.runs < 0 or args.kills < 0 or any(w < 1 for w in args.workers):
        parser.error("--runs and --kills must be whole numbers >= 0, --workers >= 1")
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
    kill_failures = records_lost = 0
    for run in range(1, args.kills + 1):
        try:
            records_lost += one_kill(run)
        except Exception as error:  # any failure counts, and the next run starts
            kill_failures += 1
            last = str(error).strip().splitlines()[-1]
            print(f"kill run {run} FAILED: {last}", flush=True)
        if run % 10 == 0 or run == args.kills:
            print(f"{run} kill runs done, {time.monotonic() - started:.0f} s, "
                  f"failures {kill_failures}, records lost {records_lost}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    result = [f"failures_{w}_workers={failures[w]}/{args.runs}" for w in args.workers]
    if args.kills:
        result += [f"failures_killed_worker={kill_failures}/{args.kills}",
                   f"records_lost={records_lost}"]
    print("RESULT " + " ".join(result) + f" seconds={time.monotonic() - started:.0f}")
    return 1 if any(failures.values()) or kill_failures else 0


if __name__ == "__main__":
    sys.exit(main())
