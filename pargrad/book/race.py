"""Synchronous against asynchronous training in the same time, on the digits.

Taught in the chapter "Sync vs async in the same time".  :func:`race` trains
the digits MLP (:mod:`pargrad.book.digits`) with :class:`pargrad.book.instruments.InstrumentedSyncTrainer`
or :class:`pargrad.asynchronous.AsyncTrainer` on four devices for a fixed
time, keeps a copy of the parameters at checkpoints along the way, and
evaluates every copy on the test set afterwards (so evaluating never slows
the run down).  :func:`time_to_target_table` turns several seeds of several
races into DAWNBench's measure: the time to reach a test accuracy.

Two clocks:

* ``mode="scheduled"``: the *virtual clock*.  Device ``d`` needs
  ``(1 + delay) / speed[d]`` time units for one step on its batch
  (:meth:`pargrad.scenario.Scenario.step_time`, the delay drawn by
  :func:`pargrad.scenario.random_delay`).  An asynchronous
  worker applies its update when its step ends; a synchronous step lasts as
  long as the slowest replica, or, with ``b`` backup workers, as long as the
  ``(N - b)``-th fastest (:func:`pargrad.book.instruments.sync_step_times`).  Every
  gradient and update is really computed by the trainers; only the durations
  come from the model.  Communication is free on this clock, for both.
  Seeded, so a run repeats exactly.
* ``mode="free-running"``: the wall clock.  Real threads (async) or a real
  ``MirroredStrategy`` step (sync) run, and each device's step is stretched
  to ``step_seconds`` times the same ``(1 + delay) / speed``, the host thread
  waiting meanwhile as it would for an accelerator: an emulated device,
  because four logical devices on two CPU cores cannot really compute side
  by side.  The measured time includes everything the
  virtual clock leaves out (Python, the lock, launching the step, the
  all-reduce), and it depends on the machine and its load.  One clock for
  every contender: a checkpoint's time is the elapsed ``time.perf_counter()``
  since the timed run began, taken around the whole run (the trainer's
  bookkeeping, the copies of the parameters at checkpoints, everything).
"""

import math
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly
from pargrad.asynchronous import MODES, AsyncTrainer
from pargrad.book import experiments, tuning
from pargrad.book.digits import (cross_entropy, cross_entropy_per_example, digits_data,
                                 digits_model, time_to_target)
from pargrad.book.experiments import Method
from pargrad.book.instruments import InstrumentedSyncTrainer, sync_step_times
from pargrad.checks import check_choice, check_positive
from pargrad.devices import logical_device_names
from pargrad.scenario import Scenario, check_scenario
from pargrad.strategies import sync_strategy

tf = import_tensorflow_quietly()

SCENARIOS = {
    "equal devices": Scenario((1.0, 1.0, 1.0, 1.0)),
    "one device 3x slower": Scenario((1.0, 1.0, 1.0, 1.0 / 3.0)),
    "heavy-tailed delays": Scenario((1.0, 1.0, 1.0, 1.0), jitter=0.5, delay_distribution="pareto"),
}

# Each method's options.  Learning rates: defaults, the best of 0.1, 0.2, 0.4,
# 0.8 on equal devices (two seeds) when the chapter was first written; the
# chapter's races replace them by each method's best rate in each scenario
# (benchmarks/sync_vs_async.py --clock virtual).  A synchronous step
# averages 4 x 32 examples, an asynchronous update 32: sync's best rate is 4
# times async's, the linear scaling rule (Goyal et al. 2017).  The
# staleness-aware rate is divided by staleness + 1 (about 4 here).
METHODS = {
    "sync": dict(kind="sync", learning_rate=0.8),
    "sync, 1 backup": dict(kind="sync", learning_rate=0.8, backup_workers=1),
    "async": dict(kind="async", learning_rate=0.2),
    "async, staleness-aware": dict(kind="async", learning_rate=0.8, staleness_aware=True),
    "async, bound 2": dict(kind="async", learning_rate=0.2, staleness_bound=2),
}

# The zero-staleness control: one worker applying the same updates (batch 32,
# async's learning rate) one after the other, on one device as fast as all the
# scenario's devices together, so it makes as many updates per time unit as the
# asynchronous workers do, none of them stale.
CONTROLS = {
    "sequential, no staleness": dict(kind="sequential", learning_rate=0.2),
}

BATCH_SIZE = 32  # examples per device and step
WARM_UP_STEPS = 3  # untimed steps before a free-running race's clock starts, sync and async alike
# The test accuracies of the time-to-target tables: two targets below the
# plateau (about 96 %) that every method reaches, where time-to-target is not
# decided by the plateau's wobbles.  TARGET is the higher one.
TARGETS = (0.90, 0.93)
TARGET = TARGETS[-1]


def replica_times(steps, scenario, seed):
    """``(steps, devices)`` virtual durations of each synchronous replica's step, for race ``seed``.

    :meth:`pargrad.scenario.Scenario.step_times` on the race's own stream
    of ``seed`` (``[seed, 2]``): ``(1 + delay) / speed``, as
    :class:`AsyncTrainer`'s virtual clock draws them.  Taught in the chapter
    "Sync vs async in the same time".
    """
    return scenario.step_times(steps, np.random.default_rng([seed, 2]))


def evaluate(snapshots, x_test, y_test, hidden=64):
    """Test accuracy and test loss of each parameter snapshot of the digits MLP."""
    model = digits_model(hidden=hidden)
    accuracies, losses = [], []
    for weights in snapshots:
        model.set_weights(weights)
        logits = model(x_test)
        accuracies.append(float(np.mean(np.argmax(logits, axis=1) == y_test)))
        losses.append(float(cross_entropy(y_test, logits)))
    return np.array(accuracies), np.array(losses)


def race(method, scenario, seed=0, budget=150.0, every=5.0, mode="scheduled",
         step_seconds=0.02, devices=None, data=None, hidden=64, **overrides):
    """Train the digits MLP with ``method`` under ``scenario`` for ``budget`` time.

    ``method`` and ``scenario`` are keys of :data:`METHODS` (or
    :data:`CONTROLS`) and :data:`SCENARIOS` (or a dict of options and a
    :class:`Scenario`);
    ``overrides`` replace a method's options (``learning_rate=...``).
    ``budget`` and ``every`` are virtual time units when scheduled, seconds
    when free-running.  ``seed`` fixes the initial weights, the batches and
    the delays; the train/test split is fixed (``digits_data(seed=0)``).

    Returns a dict: ``time`` of each checkpoint (the first is the start, then
    the first update at or after each multiple of ``every``), ``updates``
    applied by then, ``examples`` of gradient computed into them, test
    ``accuracy`` and test ``loss`` there, and ``method``, ``scenario``,
    ``seed``, ``mode``.  Taught in the chapter "Sync vs async in the same time".
    """
    options = dict({**METHODS, **CONTROLS}[method] if isinstance(method, str) else method,
                   **overrides)
    conditions = SCENARIOS[scenario] if isinstance(scenario, str) else check_scenario(scenario)
    check_choice("mode", mode, MODES)
    budget, every = check_positive("budget", budget), check_positive("every", every)
    x_train, y_train, x_test, y_test = data or digits_data(seed=0)
    if devices is None:
        devices = logical_device_names()   # logical CPUs, or logical GPUs on a GPU
    workers = len(conditions.speeds)
    if len(devices) < workers:
        raise ValueError(f"The scenario has {workers} devices but only {len(devices)} are given; "
                         f"call pargrad.logical_devices({workers}) first.")
    kind = options.pop("kind")
    if kind == "sequential":  # one device as fast as all of them: no staleness, same pace
        conditions = Scenario((float(sum(conditions.speeds)),), conditions.jitter,
                              conditions.delay_distribution)
        workers = 1
    run = _race_sync if kind == "sync" else _race_async
    checkpoints = run(options, conditions, seed, budget, every, mode, step_seconds,
                      devices[:workers], (x_train, y_train), hidden)
    times, updates, examples, snapshots = (list(column) for column in zip(*checkpoints))
    accuracy, loss = evaluate(snapshots, x_test, y_test, hidden)
    return {"method": method if isinstance(method, str) else kind, "scenario": scenario
            if isinstance(scenario, str) else "custom", "seed": seed, "mode": mode,
            "time": np.array(times), "updates": np.array(updates),
            "examples": np.array(examples), "accuracy": accuracy, "loss": loss}


def _race_async(options, scenario, seed, budget, every, mode, step_seconds, devices, data,
                hidden):
    x, y = data
    key = ("async", tuple(devices), hidden, tuple(sorted(options.items())))
    if key not in _TRAINERS:  # one trainer per configuration: its functions compile once
        # A run that diverges is a result of the race (its accuracy drops), not an error.
        _TRAINERS[key] = AsyncTrainer(digits_model(hidden=hidden), cross_entropy, devices,
                                      progress=False, stop_on_non_finite=False, **options)
    trainer = _TRAINERS[key]
    trainer.set_weights(digits_model(hidden=hidden, seed=seed).get_weights())
    checkpoints = [(0.0, 0, 0, trainer.get_weights())]
    next_checkpoint, applied = [every], [0]

    def keep(record):  # called under the trainer's lock, after each update
        applied[0] += 1
        # With threads, a record's time is taken just before the lock, so two
        # updates can be stamped out of order: checkpoint times never go back.
        now = max(record["time"], checkpoints[-1][0])
        if now >= next_checkpoint[0]:
            checkpoints.append((now, applied[0], applied[0] * BATCH_SIZE,
                                [p.numpy() for p in trainer.parameters]))
            next_checkpoint[0] = (math.floor(now / every) + 1) * every

    common = dict(batch_size=BATCH_SIZE, scenario=scenario, seed=seed, on_update=keep)
    clock = [None]  # free-running: the start of the one clock of the timed run
    if mode == "free-running":
        def keep(record, keep_on_virtual_clock=keep):  # the same checkpoints, on the one clock
            keep_on_virtual_clock({**record, "time": time.perf_counter() - clock[0]})
        common["on_update"] = keep
    if mode == "scheduled":
        trainer.fit(x, y, steps=10**9, virtual_time_limit=budget, **common)
    else:
        # Warm-up, untimed, exactly like the synchronous trainer's: a few steps on
        # the same arrays (so nothing traces again), then the weights are reset.
        trainer.fit(x, y, steps=WARM_UP_STEPS * len(devices), batch_size=BATCH_SIZE)
        trainer.set_weights(checkpoints[0][3])
        clock[0] = time.perf_counter()
        trainer.fit(x, y, steps=10**9, mode="free-running", time_limit=budget,
                    step_seconds=step_seconds, **common)
        elapsed = time.perf_counter() - clock[0]  # the whole run, bookkeeping included
    if applied[0] > checkpoints[-1][1]:  # the updates after the last checkpoint
        last = (elapsed if mode == "free-running" else float(np.max(trainer.history.time)))
        checkpoints.append((max(last, checkpoints[-1][0]), applied[0], applied[0] * BATCH_SIZE,
                            trainer.get_weights()))
    return checkpoints


_STRATEGIES = {}
_TRAINERS = {}


def _race_sync(options, scenario, seed, budget, every, mode, step_seconds, devices, data, hidden):
    replicas = len(devices)
    if replicas not in _STRATEGIES:  # one strategy per size, reused by every race
        _STRATEGIES[replicas] = sync_strategy(replicas)
    strategy = _STRATEGIES[replicas]
    free = mode == "free-running"
    key = ("sync", replicas, hidden, free and step_seconds, tuple(sorted(options.items())))
    if key not in _TRAINERS:  # one trainer per configuration: its step compiles once
        with strategy.scope():
            model = digits_model(hidden=hidden)
        _TRAINERS[key] = InstrumentedSyncTrainer(
            model, strategy, loss=cross_entropy_per_example, progress=False,
            step_seconds=step_seconds if free else None, **options)
    trainer = _TRAINERS[key]
    model = trainer.model
    model.set_weights(digits_model(hidden=hidden, seed=seed).get_weights())
    # The batches: the training set shuffled by the seed, then taken in order.
    order = np.random.default_rng([seed, 3]).permutation(len(data[0]))
    x, y = data[0][order], data[1][order]
    batch = BATCH_SIZE * replicas
    backup = options.get("backup_workers", 0)
    checkpoints = [(0.0, 0, 0, model.get_weights())]
    if free:
        # Warm-up, untimed: the same arrays and calls as the timed run, so the
        # step is traced and compiled before the clock starts (a warm-up on a
        # slice of the data would trace again, on the clock, at the first step).
        trainer.fit(x, y, steps=WARM_UP_STEPS, batch_size=batch,
                    replica_times=np.ones((WARM_UP_STEPS, replicas)))
        model.set_weights(checkpoints[0][3])
    times = replica_times(int(budget * (10 if not free else 10 / step_seconds)) + 10, scenario,
                          seed)
    used = batch - backup * BATCH_SIZE  # examples whose gradients count in a step
    clock, steps = 0.0, 0
    if not free:
        ends = np.cumsum(sync_step_times(times, backup))
        total = int(np.searchsorted(ends, budget, side="right"))  # steps that end in time
        while steps < total:
            target = (math.floor(clock / every) + 1) * every
            stop = min(total, max(steps + 1, int(np.searchsorted(ends, target, side="left")) + 1))
            trainer.fit(x, y, steps=stop - steps, batch_size=batch, replica_times=times[steps:stop])
            steps, clock = stop, float(ends[stop - 1])
            checkpoints.append((clock, steps, steps * used, model.get_weights()))
        return checkpoints
    per_chunk = max(1, int(round(every / step_seconds)))
    started = time.perf_counter()  # the one clock: elapsed time around the whole run
    while clock < budget and steps < len(times):
        n = min(per_chunk, len(times) - steps)
        trainer.fit(x, y, steps=n, batch_size=batch, replica_times=times[steps:steps + n])
        steps, clock = steps + n, time.perf_counter() - started
        checkpoints.append((clock, steps, steps * used, model.get_weights()))
    return checkpoints


def digits_time_to_target(result, target=TARGET):
    """The first checkpoint time at which a :func:`race` result reached ``target``, or ``inf``."""
    return time_to_target(result["time"], result["accuracy"], target)


def time_to_target_table(results, target=TARGET):
    """DAWNBench's measure for every (scenario, method): time to reach ``target`` test accuracy.

    ``results`` is a list of :func:`race` results (several seeds each).
    Returns a list of dicts, in the order first seen: ``scenario``,
    ``method``, ``times`` (one a seed, ``inf`` if never reached), their
    ``median``, ``low`` and ``high``, ``reached`` (seeds that got there) and
    ``seeds``.  Taught in the chapter "Sync vs async in the same time".
    """
    rows = {}
    for result in results:
        key = (result["scenario"], result["method"])
        rows.setdefault(key, []).append(
            time_to_target(result["time"], result["accuracy"], target))
    table = []
    for (scenario, method), times in rows.items():
        times = np.array(times)
        table.append({"scenario": scenario, "method": method, "times": times,
                      "median": float(np.median(times)), "low": float(times.min()),
                      "high": float(times.max()), "reached": int(np.isfinite(times).sum()),
                      "seeds": len(times)})
    return table


def times_by_seed(results, scenario, method, target=TARGET):
    """Time to ``target`` of one (scenario, method) in ``results``, one entry a seed, by seed.

    Returns ``(seeds, times)``; ``inf`` where a seed never got there.
    """
    runs = sorted((r for r in results if r["scenario"] == scenario and r["method"] == method),
                  key=lambda r: r["seed"])
    if not runs:
        raise ValueError(f"no results for scenario {scenario!r} and method {method!r}.")
    return (np.array([r["seed"] for r in runs]),
            np.array([time_to_target(r["time"], r["accuracy"], target) for r in runs]))


def paired_verdict(results, scenario, first, second, target=TARGET, resolution=0.0,
                   min_seeds=None, held_out=None):
    """Which of two methods reached ``target`` first, seed by seed, under the book's rule.

    Seeds pair the runs (the same seed gives both methods the same initial
    weights, batches and delays); times closer than ``resolution`` (the
    checkpoint interval of a wall-clock race) count as ties.  Returns
    :func:`pargrad.book.experiments.compare`'s :class:`Verdict` (at least
    ``min_seeds`` seeds, default the rule's
    :data:`~pargrad.book.experiments.MIN_SEEDS`); with ``held_out`` (the
    races of a held-out seed set, tuned on its own seeds), the
    :class:`~pargrad.book.experiments.Replicated` verdict of both sets
    pooled, which needs that many seeds together.  Taught in the chapter
    "Sync vs async in the same time".
    """
    if held_out is not None:
        return experiments.replicated(
            *(paired_verdict(runs, scenario, first, second, target, resolution, min_seeds=1)
              for runs in (results, held_out)),
            min_seeds=experiments.MIN_SEEDS if min_seeds is None else min_seeds)
    seeds_a, a = times_by_seed(results, scenario, first, target)
    seeds_b, b = times_by_seed(results, scenario, second, target)
    if not np.array_equal(seeds_a, seeds_b):
        raise ValueError(f"{first} and {second} were run on different seeds in {scenario!r}; "
                         "a paired comparison needs the same seeds.")
    both = np.isfinite(a) & np.isfinite(b)
    close = both & (np.abs(np.where(both, a, 0.0) - np.where(both, b, 0.0)) <= resolution)
    b = np.where(close, a, b)
    return experiments.compare(a, b, first, second,
                               min_seeds=experiments.MIN_SEEDS if min_seeds is None else min_seeds)


def _experiment(results, scenario, methods, target):
    """The times to ``target`` of ``methods`` in ``scenario`` as an :class:`Experiment`."""
    scores = {}
    for method in methods:
        seeds, scores[method] = times_by_seed(results, scenario, method, target)
    return experiments.Experiment(seeds, scores, {m: None for m in scores}, {})


def race_results_table(results, reference, methods, target=TARGET, held_out=None):
    """One results table: per scenario and method, the time to ``target`` against ``reference``.

    ``methods`` maps each scenario to the methods compared with the
    scenario's ``reference`` run.  Per row: the median time, the median
    per-seed ratio to the reference (over the seeds where they differ), the
    seeds on which the method was faster, and the verdict of
    :data:`pargrad.book.experiments.RULE` (each method at the rate stored
    with ``results``), as :func:`pargrad.book.experiments.results_table`
    makes them.  With ``held_out`` (races on other seeds, tuned on their
    own), every column pools both seed sets, as the verdict does.  Returns a
    :class:`pargrad.book.experiments.ResultsTable` with a scenario column.
    Shown in the chapter "Sync vs async in the same time".
    """
    rows = []
    for scenario, names in methods.items():
        runs = [_experiment(r, scenario, [reference, *names], target)
                for r in ([results] if held_out is None else [results, held_out])]
        result = runs[0] if held_out is None else experiments.Replication(*runs)
        table = experiments.results_table(result, reference, [reference, *names])
        rows.extend((scenario, *row) for row in table.rows)
    columns = ("scenario", *table.columns[:1], f"median time to {target:.0%}", *table.columns[2:])
    return experiments.ResultsTable(columns, tuple(rows))


# The claims the chapter makes about the measured (wall-clock) race: with a
# device three times slower, plain synchronous training waits three times as
# long every step, while asynchronous training and a backup worker do not.
WALL_CLOCK_CLAIMS = (("one device 3x slower", "async", "sync"),
                     ("one device 3x slower", "sync, 1 backup", "sync"))


def wall_clock_claims(results, target, resolution):
    """The verdict on each of :data:`WALL_CLOCK_CLAIMS` in a wall-clock race: ``{claim: Verdict}``.

    A claim "A reaches the target before B" holds when the verdict of
    :func:`paired_verdict` over all the seeds of ``results`` (times within
    ``resolution`` tie) is "A ahead".  With 6 seeds the signed-rank test
    needs all 6: p = 2/64.  Checked in the chapter "The race in depth" on
    the stored sweep, and by ``tools/measure_race_sweep.py``'s file.
    """
    claims = {}
    for scenario, first, second in WALL_CLOCK_CLAIMS:
        seeds = len(times_by_seed(results, scenario, first, target)[0])
        claims[f"{scenario}: {first} reaches {target:.0%} before {second}"] = paired_verdict(
            results, scenario, first, second, target, resolution, min_seeds=seeds)
    return claims


def wall_clock_rates(settings):
    """The learning rates a stored wall-clock sweep ran at: ``{scenario: {method: rate}}``.

    ``settings`` is the ``"settings"`` of :func:`stored_sweep` ``("sync_vs_async")``.
    A sweep measured before the rates were tuned per scenario stored one rate
    a method (in ``"methods"``), used in every scenario.  Shown in the chapter
    "Sync vs async in the same time".
    """
    if "learning_rates" in settings:
        return settings["learning_rates"]
    return {scenario: {method: options["learning_rate"]
                       for method, options in settings["methods"].items()}
            for scenario in settings["scenarios"]}


def format_table(table, unit="", digits=0):
    """The time-to-target table as aligned text, one line a (scenario, method)."""
    lines = [f"{'scenario':22s} {'method':24s} {'median':>8s} {'min':>8s} {'max':>8s}  reached"]
    show = lambda t: f"{t:8.{digits}f}" if np.isfinite(t) else f"{'never':>8s}"  # noqa: E731
    for row in table:
        lines.append(f"{row['scenario']:22s} {row['method']:24s} {show(row['median'])} "
                     f"{show(row['low'])} {show(row['high'])}  {row['reached']}/{row['seeds']}")
    if unit:
        lines.append(f"(times in {unit})")
    return "\n".join(lines)


def stored_sweep(name):
    """A sweep stored with the package by ``benchmarks/sync_vs_async.py``, as a dict.

    ``name`` is ``"sync_vs_async"`` (the wall-clock sweep),
    ``"sync_vs_async_virtual"`` (the virtual-clock sweep) or
    ``"sync_vs_async_virtual_held_out"`` (the same on held-out seeds, tuned
    on their own).  They ship inside
    ``pargrad`` so that the chapter runs on Colab with nothing but the package.
    """
    import importlib.resources
    import json

    check_choice("name", name, ("sync_vs_async", "sync_vs_async_virtual",
                                 "sync_vs_async_virtual_held_out"))
    return json.loads(importlib.resources.files("pargrad.book").joinpath(
        "data", f"{name}.json").read_text())


def stored_results(stored):
    """The races of a :func:`stored_sweep`, their curves as float arrays: what the verdicts take.

    Taught in the chapter "Sync vs async in the same time".
    """
    curves = ("time", "accuracy", "loss")
    return [{**r, **{k: np.array(r[k], float) for k in curves if k in r}}
            for r in stored["results"]]


def _lookup(runs, what):
    """``{(rate, seed): value}`` as a function of (rate, seed) that finds a rate within 1e-5."""
    rates = np.array(sorted({rate for rate, _ in runs}))

    def find(rate, seed):
        near = rates[np.isclose(rates, rate, rtol=1e-5, atol=0)] if len(rates) else rates
        if not len(near) or (float(near[0]), int(seed)) not in runs:
            raise ValueError(f"the file holds no {what} at rate {rate:.6g} and seed {int(seed)}; "
                             "measure it with benchmarks/sync_vs_async.py --clock virtual "
                             "--extend (--density 2 for the midpoints of the density check).")
        return runs[float(near[0]), int(seed)]
    return find


def stored_sweep_method(stored, scenario, method, target=None):
    """One (scenario, method) of a :func:`stored_sweep`'s rate sweep as a harness method.

    An :class:`pargrad.book.experiments.Method` over the stored grid of rates
    (``step=None``: the file has no other rates, but the midpoints of the
    density check, when they were measured) whose run reads each tuning
    seed's time to ``target`` (default: the one the sweep was scored by)
    from the file (``inf`` where it never got there) instead of training,
    so that the book's rule (:func:`pargrad.book.experiments.sweep`) can be
    applied to the file again.  Medians within one checkpoint interval tie
    (``resolution``): a time to a target is known to no finer.  Shown in the
    chapter "The race in depth".
    """
    settings = stored["settings"]
    targets = settings["targets"]
    target = settings["sweep_target"] if target is None else target
    if target not in targets:
        raise ValueError(f"target must be one of the file's targets {targets}, got {target!r}.")
    column = targets.index(target)
    pick = lambda r: (r["scenario"], r["method"]) == (scenario, method)  # noqa: E731
    grid = sorted({r["learning_rate"] for r in stored["sweep"] if pick(r)})
    if not grid:
        raise ValueError(f"the file holds no sweep of {method!r} in {scenario!r}; pass one of "
                         f"{sorted({(r['scenario'], r['method']) for r in stored['sweep']})}.")
    find = _lookup({(r["learning_rate"], r["seed"]): r["time_to_target"][column]
                    for r in stored["sweep"] + stored.get("dense_sweep", []) if pick(r)},
                   f"sweep run of {method!r} in {scenario!r}")

    def run(rate, seeds):
        return [np.inf if find(rate, s) is None else find(rate, s) for s in seeds]

    return Method(method, run, grid, resolution=settings.get("every", 0.0), step=None)


def estimated_tuning_sd(stored, scenario, first, second, resamples=40, seed=0):
    """An estimate of how far the draw of tuning seeds moves a race comparison, in log units.

    The race's test seeds ran at the stored best rates only, so the tuning
    draw cannot be resampled on them as on the replays' pages
    (:mod:`pargrad.book.tuning`).  Instead each of ``resamples`` bootstrap
    draws of the file's tuning seeds picks each method's rate again from the
    stored sweep (the sweep's own rule), and the draw moves the method by
    the median, over the tuning seeds, of the log-ratio of their times at
    that rate and at the stored best.  Returns the standard deviation over
    the draws of ``first``'s move minus ``second``'s (the same draws for
    both, as both were tuned on the same seeds).  Shown in the chapter "The
    race in depth".
    """
    seeds = list(stored["settings"]["tuning_seeds"])
    resolution = stored["settings"].get("every", 0.0)
    draws = tuning.tuning_draws(len(seeds), resamples=resamples, seed=seed)["bootstrap"]
    moves = []
    for name in (first, second):
        method = stored_sweep_method(stored, scenario, name)
        times = np.array([method.run(rate, seeds) for rate in method.settings()], float)
        at = tuning.pick(times, resolution)
        moved = []
        for draw in draws:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.log(times[tuning.pick(times[:, draw], resolution)] / times[at])
            moved.append(float(np.median(np.where(np.isnan(ratio), 0.0, ratio))))
        moves.append(np.array(moved))
    return float(np.std(moves[0] - moves[1], ddof=1))


def stored_experiment(stored, scenario, methods, target=TARGET, density=1):
    """The methods of one scenario of a :func:`stored_sweep`, each at its best rate; an Experiment.

    Each method is swept again from the file (:func:`stored_sweep_method`);
    with ``density=2``, again on a grid twice as dense around its best
    (:func:`pargrad.book.experiments.denser`: the density check), and its
    scores are the times to ``target`` of the file's races at that best
    rate (``dense_results`` hold the races at a best the denser grid
    moved).  A method without a sweep (none here) would raise.  Checked by
    the density test of the chapter "Sync vs async in the same time".
    """
    settings = stored["settings"]
    tuning, seeds = settings["tuning_seeds"], settings["seed_list"]
    scores, rates, sweeps = {}, {}, {}
    for method in methods:
        swept = stored_sweep_method(stored, scenario, method)
        sweeps[method] = experiments.sweep(swept, tuning)
        if density == 2:
            sweeps[method] = experiments.sweep(experiments.denser(swept, sweeps[method].best),
                                               tuning)
        rates[method] = sweeps[method].best
        pick = lambda r: (r["scenario"], r["method"]) == (scenario, method)  # noqa: E731
        find = _lookup({(r["learning_rate"], r["seed"]): r for r in
                        stored["results"] + stored.get("dense_results", []) if pick(r)},
                       f"race of {method!r} in {scenario!r}")
        scores[method] = np.array([
            time_to_target(np.array(find(rates[method], s)["time"], float),
                           np.array(find(rates[method], s)["accuracy"], float), target)
            for s in seeds])
    return experiments.Experiment(np.array(seeds), scores, rates, sweeps)


def stored_verdict(page, held_out, scenario, first, second, target=TARGET, density=1):
    """The verdict of two methods over a stored file and its held-out twin, both swept again.

    :func:`stored_experiment` on each file (``density=2``: the density
    check), pooled by :class:`pargrad.book.experiments.Replication`.
    """
    return experiments.Replication(
        *(stored_experiment(f, scenario, (first, second), target, density)
          for f in (page, held_out))).compare(first, second)
