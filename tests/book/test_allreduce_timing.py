"""pargrad.book.allreduce_timing: the measurements behind the chapter "What communication costs"."""

import json

import pytest

from pargrad.book import allreduce_timing


def test_payloads_must_be_whole_float32_tensors():
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        allreduce_timing._elements(6)
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        allreduce_timing._elements(0)
    assert allreduce_timing._elements(1024) == 256


def test_all_reduce_times_in_a_fresh_process(run_python):
    # A fresh process: a MirroredStrategy with collective ops must be the only
    # one of its size in the process (see sync_strategy).
    result = run_python("""
        import json
        import pargrad
        devices = pargrad.logical_devices(2)
        import tensorflow as tf
        from pargrad.book import allreduce_timing
        strategy = tf.distribute.MirroredStrategy(devices)
        seconds = allreduce_timing.time_all_reduce(strategy, [4, 4096], repeats=2)
        packing = allreduce_timing.time_packing(strategy, tensors=3, tensor_bytes=16, repeats=1)
        print(json.dumps({"seconds": seconds, "packing": packing}))
    """, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(measured["seconds"]) == 2 and all(s > 0 for s in measured["seconds"])
    assert set(measured["packing"]) == {"separate", "packed", "one_tensor"}
