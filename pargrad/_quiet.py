"""Keep TensorFlow's start-up log lines out of notebooks and test output.

TensorFlow's native libraries print lines such as "Could not find cuda
drivers" straight to file descriptor 2 while they load, before any of
TensorFlow's own log settings apply.  Jupyter shows those lines as red
stderr output in every chapter.  We import TensorFlow once with file
descriptor 2 pointed at /dev/null; every later ``import tensorflow`` is
the cached module and prints nothing.
"""

import contextlib
import logging
import os
import re
import sys

# The oldest releases pargrad works with (pyproject.toml says the same; the
# CI runs the unit tests with exactly these).  Keras before 3.7 wraps a
# model's variables in a way that tf.distribute combines wrongly; before
# 3.8, Dropout cannot be built under MirroredStrategy; before 3.10, metrics
# read under a strategy come out wrong (pargrad's evaluate among them); and
# before 3.11, Keras numbers a multi-step call's batches differently from
# pargrad's trainers (tests/test_sync.py checks all four).
MINIMUM_VERSIONS = {"tensorflow": (2, 16), "keras": (3, 11)}


@contextlib.contextmanager
def native_stderr_silenced():
    """Point file descriptor 2 at /dev/null for the duration of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow_quietly():
    """Import TensorFlow (and Keras) without their native start-up messages."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" not in sys.modules:
        with native_stderr_silenced():
            import tensorflow  # noqa: F401
            import keras  # noqa: F401
    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    check_versions()
    return tf


class VersionTooOldError(ImportError):
    """TensorFlow or Keras is older than pargrad supports."""


def check_versions():
    """Raise :class:`VersionTooOldError`, saying what to install, if TF or Keras is too old."""
    import keras
    import tensorflow as tf

    for name, module in (("tensorflow", tf), ("keras", keras)):
        have = _release(module.__version__)
        need = MINIMUM_VERSIONS[name]
        if have < need:
            wanted = ".".join(map(str, need))
            raise VersionTooOldError(
                f"pargrad needs {name} >= {wanted}, but this Python has {name} "
                f"{module.__version__}. Run `pip install -U '{name}>={wanted}'` "
                "(on Colab: in a cell, then Runtime > Restart session) and import "
                "pargrad again."
            )


def _release(version):
    """(major, minor) of a version string such as '2.21.0' or '3.7.0rc1'."""
    numbers = re.findall(r"\d+", version)[:2]
    return tuple(int(n) for n in numbers) + (0,) * (2 - len(numbers))
