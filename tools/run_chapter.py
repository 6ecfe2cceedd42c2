"""Execute chapters and store their outputs: ``make chapter NB=chapters/01_training_loop``.

For each chapter: bring the .ipynb up to date with its .py, execute it top to
bottom in a fresh kernel (working directory ``chapters/``), store the outputs,
and write the .py back so that the pair stays in sync.  Prints each
chapter's wall time; stops at the first chapter that fails.
"""

import pathlib
import sys
import time

import jupytext
import nbclient
import nbformat

CELL_TIMEOUT_S = 180


def run(chapter):
    script = chapter.with_suffix(".py")
    ipynb = chapter.with_suffix(".ipynb")
    notebook = jupytext.read(script)
    if ipynb.exists():  # keep the notebook-level metadata already stored
        stored = nbformat.read(ipynb, as_version=4)
        stored.cells = notebook.cells
        notebook = stored
    notebook.metadata.setdefault("kernelspec", {
        "name": "python3", "display_name": "Python 3", "language": "python"})
    start = time.perf_counter()
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(chapter.parent)}})
    client.execute()
    seconds = time.perf_counter() - start
    nbformat.write(notebook, ipynb)
    # The .py twin from the notebook as stored (nbformat sorts metadata keys),
    # so that it matches what the pair test derives from the .ipynb.
    jupytext.write(jupytext.read(ipynb), script, fmt="py:percent")
    print(f"{seconds:6.1f} s  {ipynb}")
    return seconds


def main(paths):
    chapters = [pathlib.Path(p).with_suffix("") for p in paths]
    missing = [c for c in chapters if not c.with_suffix(".py").exists()]
    if missing:
        sys.exit(f"no such chapter source: {', '.join(str(m) + '.py' for m in missing)}")
    for chapter in chapters:
        run(chapter)


if __name__ == "__main__":
    main(sys.argv[1:])
