"""The chapters follow the book's conventions (CONTRIBUTING.md)."""

import pathlib
import re
import sys

import jupytext
import nbformat
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from book_config import repository, setup_cell_source  # noqa: E402

NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
TF_NOISE = re.compile(r"cuda|oneDNN|cudart|tensorflow/core|I0000|E0000|W0000|absl::")


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_has_a_text_twin_in_sync(notebook):
    script = notebook.with_suffix(".py")
    assert script.exists(), f"{script.name} is missing: run `make chapter NB={notebook.with_suffix('')}`"
    expected = jupytext.writes(jupytext.read(notebook), fmt="py:percent")
    assert script.read_text() == expected, (
        f"{notebook.name} and {script.name} differ: edit the .py, then "
        f"`make chapter NB=chapters/{notebook.stem}`")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_pargrad_on_colab_from_the_configured_address(notebook):
    cells = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    first = cells[0]
    assert "colab" in first.metadata.get("tags", [])
    assert "hide-input" in first.metadata.get("tags", []), "collapse it: run `make setup-cells`"
    assert first.source == setup_cell_source(), "run `make setup-cells`"
    url, branch = repository()
    assert f'REPOSITORY = "{url}"' in first.source and f"@{branch}" in first.source


def test_make_setup_cells_writes_the_source_and_collapses_the_cell_keeping_its_tags():
    from setup_cells import write_setup_cell
    cell = nbformat.v4.new_code_cell("old", metadata={"tags": ["colab", "nbval-ignore-output"]})
    write_setup_cell(cell, setup_cell_source())
    assert cell.source == setup_cell_source()
    assert cell.metadata["tags"] == ["colab", "nbval-ignore-output", "hide-input"]
    write_setup_cell(cell, setup_cell_source())  # again: no tag twice
    assert cell.metadata["tags"] == ["colab", "nbval-ignore-output", "hide-input"]


def test_the_address_lives_in_config_and_the_branch_is_main():
    url, branch = repository()
    assert url.startswith("https://github.com/") and branch == "main"
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_is_executed_without_errors_or_tensorflow_noise(notebook):
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        assert cell.execution_count is not None, f"unexecuted cell: {cell.source[:60]!r}"
        for output in cell.outputs:
            assert output.output_type != "error", f"stored error in {cell.source[:60]!r}"
            if output.output_type == "stream":
                assert not TF_NOISE.search(output.text), f"TensorFlow log noise: {output.text[:120]!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_is_in_the_table_of_contents_with_summary_and_exercises(notebook):
    toc = (ROOT / "_toc.yml").read_text()
    assert f"chapters/{notebook.stem}" in toc
    text = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells
                     if c.cell_type == "markdown")
    assert "## Summary" in text and "## Exercises" in text
    assert "In this chapter you will" in text


READS_A_FILE = re.compile(r"open\(|read_text\(|read_bytes\(|np\.load\(|json\.load\(|pd\.read_")


@pytest.mark.parametrize("script", sorted((ROOT / "chapters").glob("*.py")), ids=lambda p: p.name)
def test_a_chapter_reads_no_file_of_the_repository(script):
    # On Colab a chapter has the package and nothing else of the repository:
    # data it needs ship inside pargrad (pargrad/book/data) or are generated.
    code = "\n".join(line for line in script.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    assert not READS_A_FILE.search(code), (
        f"{script.name} reads a file; ship it in pargrad/book/data and load it through pargrad")
