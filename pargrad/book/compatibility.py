"""Which training APIs work under which tf.distribute strategy, computed by running them.

Taught in the appendix "Compatibility matrix".  Each combination of

* API: Keras ``fit`` or a custom loop (``pargrad.SyncTrainer`` for the
  synchronous strategies, closures on a ``ClusterCoordinator`` for
  ``ParameterServerStrategy``),
* strategy: ``MirroredStrategy`` (one process, 2 logical CPUs),
  ``MultiWorkerMirroredStrategy`` (2 worker processes),
  ``ParameterServerStrategy`` (coordinator, 2 workers, 1 parameter server),
* gradient accumulation over 2 micro-batches or none,

trains the y = x² question's network for a few full-batch steps and is compared with the
same steps on one device.  The four combinations of one strategy run one
after the other in the same process (or cluster); the three strategies run
at the same time.  A combination that does not finish within its time limit
is reported as hanging, its processes are stopped, and the combinations
after it run in a fresh process.
"""

import json
import re
import time

import numpy as np

from pargrad.cluster import LocalCluster

APIS = ("Keras fit", "custom loop")
STRATEGIES = ("MirroredStrategy", "MultiWorkerMirroredStrategy", "ParameterServerStrategy")
ACCUMULATION = (1, 2)
STEPS = 5
LEARNING_RATE = 0.05
POINTS = 48
TOLERANCE = 1e-5
_MARK = "@@combination@@ "

_LAYOUTS = {
    "MirroredStrategy": dict(workers=1, tf_config=False),
    "MultiWorkerMirroredStrategy": dict(workers=2),
    "ParameterServerStrategy": dict(workers=2, parameter_servers=1),
}


def combinations():
    """Every (api, strategy, accumulation steps) the matrix checks, in table order."""
    return [(api, strategy, k) for strategy in STRATEGIES for api in APIS for k in ACCUMULATION]


def compatibility_matrix(time_limit=20, start_limit=60):
    """Run every combination; return one dict a combination.

    Each dict has ``api``, ``strategy``, ``accumulation`` (micro-batches an
    update), ``status`` (``works``, ``differs``, ``fails``, ``hangs``) and
    ``detail`` (how it matched one device, the error, or the time limit).
    Every combination must equal one device within ``TOLERANCE``; under
    ``ParameterServerStrategy`` the custom loop therefore runs one closure
    at a time (overlapping closures would make the result depend on timing).
    ``time_limit`` seconds is the limit of one combination, counted from
    when it starts (after its processes are up); ``start_limit`` the limit
    for starting the processes.

    Taught in the appendix "Compatibility matrix".
    """
    pending = {strategy: [c for c in combinations() if c[1] == strategy] for strategy in STRATEGIES}
    results = {}
    groups = {}
    try:
        while any(pending.values()) or groups:
            for strategy in STRATEGIES:
                if strategy not in groups and pending[strategy]:
                    todo = pending[strategy]
                    cluster = LocalCluster(
                        run_combinations, kwargs={"combinations": [list(c) for c in todo]},
                        timeout=None, **_LAYOUTS[strategy])
                    cluster.start()
                    groups[strategy] = {"cluster": cluster, "seen": 0, "since": time.monotonic(),
                                        "current": None}
            for strategy, group in list(groups.items()):
                finished = _poll(group, pending[strategy], results)
                now = time.monotonic()
                current = group["current"]
                limit = time_limit if current is not None else start_limit
                crashed = _crashed(group["cluster"])
                if finished:
                    group["cluster"].stop()
                    del groups[strategy]
                elif crashed or now - group["since"] > limit:
                    victim = current or pending[strategy][0]
                    if crashed:
                        detail = f"a process ended: {crashed}"
                        results[victim] = ("fails", detail)
                    else:
                        results[victim] = ("hangs", f"time limit {limit} s")
                    pending[strategy].remove(victim)
                    group["cluster"].stop()
                    del groups[strategy]
            time.sleep(0.05)
    finally:
        for group in groups.values():
            group["cluster"].stop()
    return [dict(api=api, strategy=strategy, accumulation=k, status=results[(api, strategy, k)][0],
                 detail=results[(api, strategy, k)][1])
            for api, strategy, k in combinations()]


def _poll(group, pending, results):
    """Read new result lines of a group; True when its combinations are all done."""
    cluster = group["cluster"]
    with cluster._lock:
        lines = [line for role, index, line in cluster.lines
                 if line.startswith(_MARK) and index == 0]
    for line in lines[group["seen"]:]:
        event = json.loads(line[len(_MARK):])
        combination = tuple(event["combination"])
        group["since"] = time.monotonic()
        if event["event"] == "start":
            group["current"] = combination
        else:
            results[combination] = (event["status"], event["detail"])
            if combination in pending:
                pending.remove(combination)
            group["current"] = None
    group["seen"] = len(lines)
    return not pending


def _crashed(cluster):
    for (role, index), process in cluster.processes.items():
        code = process.poll()
        if code not in (None, 0):
            return f"{role} {index}, exit code {code}"
    return None


def format_matrix(rows):
    """The matrix as a Markdown table: strategies down, (API, accumulation) across."""
    columns = [(api, k) for api in APIS for k in ACCUMULATION]
    header = "| strategy | " + " | ".join(
        f"{api}{', accumulate ' + str(k) if k > 1 else ''}" for api, k in columns) + " |"
    lines = [header, "|" + " --- |" * (len(columns) + 1)]
    cells = {(r["api"], r["strategy"], r["accumulation"]): r for r in rows}
    for strategy in STRATEGIES:
        row = [cells[(api, strategy, k)] for api, k in columns]
        lines.append(f"| {strategy} | " + " | ".join(
            f"**{r['status']}**: {r['detail']}".replace("|", "/") for r in row) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Inside the processes
# ----------------------------------------------------------------------------

def run_combinations(combinations):
    """Run the given combinations (all of one strategy) in this process, one after another.

    Prints a start line and a result line for each; the process (or, for the
    cluster strategies, every worker or the coordinator) must run them in the
    same order.  Returns nothing.

    Shown in the chapter "Compatibility matrix".
    """
    # In a child process (a cluster's task): the devices are split before TensorFlow starts.
    import pargrad
    from pargrad.book.parabola import fit_one_device, parabola_data

    strategy_name = combinations[0][1]
    if strategy_name == "MirroredStrategy":
        pargrad.logical_devices(2)
    tf = pargrad._quiet.import_tensorflow_quietly()
    strategy, coordinator = _make_strategy(tf, strategy_name)
    x, y = parabola_data(POINTS)
    _, reference = fit_one_device(x, y, steps=STEPS, learning_rate=LEARNING_RATE)
    for api, _, k in combinations:
        combination = [api, strategy_name, k]
        _emit({"event": "start", "combination": combination})
        try:
            if api == "Keras fit":
                weights = _keras_fit(strategy, x, y, k)
            elif coordinator is None:
                weights = _sync_loop(strategy, x, y, k)
            else:
                weights = _parameter_server_loop(tf, strategy, coordinator, x, y, k)
            status, detail = _compare(weights, reference)
        except Exception as error:  # the finding: report it and carry on
            status, detail = "fails", f"{type(error).__name__}: {short_message(error)}"
        _emit({"event": "result", "combination": combination, "status": status, "detail": detail})


def short_message(error, limit=160):
    """The first sentence of an error's message, without colours, wrappers or addresses."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    text = text.split("Arguments received by")[0]
    text = re.sub(r"PerReplica:\{.*?\}", "PerReplica{...}", text, flags=re.S)
    text = re.sub(r"0x[0-9a-f]+", "0x...", text)
    text = re.sub(r"<class '([^']+)'>", r"\1", text)
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith("Exception encountered when calling")]
    message = " ".join(lines)
    sentence = re.split(r"(?<=[.:])\s", message, maxsplit=1)[0] if message else ""
    return sentence if len(sentence) <= limit else sentence[:limit - 3] + "..."


def _emit(event):
    print(_MARK + json.dumps(event), flush=True)


def _make_strategy(tf, name):
    if name == "MirroredStrategy":
        from pargrad.devices import logical_device_names  # in a child process, as run_combinations

        devices = logical_device_names()[:2]   # logical CPUs, or logical GPUs on a GPU
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice()), None
    if name == "MultiWorkerMirroredStrategy":
        return tf.distribute.MultiWorkerMirroredStrategy(), None
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


def _compare(weights, reference):
    difference = max(float(np.max(np.abs(np.asarray(w) - r))) for w, r in zip(weights, reference))
    if not np.isfinite(difference):
        return "differs", "the weights are not finite"
    if difference <= TOLERANCE:
        return "works", f"equals one device (within {TOLERANCE:g})"
    return "differs", f"differs from one device by {difference:.1e}"


def _keras_fit(strategy, x, y, k):
    """Shown in the chapter "Compatibility matrix"."""
    import keras

    from pargrad.book.parabola import parabola_model  # in a child process, as run_combinations

    with strategy.scope():
        model = parabola_model(seed=0)
        optimizer = keras.optimizers.SGD(LEARNING_RATE, gradient_accumulation_steps=k if k > 1 else None)
        model.compile(optimizer=optimizer, loss="mean_squared_error")
    model.fit(x, y, batch_size=len(x) // k, epochs=STEPS, shuffle=False, verbose=0)
    return model.get_weights()


def _sync_loop(strategy, x, y, k):
    # In a child process, as run_combinations.
    from pargrad.book.parabola import parabola_model
    from pargrad.sync import SyncTrainer

    with strategy.scope():
        model = parabola_model(seed=0)
    trainer = SyncTrainer(model, strategy, learning_rate=LEARNING_RATE, accumulation_steps=k,
                          progress=False)
    trainer.fit(x, y, steps=STEPS)
    return model.get_weights()


def _parameter_server_loop(tf, strategy, coordinator, x, y, k):
    """Shown in the chapter "Compatibility matrix"."""
    # In a child process, as run_combinations.
    from pargrad.book.parabola import initial_weights, parabola_forward, squared_error

    with strategy.scope():
        variables = [tf.Variable(w) for w in initial_weights(0)]
    pieces = list(zip(np.split(x, k), np.split(y, k)))

    @tf.function
    def update():
        total = [tf.zeros_like(v) for v in variables]
        for xs, ys in pieces:                       # k micro-batches, summed on the worker
            with tf.GradientTape() as tape:
                loss = squared_error(ys, parabola_forward(xs, variables))
            total = [t + g / k for t, g in zip(total, tape.gradient(loss, variables))]
        for variable, gradient in zip(variables, total):
            variable.assign_sub(LEARNING_RATE * gradient)

    for _ in range(STEPS):      # one closure at a time: comparable with one device
        coordinator.schedule(update)
        coordinator.join()
    return [v.numpy() for v in variables]
