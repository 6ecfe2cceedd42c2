# %% [markdown]
# # The training loop
#
# Every way of training on several devices in this book is a way of running
# *this* loop on several devices. So we start with one device and look at the
# loop closely.
#
# **In this chapter you will**
#
# - take one training iteration apart: forward pass, loss, backward pass, update;
# - run a reader's TF1 program (placeholders, `Session`) as it was written in 2017;
# - write the same loop in TF2 with `tf.GradientTape` and check that, from the
#   same initial weights, both produce the same loss curve;
# - meet the small network that the synchronous and accumulation chapters
#   parallelise: a 1-5-1 `tanh` network fitting $y = x^2$.
#
# Runs in a few seconds on a CPU; no GPU needed.

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

# %% [markdown]
# We import `pargrad` before TensorFlow: it imports TensorFlow with its native
# start-up messages silenced, so they do not clutter the page.

# %%
import numpy as np
import pargrad
import tensorflow as tf
from pargrad import plots

# %% [markdown]
# ## One iteration, four steps
#
# One *training iteration* takes a small batch of examples and does four things:
#
# 1. **forward pass**: compute the model's predictions for the batch;
# 2. **loss**: measure how wrong they are with one number;
# 3. **backward pass**: compute the gradient of the loss with respect to every
#    parameter (backpropagation);
# 4. **update**: move every parameter a small step against its gradient,
#    $w \leftarrow w - \eta \, \partial L / \partial w$, with learning rate $\eta$.
#
# Training repeats the iteration until the loss stops falling. Parallel
# training asks: which of these four steps can several devices share, and who
# waits for whom?
#
# ## The problem: fitting $y = x^2$
#
# A question on a programming Q&A site asked how to parallelise the gradient
# computation of a tiny network: one input, a hidden layer of five `tanh`
# units, one output, trained by full-batch gradient descent (learning rate
# $10^{-2}$, 2000 steps) on 50 points of $y = x^2$ in $[-2, 2]$. We use
# exactly that problem, because it is small enough to run anywhere and big
# enough to show every effect. The data:

# %%
x, y = pargrad.parabola_data()
print("x:", x.shape, x.dtype, " first points:", x[:3, 0].round(4))
print("y:", y.shape, y.dtype, " first targets:", y[:3, 0].round(4))

# %% [markdown]
# The question built its layers with an `add_layer` helper that draws
# weights and biases from a normal distribution. We draw random-normal
# weights and set the biases to 0.1 (every claim of the book compares runs
# from the same initial weights, so how they are drawn changes no
# conclusion), once, with NumPy and a seed, so that every version of the
# loop below (and of the later chapters) starts from the *same* weights:

# %%
weights = pargrad.initial_weights(seed=0)
for name, value in zip(["W1", "b1", "W2", "b2"], weights):
    print(f"{name} {str(value.shape):7} {value.ravel().round(4)}")

# %%
pargrad.show_source(pargrad.add_layer)

# %% [markdown]
# ## The TF1 program: a graph, then a session
#
# In TensorFlow 1 you first *describe* the computation as a graph: placeholders
# for the data, variables for the parameters, and a `train_step` operation that
# the optimizer adds. Nothing runs until a `Session` is asked for a value.
# TensorFlow 2 still runs such programs through `tf.compat.v1`, in a graph of
# their own:

# %%
graph = tf.Graph()
with graph.as_default():
    xs = tf.compat.v1.placeholder(tf.float32, [None, 1])
    ys = tf.compat.v1.placeholder(tf.float32, [None, 1])
    w1, b1, w2, b2 = [tf.compat.v1.Variable(value) for value in weights]
    hidden = pargrad.add_layer(xs, w1, b1, activation=tf.nn.tanh)
    prediction = pargrad.add_layer(hidden, w2, b2)
    loss = tf.reduce_mean(tf.reduce_sum(tf.square(ys - prediction), axis=1))
    train_step = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
    init = tf.compat.v1.global_variables_initializer()

with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(init)
    tf1_losses = []
    for step in range(2000):
        _, loss_value = sess.run([train_step, loss], feed_dict={xs: x, ys: y})
        tf1_losses.append(loss_value)
    tf1_prediction = sess.run(prediction, feed_dict={xs: x})
    tf1_weights = sess.run([w1, b1, w2, b2])

tf1_losses = np.array(tf1_losses)
print(f"TF1: loss {tf1_losses[0]:.4f} at the first step, {tf1_losses[-1]:.4f} after 2000")

# %% [markdown]
# Where are the four steps? `prediction` is the forward pass and `loss` the
# loss; `minimize` added the backward pass (`compute_gradients`) *and* the
# update (`apply_gradients`) to the graph as the single operation
# `train_step`. One `sess.run([train_step, loss])` runs one whole iteration;
# the loss it returns is the one computed *before* the update. Keep this
# picture of "fetching an op runs everything it depends on": the accumulation
# chapters show how it bites.
#
# ## The same loop in TF2
#
# TensorFlow 2 runs operations as they are called (eager execution) and
# records them on a `tf.GradientTape` to backpropagate. The four steps become
# four visible lines; `tf.function` compiles the step into a graph again, for
# speed. This is `pargrad.fit_one_device`:

# %%
pargrad.show_source(pargrad.fit_one_device)

# %%
tf2_losses, tf2_weights = pargrad.fit_one_device(x, y, steps=2000, learning_rate=0.01, seed=0)
print(f"TF2: loss {tf2_losses[0]:.4f} at the first step, {tf2_losses[-1]:.4f} after 2000")

# %% [markdown]
# ## Do they train the same way?
#
# Same data, same initial weights, same learning rate: the two programs should
# follow the same loss curve. Floating-point sums may be ordered differently in
# the two runtimes, and every float32 addition is rounded to about 7 digits,
# so we compare within the rounding that 2000 steps can accumulate:
# `pargrad.rounding_tolerance` allows 10 × steps × float32's unit roundoff
# ($2^{-24}$), about $10^{-3}$, still far below the loss itself. (The
# chapter "Synchronous training" explains this tolerance and shows the same
# kind of comparison in float64.)

# %%
tolerance = pargrad.rounding_tolerance("float32", 2000)
curve_gap = np.max(np.abs(tf1_losses - tf2_losses))
weight_gap = max(np.max(np.abs(a - b)) for a, b in zip(tf1_weights, tf2_weights))
print(f"tolerance: {tolerance:.1e}")
print("same loss curve (within the tolerance):", curve_gap < tolerance)
print("same final weights (within the tolerance):", weight_gap < tolerance)
assert curve_gap < tolerance and weight_gap < tolerance

# %%
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
plots.loss_curve(tf1_losses, ax=left, label="TF1 graph + Session")
left.plot(np.arange(1, 2001), tf2_losses, "--", label="TF2 GradientTape")
left.legend()
model = pargrad.parabola_model(seed=0)
model.set_weights(tf2_weights)
plots.parabola_fit(x, y, {"before training": pargrad.parabola_model(seed=0).predict(x, verbose=0),
                          "after 2000 steps": model.predict(x, verbose=0)}, ax=right)
fig.tight_layout()

# %% [markdown]
# The two curves lie on top of each other. The fit is rough at the ends of the
# interval after 2000 steps: this is a small network trained slowly, and that is
# fine; what matters for the rest of the book is that we can reproduce its
# training exactly, and will be able to tell whether a parallel version
# changes it.
#
# `pargrad.parabola_model` builds the same network as a Keras model holding the
# same initial weights; the synchronous chapter trains it on several devices.
#
# ## Summary
#
# - One training iteration is forward pass, loss, backward pass, update.
# - TF1 describes the iteration as a graph and runs it with `Session.run`;
#   fetching an operation runs everything it depends on.
# - TF2 runs the same steps eagerly, records them with `GradientTape`, and
#   compiles them with `tf.function`. From the same initial weights the two
#   produce the same loss curve.
# - Data parallelism splits the *batch* of this loop over devices; the next
#   chapter makes the devices.
#
# ## Exercises
#
# 1. Change the learning rate to 0.1 and to 0.5 in both programs. Do they still
#    agree? What happens to the loss?
# 2. Split the 50 points into two halves, compute the gradient of the loss on
#    each half with `GradientTape`, and average them. Is the average equal to the
#    full-batch gradient? What if the halves had 20 and 30 points?
# 3. In the TF1 program, fetch only `loss` in the loop (drop `train_step`).
#    What happens to the loss curve, and why?
