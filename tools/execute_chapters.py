"""Execute chapters top to bottom without storing anything: ``make test-colab`` runs it.

Run from ``chapters/`` with the Python of the environment to test (its
``python3`` kernel is that environment's interpreter)::

    python ../tools/execute_chapters.py --jobs 2 --alone 02_devices.ipynb *.ipynb

Each chapter runs in a fresh kernel, driven by a child process of this script
(``--one PATH``), ``--jobs`` chapters at a time; the chapters named with
``--alone`` (those that time work and assert on the times) run afterwards, one
at a time, with nothing beside them.  A failing chapter (a cell's error, a
cell past its time limit, a dead kernel) is reported with its error's last
line, and the others go on.  Prints each chapter's wall time as it ends, then a
summary, and exits with status 1 if any chapter failed.

No kernel outlives its chapter: the child shuts its kernel down whether the
chapter passed or failed (nbclient's ``execute`` does, and the child checks),
and when this script is stopped it stops its children, which stop their
kernels.
"""

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

CELL_TIMEOUT_S = 300
STATUS = "STATUS "  # the child's last line: STATUS ok, or STATUS FAILED: <error>


def execute(path):
    """Run one chapter in a fresh kernel; raise on the first failing cell."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        # execute() shuts its kernel down on success and on error; make sure.
        if client.km is not None and client.km.has_kernel:
            client.km.shutdown_kernel(now=True)


def run_one(path):
    """The child: one chapter; its last line says how it went."""
    try:
        execute(pathlib.Path(path))
        status = "ok"
    except Exception as error:  # a cell's error, a timeout, a dead kernel: all count
        lines = str(error).strip().splitlines() or [type(error).__name__]
        status = "FAILED: " + re.sub(r"\x1b\[[0-9;]*m", "", lines[-1])[:300]  # no colours
    print(STATUS + status, flush=True)
    return 0 if status == "ok" else 1


class Running:
    """A child that executes one chapter; its output is kept for the report."""

    def __init__(self, path):
        self.path, self.started = path, time.perf_counter()
        # A file, not a pipe: reading it never waits for a process that holds it open.
        self.output = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--one", str(path)],
            stdout=self.output, stderr=subprocess.STDOUT, text=True)

    def finish(self):
        seconds = time.perf_counter() - self.started
        self.output.seek(0)
        lines = self.output.read().strip().splitlines()
        self.output.close()
        if lines and lines[-1].startswith(STATUS):
            status = lines[-1][len(STATUS):]
        else:  # the child itself failed: show what it printed
            status = f"FAILED: exit code {self.process.returncode}\n" + "\n".join(lines[-15:])
        print(f"{seconds:6.1f} s  {self.path.name}  {status}", flush=True)
        return status == "ok"

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()  # nbclient's handler shuts the kernel down
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def run_pool(paths, jobs):
    """Run ``paths`` ``jobs`` at a time; return the names of the failed ones."""
    waiting, running, failed = list(paths), [], []
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                running.append(Running(waiting.pop(0)))
            done = next((r for r in running if r.process.poll() is not None), None)
            if done is None:
                time.sleep(0.2)
                continue
            running.remove(done)
            if not done.finish():
                failed.append(done.path.name)
    finally:  # stopped (Ctrl-C, SIGTERM) or broken: no child, and so no kernel, outlives us
        for r in running:
            r.stop()
    return failed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="the chapters (.ipynb) to execute")
    parser.add_argument("--jobs", type=int, default=1, help="chapters at a time (default 1)")
    parser.add_argument("--alone", action="append", default=[], metavar="NAME",
                        help="a chapter (file name) to run afterwards with nothing beside it")
    parser.add_argument("--one", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return run_one(args.one)
    if args.jobs < 1:
        parser.error("--jobs must be 1 or more")
    paths = list(map(pathlib.Path, args.paths))
    unknown = set(args.alone) - {p.name for p in paths}
    if unknown:
        parser.error(f"--alone names chapters that are not given: {sorted(unknown)}")
    # SIGTERM (make or CI stopping us) unwinds like Ctrl-C, through run_pool's finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shared = [p for p in paths if p.name not in args.alone]
    alone = [p for p in paths if p.name in args.alone]
    print(f"{len(shared)} chapters {args.jobs} at a time, then {len(alone)} alone"
          + (f" ({', '.join(p.name for p in alone)})" if alone else ""), flush=True)
    started = time.perf_counter()
    failed = run_pool(shared, args.jobs) + run_pool(alone, 1)
    print(f"{len(paths) - len(failed)} of {len(paths)} chapters ran in "
          f"{time.perf_counter() - started:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
