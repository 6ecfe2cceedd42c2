# %% [markdown]
# # Devices
#
# ```{admonition} Takeaway
# :class: tip
# A device is a processor TensorFlow places operations on. One physical CPU
# or GPU can be split into several *logical* devices with
# `pargrad.logical_devices(n)`, before TensorFlow starts. They run
# multi-device programs anywhere and compute what real devices compute; they
# share the same hardware, so they are not faster.
# ```
#
# Data-parallel training needs several devices. Most readers have one: a laptop
# CPU, or one Colab GPU. TensorFlow can *split* one physical device into
# several {term}`logical devices <logical device>` (devices that TensorFlow
# places operations on but that share one piece of hardware), and every
# later chapter starts by doing so.
#
# **In this chapter you will**
#
# - tell physical devices from logical devices, and see where an operation runs;
# - split the CPU (or one GPU) into four logical devices with
#   `pargrad.logical_devices`;
# - measure what a logical device is not: extra hardware;
# - see why the split must happen before TensorFlow starts, and the error you
#   get when it is too late;
# - learn what changes on Colab's single GPU.
#
# No GPU needed.

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

# %%
import os
import time

import pargrad
import tensorflow as tf
from pargrad.book import show_source

# %% [markdown]
# ## Physical devices
#
# A *physical device* is hardware TensorFlow found: the CPU (TensorFlow counts
# all its cores as one device) and each GPU. What the cell lists depends on
# the computer it runs on:

# %% tags=["nbval-ignore-output"]
for device in tf.config.list_physical_devices():
    print(device)
print("CPU cores the operating system reports:", os.cpu_count())

# %% [markdown]
# ## Logical devices
#
# A *logical device* is what operations are placed on. By default each physical
# device is one logical device. `tf.config.set_logical_device_configuration`
# splits a physical device into several; on a GPU each part gets a memory limit.
# `pargrad.logical_devices(n)` does this for the first GPU if there is one, else
# for the CPU, and returns the names of the logical devices:

# %%
devices = pargrad.logical_devices(4)
devices

# %% [markdown]
# Calling it again with the same number is harmless; it returns the same names.
# {numref}`fig-logical-devices` draws what happened: TensorFlow found one
# physical CPU; now there are four names to place operations on, and all
# four use the same cores.

# %% mystnb={"figure": {"caption": "Left: the one physical CPU TensorFlow finds, drawn with two cores. Right: the four logical devices pargrad.logical_devices(4) makes from it; each places its operations on the same cores.", "name": "fig-logical-devices"}}
from pargrad.book.plots_one_device import logical_devices_diagram

figure = logical_devices_diagram(devices, cores=2)

# %% [markdown]
# Its code, collapsed:

# %% tags=["hide-cell"]
show_source(pargrad.logical_devices)

# %% [markdown]
# ## Where an operation runs
#
# `tf.device` chooses the logical device for the operations created inside it.
# Every tensor remembers where it was computed:

# %%
results = []
for name in devices:
    with tf.device(name):
        results.append(tf.matmul(tf.ones((2, 3)), tf.ones((3, 2))))
for result in results:
    print(result.device)

# %% [markdown]
# Those four products were computed on four different devices, as far as
# TensorFlow is concerned. `tf.distribute.MirroredStrategy` and the trainers of
# this book use exactly this: one copy of the model per logical device.
# ({term}`MirroredStrategy` is TensorFlow's synchronous training on the
# devices of one machine: each device holds a copy of the model, a
# {term}`replica`, and the replicas' gradients are summed with an
# {term}`all-reduce` before every update; the chapter
# [Synchronous training](03_synchronous) builds it up.)
#
# ## What a logical device is not
#
# Four logical CPUs share the same cores. Let us give each of them the same
# work (a few large matrix products) and compare with one device doing all of it.
# If the logical devices were real hardware, four would finish four times
# faster. Each count is timed in three interleaved rounds and keeps its
# best, since other programs may share the cores:

# %%
matrix = tf.random.stateless_normal((384, 384), seed=(1, 2))


def products_on(names, repeats=24):
    """Seconds for `repeats` different matrix products shared round-robin among `names`."""
    @tf.function
    def work(m):
        outputs = []
        for i in range(repeats):
            with tf.device(names[i % len(names)]):
                outputs.append(tf.reduce_sum(tf.matmul(m + float(i), m)))
        return tf.add_n(outputs)
    work(matrix)  # compile once
    start = time.perf_counter()
    for _ in range(5):
        work(matrix)
    return (time.perf_counter() - start) / 5


# %% tags=["nbval-ignore-output"]
timings = {n: [] for n in (1, 2, 4)}
for _ in range(3):  # interleaved rounds, best round counts: a busy moment cannot favour one
    for n in timings:
        timings[n].append(products_on(devices[:n]))
one_device, two_devices, four_devices = (min(timings[n]) for n in (1, 2, 4))
speedup = one_device / four_devices
print(f"one logical device:   {1e3 * one_device:6.1f} ms")
print(f"two logical devices:  {1e3 * two_devices:6.1f} ms")
print(f"four logical devices: {1e3 * four_devices:6.1f} ms  ({speedup:.2f}x one)")
import os

cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"cores this process may use: {cores}")
# No check on the order of these times: on a machine busy with other programs
# they scatter, so the text draws its conclusion from the cores.

# %% [markdown]
# The speed-up, if any, is bounded by the cores the machine really has (the
# cell prints how many this process may use), not by the number of logical
# devices, and TensorFlow already runs one device's operations on several
# cores: it splits one operation over the cores with its *intra-op* threads
# and runs independent operations at once with its
# *{term}`inter-op threads`*. Logical devices let us *run* multi-device
# programs anywhere and check what they compute; they do not make a program
# faster than the hardware allows.
#
# On a GPU the picture is worse, not better: products this small are bound by
# the cost of launching each kernel, and the logical GPUs of one GPU share one
# stream of launches, so expect four logical GPUs to be no faster than one,
# and often slower. Run this cell on a Colab GPU to see your runtime's
# figure ([Running on Colab GPUs](a1_colab_gpus) says what else changes).
#
# ## Too late: the split happens before TensorFlow starts
#
# TensorFlow creates its devices the first time it needs one: at the first
# operation, or when you list logical devices. After that the split is fixed
# for the life of the process. Asking for another split now is too late.
# TensorFlow's own message does not say what to do:

# %%
cpu = tf.config.list_physical_devices("CPU")[0]
try:
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError as error:
    print(type(error).__name__ + ":", error)

# %% [markdown]
# `pargrad.logical_devices` says what happened and what to do:

# %%
try:
    pargrad.logical_devices(2)
except pargrad.DevicesAlreadyInitializedError as error:
    print(type(error).__name__ + ":", error)

# %% [markdown]
# This is why every chapter calls `pargrad.logical_devices` in its first cells,
# before anything else touches TensorFlow. In a notebook, *Restart kernel* and
# run the chapter from the top.
#
# Wrong arguments are caught before TensorFlow is asked anything:

# %%
for bad in [0, 2.5]:
    try:
        pargrad.logical_devices(bad)
    except (TypeError, ValueError) as error:
        print(f"{type(error).__name__}:", error)

# %% [markdown]
# ## On Colab's single GPU
#
# On a Colab GPU runtime, `pargrad.logical_devices(4)` splits the GPU into four
# logical GPUs, `/device:GPU:0` to `/device:GPU:3`, each with a hard memory
# limit (pass `memory_limit_mb` to choose), so that the worker processes of
# later chapters still find room on the same GPU. The default is the smaller
# of a fixed cap and a share of the GPU's memory divided among the logical
# GPUs; `pargrad.devices.device_plan` computes it without a GPU, here for
# GPUs of the size of Colab's T4 and of a large data-centre GPU:

# %%
from pargrad.devices import DEFAULT_LOGICAL_GPU_MB, GPU_MEMORY_SHARE, device_plan

print(f"default: the smaller of {DEFAULT_LOGICAL_GPU_MB} MB and "
      f"{GPU_MEMORY_SHARE:.0%} of the GPU's memory / n")
for gpu_gb in (15, 80):
    for n in (2, 4):
        [limit, *_] = device_plan("GPU", n, gpu_memory_mb=gpu_gb * 1024)
        print(f"a {gpu_gb} GB GPU split {n} ways: {limit.memory_limit} MB each")

# %% [markdown]
# On either GPU the cap decides: the logical GPUs get the same limit, and
# the rest of the memory stays free for other processes.
# `pargrad.logical_devices(1)` leaves the GPU whole and lets TensorFlow take
# memory as it needs it. The CPU stays one device. Three things differ from
# real multi-GPU machines:
#
# - the logical GPUs share one GPU's compute, so, as above, four are not four
#   times faster than one;
# - `MirroredStrategy`'s usual all-reduce (the summing of the replicas'
#   gradients) on GPUs, NVIDIA's NCCL, is meant for
#   distinct physical GPUs; on logical GPUs of one GPU, `pargrad` sums the
#   gradients on one device instead ([Synchronous training](03_synchronous));
# - the memory limits are hard: a model that fits the whole GPU may not fit
#   in one logical GPU.
#
# What the chapters *compute* is the same on a CPU, on logical GPUs and on real
# ones, up to rounding in the last digits; the timings change
# ([Running on Colab GPUs](a1_colab_gpus)).
#
# ## Summary
#
# - Physical devices are hardware; logical devices are where operations are
#   placed. One physical device can be split into several logical ones.
# - `pargrad.logical_devices(n)` splits the first GPU, or the CPU, into `n`
#   logical devices and returns their names.
# - The split must come before TensorFlow initialises its devices; afterwards
#   restart the process.
# - Logical devices share the hardware: they make multi-device programs
#   runnable and checkable anywhere, not faster.
#
# ## Exercises
#
# 1. Restart the kernel and call `pargrad.logical_devices(8)`. Rerun the timing
#    cell. Does the time with eight devices differ from four?
#
#    *Hint:* count the cores, not the devices.
# 2. Call `tf.config.threading.set_intra_op_parallelism_threads(1)` right after
#    the split (before any operation) and rerun the timing. Explain the change.
#
#    *Hint:* with one intra-op thread, one matrix product uses one core; what
#    can then run on the second core?
# 3. On Colab with a GPU, run `pargrad.logical_devices(2)` and then
#    `tf.config.experimental.get_memory_info("GPU:0")` after creating a large
#    tensor on `/device:GPU:0`. What limit do you hit?
#
#    *Hint:* each logical GPU gets the default printed in the section "On
#    Colab's single GPU": the smaller of a fixed cap and a share of the
#    GPU's memory divided by the number of devices.
#
# ### Solutions
#
# These exercises measure your machine, so their answers are explanations
# of what you will see rather than printed results.
#
# ```{dropdown} Solution to exercise 1
# Hardly. Eight logical devices share the same cores as four; the products
# were already spread over all cores, so the time stays about the same, or
# grows a little with the cost of placing work on more devices.
# ```
#
# ```{dropdown} Solution to exercise 2
# With one intra-op thread a matrix product no longer splits over both cores,
# so one device on its own gets slower. The four devices' products are
# independent, and TensorFlow's inter-op threads can run two of them at once,
# one per core: the speed-up of four devices over one grows towards the
# number of cores. This is the setting the benchmark of
# [Asynchronous training](04_asynchronous) uses.
# ```
#
# ```{dropdown} Solution to exercise 3
# On a T4 the cap decides (as printed above), not the GPU's size: each of
# the two logical GPUs gets `DEFAULT_LOGICAL_GPU_MB` megabytes.
# A tensor larger than the logical GPU's limit fails with an out-of-memory
# error (`ResourceExhaustedError`) even though the physical GPU has room;
# `get_memory_info` reports the current and peak use of that logical device,
# which never exceeds its limit. Pass `memory_limit_mb` to
# `pargrad.logical_devices` to choose the limit.
# ```
