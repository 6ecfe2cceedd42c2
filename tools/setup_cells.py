"""Write the Colab setup cell (from _config.yml) into every chapter: ``make setup-cells``.

The cell tagged ``colab`` in each chapter's .py and .ipynb gets the canonical
source and the tag ``hide-input`` (the rendered page shows it collapsed; it
still runs first on Colab); its other tags are kept, and stored outputs of
the other cells are left as they are.
"""

import sys

import jupytext
import nbformat

from book_config import chapter_sources, setup_cell_source


def colab_cell(notebook, path):
    for cell in notebook.cells:
        if cell.cell_type == "code" and "colab" in cell.metadata.get("tags", []):
            return cell
    sys.exit(f"{path}: no code cell tagged 'colab'; start the chapter with one.")


SETUP_TAGS = ("colab", "hide-input")


def write_setup_cell(cell, source):
    """Give the setup ``cell`` its ``source`` and the tags ``colab`` and ``hide-input``, keeping others."""
    cell.source = source
    tags = list(cell.metadata.get("tags", []))
    cell.metadata["tags"] = tags + [tag for tag in SETUP_TAGS if tag not in tags]


def main():
    source = setup_cell_source()
    for script in chapter_sources():
        notebook = jupytext.read(script)
        write_setup_cell(colab_cell(notebook, script), source)
        jupytext.write(notebook, script, fmt="py:percent")
        ipynb = script.with_suffix(".ipynb")
        if ipynb.exists():
            stored = nbformat.read(ipynb, as_version=4)
            write_setup_cell(colab_cell(stored, ipynb), source)
            nbformat.write(stored, ipynb)
        print(f"setup cell written: {script.name}")


if __name__ == "__main__":
    main()
