# %% [markdown]
# # Compatibility matrix
#
# ```{admonition} Takeaway
# :class: tip
# In the pinned TensorFlow and Keras, custom training loops work under
# `MirroredStrategy`, `MultiWorkerMirroredStrategy` and
# `ParameterServerStrategy`, with or without gradient accumulation. Keras
# `fit` works only under `MirroredStrategy`, and only without its own
# accumulation. The table is run, not typed, so it follows the versions.
# ```
#
# Which ways of training work under which `tf.distribute` strategy, in the
# TensorFlow and Keras this book pins? Release notes answer only partly and
# go out of date, so this appendix *runs* every combination, small and with
# a time limit, and prints what happened; run it again after an upgrade.
#
# **In this chapter you will**
#
# - see the twelve combinations: Keras `fit` or a custom loop, times three
#   strategies, times with or without gradient accumulation;
# - run each for a few steps of the y = x² network against one device;
# - read the table, and the errors behind its failures.

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
# 5 full-batch steps of gradient descent from the same initial weights, and
# *works* when every final weight is within `compatibility.TOLERANCE` of the
# same steps on one device (`pargrad.book.parabola.fit_one_device`): a few
# times the float32 {term}`rounding tolerance` of five steps, far below the
# doubled step of a sum instead of a mean. *Accumulation* means 2
# {term}`micro-batches <micro-batch>` of 24 points per update, which must
# give the full batch's update.
#
# - **Keras `fit`**: the model and `keras.optimizers.SGD` (with
#   `gradient_accumulation_steps=2` for accumulation) compiled in the
#   strategy's scope, then `model.fit` on NumPy arrays (code collapsed):

# %% tags=["hide-cell"]
show_source(compatibility._keras_fit)

# %% [markdown]
# - **custom loop**: `pargrad.SyncTrainer` of
#   [Synchronous training](03_synchronous) (`accumulation_steps=2`); under
#   `ParameterServerStrategy`, closures on a `ClusterCoordinator`, as in
#   [Beyond one machine](09_beyond_one_machine), each summing its
#   micro-batches' gradients before one update (code collapsed):

# %% tags=["hide-cell"]
show_source(compatibility._parameter_server_loop)

# %% [markdown]
# Each strategy gets its own processes on 127.0.0.1: one with 2 logical
# CPUs for `MirroredStrategy`; 2 workers for `MultiWorkerMirroredStrategy`;
# a coordinator, 2 workers and a parameter server for
# `ParameterServerStrategy` (gRPC servers without authentication, always
# stopped). The three strategies run at once,
# each its four combinations in turn. A combination unfinished at its time
# limit **hangs**: its processes are killed and the next starts in fresh
# ones. The parameter-server loop waits for each closure
# (`coordinator.join()`), so that its result does not depend on timing. The
# runner, collapsed:

# %% tags=["hide-cell"]
show_source(compatibility.run_combinations)

# %% [markdown]
# ## The matrix

# %%
rows = compatibility.compatibility_matrix(time_limit=90)  # generous: slow machines are not hangs
table = compatibility.format_matrix(rows)
Markdown(f"TensorFlow {tf.__version__}, Keras {keras.__version__}:\n\n" + table)

# %% tags=["remove-cell"]
print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}:\n")
print(table)

# %% [markdown]
# ## Reading it
#
# In TensorFlow 2.21 with Keras 3.15:
#
# - **Custom loops work everywhere**, with and without accumulation, and give
#   the weights of one device: that is why the book's trainers are custom
#   loops.
# - **Keras `fit` works only under `MirroredStrategy`**, in one process. Under
#   `MultiWorkerMirroredStrategy` it fails while reducing the per-replica
#   results (keras-team/keras issue 20585); Keras 3 has no
#   parameter-server training.
# - **Keras's own accumulation (`gradient_accumulation_steps`) fails under
#   `MirroredStrategy`**, with the `merge_call` error of
#   [Accumulation in TF2 and across replicas](07_accumulation_tf2)
#   (keras-team/keras issue 20582); elsewhere `fit` fails first. Accumulate
#   in a custom loop instead.
#
# `pargrad.ShardedTrainer` ([When the model does not fit](12_sharded_training))
# is a custom loop under `MirroredStrategy` only: each shard's owner is a
# device of one process, so it refuses `MultiWorkerMirroredStrategy` and
# `ParameterServerStrategy` with a message. Its tests pass with TensorFlow
# 2.16 and Keras 3.11 (the oldest releases pargrad allows) and with
# the pinned TensorFlow 2.21; its chapter also runs on Colab's TensorFlow 2.19.
#
# A hidden cell checks these sentences against the computed table:

# %% tags=["remove-input"]
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
# - The matrix is computed: each of the twelve combinations runs a few steps
#   in its own processes, with a time limit, against one device.
# - In the pinned versions, custom loops work under all three strategies,
#   with or without accumulation; Keras `fit` works only under
#   `MirroredStrategy`, without its own accumulation.
#
# ## Exercises
#
# 1. Add a column: Keras `fit` with `steps_per_execution=5`. Does it change
#    any cell?
#
#    *Hint:* it changes how many steps a call runs, not what a step does.
# 2. Add a row for `tf.distribute.OneDeviceStrategy`. Which cells would you
#    expect to work, and do they?
#
#    *Hint:* one device means no all-reduce and no `merge_call` across
#    replicas.
# 3. Run this appendix with an older Keras 3 release. Which cells change?
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
