# %% [markdown]
# # The training loop
#
# ```{admonition} Takeaway
# :class: tip
# Training repeats one iteration: forward pass, loss, backward pass, update.
# TF1 describes it as a graph that a `Session` runs; TF2 runs it as plain
# Python calls recorded by `GradientTape`. From the same initial weights both
# follow the same loss curve, and every parallel version in this book is
# checked against this one-device loop.
# ```
#
# Every way of training on several {term}`devices <device>` in this book (a
# device is a processor TensorFlow runs operations on: the CPU or a GPU; the
# next chapter looks at them closely) is a way of running
# *this* loop on several devices. So we start with one device and look at the
# loop closely.
#
# **In this chapter you will** take one training iteration apart (forward
# pass, loss, backward pass, update), run a reader's TF1 program as it was
# written in 2017, and write the same loop in TF2, on the small network the
# later chapters parallelise: a 1-5-1 `tanh` network fitting $y = x^2$. No
# GPU needed.

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
# We import `pargrad` before TensorFlow: it imports TensorFlow with its native
# start-up messages silenced, so they do not clutter the page.

# %%
import numpy as np
import pargrad
import tensorflow as tf
from pargrad.book import show_source
from pargrad.book.plots_one_device import loss_curve, parabola_fit
from pargrad.book.parabola import (add_layer, fit_one_device, initial_weights, parabola_data,
                                    parabola_forward, parabola_model, squared_error)

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
# The y = x² question, one of the three texts this book starts from
# ([Where this book starts](00_sources)), asked on Stack Overflow how to
# parallelise the gradient computation of a tiny network: one input, a hidden layer of five `tanh`
# units, one output, trained by full-batch gradient descent (learning rate
# $10^{-2}$, 2000 steps) on 50 points of $y = x^2$ in $[-2, 2]$. We use
# exactly that problem, because it is small enough to run anywhere and big
# enough to show every effect. The data:

# %%
x, y = parabola_data()
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
weights = initial_weights(seed=0)
for name, value in zip(["W1", "b1", "W2", "b2"], weights):
    print(f"{name} {str(value.shape):7} {value.ravel().round(4)}")

# %%
show_source(add_layer)

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
    hidden = add_layer(xs, w1, b1, activation=tf.nn.tanh)
    prediction = add_layer(hidden, w2, b2)
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
# picture of "fetching an op runs everything it depends on":
# [Accumulating gradients in TF1 graphs](06_accumulation_tf1) shows how it
# bites.
#
# ## The same loop in TF2
#
# TensorFlow 2 runs operations as they are called (eager execution) and
# records them on a `tf.GradientTape` to backpropagate. The four steps become
# four visible lines; `tf.function` compiles the step into a graph again, for
# speed. This is `pargrad.book.parabola.fit_one_device`:

# %%
show_source(fit_one_device)

# %%
tf2_losses, tf2_weights = fit_one_device(x, y, steps=2000, learning_rate=0.01, seed=0)
print(f"TF2: loss {tf2_losses[0]:.4f} at the first step, {tf2_losses[-1]:.4f} after 2000")

# %% [markdown]
# ## Do they train the same way?
#
# Same data, same initial weights, same learning rate: the two programs should
# follow the same loss curve. Floating-point sums may be ordered differently in
# the two runtimes, and every float32 addition is rounded to about 7 digits,
# so we compare within the {term}`rounding tolerance` of 2000 steps:
# `pargrad.rounding_tolerance` allows 10 × steps × float32's unit roundoff
# ($2^{-24}$), about $10^{-3}$, still far below the loss itself.
# ([Synchronous training](03_synchronous) shows the same kind of comparison
# in float64, and [How the book decides](a0_methods) explains the
# tolerance.)

# %%
tolerance = pargrad.rounding_tolerance("float32", 2000)
curve_gap = np.max(np.abs(tf1_losses - tf2_losses))
weight_gap = max(np.max(np.abs(a - b)) for a, b in zip(tf1_weights, tf2_weights))
print(f"largest gap between the loss curves: below {tolerance:.1e} (the tolerance)")
print(f"largest gap between the final weights: below {tolerance:.1e}")

# %% tags=["remove-cell"]
assert curve_gap < tolerance and weight_gap < tolerance

# %% tags=["remove-cell"]
assert curve_gap < tolerance and weight_gap < tolerance

# %% mystnb={"figure": {"caption": "Left: the loss of the y = x\u00b2 network over 2000 steps of the TF1 program and of its TF2 twin, from the same initial weights. Right: the network's predictions before and after training, and the data.", "name": "fig-training-loop"}}
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
loss_curve(tf1_losses, ax=left, label="TF1 graph + Session")
left.plot(np.arange(1, 2001), tf2_losses, "--", label="TF2 GradientTape")
left.legend()
model = parabola_model(seed=0)
model.set_weights(tf2_weights)
parabola_fit(x, y, {"before training": parabola_model(seed=0).predict(x, verbose=0),
                    "after 2000 steps": model.predict(x, verbose=0)}, ax=right)
fig.tight_layout()

# %% [markdown]
# In {numref}`fig-training-loop` the two curves lie on top of each other. The fit is rough at the ends of the
# interval after 2000 steps: this is a small network trained slowly, and that is
# fine; what matters for the rest of the book is that we can reproduce its
# training exactly, and will be able to tell whether a parallel version
# changes it.
#
# `pargrad.book.parabola.parabola_model` builds the same network as a Keras model holding the
# same initial weights; [Synchronous training](03_synchronous) trains it on
# several devices.
#
# ## Summary
#
# - One training iteration is forward pass, loss, backward pass, update.
# - TF1 describes the iteration as a graph and runs it with `Session.run`;
#   fetching an operation runs everything it depends on.
# - TF2 runs the same steps eagerly, records them with `GradientTape`, and
#   compiles them with `tf.function`. From the same initial weights the two
#   produce the same loss curve.
# - {term}`Data parallelism <data parallelism>` (each device gets a full
#   copy of the model and a part of the data) splits the *batch* of this loop
#   over devices; [Devices](02_devices) makes the devices.
#
# ## Exercises
#
# 1. Change the learning rate to 0.1 and to 0.5 in both programs. Do they still
#    agree? What happens to the loss?
#
#    *Hint:* `pargrad.book.parabola.fit_one_device` takes `learning_rate`; wrap the TF1
#    program in a function of the learning rate.
# 2. Split the 50 points into two halves, compute the gradient of the loss on
#    each half with `GradientTape`, and average them. Is the average equal to the
#    full-batch gradient? What if the halves had 20 and 30 points?
#
#    *Hint:* the loss is a mean; a mean of two means is the overall mean only
#    when the parts are equally large.
# 3. In the TF1 program, fetch only `loss` in the loop (drop `train_step`).
#    What happens to the loss curve, and why?
#
#    *Hint:* what does `sess.run` execute when it is asked for `loss`?
#
# ### Solutions
#
# ```{dropdown} Solution to exercise 1
# At 0.1 the two programs still agree, and the loss ends far lower than at
# 0.01. At 0.5 the steps are too large: both programs diverge to NaN (not a
# number), the same way. The collapsed cell below runs both.
# ```

# %% tags=["hide-cell"]
def tf1_training(learning_rate, steps=2000):
    """The TF1 program above as a function of the learning rate: the loss before each step."""
    graph = tf.Graph()
    with graph.as_default():
        xs = tf.compat.v1.placeholder(tf.float32, [None, 1])
        ys = tf.compat.v1.placeholder(tf.float32, [None, 1])
        variables = [tf.compat.v1.Variable(value) for value in weights]
        loss = squared_error(ys, parabola_forward(xs, variables))
        step = tf.compat.v1.train.GradientDescentOptimizer(learning_rate).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        return np.array([sess.run([step, loss], {xs: x, ys: y})[1] for _ in range(steps)])


diverged = {}
for learning_rate in (0.1, 0.5):
    tf1_curve = tf1_training(learning_rate)
    tf2_curve, _ = fit_one_device(x, y, steps=2000, learning_rate=learning_rate, seed=0)
    diverged[learning_rate] = not np.isfinite(tf1_curve[-1]) and not np.isfinite(tf2_curve[-1])
    agree = np.allclose(tf1_curve, tf2_curve, rtol=1e-3, atol=1e-5, equal_nan=True)
    print(f"learning rate {learning_rate}: TF1 final loss {tf1_curve[-1]:.2g}, "
          f"TF2 final loss {tf2_curve[-1]:.2g}")
    assert agree  # the two curves agree to float32 rounding, NaNs included
assert diverged == {0.1: False, 0.5: True}

# %% [markdown]
# ```{dropdown} Solution to exercise 2
# With halves of 25 the average of the two gradients is the full-batch
# gradient, to float32 rounding. With 20 and 30 points the plain average
# gives the 20 points too much weight; weighting each part by its size
# (20/50 and 30/50) gives the full-batch gradient again. This is why
# [Synchronous training](03_synchronous) scales each shard's loss by the
# *global* batch size. The collapsed cell below checks both.
# ```

# %% tags=["hide-cell"]
variables = [tf.Variable(value) for value in weights]


def gradient_of(x_part, y_part):
    with tf.GradientTape() as tape:
        loss_value = squared_error(y_part, parabola_forward(x_part, variables))
    return [g.numpy() for g in tape.gradient(loss_value, variables)]


def largest_gap(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


full = gradient_of(x, y)
for sizes in ([25, 25], [20, 30]):
    parts = [gradient_of(xp, yp) for xp, yp in zip(np.split(x, [sizes[0]]), np.split(y, [sizes[0]]))]
    plain = [(a + b) / 2 for a, b in zip(*parts)]
    weighted = [(sizes[0] * a + sizes[1] * b) / 50 for a, b in zip(*parts)]
    print(f"halves {sizes}: plain average off by {largest_gap(plain, full):.4f}, "
          f"size-weighted average off by {largest_gap(weighted, full):.4f}")
assert largest_gap(weighted, full) < 1e-5 < largest_gap(plain, full)

# %% [markdown]
# ```{dropdown} Solution to exercise 3
# The curve is flat: fetching `loss` runs only what `loss` depends on, the
# forward pass, and never the update, so the weights never change and every
# step prints the initial loss. The collapsed cell below shows it.
# ```

# %% tags=["hide-cell"]
with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(init)
    only_loss = [sess.run(loss, feed_dict={xs: x, ys: y}) for _ in range(5)]
print("loss when only `loss` is fetched:", np.round(only_loss, 4))
assert len(set(only_loss)) == 1
