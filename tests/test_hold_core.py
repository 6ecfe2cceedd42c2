"""An emulated slow device holds its core (busy work), it does not lend it by sleeping."""

import threading
import time

import pargrad  # noqa: F401  (TensorFlow quietly)
from pargrad.asynchronous import hold_core


def test_hold_core_keeps_the_thread_busy_for_the_time_asked():
    started, cpu = time.perf_counter(), time.thread_time()
    held = hold_core(0.3)
    busy = time.thread_time() - cpu
    assert 0.3 <= held <= time.perf_counter() - started
    # a sleep would use about 0.0001 s of this thread's CPU time; busy work uses
    # all it gets (on a loaded machine, a share of the 0.3 s)
    assert busy > 0.01


def test_hold_core_stops_when_the_run_stops():
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    assert hold_core(10.0, stop) < 2.0
    assert hold_core(0.0) < 0.1
