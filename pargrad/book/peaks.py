"""What an update costs in memory, measured in a fresh process: the book's two memory probes.

* :func:`peak_memory` (taught in the chapter "Accumulation in TF2 and
  across replicas"): the peak memory of one update as the batch grows, with the
  gradients of the whole batch computed at once or accumulated from
  micro-batches with :class:`pargrad.GradientAccumulator`;
* :func:`sync_update_peak_memory` (taught in the chapter "Accumulation in
  depth"): how far one update of :class:`pargrad.SyncTrainer` on four
  logical devices raises the peak, without accumulation and accumulating
  ``k`` micro-batches on every replica;
* :func:`counted_state_table` (taught in the chapter "When the model does
  not fit"): the bytes each device holds at ZeRO stages 0-3 on 1 to 8
  replicas, counted from the trainers' variables, beside the formula;
* :func:`stage_peaks` and :func:`predicted_peak_bytes` (taught in the same
  chapter): the peak of training a 50-million-parameter model at stages
  0-3 on four replicas, measured, beside what the state and the step's
  transient tensors predict.

They read the peak with :class:`PeakMeter` in a child process started for
the measurement: memory that a finished run gave back to the allocator
stays in the process and would hide the next run's peak, and nothing the
notebook holds should count.  Measurements for the book, not training
tools: they live in the book's layer.
"""

import json
import os
import subprocess
import sys

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

from pargrad.accumulate import GradientAccumulator  # noqa: E402
from pargrad.checks import check_whole_number  # noqa: E402

MEMORY_FEATURES = 2048   # the batch probe's model: 2048 inputs, two hidden layers of 512, 1 output
MEMORY_HIDDEN = 512
WIDTH = 2048             # the replica probe's model: WIDTH inputs, two hidden layers of WIDTH, 10 outputs
REPLICAS = 4


class PeakMeter:
    """Peak memory of the current process (MB) since :meth:`reset`.

    GPU: TensorFlow's peak device memory.  Linux CPU: the peak resident set
    (``VmHWM``), reset through ``/proc/self/clear_refs``.  Elsewhere: the peak
    resident set since the process started (``ru_maxrss``), which cannot be
    reset, so measurements must come in increasing order.
    """

    def __init__(self):
        self.gpu = bool(tf.config.list_physical_devices("GPU"))
        self.resettable = self.gpu or self._clear_refs()
        self.device = "GPU" if self.gpu else "CPU"

    @staticmethod
    def _clear_refs():
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            return True
        except OSError:
            return False

    def reset(self):
        if self.gpu:
            tf.config.experimental.reset_memory_stats("GPU:0")
        elif self.resettable:
            self._clear_refs()

    def peak_mb(self):
        if self.gpu:
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        if self.resettable:
            with open("/proc/self/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        import resource  # Unix only; Linux has taken the /proc branch above

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB; bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _in_fresh_process(probe, arguments, timeout):
    """Run ``probe(*arguments)`` of this module in a new Python process; return its JSON result."""
    code = ("import json, sys\n"
            f"from pargrad.book.peaks import {probe}\n"
            f"print(json.dumps({probe}(*map(json.loads, sys.argv[1:]))))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code, *map(json.dumps, arguments)],
                            capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the memory probe failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------
# The whole batch against accumulated micro-batches
# ----------------------------------------------------------------------------

def peak_memory(batch_sizes, micro_batch_size, timeout=180):
    """Peak memory (MB) of one update per batch size: whole, and accumulated.

    Measured in one fresh process on a model with 2048 inputs and two hidden
    layers of 512: for each batch size, once with the gradients of the
    whole batch computed at once, once accumulated from micro-batches of
    ``micro_batch_size`` (each built only when needed).  Returns
    ``{"device": "CPU" or "GPU", "resettable": bool, "whole_mb": [...],
    "accumulated_mb": [...]}``; on a CPU the figures are peak resident
    memory, TensorFlow itself included.

    Taught in the chapter "Accumulation in TF2 and across replicas".
    """
    sizes = [int(size) for size in batch_sizes]
    if not sizes or sizes != sorted(sizes) or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive and increasing, got {batch_sizes!r}.")
    micro_batch_size = check_whole_number("micro_batch_size", micro_batch_size)
    return _in_fresh_process("_batch_probe", [sizes, micro_batch_size], timeout)


def _batch_probe(batch_sizes, micro_batch_size, features=MEMORY_FEATURES, hidden=MEMORY_HIDDEN):
    """Run in a child process: peak memory (MB) of one update per batch size, both ways.

    First every batch size accumulated from micro-batches (built one at a
    time, as a data pipeline delivers them), then every batch size at once,
    so that even a peak that cannot be reset is measured in increasing order.
    """
    import keras

    keras.utils.set_random_seed(0)
    meter = PeakMeter()
    model = keras.Sequential([
        keras.Input(shape=(features,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(1),
    ])
    accumulator = GradientAccumulator(model.trainable_variables, 1, keras.optimizers.SGD(1e-3))
    spec = [tf.TensorSpec([None, features]), tf.TensorSpec([None, 1])]

    @tf.function(input_signature=spec)
    def add(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        accumulator.accumulate(tape.gradient(loss, model.trainable_variables), tf.shape(x)[0])

    apply = tf.function(accumulator.apply)

    def update(size, piece):
        for start in range(0, size, piece):
            n = min(piece, size - start)
            generator = tf.random.Generator.from_seed(start)
            add(generator.normal([n, features]), generator.normal([n, 1]))
        apply()

    update(micro_batch_size, micro_batch_size)  # trace and warm up before measuring
    report = {"device": meter.device, "resettable": meter.resettable}
    for name, piece in (("accumulated_mb", micro_batch_size), ("whole_mb", None)):
        report[name] = []
        for size in batch_sizes:
            meter.reset()
            update(size, piece or size)
            report[name].append(round(meter.peak_mb(), 1))
    return report


# ----------------------------------------------------------------------------
# Accumulating on every replica
# ----------------------------------------------------------------------------

def probe_parameter_bytes(width=WIDTH):
    """Bytes of the replica probe model's float32 parameters (weights and biases)."""
    parameters = width * width + width + width * width + width + width * 10 + 10
    return 4 * parameters


def sync_update_peak_memory(accumulation_steps, micro_batch=8, width=WIDTH, timeout=180):
    """Peak-memory rise (MB) of one update on four replicas, in a fresh process.

    Returns ``{"device": "CPU" or "GPU", "resettable": bool, "rise_mb": float}``.
    Taught in the chapter "Accumulation in depth".
    """
    arguments = [check_whole_number(name, value) for name, value in (
        ("accumulation_steps", accumulation_steps), ("micro_batch", micro_batch),
        ("width", width))]
    return _in_fresh_process("_replica_probe", arguments, timeout)


def _replica_probe(accumulation_steps, micro_batch, width):
    """Run in a child process: MB the peak rose during the first update, and the device."""
    # In a child process: the devices are split before Keras and the trainer load.
    import pargrad

    pargrad.logical_devices(REPLICAS)
    import keras
    import numpy as np

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


# ----------------------------------------------------------------------------
# Sharded training state, counted per device
# ----------------------------------------------------------------------------

COUNTED_FEATURES = 16    # the counting model: 16 inputs, 64 tanh units, 1 output (1153 parameters)
COUNTED_HIDDEN = 64


def counted_state_table(replica_counts=(1, 2, 4, 8), optimizer="adam", timeout=240):
    """Bytes a device holds at stages 0-3, counted from the trainers' variables, beside the formula.

    In a fresh process split into ``max(replica_counts)`` logical devices
    (the notebook's own split cannot change), for every stage and number of
    replicas: a float32 model of 1153 parameters (16 inputs, 64 tanh units,
    one output: no number of replicas above 1 divides it), trained with
    ``optimizer`` (``"adam"`` or ``"momentum"``) by :class:`pargrad.SyncTrainer`
    (stage 0) or :class:`pargrad.ShardedTrainer` (stages 1-3), counted with
    :func:`pargrad.memory.bytes_by_device`.  Returns a list of rows
    ``{"stage", "replicas", "parameters", "counted": [{component: bytes} for
    each replica's device], "formula": state_bytes(...)}``.

    Taught in the chapter "When the model does not fit".
    """
    counts = [check_whole_number("replica_counts", n) for n in replica_counts]
    if optimizer not in ("adam", "momentum"):
        raise ValueError(f"optimizer must be 'adam' or 'momentum', got {optimizer!r}.")
    return _in_fresh_process("_counted_probe", [counts, optimizer], timeout)


def _counted_probe(replica_counts, optimizer_name):
    """Run in a child process: the rows of :func:`counted_state_table`."""
    import pargrad

    pargrad.logical_devices(max(replica_counts))
    import keras

    from pargrad import memory
    from pargrad.sharded import ShardedTrainer
    from pargrad.strategies import sync_strategy
    from pargrad.sync import SyncTrainer

    rows = []
    for replicas in replica_counts:
        strategy = sync_strategy(replicas)
        devices = list(strategy.extended.worker_devices)
        for stage in range(4):
            keras.utils.set_random_seed(0)
            with strategy.scope():
                model = keras.Sequential([keras.Input((COUNTED_FEATURES,)),
                                          keras.layers.Dense(COUNTED_HIDDEN, "tanh"),
                                          keras.layers.Dense(1)])
                optimizer = (keras.optimizers.Adam(1e-3) if optimizer_name == "adam"
                             else keras.optimizers.SGD(1e-3, momentum=0.9))
            if stage == 0:
                trainer = SyncTrainer(model, strategy, loss="mse", optimizer=optimizer,
                                      progress=False)
            else:
                trainer = ShardedTrainer(model, strategy, stage=stage, loss="mse",
                                         optimizer=optimizer, progress=False)
            held = memory.bytes_by_device(trainer)
            parameters = model.count_params()
            rows.append({
                "stage": stage, "replicas": replicas, "parameters": parameters,
                "counted": [held.get(tf.DeviceSpec.from_string(d).to_string(), {})
                            for d in devices],
                "formula": memory.state_bytes(parameters, replicas=replicas, stage=stage,
                                              precision="float32", optimizer=optimizer_name),
            })
    return rows


# ----------------------------------------------------------------------------
# Peaks measured at stages 0-3: the model that does not fit
# ----------------------------------------------------------------------------

PEAK_WIDTH = 2500        # the peak probe's model: 8 Dense layers of 2500 x 2500 (+ bias), float32
PEAK_LAYERS = 8          # 50,020,000 parameters, 200 MB; one layer (a stage-3 unit) 25 MB


def peak_parameters(width=PEAK_WIDTH, layers=PEAK_LAYERS):
    """Parameters of the peak probe's model: ``layers`` Dense layers of ``width`` x ``width``."""
    return layers * (width * width + width)


def stage_peaks(stages=(0, 1, 2, 3), width=PEAK_WIDTH, layers=PEAK_LAYERS, per_replica=4,
                steps=2, timeout=240):
    """Peak memory of training at ZeRO stages 0-3 on four replicas, each stage in a fresh process.

    The model: ``layers`` Dense layers of ``width`` x ``width`` (ReLU but the
    last), float32, Adam, on :data:`REPLICAS` logical devices,
    ``per_replica`` examples a replica, ``steps`` steps; stage 0 is
    :class:`pargrad.SyncTrainer`, stages 1-3 :class:`pargrad.ShardedTrainer`.
    Each stage runs in a process of its own, so that no other run's memory
    hides its peak.  Returns one row a stage: ``{"stage", "device",
    "resettable", "idle_mb", "peak_mb", "per_device_mb", "counted",
    "parameters", "width", "layers", "per_replica", "transient_bytes",
    "unit_bytes"}``, where ``peak_mb`` is how far training
    raised the peak above the idle process (TensorFlow imported, devices
    split).  On a CPU the four logical devices share one process and one
    allocator, so the peak is the resident set's (``VmHWM``), the sum over
    the devices, and ``per_device_mb`` is None; on a GPU each logical GPU's
    peak is read and ``peak_mb`` is their sum.  ``counted`` is what
    :func:`pargrad.memory.bytes_by_device` counts, summed over the devices,
    by component; ``unit_bytes`` the largest layer's parameter bytes.

    Taught in the chapter "When the model does not fit".
    """
    stages = [check_whole_number("stages", stage, 0) for stage in stages]
    if not stages or any(stage > 3 for stage in stages):
        raise ValueError(f"stages must be among 0, 1, 2 and 3, got {stages!r}.")
    arguments = [check_whole_number(name, value) for name, value in (
        ("width", width), ("layers", layers), ("per_replica", per_replica), ("steps", steps))]
    return [_in_fresh_process("_stage_probe", [stage, *arguments], timeout) for stage in stages]


def _stage_probe(stage, width, layers, per_replica, steps):
    """Run in a child process: the row of :func:`stage_peaks` for one stage."""
    import pargrad

    # A GPU's logical devices get 1 GB each by default: too little for stage 0's 1 GB a replica.
    room = 4096 if tf.config.list_physical_devices("GPU") else None
    devices = pargrad.logical_devices(REPLICAS, memory_limit_mb=room)
    import keras
    import numpy as np

    from pargrad import memory
    from pargrad.sharded import ShardedTrainer
    from pargrad.strategies import sync_strategy
    from pargrad.sync import SyncTrainer

    gpus = [d for d in devices if "GPU" in d.upper()]
    meter = PeakMeter()
    batch = per_replica * REPLICAS
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    y = rng.standard_normal((batch, width)).astype(np.float32)
    strategy = sync_strategy(REPLICAS)
    meter.reset()
    for gpu in gpus:
        tf.config.experimental.reset_memory_stats(gpu)
    idle = meter.peak_mb() if not gpus else 0.0
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((width,))] + [
            keras.layers.Dense(width, activation="relu" if i < layers - 1 else None)
            for i in range(layers)])
        optimizer = keras.optimizers.Adam(1e-4)
    if stage == 0:
        trainer = SyncTrainer(model, strategy, loss="mse", optimizer=optimizer, progress=False)
    else:
        trainer = ShardedTrainer(model, strategy, stage=stage, loss="mse", optimizer=optimizer,
                                 progress=False)
    trainer.fit(x, y, steps=steps, batch_size=batch, steps_per_call=steps)
    counted = dict.fromkeys(memory.COMPONENTS + ("total",), 0)
    for held in memory.bytes_by_device(trainer).values():
        for component, nbytes in held.items():
            counted[component] += nbytes
    # What a replica holds as tensors during a step, as the trainer reports it (stages 1-3).
    transient = (sum(trainer.transient_bytes().values())
                 if hasattr(trainer, "transient_bytes") else None)
    per_device = None
    if gpus:
        per_device = [tf.config.experimental.get_memory_info(gpu)["peak"] / 2**20 for gpu in gpus]
        peak = sum(per_device)
    else:
        peak = meter.peak_mb() - idle
    return {"stage": stage, "device": meter.device, "resettable": meter.resettable,
            "idle_mb": round(idle, 1), "peak_mb": round(peak, 1), "per_device_mb": per_device,
            "counted": counted, "parameters": model.count_params(),
            "width": width, "layers": layers, "per_replica": per_replica,
            "transient_bytes": transient,
            "unit_bytes": 4 * (width * width + width)}


def predicted_peak_bytes(row, replicas=REPLICAS):
    """The peak :func:`stage_peaks` should measure for ``row``, in bytes, and its parts.

    What a step holds at its fullest, summed over the ``replicas``:

    * the persistent state, counted from the trainer's variables
      (``row["counted"]``: at stage 0 it counts one gradient a replica, the
      tape's);
    * the gradient held twice a replica while it changes form: at stage 0
      the tape's gradient and the all-reduced sum each replica receives
      (one copy of the parameters' bytes); at stages 1 and 2 the weights
      the model runs on (joined from the replica's pieces) and their
      gradient, then the gradient and the flat vector it is joined into
      (two copies of the parameters); at stage 3, which gathers one unit
      at a time, two copies of the largest unit, ``row["unit_bytes"]``
      (its gathered weights, then its gradient); where the row has the
      trainer's own count, ``row["transient_bytes"]``
      (:meth:`pargrad.ShardedTrainer.transient_bytes`), that count;
    * at stages 1 to 3, the reduce-scatter's result: each owner's sum of
      its slices, one copy of what is reduced at once over the owners
      (the parameters at stages 1 and 2, one unit at stage 3);
    * at stages 1 to 3, the model as Keras built it, whole, before the
      trainer sharded it: released, its memory is not returned to the
      system in this process (measured: the resident set does not fall
      when its variables are dropped); FSDP avoids it by building the
      model already sharded (deferred initialization);
    * the activations: ``layers`` x ``per_replica`` x ``width`` values a
      replica, kept from the forward to the backward pass (a few MB here).

    Returns ``{"state", "gradient_forms", "owners_sums", "built_model",
    "activations", "total"}`` in bytes (the book's tables print MB of 2**20 bytes).
    Taught in the chapter "When the model does not fit".
    """
    parameter_bytes = 4 * row["parameters"]
    reduced = row.get("unit_bytes", parameter_bytes) if row["stage"] == 3 else parameter_bytes
    copies = {0: parameter_bytes, 1: 2 * parameter_bytes, 2: 2 * parameter_bytes,
              3: 2 * reduced}[row["stage"]]
    if row["stage"] >= 1 and row.get("transient_bytes") is not None:
        copies = row["transient_bytes"]      # the trainer's own count (transient_bytes())
    parts = {"state": row["counted"]["total"], "gradient_forms": replicas * copies,
             "owners_sums": reduced if row["stage"] >= 1 else 0,
             "built_model": parameter_bytes if row["stage"] >= 1 else 0,
             "activations": replicas * 4 * row["layers"] * row["per_replica"] * row["width"]}
    parts["total"] = sum(parts.values())
    return parts
