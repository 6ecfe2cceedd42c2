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
