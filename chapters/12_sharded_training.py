# %% [markdown]
# # When the model does not fit: sharded training state
#
# ```{admonition} Takeaway
# Data parallelism keeps the weights, their gradients and the optimizer's
# state whole on every device. Sharding that state (ZeRO) changes none of the
# arithmetic, the same updates bit for bit, while each of N replicas keeps
# 1/N of it: memory per device falls as the stages add up, and communication
# stays the same, half as much again at stage 3.
# ```
#
# Every replica of data parallelism keeps three things for each parameter:
# the parameter (the weights), its gradient, and the {term}`optimizer state`
# (what the optimizer keeps between updates: nothing for plain SGD, a velocity
# for {term}`momentum`, two moments for Adam). With mixed precision the model
# computes in 16 bits and the optimizer updates float32
# {term}`master weights`: 2 + 2 + 12 bytes a parameter, the 12 being the
# master copy and Adam's two float32 moments {cite}`tazi2025ultrascale`. More
# replicas shrink none of it; each holds the whole copy.
#
# {term}`ZeRO` {cite}`rajbhandari2019zero` removes the copies in three
# stages. Each replica becomes the {term}`shard owner` of 1/N of the
# parameters. Stage 1 keeps the optimizer state and master weights only at
# the owner; stage 2 also the gradients; stage 3 also the weights, which a
# replica gathers when a layer needs them and frees afterwards (PyTorch's
# {term}`FSDP` {cite}`zhao2023fsdp`). What is computed does not change: a step
# still sums the replicas' gradients and applies one update. Only who keeps
# and computes which part changes ({numref}`fig-sharded-step`): the gradients
# are {term}`reduce-scattered <reduce-scatter>` (each owner receives the sum
# of its part only), each owner updates its part, and the new weights are
# {term}`all-gathered <all-gather>`. A {term}`ring all-reduce` *is* a
# reduce-scatter followed by an all-gather, so stages 1 and 2 send what data
# parallelism sends; stage 3 gathers the weights twice a step, for the
# forward and for the backward pass.
#
# The ZeRO paper's Figure 1, a model of 7.5 billion parameters trained with
# mixed-precision Adam on 64 devices, from the book's formula
# (`pargrad.memory.state_bytes`; the calculator below turns the same formula):

# %% tags=["colab", "hide-input"]
# On Colab: install pargrad from the book's repository. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad @ git+{REPOSITORY}@main"],
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
from pargrad import cost, memory  # noqa: E402
from pargrad.book import glue, plots  # noqa: E402
from pargrad.book.parabola import parabola_data, parabola_model  # noqa: E402
from pargrad.strategies import sync_strategy  # noqa: E402

keras.utils.set_random_seed(0)
print(devices)

# %%
GB = 1e9
for stage in range(4):
    held = memory.state_bytes(7.5e9, replicas=64, stage=stage, precision="mixed", optimizer="adam")
    print(f"stage {stage}: {held['total'] / GB:5.1f} GB a device")

# %% [markdown]
# (Stage 0 is plain data parallelism.) At 64 replicas stage 3 is the only
# one whose state fits on a device with tens of gigabytes; the activations
# come on top.

# %% mystnb={"figure": {"caption": "One step of sharded training on four replicas (a drawing). 1: each replica computes the gradient of its shard of the batch, for all parameters. 2: the reduce-scatter leaves with each owner the sum of its part only. 3: each owner updates its part with the optimizer state only it keeps. 4: the all-gather gives every replica all the new weights. Steps 2 and 4 together are a ring all-reduce.", "name": "fig-sharded-step"}}
fig = plots.sharded_step_diagram(4)

# %% [markdown]
# **In this chapter you will** run stage 1 in plain TensorFlow and see it
# equal mirrored Adam; run stages 1 to 3 with `pargrad.ShardedTrainer`;
# count the bytes each device holds against the formula; count the bytes
# sent; and meet TensorFlow's traps on the way.
#
# ## A program you can copy
#
# Stage 1 for the y = x² question's network, in float64 on two logical
# CPUs, beside mirrored Adam (the reference, as in
# [Synchronous training](03_synchronous)). Each device keeps a whole model
# and its own Adam, built only for the layer it owns: device 0 owns the
# hidden layer, device 1 the output layer (whole variables, as PyTorch's
# `ZeroRedundancyOptimizer` assigns them). After the mirrored step, `step`
# computes each half's gradients on its device; sums each layer's two
# gradients on its owner (the reduce: the sum exists only there); lets each
# owner's Adam update its layer; and copies the new values to the other
# device (the gather).

# %% tags=["program"]
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
# element-wise, so updating some variables computes the same numbers as
# updating all of them. What each device keeps of Adam's state:

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
