"""The sources page's short answers say the same thing in every language.

A Chinese or Russian short answer (a block quote) translates the English
answer above it: it links the same sections and writes the same numbers,
so a reader of either language is sent to the same runs.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ROOT / "chapters" / "00_sources.md"

LINK = re.compile(r"\]\(([^)\s]+)\)")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w]|\.\d)")


def short_answers():
    """``[(English paragraph, its translation)]`` of the section "The short answers"."""
    text = SOURCES.read_text()
    section = text.split("## The short answers", 1)[1].split("\n## ", 1)[0]
    paragraphs = [p.strip() for p in section.split("\n\n") if p.strip()]
    pairs = []
    for before, paragraph in zip(paragraphs, paragraphs[1:]):
        if paragraph.startswith(">"):
            assert not before.startswith(">"), "two translations in a row: pair each with its English"
            translation = "\n".join(line.lstrip("> ") for line in paragraph.splitlines())
            pairs.append((before, translation))
    return pairs


def links(paragraph):
    return sorted(set(LINK.findall(paragraph)))


def numbers(paragraph):
    return sorted(set(NUMBER.findall(paragraph)))


def test_the_chinese_and_the_russian_answers_are_there():
    translations = [translation for _, translation in short_answers()]
    assert len(translations) == 2
    assert re.search(r"[\u4e00-\u9fff]", translations[0])
    assert re.search(r"[\u0400-\u04ff]", translations[1])


@pytest.mark.parametrize("pair", short_answers(), ids=["chinese", "russian"])
def test_a_translation_links_the_sections_and_writes_the_numbers_of_the_english(pair):
    english, translation = pair
    assert links(english), "the English short answer links no section"
    assert links(translation) == links(english)
    assert numbers(translation) == numbers(english)


def test_the_chinese_answer_says_a_stale_gradient_is_computed_on_old_parameters():
    # Not "computed on parameters the other devices have already updated":
    # that describes a fresh gradient.
    chinese = short_answers()[0][1]
    assert "陈旧梯度是按旧参数算出的" in chinese
    assert "在已被其他设备更新过的参数上算出" not in chinese


def test_answer_1s_sum_is_stated_with_the_optimizer_the_asker_used():
    english, russian = short_answers()[1]
    assert "Adam" in english and "SGD or momentum" in english
    assert "Adam" in russian and "SGD или momentum" in russian
