"""Step time of pargrad.SyncTrainer against Keras fit, a hand-written loop and one bare device.

    .venv/bin/python benchmarks/sync.py [--replicas 2] [--steps 100] [--rounds 8]
                                        [--steps-per-call 100]

One run, one model (a 64-256-256-1 perceptron), one data set, plain SGD,
one ``MirroredStrategy`` over ``--replicas`` logical devices with 256
examples a replica.  Every contender trains on the same global batch:

* the *bare* step: the same model, loss, optimizer and batch on one device,
  no strategy: the floor, what the step costs when nothing is distributed;
* ``SyncTrainer`` with one step a ``tf.function`` call and with
  ``--steps-per-call`` steps a call;
* Keras ``fit`` under the same strategy (``steps_per_execution`` 1, its
  default, and ``--steps-per-call``);
* the hand-written ``strategy.run`` loop of TensorFlow's custom-training
  tutorial (one step a call).

Each runs twice: plain TensorFlow, and with each replica's (or the bare
device's) forward and backward pass compiled by XLA.  Keras ``fit`` has no
XLA run: with ``jit_compile=True`` under ``MirroredStrategy`` it fails
(XLA cannot reach the other replicas' variables), which the script shows.
A ratio compares contenders in the same compile mode and with the same
number of steps a call, unless its line says otherwise.  Contenders are
traced first, then timed in interleaved rounds so that a busy moment of a
shared machine hits all of them; the best round counts (the median and
every round are printed too, and the process's CPU milliseconds a step, all
threads, in its least busy round).

The last line holds the ratios for a script (plain TensorFlow; ``_xla``:
both sides compiled): ``sync_vs_fit`` (Keras fit's step time over
SyncTrainer's fastest setting, target >= 4), ``sync_vs_loop``
(the hand-written loop's over SyncTrainer's, both one step a call),
``sync_vs_bare`` (SyncTrainer's fastest step over the bare step with as
many steps a call, target <= 1.15), and ``sync_vs_fit_limit`` (Keras fit's
step time over the fastest bare step: what ``sync_vs_fit`` would be if
SyncTrainer ran exactly as fast as the bare step; it goes above only where
the replicas beat the bare step, which two replicas on two CPU cores can,
and replicas on GPUs of their own do).  ``fit`` calls, SyncTrainer's and
Keras's, are timed without their fixed cost a call (see
``per_step_of_calls``), which the script prints apart.
"""

import pargrad  # noqa: F401  (first: it imports TensorFlow quietly)

import keras
import numpy as np
import tensorflow as tf

from _common import (EXAMPLES, PER_REPLICA, best_of_rounds, describe_machine,
                     mirrored_perceptron_data, perceptron, replica_parser, result_line, timed,
                     verdict)
from pargrad.book.instruments import InstrumentedSyncTrainer
from pargrad.sync import SyncTrainer

def squared_error_gradients(model, global_batch):
    """The loss and gradients SyncTrainer computes, as a function of a batch."""
    def gradients(features, targets):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(tf.square(targets - model(features, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        return loss, tape.gradient(loss, model.trainable_variables)
    return gradients


def bare_runner(device, x, y, batch, jit_compile, steps_per_call):
    """One device, no strategy: take the next batch, gradients, update; as SyncTrainer does."""
    with tf.device(device):
        model = perceptron()
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        x, y = tf.constant(x), tf.constant(y)
    gradients = squared_error_gradients(model, batch)
    if jit_compile:
        gradients = tf.function(gradients, jit_compile=True, autograph=False)

    def steps(position, n):
        def body(i, _):
            rows = (position + i * batch + tf.range(batch)) % EXAMPLES
            loss, grads = gradients(tf.gather(x, rows), tf.gather(y, rows))
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return i + 1, loss
        with tf.device(device):
            return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), tf.constant(0.0)))[1]

    steps = tf.function(steps, autograph=False)
    position = [0]

    def run(count):
        for _ in range(count // steps_per_call):
            steps(tf.constant(position[0]), tf.constant(steps_per_call)).numpy()
            position[0] = (position[0] + steps_per_call * batch) % EXAMPLES
    run(2 * steps_per_call)
    return lambda count: timed(run, count)


def sync_trainer_runner(strategy, x, y, batch, jit_compile, steps_per_call=1, record_times=None):
    with strategy.scope():
        model = perceptron()
    if record_times:    # the book's instrumented trainer, with per-replica timestamps
        trainer = InstrumentedSyncTrainer(model, strategy, learning_rate=0.01, record_times=True,
                                          progress=False, jit_compile=jit_compile)
    else:
        trainer = SyncTrainer(model, strategy, learning_rate=0.01, progress=False,
                              jit_compile=jit_compile)
    trainer.fit(x, y, steps=2 * steps_per_call, batch_size=batch, steps_per_call=steps_per_call)
    return per_step_of_calls(lambda steps: trainer.fit(x, y, steps=steps, batch_size=batch,
                                                             steps_per_call=steps_per_call))


def keras_fit_runner(strategy, x, y, batch, steps_per_execution=1, jit_compile=False):
    with strategy.scope():
        model = perceptron()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mean_squared_error",
                      steps_per_execution=steps_per_execution, jit_compile=jit_compile)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    model.fit(dataset, steps_per_epoch=2 * steps_per_execution, epochs=1, verbose=0, shuffle=False)
    return per_step_of_calls(
        lambda steps: model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False))


def per_step_of_calls(fit):
    """``run(steps)`` for a ``fit(steps)`` that also has a fixed cost a call.

    Keras ``fit`` sets up its epoch (a distributed iterator, callbacks) on
    every call, about half a second here; a user pays it once an epoch, not
    once a step.  So a ``fit`` is timed for ``steps`` and for ``2 * steps``
    steps, and the difference is the time of ``steps`` steps; the rest is
    the call's fixed cost.  ``SyncTrainer.fit`` is timed the same way.
    The best of several rounds is the best ``2 * steps`` call minus the
    best ``steps`` call (``best_calls``), not the smallest difference, which
    noise would pull down.
    """
    once, twice = [], []

    def run(steps):
        once.append(timed(fit, steps))
        twice.append(timed(fit, 2 * steps))
        return twice[-1] - once[-1]

    def best_calls(steps):
        """Seconds a step and the fixed seconds a call, from the best calls."""
        return (min(twice) - min(once)) / steps, 2 * min(once) - min(twice)
    run.best_calls = best_calls
    return run


def hand_written_runner(strategy, x, y, batch, jit_compile):
    """The loop of TensorFlow's custom-training tutorial; with XLA, the replica's
    forward and backward pass compiled as SyncTrainer compiles them."""
    with strategy.scope():
        model = perceptron()
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    gradients = squared_error_gradients(model, batch)
    if jit_compile:
        gradients = tf.function(gradients, jit_compile=True, autograph=False)

    def replica_step(features, targets):
        loss, grads = gradients(features, targets)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def run(steps):
        losses = [train_step(iterator) for _ in range(steps)]
        losses[-1].numpy()
    run(2)
    return lambda steps: timed(run, steps)


def keras_fit_with_xla_fails(strategy, x, y, batch):
    """What Keras fit(jit_compile=True) does under MirroredStrategy: its message, or None."""
    try:
        keras_fit_runner(strategy, x[:4 * batch], y[:4 * batch], batch, jit_compile=True)
    except Exception as error:  # noqa: BLE001 - shown, not handled
        return f"{type(error).__name__}: " + next(
            (line.strip().split(" (defined")[0] + " ..." for line in str(error).splitlines()
             if "Trying to access" in line), str(error).splitlines()[0][:200])
    return None


def main():
    parser = replica_parser(__doc__, rounds=8)
    parser.add_argument("--steps-per-call", type=int, default=100)
    args = parser.parse_args()
    k = args.steps_per_call
    if args.steps % k:
        parser.error(f"--steps ({args.steps}) must be a multiple of --steps-per-call ({k})")

    devices, strategy, x, y, batch = mirrored_perceptron_data(args.replicas)
    print(f"MirroredStrategy over {strategy.extended.worker_devices}, all-reduce "
          f"{type(strategy.extended._cross_device_ops).__name__}; bare step on {devices[0]}; "
          f"global batch {batch} ({PER_REPLICA} a replica), {args.steps} steps a round, "
          f"best of {args.rounds} rounds")

    runners = {}
    for jit in (False, True):
        mode = "XLA" if jit else "plain"
        runners[mode, "bare, 1 step a call"] = bare_runner(devices[0], x, y, batch, jit, 1)
        runners[mode, f"bare, {k} steps a call"] = bare_runner(devices[0], x, y, batch, jit, k)
        runners[mode, "SyncTrainer, 1 step a call"] = sync_trainer_runner(strategy, x, y, batch, jit)
        runners[mode, f"SyncTrainer, {k} steps a call"] = sync_trainer_runner(
            strategy, x, y, batch, jit, k)
        runners[mode, "hand-written strategy.run loop"] = hand_written_runner(
            strategy, x, y, batch, jit)
    runners["plain", "SyncTrainer, 1 step a call, record_times"] = sync_trainer_runner(
        strategy, x, y, batch, False, record_times=True)
    runners["plain", "Keras fit"] = keras_fit_runner(strategy, x, y, batch)
    runners["plain", f"Keras fit, steps_per_execution={k}"] = keras_fit_runner(strategy, x, y, batch, k)
    xla_fit = keras_fit_with_xla_fails(strategy, x, y, batch)

    best, every, cpu = best_of_rounds(runners, args.rounds, args.steps)
    fixed = {}
    for name, run in runners.items():
        if hasattr(run, "best_calls"):
            best[name], fixed[name] = run.best_calls(args.steps)
            cpu[name] = float("nan")  # its CPU time covers two calls and their fixed costs
    print("  mode  contender                                  best ms/step  median  CPU ms/step"
          "   all rounds")
    for (mode, name), seconds in best.items():
        rounds = " ".join(f"{1e3 * s:.2f}" for s in every[mode, name])
        print(f"  {mode:5s} {name:42s} {1e3 * seconds:8.3f} {1e3 * np.median(every[mode, name]):9.3f}"
              f" {1e3 * cpu[mode, name]:10.3f}     {rounds}")
    print("  (SyncTrainer and Keras fit rows: the best 2n-step fit call minus the best n-step "
          "call, so a call's fixed cost is left out; the rounds show each round's difference)")
    for (mode, name), seconds in fixed.items():
        print(f"  {mode:5s} {name:42s} fixed cost a fit call: {1e3 * seconds:8.1f} ms")
    if xla_fit:
        print(f"  XLA   Keras fit(jit_compile=True): fails under MirroredStrategy: {xla_fit}")

    ratios = {}
    print("\nRatios (times; like with like unless said):")
    for mode in ("plain", "XLA"):
        t = {name: best[m, name] for m, name in best if m == mode}
        sync_1, sync_k = t["SyncTrainer, 1 step a call"], t[f"SyncTrainer, {k} steps a call"]
        fastest = min(sync_1, sync_k)
        setting = "1 step" if sync_1 <= sync_k else f"{k} steps"
        bare = t["bare, 1 step a call"] if sync_1 <= sync_k else t[f"bare, {k} steps a call"]
        suffix = "" if mode == "plain" else "_xla"
        ratios["sync_vs_loop" + suffix] = t["hand-written strategy.run loop"] / sync_1
        ratios["sync_vs_bare" + suffix] = fastest / bare
        print(f"  {mode}: SyncTrainer's fastest setting is {setting} a call ({1e3 * fastest:.3f} ms)")
        print(f"    sync_vs_bare{suffix}: SyncTrainer / bare step, {setting} a call = "
              f"{ratios['sync_vs_bare' + suffix]:.3f}x ({verdict(ratios['sync_vs_bare' + suffix], 1.15, False)}); "
              f"1 step a call: {sync_1 / t['bare, 1 step a call']:.3f}x, {k} steps a call: "
              f"{sync_k / t[f'bare, {k} steps a call']:.3f}x")
        print(f"    sync_vs_loop{suffix}: hand-written loop / SyncTrainer, both 1 step a call = "
              f"{ratios['sync_vs_loop' + suffix]:.2f}x; the loop / SyncTrainer's fastest = "
              f"{t['hand-written strategy.run loop'] / fastest:.2f}x")
        if mode == "plain":
            ratios["sync_vs_fit"] = t["Keras fit"] / fastest
            ratios["sync_vs_fit_limit"] = t["Keras fit"] / min(t["bare, 1 step a call"],
                                                                t[f"bare, {k} steps a call"])
            print(f"    sync_vs_fit_limit: Keras fit / the fastest bare step = "
                  f"{ratios['sync_vs_fit_limit']:.2f}x: sync_vs_fit if SyncTrainer were exactly "
                  "as fast as the bare step")
            print(f"    sync_vs_fit: Keras fit (its default, 1 step a call) / SyncTrainer's fastest = "
                  f"{ratios['sync_vs_fit']:.2f}x ({verdict(ratios['sync_vs_fit'], 4)}); "
                  f"both 1 step a call: {t['Keras fit'] / sync_1:.2f}x; both {k} steps a call: "
                  f"{t[f'Keras fit, steps_per_execution={k}'] / sync_k:.2f}x")
            if ratios["sync_vs_fit"] > ratios["sync_vs_fit_limit"]:
                print("    sync_vs_fit is above sync_vs_fit_limit: SyncTrainer beat the bare step "
                      "(two replicas can keep two cores busy where one bare step may not; a busy "
                      "round that slowed the bare step does the same: compare the rounds above)")
            print(f"    per-replica timestamps (record_times=True) cost "
                  f"{t['SyncTrainer, 1 step a call, record_times'] / sync_1:.2f}x the step")
    xla_over_plain = min(best["XLA", "SyncTrainer, 1 step a call"],
                         best["XLA", f"SyncTrainer, {k} steps a call"]) / min(
        best["plain", "SyncTrainer, 1 step a call"], best["plain", f"SyncTrainer, {k} steps a call"])
    print(f"  SyncTrainer with XLA / without (each its fastest) = {xla_over_plain:.2f}x the time; "
          f"bare step with XLA / without ({k} steps a call) = "
          f"{best['XLA', f'bare, {k} steps a call'] / best['plain', f'bare, {k} steps a call']:.2f}x")
    print(describe_machine(devices).split("; ")[3])
    print(result_line(**ratios))


if __name__ == "__main__":
    main()
