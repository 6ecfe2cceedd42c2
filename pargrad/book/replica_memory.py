"""What accumulating on every replica costs in memory, measured.

Taught in the chapter "Accumulate and distribute".  :func:`sync_update_peak_memory`
runs one update of :class:`pargrad.SyncTrainer` on four logical devices in a
fresh process, once without accumulation and once accumulating ``k``
micro-batches of the same size, and reports how far the process's peak
memory rose above what it held before the update.  A fresh process for each
run, because memory that a finished run gave back to the allocator stays in
the process and would hide the next run's peak.  The peak is read as in the
chapter "Accumulation in TF2 and Keras 3" (``pargrad.accumulate``'s meter:
the GPU's peak, or on Linux the peak resident set, reset before the update).
"""

import json
import os
import subprocess
import sys

WIDTH = 2048        # the probe model: WIDTH inputs, two hidden layers of WIDTH, 10 outputs
REPLICAS = 4


def probe_parameter_bytes(width=WIDTH):
    """Bytes of the probe model's float32 parameters (weights and biases)."""
    parameters = width * width + width + width * width + width + width * 10 + 10
    return 4 * parameters


def _probe(accumulation_steps, micro_batch, width):
    """Run in a child process: MB the peak rose during the first update, and the device."""
    import pargrad

    pargrad.logical_devices(REPLICAS)
    import keras
    import numpy as np

    from pargrad.book.accumulation_memory import PeakMeter
    from pargrad.strategies import sync_strategy
    from pargrad.sync import SyncTrainer

    keras.utils.set_random_seed(0)
    strategy = sync_strategy(REPLICAS)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((width,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10),
        ])
    trainer = SyncTrainer(model, strategy, loss="mse", learning_rate=1e-3,
                          accumulation_steps=accumulation_steps, progress=False)
    batch = micro_batch * accumulation_steps * REPLICAS
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    y = rng.standard_normal((batch, 10)).astype(np.float32)
    meter = PeakMeter()
    meter.reset()
    before = meter.peak_mb()
    trainer.fit(x, y, steps=1, batch_size=batch)
    return {"device": meter.device, "resettable": meter.resettable,
            "rise_mb": meter.peak_mb() - before}


def sync_update_peak_memory(accumulation_steps, micro_batch=8, width=WIDTH, timeout=180):
    """Peak-memory rise (MB) of one update on four replicas, in a fresh process.

    Returns ``{"device": "CPU" or "GPU", "resettable": bool, "rise_mb": float}``.
    Taught in the chapter "Accumulate and distribute".
    """
    for name, value in (("accumulation_steps", accumulation_steps), ("micro_batch", micro_batch),
                        ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
    code = ("import json, sys\n"
            "from pargrad.book.replica_memory import _probe\n"
            "print(json.dumps(_probe(*map(int, sys.argv[1:]))))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code, str(accumulation_steps), str(micro_batch), str(width)],
        capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the memory probe failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
