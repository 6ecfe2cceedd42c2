# %% [markdown]
# # Compatibility matrix
#
# Which ways of training work under which `tf.distribute` strategy, in the
# TensorFlow and Keras this book pins? Release notes and issue trackers
# answer this only partly and go out of date, so this appendix does not type
# the answer: it *runs* every combination, small and with a time limit, and
# prints what happened. When a version changes, run it again and the table
# changes with it.
#
# **In this chapter you will**
#
# - see the twelve combinations: Keras `fit` or a custom loop, times
#   `MirroredStrategy`, `MultiWorkerMirroredStrategy` or
#   `ParameterServerStrategy`, times with or without gradient accumulation;
# - run each for a few steps of the y = x² question's network and compare it with the same
#   steps on one device;
# - read the table, and the errors behind its failures.
#
# Runs in well under a minute on two CPU cores; most of it is seven
# processes starting TensorFlow.

# %% tags=["colab"]
# On Colab: install pargrad from the book's repository. Elsewhere: nothing to do.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPOSITORY = "https://github.com/pargrad/pargrad"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"pargrad @ git+{REPOSITORY}@main"],
        check=True,
    )

# %%
import pargrad  # first: it imports TensorFlow quietly

import keras
import tensorflow as tf
from IPython.display import Markdown
from pargrad.book import compatibility, show_source

print("TensorFlow", tf.__version__, "| Keras", keras.__version__)

# %% [markdown]
# ## What each combination runs
#
# Every combination trains the y = x² question's 1-5-1 network on 48 points for
# 5 full-batch steps of gradient descent, from the same
# initial weights, and compares the final weights with the same steps on one
# device (`pargrad.book.parabola.fit_one_device`). A combination *works* when every final
# weight is within `compatibility.TOLERANCE` of one device's. The runs are
# float32 and add in different orders, so they agree only up to rounding:
# the tolerance is a few times `pargrad.rounding_tolerance("float32", 5)`,
# the rounding bound of the chapter "Synchronous training" for five float32
# steps, and far below what a wrong update moves (a sum instead of a mean
# doubles the step). *Accumulation* means 2 micro-batches of
# 24 points per update, which must give the same update as the full batch.
#
# - **Keras `fit`**: the model and `keras.optimizers.SGD` (with
#   `gradient_accumulation_steps=2` for accumulation) built and compiled in
#   the strategy's scope, then `model.fit` on NumPy arrays:

# %%
show_source(compatibility._keras_fit)

# %% [markdown]
# - **custom loop**, synchronous strategies: `pargrad.SyncTrainer` of the
#   chapter "Synchronous training" (`accumulation_steps=2` for
#   accumulation); with `ParameterServerStrategy`: closures scheduled on a
#   `ClusterCoordinator`, as in the chapter "Beyond one machine", each
#   summing the gradients of its micro-batches on the worker before one
#   update:

# %%
show_source(compatibility._parameter_server_loop)

# %% [markdown]
# Each strategy gets its own processes: one process with 2 logical CPUs for
# `MirroredStrategy`, 2 worker processes for `MultiWorkerMirroredStrategy`, a
# coordinator, 2 workers and a parameter server for
# `ParameterServerStrategy`, all on 127.0.0.1 (TensorFlow's gRPC servers
# listen on all interfaces and have no authentication; they run for seconds
# and are always stopped). The four combinations of a strategy run one after
# the other in its processes; the three strategies run at the same time. A
# combination that has not finished after its time limit counts as
# **hangs**; its processes are killed and the next combination starts in
# fresh ones. Under `ParameterServerStrategy` the custom loop waits for each
# closure before it schedules the next (`coordinator.join()`), so that its
# result, too, can be compared with one device; overlapping closures would
# make it depend on timing (see the chapter "Beyond one machine").

# %%
show_source(compatibility.run_combinations)

# %% [markdown]
# ## The matrix

# %%
rows = compatibility.compatibility_matrix(time_limit=90)  # generous: slow machines are not hangs
table = compatibility.format_matrix(rows)
print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}:\n")
print(table)

# %%
Markdown(table)

# %% [markdown]
# ## Reading it
#
# In TensorFlow 2.21 with Keras 3.15:
#
# - **Custom loops work everywhere**, with and without accumulation, and give
#   the weights of one device. This is why the book's
#   trainers are custom loops.
# - **Keras `fit` works only under `MirroredStrategy`**, in one process. Under
#   `MultiWorkerMirroredStrategy` it fails while reducing the per-replica
#   results (keras-team/keras issue 20585); `ParameterServerStrategy` needs
#   its datasets made by the coordinator, which Keras 3's `fit` does not do:
#   Keras 3 has no parameter-server training.
# - **Keras's own accumulation (`gradient_accumulation_steps`) fails under
#   `MirroredStrategy`** with the `merge_call` error of the chapter
#   "Accumulation in TF2 and across replicas" (keras-team/keras issue 20582); under
#   the other two strategies `fit` fails before accumulation matters.
#   Accumulate in a custom loop instead.
#
# The cell below checks these sentences against the table, so that a new
# version that changes the table also fails here and the text gets updated:

# %%
status = {(r["api"], r["strategy"], r["accumulation"]): r["status"] for r in rows}
assert all(status[("custom loop", s, k)] == "works"
           for s in compatibility.STRATEGIES for k in compatibility.ACCUMULATION)
assert status[("Keras fit", "MirroredStrategy", 1)] == "works"
assert all(status[("Keras fit", s, k)] == "fails"
           for s in compatibility.STRATEGIES[1:] for k in compatibility.ACCUMULATION)
assert status[("Keras fit", "MirroredStrategy", 2)] == "fails"
print("the text agrees with the table")

# %% [markdown]
# ## Summary
#
# - The matrix is computed, not typed: each of the twelve combinations runs
#   for a few steps in its own processes, with a time limit, and is compared
#   with one device.
# - In the pinned versions, custom loops work under all three strategies,
#   with or without accumulation; Keras `fit` works only under
#   `MirroredStrategy`, and only without its built-in accumulation.
#
# ## Exercises
#
# 1. Add a column: Keras `fit` with `steps_per_execution=5`. Does it change
#    any cell?
#
#    *Hint:* `steps_per_execution` changes how many steps one call runs, not
#    what a step computes.
# 2. Add a row for `tf.distribute.OneDeviceStrategy`. Which cells would you
#    expect to work, and do they?
#
#    *Hint:* one device means no all-reduce and no `merge_call` across
#    replicas.
# 3. Install an older Keras 3 release in a fresh environment and run this
#    appendix again. Which cells change?
#
#    *Hint:* look at the cells that name a Keras issue.
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# It should not change any cell that works: `steps_per_execution` runs
# several steps in one `tf.function` call, each still one update. Cells that
# fail keep failing, since the failures come from the strategy, not from the
# number of steps per call.
# ```
#
# ```{dropdown} Solution to exercise 2
# `OneDeviceStrategy` has one replica and no cross-replica reduction, so
# `fit`, a custom loop and `gradient_accumulation_steps` are all expected to
# work, like the plain one-device column; running the appendix with the new
# row checks it.
# ```
#
# ```{dropdown} Solution to exercise 3
# The cells that depend on Keras's own distribution code: `fit` under the
# multi-worker strategy and `gradient_accumulation_steps` under
# `MirroredStrategy` fail or pass depending on the release; the custom loops
# work with every release that runs at all.
# ```
