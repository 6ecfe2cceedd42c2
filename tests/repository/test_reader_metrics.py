"""tools/reader_metrics.py: how it counts, and the budgets of a book a learner finishes.

Every budget holds: each core chapter, the core path and the whole book in
words, the visible checks of a page, the p-values of the book.
Last, the reader's maps of the book (the intro, the Colab appendix) list every page.
"""

import json
import re
import pathlib
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import reader_metrics  # noqa: E402


PROSE = textwrap.dedent("""\
    # A title

    Some *prose* with an {term}`all-reduce`, `code`, a [link text](x.md),
    $x^2$ math and {term}`two words <all-reduce>`.

    <!-- a comment
    over two lines -->

    $$
    y = x^2 + display math words
    $$

    ```python
    ignored = "code words"
    ```

    ```{note}
    :class: tip
    Two words.
    ```

    ```{dropdown} Solution to exercise 1
    collapsed until a click
    ```

    ```{admonition} Collapsed too
    :class: dropdown
    hidden words
    ```
    """)


def test_prose_words_count_the_prose_and_nothing_else():
    # "A title" 2; "Some prose with an W, W, a link text, math and two words." 13;
    # the note's body 2. Not counted: the comment, the display math, the code
    # block, the note's option line, and the two collapsed blocks.
    assert reader_metrics.prose_words(PROSE) == 2 + 13 + 2


def test_prose_words_of_a_role_with_a_text_are_the_texts_words():
    assert reader_metrics.prose_words("see {doc}`the three texts <00_sources>`") == 4
    assert reader_metrics.prose_words("see {cite}`chen2016revisiting`") == 2


def test_russian_counts_word_by_word_and_chinese_one_word_per_one_and_a_half_characters():
    assert reader_metrics.prose_words("Ответ 1 применяет сумму.") == 4
    # 6 characters -> 4 words; 3 -> 2; a run of 1 character is still 1 word
    assert reader_metrics.prose_words("异步模式吃亏，同步模。一") == 4 + 2 + 1
    assert reader_metrics.prose_words("简答：in English too") == 1 + 3


def test_an_admonitions_title_is_prose_and_the_boxes_are_counted():
    markdown = textwrap.dedent("""\
        ```{admonition} Takeaway
        Three words here.
        ```

        ```{admonition} Further reading: guides
        One.
        ```

        ```{warning}
        Careful.
        ```

        ```{admonition} A solution
        :class: dropdown
        hidden
        ```

        ```{dropdown} Solution to exercise 1
        hidden too
        ```
        """)
    assert reader_metrics.prose_words(markdown) == (1 + 3) + (3 + 1) + 1
    assert reader_metrics.admonitions(markdown) == (1, 3)


def glued(name, text=None, image=False):
    """A code cell's output as ``glue(name, value, display=False)`` stores it."""
    data = {"application/papermill.record/text/plain": text or repr(name)}
    if image:
        data["application/papermill.record/image/png"] = "iVBORw0KGgo="
    return {"output_type": "display_data", "data": data,
            "metadata": {"scrapbook": {"mime_prefix": "application/papermill.record/",
                                       "name": name}}}


def notebook(cells):
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def code(source, tags=(), printed=""):
    return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)},
            "execution_count": 1,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}]}


@pytest.fixture
def book(tmp_path):
    """A book of four pages: the intro, one core chapter (a notebook), one appendix page."""
    (tmp_path / "_toc.yml").write_text(textwrap.dedent("""\
        format: jb-book
        root: intro
        parts:
          - caption: "Part I: One device"
            chapters:
              - file: chapters/01_one
              - file: chapters/02_two
          - caption: Appendix
            chapters:
              - file: chapters/a1_methods
        """))
    (tmp_path / "intro.md").write_text("# Intro\n\nFour words of prose.\n")
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    (chapters / "01_one.ipynb").write_text(notebook([
        {"cell_type": "markdown", "metadata": {},
         "source": "# One\n\nThe rule gives p = 0.03 here."},
        code("x = 1\nassert x == 1\nglue('x', x)\n", printed="sign test p = 0.2 -> ahead\n"),
        code("assert True\n", tags=["hide-input"], printed="p = 0.5\n"),
        code("assert True\n", tags=["remove-cell"], printed="p = 0.5\n"),
        code("pargrad.book.glue('y', 2)\n", tags=["hide-output"], printed="p = 0.01\n"),
    ]))
    (chapters / "02_two.py").write_text(textwrap.dedent("""\
        # %% [markdown]
        # # Two
        #
        # Three more words.

        # %% tags=["remove-input"]
        assert 1 + 1 == 2

        # %%
        assert 2 + 2 == 4
        """))
    (chapters / "a1_methods.md").write_text("# Methods\n\nA p-value of 0.04 is below the level.\n")
    return tmp_path


def test_pages_come_in_reading_order_and_the_appendix_is_not_core(book):
    pages = reader_metrics.toc_pages(book)
    assert [(page, core) for page, _, core in pages] == [
        ("intro", True), ("chapters/01_one", True), ("chapters/02_two", True),
        ("chapters/a1_methods", False)]


def test_a_hidden_assert_does_not_count_and_a_visible_one_does(book):
    metrics = {p["page"]: p for p in reader_metrics.measure_book(book)["pages"]}
    # visible: assert, glue( and pargrad.book.glue( (its output is hidden, not its input)
    assert metrics["chapters/01_one"]["visible_checks"] == 3
    # a percent-format page when there is no notebook: remove-input hides the first assert
    assert metrics["chapters/02_two"]["visible_checks"] == 1


def test_p_values_count_in_the_prose_and_in_the_outputs_a_reader_sees(book):
    metrics = {p["page"]: p for p in reader_metrics.measure_book(book)["pages"]}
    # the prose's, the visible cell's output, the hide-input cell's output (shown);
    # not the removed cell's nor the hidden output
    assert metrics["chapters/01_one"]["p_values"] == 3
    assert metrics["chapters/a1_methods"]["p_values"] == 1


def test_totals_of_the_core_path_and_the_book(book):
    metrics = reader_metrics.measure_book(book)
    words = {p["page"]: p["prose_words"] for p in metrics["pages"]}
    assert words == {"intro": 5, "chapters/01_one": 7, "chapters/02_two": 4,
                     "chapters/a1_methods": 9}
    assert metrics["core_path"]["prose_words"] == 5 + 7 + 4
    assert metrics["book"]["prose_words"] == 5 + 7 + 4 + 9
    assert metrics["book"]["p_values"] == 4


def test_figures_count_figure_cells_and_glued_figures(tmp_path):
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: chapters/01_one\n")
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    figure_cell = code("fig = plot()\n")
    figure_cell["metadata"]["mystnb"] = {"figure": {"caption": "A plot.", "name": "fig-a"}}
    removed_figure = code("fig = plot()\n", tags=["remove-cell"])
    removed_figure["metadata"]["mystnb"] = {"figure": {"caption": "Gone.", "name": "fig-b"}}
    (chapters / "01_one.ipynb").write_text(notebook([
        {"cell_type": "markdown", "metadata": {}, "source": "# One\n\nText."},
        figure_cell,
        removed_figure,
        code("glue('fig-c', figure, display=False)\n", tags=["remove-cell"]),
        {"cell_type": "markdown", "metadata": {},
         "source": "```{glue:figure} fig-c\n:name: fig-c\n\nA glued figure.\n```\n\n"
                   ":::{glue:figure} fig-d\nAnother.\n:::\n"},
        code("plt.plot([1, 2])\n"),  # a plot without a name or caption: not a numbered figure
    ]))
    metrics = reader_metrics.measure_book(tmp_path)
    assert metrics["pages"][0]["figures"] == 3
    assert metrics["book"]["figures"] == 3


def test_a_p_value_hidden_in_a_glue_is_counted_and_so_is_a_glued_image(tmp_path):
    # The page types no p-value; the reader sees two, from the glued verdicts,
    # and a figure shown by a {glue} directive.
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: chapters/01_one\n")
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    gluing = code("glue('verdict', text, display=False)\n", tags=["remove-cell"])
    gluing["outputs"] = [glued("verdict", "'DiLoCo ahead (p = 0.002)'"),
                         glued("other", "'too few seeds to tell (p-value of 0.3)'"),
                         glued("seeds", "30"), glued("curves", image=True)]
    (chapters / "01_one.ipynb").write_text(notebook([
        {"cell_type": "markdown", "metadata": {},
         "source": "# One\n\nOn {glue:text}`seeds` seeds: {glue:text}`verdict`, and "
                   "{glue:md}`other:s`.\n\n```{glue} curves\n```\n"},
        gluing,
    ]))
    page = reader_metrics.measure_book(tmp_path)["pages"][0]
    assert page["p_values"] == 2
    assert page["figures"] == 1


def test_a_page_missing_from_disk_is_named(book):
    (book / "chapters" / "a1_methods.md").unlink()
    with pytest.raises(FileNotFoundError, match="chapters/a1_methods"):
        reader_metrics.measure_book(book)


def test_the_table_lists_every_page_of_the_book(book, capsys):
    assert reader_metrics.main([str(book), "--table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| page |")
    assert [line.split(" | ")[0].lstrip("| ") for line in lines[2:]] == [
        "intro", "chapters/01_one", "chapters/02_two", "chapters/a1_methods",
        "total: core path", "total: book"]


# The budgets, on the book itself.

@pytest.fixture(scope="module")
def measured():
    return reader_metrics.measure_book(ROOT)


def test_every_page_of_the_table_of_contents_is_measured(measured):
    pages = [p["page"] for p in measured["pages"]]
    assert pages[:2] == ["intro", "chapters/00_sources"]
    assert len(pages) == len(set(pages)) and all(p["prose_words"] > 0 for p in measured["pages"])


def test_every_core_chapter_is_at_most_3000_words(measured):
    over = {p["page"]: p["prose_words"] for p in measured["pages"]
            if p["core"] and reader_metrics.is_chapter(p)
            and p["prose_words"] > reader_metrics.CORE_CHAPTER_WORDS}
    assert over == {}


def test_the_core_path_is_within_its_budget(measured):
    assert measured["core_path"]["prose_words"] <= reader_metrics.CORE_PATH_WORDS


def test_the_whole_book_is_within_its_budget(measured):
    assert measured["book"]["prose_words"] <= reader_metrics.BOOK_WORDS


def test_every_page_shows_at_most_5_assert_or_glue_lines(measured):
    over = {p["page"]: p["visible_checks"] for p in measured["pages"]
            if p["visible_checks"] > reader_metrics.VISIBLE_CHECKS_PER_CHAPTER}
    assert over == {}


def test_the_book_shows_at_most_12_p_values(measured):
    assert measured["book"]["p_values"] <= reader_metrics.BOOK_P_VALUES


# Orientation: the reader's maps of the book list every page.

def page_title(page):
    """The first heading of a page's source (``.md``, or the ``.py`` of a notebook)."""
    md = ROOT / (page + ".md")
    text = md.read_text() if md.exists() else (ROOT / (page + ".py")).read_text()
    return next(line.lstrip("# ").strip() for line in text.splitlines()
                if line.startswith("# ") and not line.startswith("# %%"))


def test_the_intro_lists_every_page_in_reading_order():
    linked = re.findall(r"\]\((chapters/[\w]+)\)", (ROOT / "intro.md").read_text())
    reading_order = [page for page, _, _ in reader_metrics.toc_pages(ROOT)][1:]
    first_mentions = list(dict.fromkeys(linked))
    assert [page for page in first_mentions if page in reading_order] == reading_order


def test_the_colab_appendix_has_a_row_for_every_chapter():
    rows = re.findall(r"^\| ([^|]+?) \|", (ROOT / "chapters" / "a1_colab_gpus.md").read_text(),
                      flags=re.M)
    notebooks = [page for page, _, _ in reader_metrics.toc_pages(ROOT)
                 if (ROOT / (page + ".ipynb")).exists()]
    assert [page_title(page) for page in notebooks if page_title(page) not in rows] == []


TAKEAWAY = re.compile(r"```\{admonition\} Takeaway\n(.*?)\n```", re.S)


@pytest.mark.parametrize("script", sorted((ROOT / "chapters").glob("[0-9d][0-9]_*.py")),
                         ids=lambda path: path.stem)
def test_every_chapter_opens_with_a_takeaway_of_at_most_60_words(script):
    # The answer first. The takeaway is the first thing under the title.
    first_cell = reader_metrics.percent_cells(script.read_text())[0]
    markdown = reader_metrics._text(first_cell["source"])
    found = TAKEAWAY.search(markdown)
    assert found, f"{script.name}: no Takeaway admonition in the first cell"
    before = markdown[:found.start()].strip().splitlines()
    assert [line for line in before if line.strip()] == [before[0]] and before[0].startswith("# ")
    assert reader_metrics.prose_words(found.group(1)) <= 60
