"""The methods page's worked example is what the code prints, not a pasted output."""

import pathlib
import re

import numpy as np

from pargrad.book import experiments

PAGE = pathlib.Path(__file__).resolve().parents[2] / "chapters" / "a0_methods.md"


def test_the_worked_example_prints_what_the_page_shows():
    text = PAGE.read_text()
    a = np.array(re.search(r"^A: ([\d ]+)$", text, re.M).group(1).split(), float)
    b = np.array(re.search(r"^B: ([\d ]+)$", text, re.M).group(1).split(), float)
    shown = re.search(r"^A vs B: .*$", text, re.M).group(0)
    assert str(experiments.compare(a, b, "A", "B", min_seeds=20)) == shown
    d = np.log(a) - np.log(b)
    d = d[d != 0]
    losses = np.argsort(np.argsort(np.abs(d)))[d > 0] + 1
    assert "ranks 1 to 4 of 19" in " ".join(text.split())
    assert sorted(losses.tolist()) == [1, 2, 3, 4] and len(d) == 19


def test_the_constants_the_page_names_are_the_codes():
    text = " ".join(PAGE.read_text().split())
    for name in ("ALPHA", "MIN_SEEDS", "FLOOR", "SPREAD", "EFFECT", "MIN_POWER"):
        assert f"`{name} = {getattr(experiments, name):g}`" in text, name
    assert "`RATE_STEP = 2 ** 0.25`" in text and experiments.RATE_STEP == 2 ** 0.25


def test_the_page_names_each_verdict_the_code_returns_and_says_the_test_is_about_symmetry():
    text = " ".join(PAGE.read_text().split())
    for verdict in (experiments.NEGLIGIBLE, experiments.NO_DIFFERENCE, experiments.CLOSE,
                    experiments.TOO_FEW):
        assert f"**{verdict[0].upper()}{verdict[1:]}**" in text, verdict
    assert "*symmetric*" in text and "experiments.holm" in text
    assert "test_stated_verdicts_conclusions.py" in text
