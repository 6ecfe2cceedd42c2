# %% [markdown]
# # Accumulating gradients in TF1 graphs
#
# ```{admonition} Takeaway
# Sum the $k$ micro-batches' gradients into accumulator variables and apply
# `accumulator / k` (or divide by a counter) in a separate `run` call: the
# big batch's update. Answer 1 applies the sum: harmless with its Adam, a
# step $k$ times too long with SGD or momentum. Answer 4's 2.4 is the
# `assign_add` run once more by the fetch.
# ```
#
# A batch that does not fit in memory can still be trained on: split it into
# $k$ *{term}`micro-batches <micro-batch>`*, compute their gradients one after
# the other, add them up, and update the weights once. This is
# *{term}`gradient accumulation`*. Done right, the update is exactly the big
# batch's; done wrong, it is $k$ times too large (with SGD), or it silently re-runs part
# of the graph.
#
# Our guide is the accumulation thread ([Where this book starts](00_sources)),
# a Russian Q&A, "how to update parameters with accumulated gradients",
# written for TensorFlow 1's graph mode. We run all five of its answers.
#
# **The answer, in one line per answer.** Answer 1 sums: the step is $k$
# times the big batch's, a hidden learning rate of $k\eta$. Answer 2 is right
# but moves every gradient through Python. Answer 3 (a counter, apply
# `accumulator / counter`) is the recipe. Answer 4's `accum_op / 5` fetches
# the `assign_add` again: 2.4, and the accumulator holds 12. Answer 5:
# PyTorch sums into `.grad` by itself; divide the loss by $k$.
#
# **In this chapter you will** run each answer, fall into answer 4's trap
# and explain it from the ops the graph runs, and use
# `pargrad.tf1.accumulation_ops`, the recipe with all of this fixed.
#
# You need the chapter [The training loop](01_training_loop); no GPU.

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
# The chapter runs TF1-style graphs through `tf.compat.v1`, which TensorFlow
# 2.21 still ships, on one device: accumulation does $k$ pieces of work *one
# after the other*.

# %%
import inspect
import time

import numpy as np
import pargrad
import tensorflow as tf
from pargrad import tf1
from pargrad.book.plots_one_device import loss_curve
from pargrad.book.graph_ops import ops_run_by
from pargrad.book import show_lines, show_source
from pargrad.book.parabola import initial_weights, parabola_data, parabola_forward, squared_error

v1 = tf.compat.v1
print("TensorFlow", tf.__version__)

# %% [markdown]
# ## The setting: the y = x² network, one batch, five micro-batches
#
# We reuse the 1-5-1 `tanh` network fitting $y = x^2$ from the chapter "The
# training loop": 50 points, mean squared error, learning rate $10^{-2}$, the
# same initial weights every time, built as a TF1 graph (placeholders,
# variables, a loss tensor).

# %%
LEARNING_RATE = 1e-2
x_all, y_all = parabola_data()
NAMES = ["W1", "b1", "W2", "b2"]


def parabola_graph():
    """The y = x² question's network in the current graph: placeholders, variables, mean loss."""
    x = v1.placeholder(tf.float32, [None, 1], name="x")
    y = v1.placeholder(tf.float32, [None, 1], name="y")
    variables = [tf.Variable(w, name=n) for w, n in zip(initial_weights(), NAMES)]
    loss = squared_error(y, parabola_forward(x, variables))
    return x, y, variables, loss


def micro_batches(k):
    """The 50 points cut into k equal micro-batches, in order."""
    return list(zip(np.split(x_all, k), np.split(y_all, k)))


def max_difference(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


# %% [markdown]
# The loss is a *mean* over the batch, so with $k$ equal micro-batches of $n$
# examples each the big batch's gradient is the mean of the micro-batches':
#
# $$\nabla L_{\text{big}} = \frac{1}{kn}\sum_{j=1}^{kn} \nabla \ell_j
#   = \frac{1}{k}\sum_{i=1}^{k} \underbrace{\frac{1}{n}\sum_{j \in B_i} \nabla \ell_j}_{\nabla L_i} .$$
#
# Accumulation must apply the **mean**, not the sum. Our yardstick in every
# section: one plain step on all 50 points.

# %%
def big_batch_step(make_optimizer, updates=1):
    """Weights after `updates` plain steps on the whole batch."""
    graph = tf.Graph()
    with graph.as_default():
        x, y, variables, loss = parabola_graph()
        step = make_optimizer().minimize(loss)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(updates):
            session.run(step, {x: x_all, y: y_all})
        return session.run(variables)


initial = initial_weights()
sgd = lambda: v1.train.GradientDescentOptimizer(LEARNING_RATE)  # noqa: E731
big_sgd = big_batch_step(sgd)
print("W2 before:      ", initial[2][:, 0].round(6))
print("W2 after a step:", big_sgd[2][:, 0].round(6))

# %% [markdown]
# ## Answer 1: accumulator variables, which sum
#
# The first answer adds one non-trainable accumulator per trainable variable,
# an op list that zeroes them (`zero_ops`), one that adds a micro-batch's
# gradients to them (`accum_ops`), and a training step that applies the
# accumulators. As written, it fails on TensorFlow 2 before it starts:
# `initialized_value()` belonged to the old reference variables, and TF 2's
# are resource variables.

# %%
graph = tf.Graph()
with graph.as_default():
    x, y, variables, loss = parabola_graph()
    tvs = v1.trainable_variables()
    try:
        accum_vars = [tf.Variable(tf.zeros_like(tv.initialized_value()), trainable=False)
                      for tv in tvs]
    except NotImplementedError as error:
        print(f"{type(error).__name__} from {type(tvs[0]).__name__}.initialized_value()")

# %% [markdown]
# Creating the accumulators from the variables' shapes instead, the rest of the
# answer runs as written:

# %% tags=["hide-input"]
def answer1_graph(make_optimizer):
    """Answer 1's recipe: accumulators, zero_ops, accum_ops, apply the accumulators."""
    x, y, variables, loss = parabola_graph()
    optimizer = make_optimizer()
    tvs = v1.trainable_variables()
    accum_vars = [tf.Variable(tf.zeros(tv.shape), trainable=False) for tv in tvs]
    zero_ops = [av.assign(tf.zeros_like(av)) for av in accum_vars]
    gvs = optimizer.compute_gradients(loss, tvs)
    accum_ops = [accum_vars[i].assign_add(gv[0]) for i, gv in enumerate(gvs)]
    train_step = optimizer.apply_gradients([(accum_vars[i], gv[1]) for i, gv in enumerate(gvs)])
    return x, y, variables, loss, zero_ops, accum_ops, train_step


def run_answer1(make_optimizer, k):
    """One update from k micro-batches with answer 1's recipe; returns the weights."""
    graph = tf.Graph()
    with graph.as_default():
        x, y, variables, loss, zero_ops, accum_ops, train_step = answer1_graph(make_optimizer)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        session.run(zero_ops)
        for xb, yb in micro_batches(k):
            session.run(accum_ops, {x: xb, y: yb})
        session.run(train_step)
        return session.run(variables)


def step_ratio(after, big_after):
    """Length of a step over the length of the big batch's step, all weights together."""
    step = np.concatenate([(a - w).ravel() for a, w in zip(after, initial)])
    big_step = np.concatenate([(b - w).ravel() for b, w in zip(big_after, initial)])
    return np.linalg.norm(step) / np.linalg.norm(big_step), float(
        np.dot(step, big_step) / np.linalg.norm(step) / np.linalg.norm(big_step))


K = 5
summed = run_answer1(sgd, K)
length, cosine = step_ratio(summed, big_sgd)
print(f"SGD:  answer 1's step is {length:.3f} x the big batch's, same direction: {cosine:.3f}")

# %% [markdown]
# The step points the right way but is $k = 5$ times as long: the
# accumulators hold the *sum* $\sum_i \nabla L_i = k\,\nabla L_{\text{big}}$,
# and SGD's step is proportional to the gradient, so answer 1 trains with a
# learning rate of $k\eta$ without saying so. Adam divides the gradient by a
# running estimate of its own magnitude, so multiplying every gradient by $k$
# changes almost nothing:

# %%
adam = lambda: v1.train.AdamOptimizer(LEARNING_RATE)  # noqa: E731
summed_adam = run_answer1(adam, K)
big_adam = big_batch_step(adam)
length, cosine = step_ratio(summed_adam, big_adam)
print(f"Adam: answer 1's step is {length:.3f} x the big batch's, same direction: {cosine:.3f}")

# %% [markdown]
# So with Adam the bug hides (up to Adam's $\epsilon$), and with SGD or
# momentum it changes the learning rate. {numref}`fig-answer1-curves` shows
# what that does: the network trained for 200 updates of 50 examples each,
# plainly, with answer 1 and 5 micro-batches of 10, and with answer 1 and 50
# micro-batches of one example.

# %% tags=["hide-input"]
def train_answer1(k, updates=200):
    """Full-batch loss before each of `updates` answer-1 updates of k micro-batches."""
    graph = tf.Graph()
    with graph.as_default():
        x, y, variables, loss, zero_ops, accum_ops, train_step = answer1_graph(sgd)
        init = v1.global_variables_initializer()
    losses = []
    with v1.Session(graph=graph) as session:
        session.run(init)
        batches = micro_batches(k)
        for _ in range(updates):
            losses.append(session.run(loss, {x: x_all, y: y_all}))
            if not np.isfinite(losses[-1]):
                break
            session.run(zero_ops)
            for xb, yb in batches:
                session.run(accum_ops, {x: xb, y: yb})
            session.run(train_step)
    return np.array(losses)


curves = {"big batch (k = 1)": train_answer1(1),
          "answer 1, k = 5": train_answer1(5),
          "answer 1, k = 50": train_answer1(50)}
DIVERGES_WITHIN = 100  # updates: a bound, because the update where it overflows is chaotic
for label, losses in curves.items():
    if np.isfinite(losses[-1]):
        print(f"{label:18s} loss after {len(losses):3d} updates: {losses[-1]:.4g}")
    else:
        print(f"{label:18s} diverges: the loss overflows to {losses[-1]} within "
              f"{DIVERGES_WITHIN} updates")

# %% tags=["remove-cell"]
assert np.isfinite(curves["answer 1, k = 5"][-1]) and len(curves["answer 1, k = 5"]) == 200
assert not np.isfinite(curves["answer 1, k = 50"][-1])
assert len(curves["answer 1, k = 50"]) <= DIVERGES_WITHIN

# %% mystnb={"figure": {"caption": "The y = x\u00b2 network's full-batch loss over 200 updates: plain big-batch training, and answer 1's summed accumulation with 5 micro-batches of 10 and with 50 micro-batches of one example.", "name": "fig-answer1-curves"}}
figure = None
for label, losses in curves.items():
    figure = loss_curve(losses, ax=figure.axes[0] if figure else None, label=label,
                        title="Answer 1 scales the learning rate by k")
_ = figure.axes[0].set_xlabel("update")
# k = 50 leaves the plot upwards on its way to inf
_ = figure.axes[0].set_ylim(1e-2, 1e3)

# %% [markdown]
# With $k = 5$ the summed step is five times the learning rate, which happens
# to suit this small problem: training looks *better*. With $k = 50$ training
# diverges: the loss overflows to `inf` within the bound printed above (where
# exactly depends on the CPU's rounding). The real damage is that the
# learning rate now depends on how the batch was cut: change $k$ to fit a
# different GPU and the training changes. Accumulation must not change the
# training at all.
#
# ## Answer 2: fetch the gradients, keep them, feed them back
#
# The second answer keeps the graph plain: the micro-batches' gradient
# *values* are fetched into Python and kept, and `apply_gradients` is fed
# from placeholders. We average the kept values in NumPy, so the step is the
# big batch's:

# %%
def answer2_graph(make_optimizer):
    x, y, variables, loss = parabola_graph()
    optimizer = make_optimizer()
    gvs = optimizer.compute_gradients(loss, variables)
    gradients = [g for g, _ in gvs]
    fed = [v1.placeholder(tf.float32, v.shape) for v in variables]
    train_step = optimizer.apply_gradients(zip(fed, variables))
    return x, y, variables, gradients, fed, train_step


graph = tf.Graph()
with graph.as_default():
    x, y, variables, gradients, fed, train_step = answer2_graph(sgd)
    init = v1.global_variables_initializer()
with v1.Session(graph=graph) as session:
    session.run(init)
    kept = [session.run(gradients, {x: xb, y: yb}) for xb, yb in micro_batches(K)]
    mean = [np.mean(values, axis=0) for values in zip(*kept)]
    session.run(train_step, dict(zip(fed, mean)))
    answer2 = session.run(variables)
print(f"answer 2 vs big batch, max |difference|: {max_difference(answer2, big_sgd):.6f}")

# %% [markdown]
# It works, and any arithmetic on the kept gradients is plain NumPy. The
# price: every micro-batch's gradient travels from the device into Python,
# and the mean travels back. For our 16 weights that is nothing; for a
# million float32 weights it is $4 \cdot 10^6$ bytes per micro-batch each
# way, and on a GPU each trip crosses the PCIe bus. A layer of 1024 × 1024
# weights makes the cost visible:

# %%
def wide_graph(width=1024):
    """A single 1024 x 1024 layer: big gradients, little arithmetic."""
    x = v1.placeholder(tf.float32, [None, width])
    weights = tf.Variable(tf.random.stateless_normal([width, width], seed=[0, 1]) * 0.01)
    loss = tf.reduce_mean(tf.square(tf.matmul(x, weights)))
    return x, weights, loss


WIDE_K, WIDE_BATCH, WINDOWS = 8, 32, 4
wide_data = np.random.default_rng(0).standard_normal(
    (WIDE_K, WIDE_BATCH, 1024)).astype(np.float32)
graph = tf.Graph()
with graph.as_default():
    x, weights, loss = wide_graph()
    in_graph = tf1.accumulation_ops(loss, sgd())
    gradient = v1.gradients(loss, weights)[0]
    fed = v1.placeholder(tf.float32, weights.shape)
    feed_step = sgd().apply_gradients([(fed, weights)])
    init = v1.global_variables_initializer()

moved = WIDE_K * weights.shape.num_elements() * 4 + weights.shape.num_elements() * 4
print(f"answer 2 moves {moved / 2**20:.1f} MiB through Python per update "
      f"(k = {WIDE_K}); the in-graph recipe moves none")

# %% tags=["nbval-ignore-output"]
with v1.Session(graph=graph) as session:
    session.run(init)

    def window_in_graph():
        session.run(in_graph.zero_ops)
        for xb in wide_data:
            session.run(in_graph.accum_ops, {x: xb})
        session.run(in_graph.train_step)

    def window_through_python():
        kept = [session.run(gradient, {x: xb}) for xb in wide_data]
        session.run(feed_step, {fed: np.mean(kept, axis=0)})

    windows = {"in graph": window_in_graph, "through Python": window_through_python}
    timings = {name: float("inf") for name in windows}
    for _ in range(3):  # interleaved rounds, best round counts: fair on a busy machine
        for name, window in windows.items():
            window()  # warm up
            start = time.perf_counter()
            for _ in range(WINDOWS):
                window()
            timings[name] = min(timings[name], (time.perf_counter() - start) / WINDOWS)
for name, seconds in timings.items():
    print(f"{name:15s} {1000 * seconds:6.1f} ms per update of {WIDE_K} micro-batches")
print(f"through Python / in graph: {timings['through Python'] / timings['in graph']:.2f}x")

# %% [markdown]
# On a CPU the two cost about the same, and which is ahead changes from run
# to run: a "trip" to Python is a copy within the same memory, and the
# in-graph recipe's `assign_add` reads and writes the same $4 \cdot 10^6$
# bytes per micro-batch. On a GPU the trips cross the PCIe bus. The
# {term}`α–β model` (developed in the chapter "What communication costs")
# prices a message of $n$ bytes at $\alpha + n/\beta$ seconds, a latency
# $\alpha$ plus the bytes over the link's bandwidth $\beta$; at PCIe 4.0 x16's
# peak bandwidth, a lower bound for the copies alone:

# %%
from pargrad import cost

# 16 GT/s a lane, 16 lanes, 128b/130b coding; the 5 µs a message is an assumption.
pcie4 = cost.Link(5e-6, 16e9 * 16 * 128 / 130 / 8, "PCIe 4.0 x16")
copies = (WIDE_K + 1) * cost.message_time(moved / (WIDE_K + 1), pcie4)  # k gradients out, one mean in
print(f"answer 2's copies over {pcie4.name}: at least {1000 * copies:.2f} ms per update, "
      f"which the in-graph recipe never pays")

# %% [markdown]
# ## Answer 3: a counter, and apply the mean
#
# The third answer fixes answer 1 with a counter that `accum_ops` increments
# and a training step that applies `accumulator / counter`, everything in the
# graph. The division must read the *variables*, a point answer 4 explains.

# %% tags=["hide-input"]
def answer3_graph(make_optimizer):
    """Answer 1 plus a counter: apply accumulator / counter."""
    x, y, variables, loss = parabola_graph()
    optimizer = make_optimizer()
    accum_vars = [tf.Variable(tf.zeros(v.shape), trainable=False) for v in variables]
    counter = tf.Variable(0.0, trainable=False)
    zero_ops = [av.assign(tf.zeros_like(av)) for av in accum_vars] + [counter.assign(0.0)]
    gvs = optimizer.compute_gradients(loss, variables)
    accum_ops = [av.assign_add(g) for av, (g, _) in zip(accum_vars, gvs)]
    accum_ops.append(counter.assign_add(1.0))
    train_step = optimizer.apply_gradients(
        [(av.read_value() / counter.read_value(), v) for av, (_, v) in zip(accum_vars, gvs)])
    return x, y, variables, zero_ops, accum_ops, train_step


def run_answer3(make_optimizer, k, updates=3):
    graph = tf.Graph()
    with graph.as_default():
        x, y, variables, zero_ops, accum_ops, train_step = answer3_graph(make_optimizer)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(updates):
            session.run(zero_ops)
            for xb, yb in micro_batches(k):
                session.run(accum_ops, {x: xb, y: yb})
            session.run(train_step)
        return session.run(variables)


for name, make_optimizer in [("SGD", sgd), ("Adam", adam)]:
    accumulated = run_answer3(make_optimizer, K)
    big = big_batch_step(make_optimizer, updates=3)
    difference = max_difference(accumulated, big)
    print(f"{name:4s}: 3 updates of {K} micro-batches vs 3 big-batch steps, "
          f"max |difference| = {difference:.6f}")
    assert difference < 1e-6

# %% [markdown]
# Within float32 rounding (differences of order $10^{-8}$ on weights of
# order 1, printed as 0.000000), the accumulated updates *are* the big
# batch's, over several updates and with Adam's moment estimates: Adam sees
# one gradient per update, the mean, exactly as with the big batch.
#
# Two caveats answer 3 does not mention. The counter counts micro-batches, so
# the equality needs micro-batches of equal size (the next chapter weights by
# examples instead). And what is computed per batch besides the gradient,
# such as BatchNorm's statistics, still sees micro-batches; the next chapter
# measures that too.
#
# ## Answer 4: the trap of `accum_op / batchsize`
#
# The fourth answer divides the result of the accumulate op by the number of
# micro-batches. Its author tested it with a placeholder fed 2.0 five times,
# so the mean should be 2.0:

# %% tags=["program"]
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # set before TensorFlow starts: no start-up logs

import tensorflow as tf

v1 = tf.compat.v1
graph = tf.Graph()
with graph.as_default():
    value = v1.placeholder(tf.float32, [], name="value")
    acum = tf.Variable(0.0, name="acum")
    accum_op = acum.assign_add(value)
    divide = accum_op / 5.0
    init = v1.global_variables_initializer()

with v1.Session(graph=graph) as session:
    session.run(init)
    for _ in range(5):
        session.run(accum_op, {value: 2.0})
    print("accumulator after 5 runs:     ", session.run(acum))
    try:
        session.run(divide)
    except tf.errors.InvalidArgumentError as error:
        first = next(line for line in error.message.splitlines() if "must feed" in line)
        print("divide without a feed:        ", type(error).__name__, first.strip())
    print("divide (fed 2.0 once more):   ", session.run(divide, {value: 2.0}))
    print("accumulator after divide:     ", session.run(acum))

# %% [markdown]
# 2.4, not 2.0, and the accumulator now holds 12. `divide` is not "the
# accumulator divided by 5"; it is "the value returned by `accum_op`, divided
# by 5". Fetching a tensor makes the session run *every op that tensor
# depends on*, and `accum_op`'s value depends on the `assign_add` that
# produces it. So fetching `divide` adds the fed value once more
# ($10 + 2 = 12$) and then divides ($12 / 5 = 2.4$); without a feed it cannot
# even run. `pargrad.book.graph_ops.ops_run_by` lists the ops a fetch
# executes, inputs first:

# %%
for name, kind in ops_run_by(divide):
    print(f"{kind:20s} {name}")

# %% [markdown]
# There it is: `AssignAddVariableOp`, fed by the placeholder, upstream of the
# division. The fix: divide something that does *not* depend on the
# accumulate op (the variable's value, `acum.read_value()`), and accumulate
# and apply in **separate** `session.run` calls (within one call, TensorFlow
# does not order a read and an unrelated write of the same variable):

# %%
with graph.as_default():
    mean_value = acum.read_value() / 5.0

print([kind for _, kind in ops_run_by(mean_value)])
with v1.Session(graph=graph) as session:
    session.run(init)
    for _ in range(5):
        session.run(accum_op, {value: 2.0})
    print("mean:", session.run(mean_value), " accumulator after:", session.run(acum))

# %% [markdown]
# ### The `tf.cond` attempt
#
# The answer then tries to do both jobs with one fetch: a boolean
# placeholder picks a branch of a `tf.cond`; the "true" branch returns the
# accumulate op, built before the cond, and the "false" branch divides it,
# the division built inside the branch. The author feeds `True` four times,
# then `False` once:

# %% tags=["program"]
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # set before TensorFlow starts: no start-up logs

import tensorflow as tf

v1 = tf.compat.v1
graph = tf.Graph()
with graph.as_default():
    value = v1.placeholder(tf.float32, [], name="value")
    accumulating = v1.placeholder(tf.bool, [], name="accumulating")
    acum = tf.Variable(0.0, name="acum")
    accum_op = acum.assign_add(value)  # built outside the cond
    result = v1.cond(accumulating, lambda: accum_op, lambda: accum_op / 5.0)  # division inside
    init = v1.global_variables_initializer()

with v1.Session(graph=graph) as session:
    session.run(init)
    for flag in [True] * 4 + [False]:
        got = session.run(result, {value: 2.0, accumulating: flag})
        print(f"accumulating={flag!s:5}: result {got:.1f}, accumulator {session.run(acum):.1f}")

# %% [markdown]
# On this toy it prints 2.0 at the end, the mean, which looks like success.
# It is not: the `False` call did not skip the accumulation, it accumulated
# the fifth value too (the accumulator holds 10 after five calls, not four)
# and then divided. `accum_op` was created outside the branch functions, so
# it is an input of the cond and runs on every call, whichever branch wins.
# Only ops created *inside* the lambdas are conditional:

# %%
runs = [kind for _, kind in ops_run_by(result)].count("AssignAddVariableOp")
print("AssignAddVariableOp ops that fetching the cond runs, whichever branch:", runs)

# %% tags=["remove-cell"]
assert runs == 1

# %% [markdown]
# The answer ends with a retraction: with a real model "nothing works" and the
# optimizers fail. Same cause: an optimizer's `apply_gradients`, built outside
# the cond, runs on *every* call, accumulating ones included. A counter that
# can only advance after the optimizer's update has run counts how often it
# ran:

# %% tags=["program"]
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # set before TensorFlow starts: no start-up logs

import tensorflow as tf

v1 = tf.compat.v1
graph = tf.Graph()
with graph.as_default():
    value = v1.placeholder(tf.float32, [], name="value")
    accumulating = v1.placeholder(tf.bool, [], name="accumulating")
    w = tf.Variable(1.0, name="w")
    acum = tf.Variable(0.0, name="acum")
    accum_op = acum.assign_add(value)
    train_step = v1.train.GradientDescentOptimizer(1.0).apply_gradients(
        [(acum.read_value() / 5.0, w)])  # built outside the cond, like the answer's
    applied = tf.Variable(0, name="applied")
    with tf.control_dependencies([train_step]):
        count_update = applied.assign_add(1)  # advances only after train_step ran

    def apply_mean():
        with tf.control_dependencies([count_update]):
            return tf.identity(acum.read_value())

    result = v1.cond(accumulating, lambda: tf.identity(accum_op), apply_mean)
    init = v1.global_variables_initializer()

with v1.Session(graph=graph) as session:
    session.run(init)
    for flag in [True] * 4 + [False]:
        session.run(result, {value: 2.0, accumulating: flag})
    runs = int(session.run(applied))
print(f"calls: 5, meant to update w: 1, the optimizer's update ran: {runs} times")

# %% tags=["remove-cell"]
assert runs == 5

# %% [markdown]
# (Within one call the order of the accumulate and the apply is not defined
# either, so the values of `w` are not worth printing.) That is the failure
# the author met. A reader today meets a second one, which the author,
# writing TensorFlow 1 in 2017, could not have: under a `tf.distribute`
# strategy a Keras 3 optimizer applies its update through `merge_call`, which
# must run in the replica function itself, not inside a branch of a
# `tf.cond` (a branch is a graph of its own). A TensorFlow 2 lesson, then:

# %%
import keras

strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
with strategy.scope():
    variable = tf.Variable(1.0)
    optimizer = keras.optimizers.SGD(0.1)


@tf.function
def apply_if(flag):
    def replica_step():
        def apply():
            optimizer.apply_gradients([(tf.constant(1.0), variable)])
            return tf.constant(1)
        return tf.cond(flag, apply, lambda: tf.constant(0))
    return strategy.run(replica_step)


try:
    apply_if(tf.constant(True))
except RuntimeError as error:
    message = str(error)
    print(type(error).__name__, message[message.index("`merge_call`"):].split(". ")[0])

# %% [markdown]
# So a `tf.cond` is the wrong tool twice over: ops built outside it are not
# conditional (TensorFlow 1, as the author found), and an optimizer's update
# built inside it fails under a strategy (TensorFlow 2). Accumulating and
# applying are different jobs at different times: in TF1, two ops and two
# `session.run` calls; in TF2, an `if` in Python around two `tf.function`s
# (the next chapter).
#
# ## Answer 5: PyTorch accumulates by itself
#
# The last answer notes that PyTorch needs none of this: `backward()` *adds*
# into each parameter's `.grad` (hence `optimizer.zero_grad()` in PyTorch
# loops), so to accumulate $k$ micro-batches you simply call `backward()` $k$
# times without zeroing in between, and dividing each micro-batch's loss by
# $k$ gives the mean
# {cite}`li2020pytorch`. Side by side:
#
# | TF1 recipe (answer 3) | PyTorch |
# | --- | --- |
# | `session.run(zero_ops)` | `optimizer.zero_grad()` |
# | `session.run(accum_ops, feed)` | `(loss(model(x), y) / k).backward()` |
# | `session.run(train_step)` (applies `accumulator / counter`) | `optimizer.step()` |
#
# Answer 4's toy in PyTorch: a weight $w$, a "loss" $2w$ whose gradient is 2,
# five backward passes. Without PyTorch installed, the cell computes the same
# two numbers with TensorFlow; the output is the same either way.

# %% tags=["hide-input"]
def pytorch_accumulation(k=5, value=2.0):
    import torch

    w = torch.zeros((), requires_grad=True)
    for _ in range(k):
        (w * value).backward()          # .grad += 2.0
    summed = w.grad.item()
    w.grad = None                       # what optimizer.zero_grad() does
    for _ in range(k):
        (w * value / k).backward()      # .grad += 2.0 / k
    return summed, w.grad.item()


def tensorflow_accumulation(k=5, value=2.0):
    w = tf.Variable(0.0)
    summed, averaged = tf.Variable(0.0), tf.Variable(0.0)
    for _ in range(k):
        with tf.GradientTape(persistent=True) as tape:
            loss = w * value
            scaled = loss / k
        summed.assign_add(tape.gradient(loss, w))
        averaged.assign_add(tape.gradient(scaled, w))
    return float(summed.numpy()), float(averaged.numpy())


try:
    import torch  # noqa: F401
    accumulate = pytorch_accumulation
except ImportError:
    accumulate = tensorflow_accumulation
summed, averaged = accumulate()
print(f".grad after 5 backward passes of 2*w:       {summed:.1f}  (the sum, answer 1)")
print(f".grad after 5 backward passes of 2*w / 5:   {averaged:.1f}  (the mean, answer 3)")

# %% [markdown]
# PyTorch's default is answer 1's behaviour: a sum. Forgetting `zero_grad()`
# accumulates by accident; forgetting to divide by $k$ scales the learning
# rate. Answer 4's trap has no PyTorch twin: PyTorch runs each line once,
# when Python reaches it, with no graph to re-run.
#
# ## The clean version: `pargrad.tf1.accumulation_ops`
#
# Everything above, fixed, as one function: it works with resource variables
# and any `tf.compat.v1.train` optimizer, counts the micro-batches, reads the
# variables in `train_step` (so fetching it never re-runs `accum_ops` and
# needs no feed), and refuses to divide by a counter of 0. First the two op
# lists a training loop runs:

# %%
show_lines(tf1.accumulation_ops, "zero_ops = [accumulator.assign",
           "accum_ops.append(counter.assign_add(1.0))")

# %% [markdown]
# `zero_ops` zeroes every accumulator and the counter; `accum_ops` adds one
# micro-batch's gradient to each accumulator (`_add_gradient` also handles
# embedding layers' sparse gradients) and 1 to the counter: answer 3's
# recipe. With `num_examples`, a second branch weights each gradient by the
# micro-batch's size and counts examples, as the next chapter explains. Then
# the training step:

# %%
show_lines(tf1.accumulation_ops, "# Read the variables", "train_step = optimizer.apply_gradients")

# %% [markdown]
# The division reads the *variables* (`read_value()`), never the tensors
# `assign_add` returned: the fix for answer 4's trap. `assert_positive` makes
# a `train_step` with nothing accumulated fail instead of applying $0/0$, and
# `tf.control_dependencies` makes the division wait for that check. The whole
# source is in the collapsed cell below.

# %% tags=["hide-cell"]
show_source(tf1.accumulation_ops)

# %% [markdown]
# Fetching `train_step` runs no accumulate op, whatever is fed:

# %%
graph = tf.Graph()
with graph.as_default():
    x, y, variables, loss = parabola_graph()
    ops = tf1.accumulation_ops(loss, sgd())
    init = v1.global_variables_initializer()
accumulate_ops_run = [kind for _, kind in ops_run_by(ops.train_step)].count("AssignAddVariableOp")
print("AssignAddVariableOp ops that fetching train_step runs:", accumulate_ops_run)

with v1.Session(graph=graph) as session:
    session.run(init)
    try:
        session.run(ops.train_step)
    except tf.errors.InvalidArgumentError as error:
        print(type(error).__name__, error.message.splitlines()[2].split("]")[0] + "]")

# %% [markdown]
# And it trains the y = x² network exactly as the big batch does. We train 200
# updates with 5 micro-batches of 10 and compare with the plain big-batch
# loss curve from answer 1's experiment ($k = 1$ there is plain training):

# %%
losses = []
with v1.Session(graph=graph) as session:
    session.run(init)
    for _ in range(200):
        losses.append(session.run(loss, {x: x_all, y: y_all}))
        session.run(ops.zero_ops)
        for xb, yb in micro_batches(K):
            session.run(ops.accum_ops, {x: xb, y: yb})
        session.run(ops.train_step)
losses = np.array(losses)
big_losses = curves["big batch (k = 1)"]
print(f"loss after 200 updates: accumulated {losses[-1]:.6f}, big batch {big_losses[-1]:.6f}")
print(f"largest gap between the two curves: {np.abs(losses - big_losses).max():.6f}")

# %% [markdown]
# ## Summary
#
# - Gradient accumulation replaces one big batch by $k$ micro-batches run one
#   after the other; the update must use the **mean** of their gradients.
# - Answer 1 applies the **sum**: harmless with Adam, the optimizer its code
#   uses (Adam divides the factor $k$ away, up to its $\epsilon$); with SGD or
#   momentum the step is exactly $k$ times too large (a hidden learning rate of
#   $k\eta$, here stable for $k=5$ and divergent for $k=50$).
# - Answer 2 (gradients kept in Python and fed back) is correct but moves
#   every gradient through Python twice per update.
# - Answer 3 adds a counter and applies `accumulator / counter`: equal to the
#   big batch within float32 rounding, for SGD and Adam, over many updates.
# - Answer 4's trap: a tensor returned by `assign_add` re-runs the
#   `assign_add` whenever it is fetched, so `accum_op / 5` gives 2.4 and leaves
#   12. Read the variable instead, and accumulate and apply in separate
#   `run` calls. A `tf.cond` runs ops created outside it on every call (the
#   toy's 2.0 is an accident; `apply_gradients` updates at every call);
#   inside it, a Keras optimizer's `merge_call` fails under a strategy.
# - PyTorch accumulates into `.grad` by itself; divide the loss by $k$.
# - `pargrad.tf1.accumulation_ops(loss, optimizer)` packages the fixed recipe.
#
# ## Exercises
#
# 1. Change answer 1's experiment to a momentum optimizer
#    (`v1.train.MomentumOptimizer(LEARNING_RATE, 0.9)`). Does training now
#    diverge at a smaller $k$ than with SGD, or at a larger one? Why?
#
#    *Hint:* with momentum $\beta$, a constant gradient moves the weights by
#    up to $\eta / (1 - \beta)$ per update; but what happens in a direction
#    where the gradient changes sign from one step to the next?
# 2. Answer 3 divides by the number of micro-batches. Cut the 50 points into
#    micro-batches of 16, 16, 16 and 2, and measure how far the step lands
#    from the big batch's. Then pass `num_examples=tf.shape(x)[0]` to
#    `accumulation_ops` and measure again.
#
#    *Hint:* `step_ratio` compares a step with the big batch's.
# 3. Fetch `ops.accum_ops` and `ops.train_step` in the *same*
#    `session.run` call several times. Is the result always the same? Use
#    `ops_run_by` to explain.
#
#    *Hint:* is there a path from the accumulate ops to `train_step`'s reads?
# 4. Rewrite the `tf.cond` attempt so that the ops are created inside the
#    branch functions. Does it give 2.0 now? What does the sixth run do to
#    the accumulator?
#
#    *Hint:* write the branches as `lambda: acum.assign_add(value)` and, once
#    as in the answer and once reading the variable, as the division.
# 5. With $k$ micro-batches of $n$ examples, answer 2 moves $(k+1)$ copies of
#    the gradients through Python per update. Estimate the time this takes
#    for a 100-million-parameter model over a PCIe link that carries
#    $16 \cdot 10^9$ bytes a second, per update.
#
#    *Hint:* a float32 parameter is 4 bytes.
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# At a larger one, not a smaller one. On a slope that stays
# the same, momentum's steps grow to $\eta/(1-\beta)$, ten times SGD's, which
# speeds up the slow directions. But stability is decided in the steepest
# direction, where the gradient changes sign from step to step and momentum
# partly cancels it: for gradient descent with momentum the limit is
# $\eta\lambda < 2(1+\beta)$ instead of SGD's $\eta\lambda < 2$ ($\lambda$ the
# largest curvature), almost twice as large for $\beta = 0.9$. So $k = 50$,
# where answer 1 with SGD diverged, still trains with momentum:
# ```

# %% tags=["hide-cell"]
momentum = lambda: v1.train.MomentumOptimizer(LEARNING_RATE, 0.9)  # noqa: E731


def final_loss_answer1(make_optimizer, k, updates=200):
    """Full-batch loss after `updates` answer-1 updates of k micro-batches (inf if it diverged)."""
    graph = tf.Graph()
    with graph.as_default():
        x, y, variables, loss, zero_ops, accum_ops, train_step = answer1_graph(make_optimizer)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(updates):
            session.run(zero_ops)
            for xb, yb in micro_batches(k):
                session.run(accum_ops, {x: xb, y: yb})
            session.run(train_step)
        value = session.run(loss, {x: x_all, y: y_all})
    return value if np.isfinite(value) else np.inf


momentum_losses = {k: final_loss_answer1(momentum, k) for k in (5, 50)}
for k, value in momentum_losses.items():
    print(f"momentum, answer 1, k = {k}: loss after 200 updates {value:.2g}")
sgd_k50 = curves["answer 1, k = 50"]
print(f"SGD,      answer 1, k = 50: {'diverged' if not np.isfinite(sgd_k50[-1]) else 'trained'}")
assert np.isfinite(momentum_losses[50]) and not np.isfinite(sgd_k50[-1])

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# Counting micro-batches gives the two last points the
# weight of sixteen, and the step lands visibly off the big batch's; weighting
# by examples puts it back:
# ```

# %% tags=["hide-cell"]
unequal = list(zip(np.split(x_all, [16, 32, 48]), np.split(y_all, [16, 32, 48])))
for weighted in (False, True):
    graph = tf.Graph()
    with graph.as_default():
        x, y, variables, loss = parabola_graph()
        ops = tf1.accumulation_ops(loss, sgd(), num_examples=tf.shape(x)[0] if weighted else None)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        session.run(ops.zero_ops)
        for xb, yb in unequal:
            session.run(ops.accum_ops, {x: xb, y: yb})
        session.run(ops.train_step)
        after = session.run(variables)
    length, cosine = step_ratio(after, big_sgd)
    print(f"{'weighted by examples' if weighted else 'counting micro-batches'}: step is "
          f"{length:.3f} x the big batch's, direction {cosine:.3f}, "
          f"max |difference| {max_difference(after, big_sgd):.6f}")
assert max_difference(after, big_sgd) < 1e-6

# %% [markdown]
# ```{dropdown} Solution to exercise 3
# Not reliably. `ops_run_by(ops.train_step)` contains no
# `AssignAddVariableOp`: the reads of the accumulators in `train_step` do not
# depend on the adds in `accum_ops`, so within one `session.run` TensorFlow
# may run the reads before, after or between the adds. The result depends on
# scheduling: apply in a separate `run` call.
# ```
#
# ```{dropdown} Solution to exercise 4
# Created inside the branches, the ops run only in the branch
# taken. Written as in the answer (the division of the value returned by a
# new `assign_add`), the sixth run still adds once more and gives 2.4; reading
# the variable in the division branch gives 2.0 and leaves 10:
# ```

# %% tags=["hide-cell"]
for divide_reads_variable in (False, True):
    graph = tf.Graph()
    with graph.as_default():
        value = v1.placeholder(tf.float32, [], name="value")
        acum = tf.Variable(0.0, name="acum")
        counter = tf.Variable(0.0, name="counter")
        count_op = counter.assign_add(1.0)
        if divide_reads_variable:
            divide_branch = lambda: acum.read_value() / 5.0  # noqa: E731
        else:
            divide_branch = lambda: acum.assign_add(value) / 5.0  # noqa: E731
        result = tf.cond(counter.read_value() < 5.0, lambda: acum.assign_add(value), divide_branch)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for run in range(1, 7):
            got = session.run(result, {value: 2.0})
            session.run(count_op)
        print(f"division {'reads the variable' if divide_reads_variable else 'as in the answer'}: "
              f"sixth run {got:.1f}, accumulator {session.run(acum):.1f}")
assert got == 2.0

# %% [markdown]
# ```{dropdown} Solution to exercise 5
# $10^8$ float32 parameters are $4 \cdot 10^8$ bytes; at
# $16 \cdot 10^9$ bytes a second one copy takes $4 \cdot 10^8 / (16 \cdot
# 10^9)$ s, a fortieth of a second, so $(k+1)$ copies take $(k+1)/40$ s per
# update: nine fortieths of a second for $k = 8$, typically more than the
# computation of the update itself. The
# in-graph recipe keeps the accumulators on the device and moves nothing.
# ```

