"""pargrad.book.graph_ops: the ops a TF1 fetch runs, inputs first."""

import pargrad  # noqa: F401  (first: TensorFlow quietly)
import tensorflow as tf
from pargrad.book.graph_ops import ops_run_by


def test_fetching_a_division_of_an_accumulating_op_runs_the_add_again():
    graph = tf.Graph()
    with graph.as_default():
        accumulator = tf.compat.v1.Variable(0.0, use_resource=True, name="accumulator")
        added = accumulator.assign_add(2.0, name="accumulate")
        divided = tf.divide(added, 5.0, name="divided")
    ops = ops_run_by(divided)
    names = [name for name, _ in ops]
    assert names[-1] == "divided"
    assert ("accumulate", "AssignAddVariableOp") in ops
    # Inputs come before the ops that read them, and each op once.
    assert names.index("accumulator") < names.index("accumulate") < names.index("divided")
    assert len(names) == len(set(names))


def test_an_op_with_no_inputs_runs_alone():
    graph = tf.Graph()
    with graph.as_default():
        constant = tf.constant(1.0, name="one")
    assert ops_run_by(constant) == [("one", "Const")]
    assert ops_run_by(constant.op) == [("one", "Const")]
