"""`.ci/run` runs what the README's `make test` runs, part by part, in the same order.

`.ci/run` times each part of `make test` as a stage of its own (its table shows which part a
change makes longer), so the two lists could drift apart: a part added to `make test` and not
to `.ci/run` would leave CI.  This test reads both files.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def make_test_parts(makefile):
    """The targets `make test` runs: its prerequisites, then the targets its recipe makes."""
    rule = re.search(r"^test:([^\n]*)\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE)
    assert rule, "the Makefile has no `test:` rule"
    parts = rule.group(1).split()
    for line in rule.group(2).splitlines():
        # "$(MAKE) --no-print-directory -o book test-first-pass": the last word is the target
        parts.append(line.split()[-1])
    return parts


def ci_stages(script):
    """The make targets `.ci/run` runs as stages, in order."""
    return [re.findall(r"make (?:-o \S+ )*([\w-]+)", line)[0]
            for line in script.splitlines() if line.startswith("stage ") and " make " in line]


def test_ci_runs_every_part_of_make_test_in_order():
    parts = make_test_parts((ROOT / "Makefile").read_text())
    stages = ci_stages((ROOT / ".ci" / "run").read_text())
    assert parts == ["lint", "book", "test-first-pass", "test-timed-pass", "test-stress",
                     "test-other-numerics"], parts
    ran = [s for s in stages if s in parts]
    assert ran == parts, f".ci/run runs {ran} of make test's parts {parts}"


def test_the_readers_commands_are_in_ci():
    stages = ci_stages((ROOT / ".ci" / "run").read_text())
    for command in ("venv", "test-browser", "test-colab"):
        assert command in stages, f".ci/run does not run make {command}"


def test_the_parser_sees_a_part_left_out():
    makefile = "test: lint book\n\t$(MAKE) --no-print-directory -o book test-first-pass\n" \
               "\t$(MAKE) --no-print-directory test-stress\n"
    script = 'stage "lint" make lint\nstage "book" make book\nstage "x" make test-stress\n'
    parts = make_test_parts(makefile)
    assert parts == ["lint", "book", "test-first-pass", "test-stress"]
    assert [s for s in ci_stages(script) if s in parts] != parts
