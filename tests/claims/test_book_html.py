"""The built book (`make book`) has a Colab button on every chapter page."""

import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from book_config import repository  # noqa: E402

HTML = ROOT / "_build" / "html"
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))

if not (HTML / "index.html").exists():
    if os.environ.get("PARGRAD_REQUIRE_HTML"):
        raise RuntimeError("_build/html is missing: `make test` builds the book first")
    pytest.skip("the book is not built; run `make book` (make test does)", allow_module_level=True)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_page_has_a_colab_button_for_its_notebook_on_main(notebook):
    page = HTML / "chapters" / f"{notebook.stem}.html"
    assert page.exists(), f"{page} was not built"
    url, branch = repository()
    owner_repo = url.removeprefix("https://github.com/")
    expected = (f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/"
                f"chapters/{notebook.name}")
    buttons = set(re.findall(r'https://colab\.research\.google\.com/[^"\']+', page.read_text()))
    assert buttons == {expected}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_page_shows_stored_outputs_without_tensorflow_noise(notebook):
    page = (HTML / "chapters" / f"{notebook.stem}.html").read_text()
    assert "cell_output" in page
    assert not re.search(r"Could not find cuda|oneDNN custom operations|cudart_stub", page)


def _program_notebooks():
    import nbformat

    return [notebook for notebook in NOTEBOOKS
            if any("program" in cell.metadata.get("tags", [])
                   for cell in nbformat.read(notebook, as_version=4).cells)]


@pytest.mark.parametrize("notebook", _program_notebooks(), ids=lambda p: p.name)
def test_programs_to_copy_are_framed_and_get_the_copy_button(notebook):
    """A cell tagged `program` is labelled and framed (programs.css) and its code sits where
    sphinx-copybutton's script puts a copy button (its selector, div.highlight pre)."""
    import bs4
    import nbformat

    page = bs4.BeautifulSoup((HTML / "chapters" / f"{notebook.stem}.html").read_text(),
                             "html.parser")
    scripts = [tag.get("src", "") for tag in page.find_all("script")]
    assert any(src.split("?")[0].endswith("copybutton.js") for src in scripts), (
        "sphinx-copybutton is missing")
    copybutton = (HTML / "_static" / "copybutton.js").read_text()
    selector = re.search(r"COPYBUTTON_SELECTOR = '([^']+)'", copybutton).group(1)
    styles = [tag.get("href", "") for tag in page.find_all("link", rel="stylesheet")]
    assert any(href.split("?")[0].endswith("programs.css") for href in styles)
    assert "tag_program" in (HTML / "_static" / "programs.css").read_text()
    stored = [cell for cell in nbformat.read(notebook, as_version=4).cells
              if cell.cell_type == "code" and "program" in cell.metadata.get("tags", [])]
    shown = page.select("div.cell.tag_program")
    assert len(shown) == len(stored)
    for cell, source in zip(shown, stored):
        code = cell.select(selector)
        assert code, f"a program in {notebook.name} has no code where the copy button goes"
        first_line = source.source.strip().splitlines()[0]
        assert first_line in code[0].get_text()
