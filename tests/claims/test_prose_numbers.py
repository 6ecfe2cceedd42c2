"""No typed numbers in the prose: a measured number is glued or printed by its page.

Typed numbers drifted away from the outputs they described in two review
rounds.  This guard reads every page's prose (the markdown cells of the
chapters, the ``.md`` pages and ``intro.md``) and fails on a number that
carries a unit or a decimal point (``12 %``, ``87.8 s``, ``1.41×``,
``900 GB/s``, ``0.93``, ``1e-5``) unless

* it is glued from a cell (``{glue:text}`name``` -- the number is then not
  in the prose at all),
* it is printed by a code cell of the same page (it appears in that page's
  stored outputs, glued values included),
* it is a decimal setting that a code cell of the same page uses (a
  learning rate ``0.01`` that appears as a literal in the page's code: if
  the code changes, the literal is gone and the prose fails), or
* it is a cited constant: listed in ``CITED_CONSTANTS`` below for that page
  with the citation key of the datasheet or paper it comes from; the page
  must cite that key.

Version numbers (``TensorFlow 2.21``), products (``10 × steps``), decades and
inline code (```f(0.9)```) are not measurements and are skipped.
"""

import pathlib
import re

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"

# page stem -> {number with its unit, as the prose writes it: citation key}.
# Only figures from a datasheet or a paper's result belong here.
CITED_CONSTANTS = {
    "00_sources": {"2.4": "parabolaquestion", "2.0": "parabolaquestion"},  # its author's test
    "03_synchronous": {"90%": "goyal2017accurate"},
    "05_sync_vs_async": {  # DAWNBench's final ImageNet times
        "2 min": "dawnbench2020leaderboard", "38 s": "dawnbench2020leaderboard",
        "43 s": "dawnbench2020leaderboard", "9 min": "dawnbench2020leaderboard",
        "22 s": "dawnbench2020leaderboard", "93%": "dawnbench2020leaderboard",
        # the figure the stale-gradient article's page quotes, before the leaderboard's
        "10 min": "stalegradientarticle", "28 s": "stalegradientarticle",
    },
    "09_beyond_one_machine": {"54 days": "dubey2024llama3"},
    "12_sharded_training": {"7.5": "rajbhandari2019zero"},  # ZeRO's Figure 1: 7.5 B parameters
    "10_communication_costs": {
        "100 Gb/s": "ieee2022ethernet",
        "3.8": "he2016deep",
    },
    "d6_communication_in_depth": {
        "50 Gb/s": "goyal2017accurate",
        "120 ms": "goyal2017accurate",
        "90%": "goyal2017accurate",
    },
}

UNITS = {  # a unit as written -> the unit it means
    "%": "%", "percent": "%",
    "x": "x", "×": "x",
    "ns": "ns", "µs": "µs", "μs": "µs", "us": "µs", "ms": "ms",
    "s": "s", "sec": "s", "second": "s", "seconds": "s",
    "min": "min", "minute": "min", "minutes": "min",
    "h": "h", "hour": "h", "hours": "h", "day": "day", "days": "day",
    "B": "B", "KB": "KB", "kB": "KB", "KiB": "KB", "MB": "MB", "MiB": "MB",
    "GB": "GB", "GiB": "GB", "TB": "TB",
    "KB/s": "KB/s", "MB/s": "MB/s", "GB/s": "GB/s", "TB/s": "TB/s",
    "Gbit/s": "Gbit/s", "Gb/s": "Gbit/s", "Tbit/s": "Tbit/s",
    "FLOP/s": "FLOP/s", "TFLOP/s": "TFLOP/s", "TFLOPS": "TFLOP/s", "GFLOPS": "GFLOP/s",
    "GHz": "GHz", "W": "W", "k": "k",
}
_UNIT = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
NUMBER = re.compile(
    r"(?<![\w.\-/])"                                   # not inside a word, a path or a version
    r"(?P<number>\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"(?![\w.]*\d)"                                    # not a version like 2.21.0
    r"(?:[ \u00a0\u202f]?(?P<unit>" + _UNIT + r")(?![\w/]))?",
)
VERSION_CONTEXT = re.compile(
    r"(?:TensorFlow|TF|Keras|Python|CUDA|cuDNN|NumPy|numpy|PyTorch|NCCL|Horovod|Jupyter Book|"
    r"jupyter-book|MyST-NB|nbval|version|versions|release|v)"
    r"\s*(?:\d+(?:\.\d+)*(?:\.x)?\s*(?:,|and|or|to|–|-|/)\s*)*$")


def prose_without_markup(line):
    """The prose of one markdown line, with roles, links, URLs and TeX markup taken out."""
    line = re.sub(r"\{[\w:-]+\}`[^`]*`", " ", line)             # {glue:text}`x`, {cite}`k`, ...
    line = re.sub(r"`[^`]*`", " ", line)                        # code: `f(0.9)` is code, not prose
    line = re.sub(r"\]\([^)]*\)", "]", line)                    # link targets
    line = re.sub(r"https?://\S+", " ", line)
    line = re.sub(r"<!--.*?-->", " ", line)
    line = re.sub(r"\\text\{([^}]*)\}", r"\1", line)
    line = (line.replace(r"\mu", "µ").replace(r"\times", "×").replace(r"\%", "%")
            .replace(r"\,", " ").replace(r"\;", " ").replace("~", " "))
    # In inline math a number joined to a letter is a coefficient ($2k - 1$), not a unit.
    line = re.sub(r"\$[^$]*\$", lambda m: re.sub(r"(\d)([A-Za-z])", "\\1·\\2", m.group(0)), line)
    return line


def typed_numbers(line, before=""):
    """Numbers in a line of prose that carry a unit or a decimal point, as (text, number, unit).

    ``before`` is the prose just before the line (the previous line), where
    the word that makes a number a version ("TensorFlow") may stand.
    """
    before = prose_without_markup(before)[-40:] + " "
    text = prose_without_markup(line)
    found = []
    for match in NUMBER.finditer(text):
        number, unit = match.group("number"), match.group("unit")
        decimal = "." in number or "e" in number
        after = text[match.end():]
        if unit in ("x", "×") and (re.match(r"[ \u00a0]*\d", after) or (
                match.group(0)[len(number)] in " \u00a0" and re.match(r" [\w$(\\]", after))):
            unit = None                             # "4 × 4", "10 × steps": a product, not a ratio
        if unit == "s" and re.fullmatch(r"1[89]\d0|20\d0", number) and match.group(0).endswith("0s"):
            continue                                # "the 2010s": a decade
        if not decimal and unit is None:
            continue
        if VERSION_CONTEXT.search((before + text[:match.start()])[-40:]):
            continue
        found.append((match.group(0).strip(), number, UNITS.get(unit)))
    return found


def code_of(script):
    """The code cells of a percent-format chapter, comments dropped."""
    code, in_code = [], False
    for line in script.read_text().splitlines():
        if line.startswith("# %%"):
            in_code = "[markdown]" not in line
            continue
        if in_code and not line.lstrip().startswith("#"):
            code.append(line.split("  #")[0])
    return "\n".join(code)


def printed_numbers(outputs_text):
    """The (number, unit) pairs a page's outputs show, and the bare numbers."""
    pairs, bare = set(), set()
    for match in NUMBER.finditer(outputs_text):
        number = match.group("number")
        bare.add(number)
        if match.group("unit"):
            pairs.add((number, UNITS[match.group("unit")]))
    return pairs, bare


def is_printed(number, unit, pairs, bare):
    """A decimal is printed if its digits are; an integer with a unit if it is printed with that unit."""
    if "." in number or "e" in number:
        return number in bare
    return (number, unit) in pairs


def cited_key(page, text, unit, number):
    """The citation key listed for this number on this page, or None."""
    constants = CITED_CONSTANTS.get(page, {})
    for written, key in constants.items():
        [(_, n, u)] = typed_numbers(written) or [(None, None, None)]
        if n == number and u == unit:
            return key
    return None


def prose_lines_of_script(path):
    """(line number, text) of the markdown cells of a percent-format chapter."""
    lines, in_markdown = [], False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith("# %%"):
            in_markdown = "[markdown]" in line
            continue
        if in_markdown and line.startswith("#"):
            lines.append((number, line[2:] if line.startswith("# ") else line[1:]))
    return lines


def prose_lines_of_markdown(path):
    return list(enumerate(path.read_text().splitlines(), start=1))


def outside_code_fences(lines):
    """Drop lines inside ``` code blocks; a ```{directive} block (a dropdown, a note) is prose."""
    kept, open_blocks = [], []                  # "code" or "directive", innermost last
    for number, line in lines:
        stripped = line.strip()
        if stripped.startswith("```"):
            info = stripped.strip("`").strip()
            if info == "" and open_blocks:
                open_blocks.pop()               # a bare fence closes the innermost block
            elif info.startswith("{") and not info.startswith(("{code", "{literalinclude")):
                open_blocks.append("directive")
            else:
                open_blocks.append("code")
            continue
        if "code" not in open_blocks:
            kept.append((number, line))
    return kept


def outputs_of(notebook):
    """All text a notebook's code cells printed or glued."""
    parts = []
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if "text" in output:
                parts.append(output["text"])
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/") or mime.startswith("application/papermill.record/text"):
                    parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def pages():
    found = []
    for script in sorted(CHAPTERS.glob("*.py")):
        if script.with_suffix(".ipynb").exists():
            found.append(script)
    found += sorted(CHAPTERS.glob("*.md")) + [ROOT / "intro.md"]
    return found


def findings(page):
    """Messages for every typed number of a page that is neither printed, glued nor cited."""
    if page.suffix == ".py":
        lines = prose_lines_of_script(page)
        pairs, bare = printed_numbers(outputs_of(page.with_suffix(".ipynb")))
        settings = printed_numbers(code_of(page))[1]
    else:
        lines = prose_lines_of_markdown(page)
        pairs, bare, settings = set(), set(), set()
    messages = []
    previous = ""
    for number_of_line, line in outside_code_fences(lines):
        found, previous = typed_numbers(line, before=previous), line
        for text, number, unit in found:
            if (is_printed(number, unit, pairs, bare) or (unit is None and number in settings)
                    or cited_key(page.stem, text, unit, number)):
                continue
            messages.append(
                f"{page.relative_to(ROOT)}:{number_of_line}: the number {text!r} is typed in "
                f"the prose ({line.strip()[:90]!r}). Glue it from a cell "
                "(pargrad.book.glue + {glue:text}`name`), print it in a code cell of this page, "
                "or, if it is a datasheet figure or a paper's result, cite it and list it in "
                "CITED_CONSTANTS of tests/claims/test_prose_numbers.py with its citation key.")
    return messages


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_number_with_a_unit_or_a_decimal_is_glued_printed_or_cited(page):
    problems = findings(page)
    assert not problems, "\n".join(problems)


def test_cited_constants_name_a_reference_the_page_cites():
    bibliography = (ROOT / "references.bib").read_text()
    for stem, constants in CITED_CONSTANTS.items():
        [page] = [p for p in CHAPTERS.glob(stem + ".*") if p.suffix in (".py", ".md")]
        text = page.read_text()
        for written, key in constants.items():
            assert typed_numbers(written), f"{written!r} is not a number with a unit or a decimal"
            assert re.search(r"@\w+\{" + key + ",", bibliography), f"{key} is not in references.bib"
            assert key in re.findall(r"\{cite\}`([^`]*)`", text) or any(
                key in keys.split(",") for keys in re.findall(r"\{cite\}`([^`]*)`", text)), (
                f"{page.name} lists {written} as cited from {key} but never cites {key}")


# The detector itself, on a small synthetic text: it must be able to fail.

def test_the_detector_finds_numbers_with_units_and_decimals():
    line = "It ran in 87.8 s, 12 % faster (1.41×), at 900 GB/s; the ratio was 0.93 and 3e-13."
    assert [t[0] for t in typed_numbers(line)] == ["87.8 s", "12 %", "1.41×", "900 GB/s", "0.93",
                                                   "3e-13"]


def test_the_detector_skips_integers_versions_and_markup():
    line = ("With TensorFlow 2.21 and Keras 3.15, 4 workers ran 64 updates on a 4 × 4 grid; "
            "see {glue:text}`speedup:.2f` and {cite}`goyal2017accurate` at https://x.org/1.5.")
    assert typed_numbers(line) == []


def test_a_typed_number_fails_unless_printed(tmp_path):
    pairs, bare = printed_numbers("elapsed 87.8 s\nspeed-up 1.41x\n")
    assert is_printed("87.8", "s", pairs, bare)
    assert is_printed("1.41", "x", pairs, bare)
    assert not is_printed("0.93", None, pairs, bare)
    assert not is_printed("12", "%", pairs, bare)


def test_a_synthetic_page_with_a_typed_number_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    page = tmp_path / "intro.md"
    page.write_text("# A page\n\nThe run took 47.9 s.\n\n```python\nx = 0.5\n```\n")
    [message] = findings(page)
    assert "intro.md:3" in message and "'47.9 s'" in message and "glue" in message
