"""pargrad.tf1.accumulation_ops: k micro-batches equal one big batch, and the traps stay fixed."""

import numpy as np
import pytest

import pargrad  # noqa: F401  (quiet TensorFlow first)
import tensorflow as tf
from pargrad import tf1
from pargrad.book.graph_ops import ops_run_by
from pargrad.book.parabola import initial_weights, parabola_data, parabola_forward, squared_error

v1 = tf.compat.v1
TOLERANCE = 1e-6

OPTIMIZERS = {
    "sgd": lambda: v1.train.GradientDescentOptimizer(0.05),
    "momentum": lambda: v1.train.MomentumOptimizer(0.05, momentum=0.9),
    "adam": lambda: v1.train.AdamOptimizer(0.05),
}


def build(optimizer_name, weighted):
    """The 1-5-1 parabola network in a graph, with accumulation ops and a big-batch step."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 1])
        y = v1.placeholder(tf.float32, [None, 1])
        variables = [tf.Variable(w) for w in initial_weights(seed=1)]
        loss = squared_error(y, parabola_forward(x, variables))
        ops = tf1.accumulation_ops(
            loss, OPTIMIZERS[optimizer_name](), var_list=variables,
            num_examples=tf.shape(x)[0] if weighted else None,
        )
        big_step = OPTIMIZERS[optimizer_name]().minimize(loss, var_list=variables)
        init = v1.global_variables_initializer()
    return graph, x, y, variables, ops, big_step, init


def max_difference(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def scale(weights):
    return max(1.0, max(float(np.abs(w).max()) for w in weights))


@pytest.mark.claim
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("sizes", [(10, 10, 10, 10, 10), (16, 16, 16, 2)], ids=["equal", "unequal"])
def test_micro_batches_equal_the_big_batch(optimizer_name, sizes):
    weighted = len(set(sizes)) > 1
    x_all, y_all = parabola_data()
    graph, x, y, variables, ops, big_step, init = build(optimizer_name, weighted)
    bounds = np.cumsum((0,) + sizes)
    with v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(3):
            session.run(ops.zero_ops)
            for low, high in zip(bounds[:-1], bounds[1:]):
                session.run(ops.accum_ops, {x: x_all[low:high], y: y_all[low:high]})
            session.run(ops.train_step)
        accumulated = session.run(variables)
        session.run(init)
        for _ in range(3):
            session.run(big_step, {x: x_all, y: y_all})
        big = session.run(variables)
    assert max_difference(accumulated, big) <= TOLERANCE * scale(big)


@pytest.mark.claim
def test_counting_micro_batches_is_wrong_for_unequal_sizes():
    """Answer 3's counter divides by the number of micro-batches: wrong when they differ."""
    x_all, y_all = parabola_data()
    graph, x, y, variables, ops, big_step, init = build("sgd", weighted=False)
    with v1.Session(graph=graph) as session:
        session.run(init)
        session.run(ops.zero_ops)
        for low, high in ((0, 48), (48, 50)):
            session.run(ops.accum_ops, {x: x_all[low:high], y: y_all[low:high]})
        session.run(ops.train_step)
        counted = session.run(variables)
        session.run(init)
        session.run(big_step, {x: x_all, y: y_all})
        big = session.run(variables)
    assert max_difference(counted, big) > 1e-3


@pytest.mark.claim
def test_train_step_does_not_rerun_the_accumulate_ops():
    """Answer 4's trap: fetching train_step must apply the mean of what was accumulated."""
    graph = tf.Graph()
    with graph.as_default():
        feed = v1.placeholder(tf.float32, [])
        weight = tf.Variable(0.0)
        loss = weight * feed  # gradient with respect to weight = the fed value
        ops = tf1.accumulation_ops(loss, v1.train.GradientDescentOptimizer(1.0))
        init = v1.global_variables_initializer()
    assert ("AssignAddVariableOp" not in {kind for _, kind in ops_run_by(ops.train_step)})
    with v1.Session(graph=graph) as session:
        session.run(init)
        session.run(ops.zero_ops)
        for _ in range(5):
            session.run(ops.accum_ops, {feed: 2.0})
        session.run(ops.train_step, {feed: 100.0})  # whatever is fed is ignored
        assert session.run(weight) == pytest.approx(-2.0)
        assert session.run(ops.accumulators[0]) == pytest.approx(10.0)
        assert session.run(ops.counter) == pytest.approx(5.0)


@pytest.mark.claim
def test_the_trap_itself_still_happens_in_plain_tf():
    """What the chapter shows: accum_op / 5 re-runs assign_add (2.4 and 12)."""
    graph = tf.Graph()
    with graph.as_default():
        feed = v1.placeholder(tf.float32, [])
        accumulator = tf.Variable(0.0)
        accum_op = accumulator.assign_add(feed)
        divide = accum_op / 5.0
        init = v1.global_variables_initializer()
    assert "AssignAddVariableOp" in {kind for _, kind in ops_run_by(divide)}
    with v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(5):
            session.run(accum_op, {feed: 2.0})
        assert session.run(divide, {feed: 2.0}) == pytest.approx(2.4)
        assert session.run(accumulator) == pytest.approx(12.0)


def test_train_step_with_nothing_accumulated_raises():
    x_all, y_all = parabola_data()
    graph, x, y, variables, ops, _, init = build("adam", weighted=False)
    with v1.Session(graph=graph) as session:
        session.run(init)
        before = session.run(variables)
        with pytest.raises(tf.errors.InvalidArgumentError, match="nothing accumulated"):
            session.run(ops.train_step)
        session.run(ops.accum_ops, {x: x_all, y: y_all})
        session.run(ops.zero_ops)
        with pytest.raises(tf.errors.InvalidArgumentError, match="nothing accumulated"):
            session.run(ops.train_step)
        after = session.run(variables)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert all(np.isfinite(w).all() for w in after)


def test_works_with_resource_variables():
    graph, *_ = build("sgd", weighted=False)
    with graph.as_default():
        variable = v1.trainable_variables()[0]
        assert type(variable).__name__ == "ResourceVariable"
        with pytest.raises(NotImplementedError):
            variable.initialized_value()  # why answer 1's recipe fails today


def test_bad_arguments_raise():
    with pytest.raises(RuntimeError, match="tf.Graph"):
        tf1.accumulation_ops(tf.constant(1.0), v1.train.GradientDescentOptimizer(0.1))
    graph = tf.Graph()
    with graph.as_default():
        weight = tf.Variable(1.0)
        loss = weight * 2.0
        with pytest.raises(TypeError, match="tf.compat.v1.train"):
            import keras
            tf1.accumulation_ops(loss, keras.optimizers.SGD(0.1))
        with pytest.raises(ValueError, match="scalar"):
            tf1.accumulation_ops(tf.stack([loss, loss]), v1.train.GradientDescentOptimizer(0.1))
        other = tf.Variable(3.0)
        with pytest.raises(ValueError, match="depends on none"):
            tf1.accumulation_ops(loss, v1.train.GradientDescentOptimizer(0.1), var_list=[other])


# --- multi_tower_step: the y = x² question answered in TF1 -----------------


def train_towers(towers, steps=50, dtype=tf.float64):
    """Weights after `steps` updates of the parabola network, one tower per device (all CPU)."""
    x_all, y_all = parabola_data()
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(dtype, [50, 1])
        y = v1.placeholder(dtype, [50, 1])
        variables = [tf.Variable(w.astype(dtype.as_numpy_dtype)) for w in initial_weights(seed=0)]
        if towers is None:  # the full batch, one plain step
            step = v1.train.GradientDescentOptimizer(0.01).minimize(
                squared_error(y, parabola_forward(x, variables)))
        else:
            ops = tf1.multi_tower_step(
                lambda xs, ys: squared_error(ys, parabola_forward(xs, variables)),
                v1.train.GradientDescentOptimizer(0.01), x, y, ["/cpu:0"] * towers)
            assert len(ops.tower_losses) == towers and len(ops.mean_gradients) == 4
            step = ops.train_step
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(steps):
            session.run(step, {x: x_all, y: y_all})
        return session.run(variables)


@pytest.mark.parametrize("towers", [2, 5])
def test_multi_tower_step_equals_the_full_batch_in_float64(towers):
    full = train_towers(None)
    towered = train_towers(towers)
    assert max_difference(full, towered) < pargrad.rounding_tolerance("float64", 50)
    assert max_difference(full, train_towers(None, steps=0)) > 1e-3  # it did train


def test_average_tower_gradients_averages_and_checks_the_variables():
    graph = tf.Graph()
    with graph.as_default():
        a, b = tf.Variable(1.0), tf.Variable(2.0)
        mean = tf1.average_tower_gradients([[(tf.constant(1.0), a)], [(tf.constant(3.0), a)]])
        with pytest.raises(ValueError, match="same shared variables"):
            tf1.average_tower_gradients([[(tf.constant(1.0), a)], [(tf.constant(3.0), b)]])
        with pytest.raises(ValueError, match="at least one tower"):
            tf1.average_tower_gradients([])
        with v1.Session(graph=graph) as session:
            assert session.run(mean[0][0]) == pytest.approx(2.0)
            assert mean[0][1] is a


def test_multi_tower_step_bad_arguments_raise():
    sgd = v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(RuntimeError, match="tf.Graph"):
        tf1.multi_tower_step(None, sgd, tf.zeros([4, 1]), tf.zeros([4, 1]), ["/cpu:0"])
    graph = tf.Graph()
    with graph.as_default():
        x, y = v1.placeholder(tf.float32, [50, 1]), v1.placeholder(tf.float32, [50, 1])
        loss = lambda xs, ys: tf.reduce_mean(xs - ys)  # noqa: E731
        import keras
        with pytest.raises(TypeError, match="tf.compat.v1.train"):
            tf1.multi_tower_step(loss, keras.optimizers.SGD(0.1), x, y, ["/cpu:0"])
        with pytest.raises(ValueError, match="at least one device"):
            tf1.multi_tower_step(loss, sgd, x, y, [])
        with pytest.raises(ValueError, match="multiple of 3"):
            tf1.multi_tower_step(loss, sgd, x, y, ["/cpu:0"] * 3)
