"""Unit tests share one process: split the CPU (or GPU) into 4 logical devices first.

Tests that need another split run in a subprocess: the ``run_python`` fixture.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import pargrad
import tensorflow as tf

DEVICES = pargrad.logical_devices(4)
# The tests compare float32 runs within float32 rounding; on Ampere and newer
# GPUs TensorFlow would run float32 matrix products in TF32 (about 1e-3
# relative error).  No effect on CPUs.
tf.config.experimental.enable_tensor_float_32_execution(False)


@pytest.fixture(scope="module")
def deterministic_ops():
    """Deterministic kernels for a module whose tests compare runs bit for bit.

    On a CPU TensorFlow's kernels already add in a fixed order; on a GPU
    some (a bias's or a convolution's gradient) may not, unless op
    determinism is on.  It is switched off again after the module, because
    it makes ``tf.timestamp`` raise, which the book's instrumented trainer
    uses.  TensorFlow's public API can only switch it on, hence the private
    ``disable_op_determinism``.
    """
    from tensorflow.python.framework import config

    tf.config.experimental.enable_op_determinism()
    yield
    config.disable_op_determinism()


def _run_python(code, timeout=120, env=None):
    """Run ``code`` in a fresh Python process; return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )


@pytest.fixture
def devices():
    """The four logical devices of the test session."""
    return DEVICES


@pytest.fixture
def run_python():
    """``run_python(code, timeout=120, env=None)``: run code in a fresh process."""
    return _run_python
