"""A page shows no code cell longer than a screen: at most 25 lines, programs apart.

A longer helper is collapsed (``hide-input``: its output stays, its code is
one click away) or moved into a ``pargrad.book`` module with its tests.
A program (tagged ``program``) is shown whole: a reader copies it.
"""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import reader_metrics  # noqa: E402

MOST_LINES = 25
HIDDEN_INPUT = reader_metrics.HIDDEN_INPUT
SCRIPTS = sorted((ROOT / "chapters").glob("[0-9ad][0-9]_*.py"))


def long_visible_cells(script_text):
    """``[(first line, lines)]`` of the code cells a reader sees that are over the limit."""
    found = []
    for cell in reader_metrics.percent_cells(script_text):
        tags = set(cell["metadata"].get("tags", []))
        if cell["cell_type"] != "code" or tags & HIDDEN_INPUT or "program" in tags:
            continue
        lines = cell["source"].strip("\n").splitlines()
        if len(lines) > MOST_LINES:
            found.append((lines[0], len(lines)))
    return found


def test_a_long_cell_is_found_and_a_collapsed_one_or_a_program_is_not():
    long = "\n".join(f"x{i} = {i}" for i in range(26))
    script = (f"# %%\n{long}\n\n# %% tags=[\"hide-input\"]\n{long}\n\n"
              f"# %% tags=[\"program\"]\n{long}\n\n# %%\nshort = 1\n")
    assert long_visible_cells(script) == [("x0 = 0", 26)]


@pytest.mark.parametrize("script", SCRIPTS, ids=[script.stem for script in SCRIPTS])
def test_no_visible_cell_is_over_25_lines(script):
    assert long_visible_cells(script.read_text()) == []
