"""Every cell a chapter script declares is a cell of its notebook.

Where jupytext thinks a markdown cell's code fence is open (the closing
fence of an admonition whose title holds inline code, which jupytext does
not take for an opening one, did it once), it reads the ``# %%`` markers
after it as more markdown: the code cells become text on the page,
never run, and nbval never sees them; writing the script back then comments
their code out.  So jupytext must read as many cells from a chapter's script
as the script has markers, and the stored notebook has no markdown line that
is a swallowed marker.
"""

import json
import pathlib
import re

import jupytext
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "chapters").glob("[0-9ad][0-9]_*.py"))
MARKER = re.compile(r"^# %%", re.MULTILINE)


def lost_cells(script_text):
    """How many of the script's ``# %%`` markers jupytext does not read as cells."""
    return len(MARKER.findall(script_text)) - len(jupytext.reads(script_text, fmt="py:percent").cells)


def swallowed_markers(notebook):
    """The markdown lines of a notebook that are cell markers jupytext did not split on."""
    return [line for cell in notebook["cells"] if cell["cell_type"] == "markdown"
            for line in "".join(cell["source"]).splitlines() if line.startswith("%%")]


def test_a_swallowed_cell_is_found():
    # jupytext does not open a fence at an info string with inline code, so the closing
    # fence opens one, and the marker under it is read as markdown
    swallowing = "# %% [markdown]\n# ```{admonition} What `x` is\n# ```\n# %%\n# ```\n"
    assert lost_cells(swallowing) == 1
    assert lost_cells(swallowing.replace("What `x` is", "What x is")) == 0
    page = {"cells": [{"cell_type": "markdown", "source": ["text\n", "%% tags=[\"x\"]\n"]},
                      {"cell_type": "code", "source": ["%%time\n"]}]}
    assert swallowed_markers(page) == ['%% tags=["x"]']


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_declared_cell_is_a_cell(script):
    lost = lost_cells(script.read_text())
    assert not lost, (f"jupytext reads {lost} of {script.name}'s cells as markdown: look for a code "
                      "fence it thinks is open (inline code in an admonition's title)")
    notebook = json.loads(script.with_suffix(".ipynb").read_text())
    assert not swallowed_markers(notebook), (
        f"{script.with_suffix('.ipynb').name} has cell markers inside markdown; fix the script "
        "and re-execute it (make chapter NB=...)")
