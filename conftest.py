"""pytest settings for the whole repository: report how long each chapter took under nbval."""

import collections
import pathlib

_chapter_seconds = collections.defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _chapter_seconds[path] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _chapter_seconds:
        return
    terminalreporter.section("slowest chapters (nbval, seconds)")
    for path, seconds in sorted(_chapter_seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:7.1f}  {pathlib.Path(path).name}")
