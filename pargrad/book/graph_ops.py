"""What a TF1 graph runs: the ops behind one ``Session.run`` fetch.

Taught in the chapter "Accumulating gradients in TF1 graphs", which uses
:func:`ops_run_by` to show why fetching ``accum_op / 5`` adds the gradient
again.  A tool for showing, not for training: it lives in the book's layer.
"""


def ops_run_by(fetch):
    """The ops a ``Session.run(fetch)`` executes, inputs first, as ``(name, type)`` pairs.

    Follows data inputs and control inputs back from ``fetch`` (a tensor,
    operation or variable of a graph).  The chapter "Accumulating gradients in
    TF1 graphs" uses it to show that fetching ``accum_op / 5`` runs the
    ``AssignAddVariableOp`` again.
    """
    start = fetch.op if hasattr(fetch, "op") else fetch
    order, seen = [], set()
    stack = [(start, False)]
    while stack:
        op, inputs_done = stack.pop()
        if inputs_done:
            order.append((op.name, op.type))
            continue
        if op in seen:
            continue
        seen.add(op)
        stack.append((op, True))
        parents = [tensor.op for tensor in op.inputs] + list(op.control_inputs)
        for parent in reversed(parents):
            if parent not in seen:
                stack.append((parent, False))
    return order
