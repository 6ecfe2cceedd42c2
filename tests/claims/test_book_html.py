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
