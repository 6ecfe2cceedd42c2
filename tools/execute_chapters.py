"""Execute chapters top to bottom without storing anything: ``make test-colab`` runs it.

Run from ``chapters/`` with the Python of the environment to test (its
``python3`` kernel is that environment's interpreter).  Each chapter runs in
a fresh kernel; a failing cell is reported with its error, and the script
goes on with the next chapter.  Prints each chapter's wall time and exits
with status 1 if any chapter failed.
"""

import pathlib
import sys
import time

import nbclient
import nbformat

CELL_TIMEOUT_S = 300


def execute(path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()


def main(paths):
    failed = []
    for path in map(pathlib.Path, paths):
        start = time.perf_counter()
        try:
            execute(path)
            status = "ok"
        except nbclient.exceptions.CellExecutionError as error:
            failed.append(path.name)
            status = "FAILED: " + str(error).strip().splitlines()[-1][:300]
        print(f"{time.perf_counter() - start:6.1f} s  {path.name}  {status}", flush=True)
    print(f"{len(paths) - len(failed)} of {len(paths)} chapters ran"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
