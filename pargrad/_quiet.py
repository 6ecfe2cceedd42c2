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
import sys


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
    return tf
