# %% [markdown]
# # When the model does not fit
#
# ```{admonition} Takeaway
# ZeRO shards what data parallelism keeps whole on every device (weights,
# gradients, optimizer state), with the same updates bit for bit.
# Measured, the peak falls less than the state: a step also holds
# gradients, and stage 3 one layer's weights at a time. Stages 1 and 2
# send what an all-reduce sends, stage 3 half as much again.
# ```
#
# Each replica of data parallelism keeps, for every parameter, the weight,
# its gradient and the {term}`optimizer state` (what the optimizer keeps
# between updates: a velocity for {term}`momentum`, two moments for Adam).
# With {term}`mixed precision` (its section below) the model computes in 16
# bits and the optimizer updates float32 {term}`master weights`: 2 + 2 + 12
# bytes a parameter, the 12 being the master copy and Adam's two moments
# {cite}`tazi2025ultrascale`. More replicas shrink none of it.
#
# {term}`ZeRO` {cite}`rajbhandari2019zero` removes the copies. Each replica
# becomes the {term}`shard owner` of 1/N of the parameters. Stage 1 keeps
# the optimizer state and master weights only at the owner; stage 2 also the
# gradients; stage 3 also the weights, gathered when a layer needs them and
# freed afterwards (PyTorch's {term}`FSDP` {cite}`zhao2023fsdp`). A step
# still sums the replicas' gradients and applies one update; only who keeps
# which part changes ({numref}`fig-sharded-step`): the gradients are
# {term}`reduce-scattered <reduce-scatter>` (each owner receives the sum of
# its part only), each owner updates its part, and the new weights are
# {term}`all-gathered <all-gather>`. A {term}`ring all-reduce` *is* a
# reduce-scatter and an all-gather, so stages 1 and 2 send what data
# parallelism sends; stage 3 gathers the weights twice, for the forward and
# the backward pass.
#
# The ZeRO paper's Figure 1 (7.5 billion parameters, mixed-precision Adam,
# 64 devices), from the book's formula `pargrad.memory.state_bytes`:

# %% tags=["colab", "hide-input"]
# On Colab: install pargrad and what its chapters need. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad[book] @ git+{REPOSITORY}@main"],
        check=True,
    )

# %% [markdown]
# `pargrad` first; then two logical CPUs for the program below, and the
# chapter's two logical devices (the same two CPUs, or two logical GPUs on a
# GPU); then seeds.

# %%
import numpy as np
import pargrad  # first: it imports TensorFlow quietly
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]  # as the program below splits it
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
devices = pargrad.logical_devices(2)

import keras  # noqa: E402
from pargrad import allreduce, cost, memory  # noqa: E402
from pargrad.book.plots_sharded import memory_against_replicas, sharded_step_diagram  # noqa: E402
from pargrad.book.parabola import parabola_data, parabola_model  # noqa: E402
from pargrad.strategies import sync_strategy  # noqa: E402

keras.utils.set_random_seed(0)
# Bit-for-bit comparisons: on a GPU, reductions may otherwise add in any order.
tf.config.experimental.enable_op_determinism()
print(devices)

# %%
GB = 1e9
for stage in range(4):
    held = memory.state_bytes(7_500_000_000, replicas=64, stage=stage, precision="mixed", optimizer="adam")
    print(f"stage {stage}: {held['total'] / GB:5.1f} GB a device")

# %% [markdown]
# (Stage 0 is plain data parallelism.) In the Ultra-Scale Playbook's
# notation {cite}`tazi2025ultrascale`, Ψ parameters on N devices with
# mixed-precision Adam, a device holds (parameters + gradients + optimizer
# state with the master weights):
#
# | stage | bytes a device |
# | --- | --- |
# | 0 | 2Ψ + 2Ψ + 12Ψ |
# | 1 | 2Ψ + 2Ψ + 12Ψ/N |
# | 2 | 2Ψ + (2 + 12)Ψ/N |
# | 3 | (2 + 2 + 12)Ψ/N |
#
# Which stage first holds this state on devices of the usual sizes:

# %%
for device_gb in (32, 40, 80):
    first = next(stage for stage in range(4) if memory.state_bytes(
        7_500_000_000, replicas=64, stage=stage, precision="mixed", optimizer="adam")["total"]
        <= device_gb * GB)
    print(f"a {device_gb} GB device: stage {first} is the first whose state fits")

# %% tags=["remove-cell"]
assert first == 1  # the paper trains this model with stage 1 on 32 GB GPUs

# %% [markdown]
# Stage 1 already fits them all: the ZeRO paper trains this model with
# stage 1 on the smallest of them. Stage 2 leaves more room, and stage 3
# most, for the activations, which come on top and are not sharded.

# %% mystnb={"figure": {"caption": "One step of sharded training on four replicas (a drawing). 1: each replica computes the gradient of its shard of the batch, for all parameters. 2: the reduce-scatter leaves with each owner the sum of its part only. 3: each owner updates its part with the optimizer state only it keeps. 4: the all-gather gives every replica all the new weights. Steps 2 and 4 together are a ring all-reduce.", "name": "fig-sharded-step"}}
fig = sharded_step_diagram(4)

# %% [markdown]
# **In this chapter you will** run stage 1 in plain TensorFlow, then stages
# 1 to 3 with `pargrad.ShardedTrainer`; count the bytes each device holds
# and sends against the formulas; and meet TensorFlow's traps.
#
# ## A program you can copy
#
# Stage 1 for the y = x² question's network in float64, beside mirrored
# Adam (as in [Synchronous training](03_synchronous)). Each device keeps a
# whole model and an Adam built only for the layer it owns (whole
# variables, as PyTorch's `ZeroRedundancyOptimizer` assigns them). `step`
# computes each half's gradients on its device, sums each layer's two
# gradients on its owner (the reduce), lets the owner's Adam update the
# layer, and copies it to the other device (the gather).

# %% tags=["program"]
import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # before TensorFlow loads: no C++ logs on the page
import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]  # first of all: two logical CPUs
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
devices = [device.name for device in tf.config.list_logical_devices("CPU")]
keras.config.set_floatx("float64")  # weights, gradients and Adam's moments in float64
halves = [(x, x**2) for x in np.split(np.linspace(-2.0, 2.0, 50)[:, None], 2)]  # y = x², 25 points a device


def new_model():  # the y = x² question's 1-5-1 tanh network, the same weights at every call
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(5, "tanh"), keras.layers.Dense(1)])


def gradients(model, x, y):  # of this half's share of the whole batch's mean squared error
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(model(x) - y)) / 50
    return tape.gradient(loss, model.trainable_variables)


strategy = tf.distribute.MirroredStrategy(devices, tf.distribute.ReductionToOneDevice())
with strategy.scope():  # the reference: both devices keep all weights and all of Adam's state
    mirrored, mirrored_adam = new_model(), keras.optimizers.Adam(0.01)
data = strategy.experimental_distribute_values_from_function(lambda c: halves[c.replica_id_in_sync_group])
replicas, adams = [], [keras.optimizers.Adam(0.01) for _ in devices]  # stage 1, below
for owner, device in enumerate(devices):
    with tf.device(device):  # device r keeps a whole model, and Adam's moments for layer r only
        replicas.append(new_model())
        adams[owner].build(replicas[owner].layers[owner].weights)


@tf.function
def step():
    strategy.run(lambda batch: mirrored_adam.apply_gradients(  # Keras sums the two gradients
        zip(gradients(mirrored, *batch), mirrored.trainable_variables)), args=(data,))
    parts = []
    for model, device, batch in zip(replicas, devices, halves):
        with tf.device(device):  # each device: the gradients of its half, for both layers
            parts.append(gradients(model, *batch))
    for owner, device in enumerate(devices):  # device r owns layer r (its kernel and bias)
        with tf.device(device):  # reduce: the owner sums its layer's gradients, and updates it
            sums = [parts[0][i] + parts[1][i] for i in (2 * owner, 2 * owner + 1)]
            adams[owner].apply_gradients(zip(sums, replicas[owner].layers[owner].weights))
        for copy, new in zip(replicas[1 - owner].layers[owner].weights, replicas[owner].layers[owner].weights):
            copy.assign(new)  # gather: the other device copies the owner's new values


for _ in range(200):
    step()
gap = max(np.abs(a - b).max() for r in replicas for a, b in zip(r.get_weights(), mirrored.get_weights()))
print(f"largest weight gap to mirrored Adam after 200 steps: {gap}")

# %% [markdown]
# Bit for bit: each sum is the same addition, and Adam's update is
# element-wise. What each device keeps of Adam's state:

# %%
def moments(optimizer):  # numbers in an Adam's moment variables (not its step counter)
    return sum(int(np.prod(v.shape)) for v in optimizer.variables if len(v.shape) > 0)


for rank, device in enumerate(devices):
    print(f"{device}: stage 1 keeps {moments(adams[rank])} numbers of Adam's state, "
          f"mirrored Adam {moments(mirrored_adam)}")

# %% tags=["remove-cell"]
# The program trained (the weights moved), every replica holds the same weights,
# and each owner's Adam moments live on the owner's device.
start = new_model().get_weights()
assert max(np.abs(a - b).max() for a, b in zip(mirrored.get_weights(), start)) > 0.1
assert gap == 0.0
for rank, device in enumerate(devices):
    for v in adams[rank].variables:
        if len(v.shape) > 0:
            assert v.value.device.endswith(device.split("device:")[-1]), (v.path, v.value.device)
assert moments(adams[0]) + moments(adams[1]) == moments(mirrored_adam)
keras.config.set_floatx("float32")  # the program set float64 for all of Keras; back to the default
devices = pargrad.logical_devices(2)  # the chapter's devices again (logical GPUs on a GPU)

# %% [markdown]
# ## `ShardedTrainer`: stages 1 to 3, equal to `SyncTrainer`
#
# `pargrad.ShardedTrainer(model, strategy, stage=...)` does this for any
# Keras model whose variables are all trainable, on `SyncTrainer`'s fit loop
# (`fit`, `evaluate`, callbacks, exact resume). It flattens the variables
# into one vector padded with zeros to a multiple of N, so every owner holds
# as many values (with whole variables, the largest layer's owner holds the
# most), and gives each owner a copy of your optimizer on its device. One
# step:

# %%
from pargrad.book import show_lines  # noqa: E402
from pargrad.sharded import ShardedTrainer, mirrored_slots  # noqa: E402
from pargrad.sync import SyncTrainer  # noqa: E402

show_lines(ShardedTrainer._sharded_step, "loss, flat = self.strategy.run(replica_step)",
           "return self._owners_update(losses, shards)")
show_lines(ShardedTrainer._owners_update, "for s, device in enumerate(self._devices):",
           "self._all_gather(updates)")

# %% [markdown]
# `strategy.run` computes each replica's gradient as one flat vector (kept
# whole at stage 1; at stages 2 and 3 only the owners' reduced shards are
# kept). `_reduce_scatter` sends slice s of every gradient to owner s, which
# adds them. The owners update outside `strategy.run`, each under its
# device. At stages 1 and 2 each replica holds its copy of the parameters
# as N pieces, and owner s's optimizer updates piece s of its own copy in
# place (no master copy); `_all_gather` copies it into the other replicas'
# piece s.
#
# At stage 3 the model runs one *unit* at a time (a layer, or layers
# grouped with `units=`, FSDP's wrapping policy): its weights are gathered
# before its forward pass and dropped after. The backward pass gathers
# them again, recomputes the unit's forward pass from its stored input (a
# tape keeps what it watched; about one more forward pass, as
# `tf.recompute_grad`), and sends the unit's gradient to the owners at once:

# %%
show_lines(ShardedTrainer._unit_step, "for u in reversed(range(len(self.units))):",
           "self.units[u], [list(g) for g in zip(*grads)], add=i > 0)")

#
# The three stages against `SyncTrainer` with the same Adam, in float64, for
# a 1-6-1 network (19 parameters: two shards of 10, one value of padding);
# the largest gaps over every weight and moment after 100 steps:

# %% tags=["hide-input"]
x64, y64 = parabola_data(dtype="float64")
strategy = sync_strategy(2)
histories = {}  # trainer -> what its fit returned


def trained(stage, steps=100, **options):
    """A trainer (SyncTrainer for stage 0) after `steps` full-batch Adam steps on y = x²."""
    with strategy.scope():
        model = parabola_model(hidden=6, dtype="float64")
        adam = keras.optimizers.Adam(0.01)
    kind = SyncTrainer if stage == 0 else ShardedTrainer
    trainer = kind(model, strategy, loss="mse", optimizer=adam, progress=False,
                   **({} if stage == 0 else {"stage": stage}), **options)
    histories[trainer] = trainer.fit(x64, y64, steps=steps, batch_size=50)
    return trainer


def largest_gap(left, right):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(left, right))


reference = trained(0)
reference_slots = mirrored_slots(reference.optimizer)
sharded = {stage: trained(stage) for stage in (1, 2, 3)}
for stage, trainer in sharded.items():
    slots = trainer.gathered_slots()
    slot_gap = max(largest_gap(slots[name], reference_slots[name]) for name in reference_slots)
    print(f"stage {stage}: weight gap {largest_gap(trainer.gathered_weights(), reference.model.get_weights())}, "
          f"Adam state gap {slot_gap}")

# %% tags=["remove-cell"]
for stage, trainer in sharded.items():
    assert trainer.stage == stage and trainer.parameter_count == 19 and trainer.shard_size == 10
    assert all(np.all(v == 0) for v in trainer.padding().values())
    if stage < 3:
        for copy in trainer.replica_weights():
            assert largest_gap(copy, trainer.gathered_weights()) == 0.0
assert largest_gap(reference.model.get_weights(), parabola_model(hidden=6, dtype="float64").get_weights()) > 0.1

# %% [markdown]
# Bit for bit, stage 3 included: every gradient is summed in the mirrored
# run's order (`tf.distribute.ReductionToOneDevice` adds replica 0's, then
# 1's), and a slice of an element-wise update is the update of the slice.
#
# A checkpoint (`tf.train.Checkpoint(trainer=...)`, at every stage, before
# or after `fit`) holds the parameters and the owners' optimizer state
# gathered and unpadded, and restoring cuts them into the new trainer's
# shards, so it restores at another stage or replica count, as PyTorch's
# distributed checkpoint reshards on load. A run saved at stage 2 after 50
# steps and resumed at stage 3 in a new trainer, whose model started
# elsewhere, against the uninterrupted 100 steps of stage 3; then
# `unshard()`, which puts stage 3's weights back into the Keras model
# (released while the trainer trains) so that it predicts and saves:

# %%
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as folder:
    first = trained(2, steps=50)
    saved = tf.train.Checkpoint(trainer=first).save(f"{folder}/ckpt")
    with strategy.scope():
        other = parabola_model(seed=1, hidden=6, dtype="float64")
        adam = keras.optimizers.Adam(0.01)
    resumed = ShardedTrainer(other, strategy, stage=3, loss="mse", optimizer=adam, progress=False)
    tf.train.Checkpoint(trainer=resumed).restore(saved).assert_consumed()
    resumed.fit(x64, y64, steps=50, batch_size=50)
print(f"saved at stage 2, resumed at stage 3, against uninterrupted stage 3: weight gap "
      f"{largest_gap(resumed.gathered_weights(), sharded[3].gathered_weights())}")
print(f"evaluate: loss {resumed.evaluate(x64, y64)['loss']:.6f}")
model = sharded[3].unshard()  # the weights back in the Keras model: it predicts and saves again
print(f"stage 3 after unshard(): model.get_weights() against gathered_weights(): gap "
      f"{largest_gap(model.get_weights(), sharded[3].gathered_weights())}; "
      f"model.predict gives {model.predict(x64[:3], verbose=0).shape}")

# %% [markdown]
# With `accumulation_steps=k`, stages 2 and 3 add each micro-batch's reduced
# shard into the owner's accumulator (1/N of the sums): over replicas first,
# then micro-batches, where `SyncTrainer` adds each replica's micro-batches
# first. Another order, so equal within float64 rounding
# (`pargrad.rounding_tolerance`):

# %%
tolerance = pargrad.rounding_tolerance("float64", 100)
accumulated = trained(2, accumulation_steps=5)
sync_accumulated = trained(0, accumulation_steps=5)
gap = largest_gap(accumulated.gathered_weights(), sync_accumulated.model.get_weights())
print(f"stage 2, 5 micro-batches a step, against SyncTrainer: weight gap below {tolerance:.0e}"
      if gap < tolerance else f"UNEXPECTED: weight gap {gap}")

# %% [markdown]
# ## Memory, counted per device
#
# `pargrad.memory.bytes_by_device(trainer)` adds up the bytes of the
# variables a trainer holds, by device. The notebook's two devices cannot
# become eight, so `counted_state_table` counts in a fresh process: a
# float32 model of 1,153 parameters with Adam, by `SyncTrainer` (stage 0)
# and `ShardedTrainer`, on 1 to 8 replicas. Bytes a device:

# %%
from pargrad.book.peaks import counted_state_table  # noqa: E402

table = counted_state_table((1, 2, 4, 8))
print("stage  N  parameters  gradients  Adam state  master  | counted  formula")
for row in table:
    held = row["counted"][0]
    print(f"{row['stage']:5d} {row['replicas']:2d} {held['parameters']:11d} {held['gradients']:10d} "
          f"{held['optimizer_state']:11d} {held['master_weights']:7d}  | {held['total']:7d}"
          f"  {row['formula']['total']:7d}")

# %% tags=["remove-cell"]
for row in table:
    assert all(device == row["formula"] for device in row["counted"]), row
    assert row["parameters"] == 1153
totals = {(row["stage"], row["replicas"]): row["formula"]["total"] for row in table}
assert totals[1, 8] < totals[0, 8] and totals[3, 8] < totals[2, 8] < totals[1, 8]
assert totals[1, 1] == totals[0, 1]  # one device: stage 1 holds what data parallelism holds

# %% [markdown]
# Every device holds exactly what `pargrad.memory.state_bytes` says, and
# the master column stays empty: in float32 the owner updates its piece in
# place, as the program above does, so on one device stage 1 holds what
# data parallelism holds ({numref}`fig-memory-against-replicas`). A master
# copy is needed only where precision needs it, with mixed precision: the 4
# of the 12.

# %% mystnb={"figure": {"caption": "Training state a device holds against the number of replicas, float32 Adam, for the 1,153-parameter model: points counted from the variables of real trainers, lines from the formula. Data parallelism stays flat; each stage falls further, and stage 3 falls as 1/N.", "name": "fig-memory-against-replicas"}}
formula = {stage: {n: memory.state_bytes(1153, replicas=n, stage=stage)["total"]
                   for n in range(1, 9)} for stage in range(4)}
counted = {}
for row in table:
    counted.setdefault(row["stage"], {})[row["replicas"]] = row["counted"][0]["total"]
fig = memory_against_replicas(counted, formula)  # in KiB

# %% [markdown]
# On a GPU the cell below reads each logical GPU's peak; on a CPU all
# logical devices share one allocator, with no per-device peak:

# %% tags=["nbval-ignore-output"]
peaks, reason = memory.peak_bytes_by_device()
print(reason if peaks is None else {device: f"{peak / 2**20:.1f} MiB" for device, peak in peaks.items()})

# %% [markdown]
# ## Peaks, measured
#
# The variables are not all a step holds. `pargrad.book.peaks.stage_peaks`
# trains a larger model (below) with Adam for two steps on four logical
# devices at each stage, each stage in a fresh process, and reads how far
# the peak rose above the idle process. On a CPU the four logical devices
# are one process with one allocator, so the peak is the resident set's:
# the sum over the four devices. On a GPU the cell reads each logical GPU's
# peak and adds them. One cell a stage, each a few tens of seconds. The
# prediction (`predicted_peak_bytes`) adds to the
# counted variables what the step holds for a moment on every replica: the
# gradient in two forms or the weights and their gradient (at stage 0 the
# tape's gradient and the all-reduced sum; at stages 1 and 2 the weights
# joined from the pieces and their gradient, then the gradient and the
# flat vector it is joined into: two copies; at stage 3 the largest
# unit's gathered weights, its gradient and the slices cut from it for
# the owners: three copies of one layer), at stages 1 to 3 the owners'
# sums of their slices and the model as Keras built it (released, its
# memory stays in the process), and the activations.

# %% tags=["nbval-ignore-output"]
import os  # noqa: E402

from pargrad.book.peaks import predicted_peak_bytes, stage_peaks  # noqa: E402

MB = 2**20
rows = []


def measure(stage):
    """Train at `stage` in a fresh process; print its row: predicted, measured, ratio."""
    (row,) = stage_peaks((stage,))
    row["predicted_mb"] = predicted_peak_bytes(row)["total"] / MB
    rows.append(row)
    print(f"{stage:5d} {row['predicted_mb']:13.0f} {row['peak_mb']:12.0f} "
          f"{row['peak_mb'] / row['predicted_mb']:6.2f}   (load {os.getloadavg()[0]:.1f})")


print("stage  predicted MB  measured MB  ratio")
measure(0)

# %% tags=["nbval-ignore-output"]
measure(1)

# %% tags=["nbval-ignore-output"]
measure(2)

# %% tags=["nbval-ignore-output"]
measure(3)
print(f"{rows[0]['parameters']:,} float32 parameters in {rows[0]['layers']} layers, "
      f"{4 * rows[0]['parameters'] / MB:.0f} MB; on the {rows[0]['device']}")

# %% tags=["remove-cell"]
assert rows[0]["parameters"] >= 50_000_000 and rows[0]["layers"] >= 8
assert [row["stage"] for row in rows] == [0, 1, 2, 3]
measured = [row["peak_mb"] for row in rows]
predicted = [row["predicted_mb"] for row in rows]
for i in range(3):  # falls where the prediction falls by more than the 15 % band
    if predicted[i] > 1.15 * predicted[i + 1]:
        assert measured[i] > measured[i + 1], (measured, predicted)
assert measured[3] < min(measured[:3])
if rows[0]["device"] == "CPU" and rows[0]["resettable"]:
    assert 0.85 <= rows[3]["peak_mb"] / rows[3]["predicted_mb"] <= 1.15, rows[3]
    for row in rows[:3]:  # below on a loaded CPU: measured from 0.83 to 1.00 at stage 0
        assert 0.80 <= row["peak_mb"] / row["predicted_mb"] <= 1.15, row

# %% [markdown]
# Each measured peak is close to its prediction (the ratio column); what the
# prediction leaves out is TensorFlow's own working memory (the traced
# step, small temporaries). Stages 0 to 2 can come out lower: how many
# gradient copies live at once depends on how the replicas' ops
# interleave. Stage 1 peaks near the mirrored run: its joined copy of the
# weights takes back what sharding the optimizer state saved. Stage 3
# falls furthest: a replica holds one layer's weights and gradient at a
# time, never the model's. The activations, at this batch and at a large one:

# %%
small = predicted_peak_bytes(rows[3])["activations"]
print(f"activations at {rows[3]['per_replica']} examples a replica: {small / MB:.1f} MB in all; "
      f"at 1,024 a replica: {small * 1024 / rows[3]['per_replica'] / MB:.0f} MB, against "
      f"{rows[3]['counted']['total'] / MB:.0f} MB of stage 3's state")

# %% [markdown]
# **The model that does not fit.** Give the four devices together a budget
# between the mirrored run's peak and stage 3's:

# %% tags=["nbval-ignore-output"]
peak = {row["stage"]: row["peak_mb"] for row in rows}
budget = 100 * round((peak[0] + peak[3]) / 200)
print(f"budget {budget} MB ({budget / 4:.0f} MB a device): the mirrored run peaks at "
      f"{peak[0]:.0f} MB and does not fit; stage 3 peaks at {peak[3]:.0f} MB and fits")

# %% tags=["remove-cell"]
assert peak[3] <= budget < peak[0]

# %% [markdown]
# The formula for any model, in your browser:
#
# <div id="pargrad-memory-calculator">(The memory calculator needs the
# rendered book, with JavaScript; in a notebook, call
# `pargrad.memory.state_bytes` instead.)</div>
#
# ## Communication, counted
#
# The history records the bytes each replica sends a step: a
# reduce-scatter and an all-gather, each $(N-1)/N$ of the padded
# parameters' bytes, a ring all-reduce's $2(N-1)/N$. Stage 3 (ZeRO's and
# `ShardedTrainer`'s) gathers each layer again for the backward pass,
# three halves in all; one formula counts both,
# `pargrad.allreduce.sharded_step_bytes` (one gather or two).
# `pargrad.cost`'s α–β model
# ([What communication costs](10_communication_costs)) turns ZeRO's counts
# into seconds for the paper's model in 16 bits on 64 GPUs over InfiniBand
# NDR:

# %%
for stage, trainer in sharded.items():
    history = histories[trainer]
    print(f"stage {stage}: {history.bytes_sent[0]:.0f} bytes sent a step a replica; "
          f"a ring all-reduce of {history.parameter_bytes} bytes sends "
          f"{allreduce.ring_bytes(history.parameter_bytes, 2):.0f}")
ndr = cost.Link(5e-6, 400e9 / 8, "InfiniBand NDR")  # the chapter on costs' table: 400 Gb/s a port
nbytes = 2 * 7_500_000_000
one_pass = cost.reduce_scatter_time(nbytes, 64, ndr) + cost.all_gather_time(nbytes, 64, ndr)
for stage in range(4):
    gathers = 2 if stage == 3 else 1  # ZeRO's stage 3 gathers each layer twice
    ratio = allreduce.sharded_step_bytes(nbytes, 64, gathers=gathers) / allreduce.ring_bytes(nbytes, 64)
    print(f"ZeRO stage {stage}: {ratio:.1f}x data parallelism's bytes, {ratio * one_pass:.2f} s a step")

# %% tags=["remove-cell"]
for stage, trainer in sharded.items():  # 2(N-1)/N = 1 at N = 2; three halves at stage 3
    assert np.all(histories[trainer].bytes_sent
                  == (1.5 if stage == 3 else 1) * histories[trainer].parameter_bytes)
assert abs(one_pass - cost.ring_all_reduce_time(nbytes, 64, ndr)) < 1e-12

# %% [markdown]
# Such a step computes for seconds, so most of this can hide: the
# reduce-scatter behind the rest of the backward pass, and stage 3's
# gathers too, since ZeRO and FSDP prefetch the next layer's weights while
# the current layer computes (at the cost of holding two layers at once).
# `ShardedTrainer` does not prefetch: its copies and compute share the
# same cores, so it would hide nothing.
#
# ## How it is done in TensorFlow, traps included
#
# - **No reduce-scatter on a CPU.** `ReplicaContext` offers `all_reduce`
#   and `all_gather` only; `CollectiveReduceScatterV2` has no CPU kernel.
#   `pargrad` cuts each gradient into N slices where it lives and copies
#   slice s to owner s, which adds them: a ring's bytes, but all at once,
#   the owner holding N slices (a ring holds two chunks). Stage 3 sends
#   each unit's gradient as soon as its backward pass ends.
# - **Keras 3 optimizers all-reduce by themselves** inside `strategy.run`
#   {cite}`kerasissue19308`: what the program's mirrored Adam relies on, but
#   shards would be summed with other owners' shards. So each owner's
#   optimizer is created and called outside the strategy, under its device.
# - **No sharding API to build on.** `keras.distribution` is JAX-only;
#   DTensor works with raw `tf.Variable`s, not Keras 3 models. Here,
#   sharding is variables placed with `tf.device` and copies between them.
#
# ```{admonition} What ShardedTrainer is and is not
# :class: note
# It is ZeRO's stages 1 to 3 over the logical devices of **one process**
# (a `MirroredStrategy`), on `SyncTrainer`'s fit loop, bit for bit the
# mirrored run: a tool to see where every byte lives. It is not a way to
# train across machines: TensorFlow's `MultiWorkerMirroredStrategy` is data
# parallelism with nothing sharded, and the owners' optimizers here are one
# process's devices. Its collectives are copies between devices, and its
# stage 3 recomputes each layer's forward pass. It refuses, with the reason:
# `mixed_float16` (no loss scaling of shards), models with non-trainable
# state such as BatchNormalization's moving statistics (Keras updates them
# on every replica outside the optimizer, which a sharded update bypasses),
# variables of several dtypes, at stage 3 a model that is not a
# `keras.Sequential`, `MultiWorkerMirroredStrategy`, and
# `metrics`, `sample_weight` and `jit_compile`.
# ```
#
# ## Mixed precision
#
# Training in {term}`mixed precision` computes the forward and backward
# passes in 16-bit floats and keeps float32 where precision matters
# {cite}`micikevicius2018mixed`: the {term}`master weights`, which the
# optimizer updates (a 16-bit weight would round away updates smaller than
# the gap to its next value), and the optimizer state. In Keras it
# is a policy: `keras.mixed_precision.set_dtype_policy("mixed_bfloat16")`
# makes layers compute in bfloat16 and keep float32 variables. bfloat16 has
# float32's exponent range with fewer digits, so gradients neither overflow
# nor vanish; float16 has more digits but a narrow range, so small gradients
# underflow to zero unless the loss is multiplied by a large factor before
# the backward pass and the gradients divided by it after (loss scaling,
# `keras.optimizers.LossScaleOptimizer`), the factor lowered whenever a
# gradient overflows. Counted as ZeRO counts: 2 bytes of 16-bit parameters,
# 2 of gradients, 12 of float32 master weights and Adam's moments.
# `ShardedTrainer` accepts `mixed_bfloat16` (equal to `SyncTrainer` under
# the same policy) as Keras runs it: the variables stay float32 and each
# layer casts them to bfloat16 when it computes, so it keeps float32
# parameters and gradients and needs no separate master copy. Bytes a
# parameter, on 64 devices:

# %%
for stage in range(4):
    zero, here = (memory.state_bytes(6400, replicas=64, stage=stage, precision=precision,
                                     optimizer="adam")["total"] / 6400
                  for precision in ("mixed", "float32"))
    print(f"stage {stage}: ZeRO's mixed precision {zero:5.2f}, ShardedTrainer under "
          f"mixed_bfloat16 {here:5.2f} bytes a parameter")

# %% [markdown]
# The same 16 bytes unsharded; sharded, ZeRO's 16-bit weights and gradients
# cost half of what stay float32 here, and its master copy sits with the
# optimizer state, sharded from stage 1. `mixed_float16` is refused: it
# needs loss scaling, which the trainer does not do for shards; use
# `mixed_bfloat16`.
#
# ## When your model does not fit
#
# In the order a practitioner tries them:
#
# 1. **Accumulate smaller micro-batches.** The activations grow with the
#    micro-batch, and the state does not; accumulation keeps the update's
#    batch and one micro-batch's activations at a time ([Accumulation in
#    TF2 and across replicas](07_accumulation_tf2)).
# 2. **Mixed precision**: halves the activations and the weights the
#    passes read, and speeds up the compute on GPUs with 16-bit units.
# 3. **`tf.recompute_grad`**: wrap a block so that its activations are
#    recomputed in the backward pass instead of kept, about one more
#    forward pass for a fraction of the activations.
# 4. **Stage 3** (or 1 and 2 first, which send no more than data
#    parallelism): the state falls as 1/N, as above.
# 5. **Past one machine**, reach for a framework that shards across
#    processes: JAX with Keras 3's `keras.distribution` (`DataParallel`,
#    `ModelParallel` with a layout map), PyTorch's FSDP
#    {cite}`zhao2023fsdp`, or DeepSpeed's ZeRO {cite}`rajbhandari2019zero`.
#
# ## Summary
#
# - Data parallelism keeps weights, gradients and optimizer state whole on
#   every device: 2Ψ + 2Ψ + 12Ψ bytes with mixed-precision Adam, stage 3
#   (2 + 2 + 12)Ψ/N.
# - ZeRO shards the optimizer state (stage 1), also the gradients (2), also
#   the weights (3): each replica owns 1/N and updates it.
# - A step: gradients, reduce-scatter, owners' updates, all-gather; the
#   same sums in the same order, so bit for bit the mirrored run.
# - `pargrad.ShardedTrainer` runs it on the fit loop;
#   `pargrad.memory.bytes_by_device` counts what it holds, equal to
#   `pargrad.memory.state_bytes`; the measured peak adds the step's
#   gradients (and at stage 3 one layer's gathered weights) on every replica.
# - Stages 1 and 2 send what an all-reduce sends; stage 3 half again, which
#   ZeRO and FSDP prefetch, layer by layer, behind the compute.
# - Activations are not sharded: smaller micro-batches, mixed precision and
#   recomputation shrink them; past one machine, JAX, FSDP or DeepSpeed.
#
# ## Exercises
#
# 1. A model of 70 billion parameters is trained with mixed-precision Adam
#    on GPUs of 80 GB. On 8 GPUs, which stages fit the training state? How
#    many GPUs does stage 3 need?
#
#    *Hint:* `memory.state_bytes(70_000_000_000, replicas=n, stage=s,
#    precision="mixed", optimizer="adam")`, or the calculator.
# 2. Change the program's two `Adam(0.01)` to
#    `SGD(0.01, momentum=0.9)`. Is stage 1 still equal to the mirrored run?
#
#    *Hint:* is momentum's update element-wise?
# 3. Why does an all-gather after a reduce-scatter send exactly what a ring
#    all-reduce sends? Check it with `pargrad.cost`.
#
#    *Hint:* what are the two phases of the ring all-reduce in
#    [Synchronous training](03_synchronous)?
#
# ### Solutions

# %% tags=["hide-cell"]
needs = {stage: memory.state_bytes(70_000_000_000, replicas=8, stage=stage, precision="mixed",
                                   optimizer="adam")["total"] / GB for stage in range(4)}
print({stage: f"{gb:.1f} GB" for stage, gb in needs.items()})
gpus = next(n for n in range(1, 1025)
            if memory.state_bytes(70_000_000_000, replicas=n, stage=3, precision="mixed",
                                  optimizer="adam")["total"] <= 80 * GB)
print(f"stage 3 fits in {80} GB from {gpus} GPUs")
assert all(gb > 80 for gb in needs.values()) and gpus == 14

# %% [markdown]
# ```{dropdown} Solution to exercise 1
# On 8 GPUs none fits: the collapsed cell above prints the four totals, the
# smallest (stage 3) above 80 GB. Stage 3 fits from 14 GPUs; in practice
# 16, with room left for the activations, which come on top.
# ```

# %% tags=["hide-cell"]
with strategy.scope():
    model = parabola_model(hidden=6, dtype="float64")
    momentum = keras.optimizers.SGD(0.01, momentum=0.9)
reference_momentum = SyncTrainer(model, strategy, loss="mse", optimizer=momentum, progress=False)
reference_momentum.fit(x64, y64, steps=100, batch_size=50)
with strategy.scope():
    model = parabola_model(hidden=6, dtype="float64")
    momentum = keras.optimizers.SGD(0.01, momentum=0.9)
stage1_momentum = ShardedTrainer(model, strategy, stage=1, loss="mse", optimizer=momentum,
                                 progress=False)
stage1_momentum.fit(x64, y64, steps=100, batch_size=50)
momentum_gap = largest_gap(stage1_momentum.gathered_weights(), reference_momentum.model.get_weights())
print(f"stage 1 with momentum against SyncTrainer: weight gap {momentum_gap}")
assert momentum_gap == 0.0

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# Yes, bit for bit: momentum's update, like Adam's, treats every parameter
# on its own, so a shard's update is the whole update's slice. The collapsed
# cell above shows it with `ShardedTrainer`, which is the program's stage 1
# with a flat vector.
# ```
#
# ```{dropdown} Solution to exercise 3
# A ring all-reduce is two phases of N - 1 steps each: in the first (a
# reduce-scatter) every replica ends with the sum of one chunk, in the
# second (an all-gather) it passes the summed chunks on. Each phase sends
# (N - 1)/N of the bytes, so `cost.reduce_scatter_time(n, N, link) +
# cost.all_gather_time(n, N, link)` equals `cost.ring_all_reduce_time(n, N,
# link)`, the messages and the bytes alike.
# ```
