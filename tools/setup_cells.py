"""Write the Colab setup cell (from _config.yml) into every chapter: ``make setup-cells``.

The cell tagged ``colab`` in each chapter's .py and .ipynb gets the canonical
source; stored outputs of the other cells are left as they are.
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


def main():
    source = setup_cell_source()
    for script in chapter_sources():
        notebook = jupytext.read(script)
        colab_cell(notebook, script).source = source
        jupytext.write(notebook, script, fmt="py:percent")
        ipynb = script.with_suffix(".ipynb")
        if ipynb.exists():
            stored = nbformat.read(ipynb, as_version=4)
            colab_cell(stored, ipynb).source = source
            nbformat.write(stored, ipynb)
        print(f"setup cell written: {script.name}")


if __name__ == "__main__":
    main()
