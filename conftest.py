"""pytest settings for the whole repository: report how long each chapter took under nbval."""

import collections
import os
import pathlib
import sys

import pytest

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


_exit_status = 0


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the process as soon as pytest is done, with pytest's exit status.

    A guard: TensorFlow objects still alive at interpreter shutdown (such as
    a distribution strategy's tf.data iterator, which one accumulation test
    makes) are destroyed then, and TF 2.21's iterator destructor can wait
    forever for a thread that shutdown already stopped.  Every test has run
    and been reported by now; skipping the interpreter's teardown keeps
    `make test` from hanging after its summary.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)

