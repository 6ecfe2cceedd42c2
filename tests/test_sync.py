"""pargrad.SyncTrainer: equal to the big batch, timed honestly, strict on bad input.

The session has 4 logical devices (tests/conftest.py); 5 devices and two
processes run in fresh processes.
"""

import json

import keras
import numpy as np
import pytest

import pargrad
from pargrad.book import plots
from pargrad.cluster import LocalCluster
from pargrad.sync import (
    DevicesNotReadyError,
    SyncTrainer,
    ring_all_reduce,
    sync_strategy,
)
from pargrad.book.instruments import InstrumentedSyncTrainer
from pargrad.book.parabola import fit_one_device, parabola_data, parabola_model, train_parabola

STEPS = 2000
# The equalities of the book hold in exact arithmetic; float32 runs meet
# them within the rounding of their steps (pargrad.rounding_tolerance), and
# the 2000-step runs are in float64, where no machine's order of additions
# can hide the point.
TOLERANCE = pargrad.rounding_tolerance("float32", 300)
EXACT = pargrad.rounding_tolerance("float64", STEPS)
# Keras keeps the learning rate in float32 (keras.backend.floatx()) even for
# a float64 model: the float64 reference uses the same number.
KERAS_RATE = float(np.float32(1e-2))


@pytest.fixture(scope="module")
def reference():
    """The y = x² network on one device with the full batch of 50, in float64: (losses, weights)."""
    x, y = parabola_data(dtype="float64")
    return fit_one_device(x, y, steps=STEPS, learning_rate=KERAS_RATE, seed=0)


def max_gap(weights_a, weights_b):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights_a, weights_b))


def trainer_for(replicas, model_fn=None, **options):
    strategy = sync_strategy(replicas)
    with strategy.scope():
        model = (model_fn or (lambda: parabola_model(seed=0)))()
    instrumented = {"record_times", "stragglers"} & set(options)  # the book's instruments
    trainer_class = InstrumentedSyncTrainer if instrumented else SyncTrainer
    return trainer_class(model, strategy, progress=False, **options)


def mlp(features=64, width=256):
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(1),
    ])


def mlp_data(n=2048, features=64):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, features)).astype(np.float32),
            rng.standard_normal((n, 1)).astype(np.float32))


# -- equivalence ---------------------------------------------------------------

@pytest.mark.claim
def test_the_float32_runs_differ_by_rounding_and_float64_closes_the_gap():
    # Without float64 the 2000-step gap is rounding of float32's size; the
    # tolerance used above is what makes the float64 comparison meaningful.
    x32, y32 = parabola_data()
    _, weights32 = fit_one_device(x32, y32, steps=300)
    trainer = trainer_for(2)
    trainer.fit(x32, y32, steps=300, steps_per_call=100)
    gap32 = max_gap(trainer.model.get_weights(), weights32)
    assert gap32 < TOLERANCE
    x64, y64 = parabola_data(dtype="float64")
    _, weights64 = fit_one_device(x64, y64, steps=300, learning_rate=KERAS_RATE)
    trainer64 = trainer_for(2, lambda: parabola_model(seed=0, dtype="float64"))
    trainer64.fit(x64, y64, steps=300, steps_per_call=100)
    gap64 = max_gap(trainer64.model.get_weights(), weights64)
    assert gap64 < pargrad.rounding_tolerance("float64", 300)
    assert gap64 < gap32 / 1e4 or gap32 == 0


@pytest.mark.parametrize("kind, physical, expected", [
    ("CPU", [0, 0], "ReductionToOneDevice"),
    ("GPU", [0, 0, 0, 0], "ReductionToOneDevice"),   # logical GPUs of one GPU
    ("GPU", [0, 1], "NcclAllReduce"),                # a GPU each
    ("GPU", [0, 0, 1], "ReductionToOneDevice"),      # mixed: no NCCL on a shared GPU
    ("GPU", [0], "ReductionToOneDevice"),
])
def test_the_all_reduce_suits_the_devices(kind, physical, expected):
    assert type(pargrad.choose_cross_device_ops(kind, physical)).__name__ == expected


def test_strategies_of_different_sizes_live_in_one_process(devices):
    # TensorFlow's default collectives would fail here ("joining a group with
    # size 2, but that group has size 4"), on logical CPUs and logical GPUs.
    x, y = parabola_data(n=48)
    for replicas in (4, 2, 4, 3):
        trainer = trainer_for(replicas)
        trainer.fit(x, y, steps=2, steps_per_call=1)
        assert trainer.replicas == replicas

@pytest.mark.claim
@pytest.mark.parametrize("replicas", [1, 2])
def test_matches_the_full_batch_after_2000_steps(replicas, reference):
    losses, weights = reference
    result = train_parabola(replicas, steps=STEPS, dtype="float64")
    assert result["replicas"] == replicas and result["weights"][0].dtype == np.float64
    assert max_gap(result["weights"], weights) < EXACT
    assert np.max(np.abs(result["loss"] - losses)) < EXACT
    assert result["loss"][-1] < result["loss"][0] / 10      # it did train


@pytest.mark.claim
def test_matches_the_full_batch_on_four_devices():
    x, y = parabola_data(n=48)          # 48 = 4 x 12
    losses, weights = fit_one_device(x, y, steps=300)
    trainer = trainer_for(4)
    history = trainer.fit(x, y, steps=300, steps_per_call=100)
    assert max_gap(trainer.model.get_weights(), weights) < TOLERANCE
    assert np.max(np.abs(history.loss - losses)) < TOLERANCE


@pytest.mark.claim
def test_matches_the_full_batch_on_five_devices_in_a_fresh_process(run_python, reference):
    completed = run_python("""
        import json, pargrad
        pargrad.logical_devices(5)
        from pargrad.book.parabola import train_parabola
        result = train_parabola(5, steps=2000, dtype="float64")
        print(json.dumps({"replicas": result["replicas"],
                          "weights": [w.tolist() for w in result["weights"]]}))
    """)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 5
    assert max_gap([np.array(w) for w in result["weights"]], reference[1]) < EXACT


def test_two_processes_match_one_process(reference):
    with LocalCluster(train_parabola, workers=2, kwargs={"steps": STEPS, "dtype": "float64"},
                      timeout=240) as cluster:
        results = cluster.wait()
    assert [r["replicas"] for r in results] == [2, 2]
    # Both workers hold the same parameters, equal to the single-device run.
    assert max_gap(results[0]["weights"], results[1]["weights"]) == 0
    assert max_gap(results[0]["weights"], reference[1]) < EXACT
    assert np.max(np.abs(results[0]["loss"] - reference[0])) < EXACT


@pytest.mark.claim
def test_accumulation_matches_the_full_batch_and_reports_the_effective_batch():
    x, y = parabola_data()
    losses, weights = fit_one_device(x, y, steps=200)
    trainer = trainer_for(2, accumulation_steps=5)
    history = trainer.fit(x, y, steps=200, steps_per_call=100)
    assert (history.micro_batch_size, history.accumulation_steps, history.replicas) == (5, 5, 2)
    assert history.effective_batch_size == 50
    assert max_gap(trainer.model.get_weights(), weights) < TOLERANCE
    assert np.max(np.abs(history.loss - losses)) < TOLERANCE


@pytest.mark.claim
def test_minibatches_are_taken_in_order_like_one_device():
    x, y = mlp_data(n=256, features=4)
    single = trainer_for(1, lambda: mlp(4, 16))
    double = trainer_for(2, lambda: mlp(4, 16))
    single.fit(x, y, steps=10, batch_size=64)
    double.fit(x, y, steps=10, batch_size=64)
    assert max_gap(single.model.get_weights(), double.model.get_weights()) < TOLERANCE


# -- what a step costs -----------------------------------------------------------

@pytest.mark.parametrize("steps_per_call", [1, 10])
def test_per_replica_times_add_up_to_the_step(steps_per_call):
    """launch + compute + wait fill the step; the all-reduce lines the replicas up."""
    x, y = mlp_data()
    trainer = trainer_for(2, mlp, record_times=True)
    trainer.fit(x, y, steps=steps_per_call, batch_size=512, steps_per_call=steps_per_call)  # trace
    history = trainer.fit(x, y, steps=30, batch_size=512, steps_per_call=steps_per_call)
    slack = 1e-4
    assert (history.launch > -slack).all()
    assert (history.compute > 0).all() and (history.wait > -slack).all()
    parts = history.launch + history.compute + history.wait
    assert (parts <= history.step_time[:, None] + slack).all()
    if steps_per_call > 1:
        # The step ends when its last replica has its update.
        assert np.allclose(parts.max(axis=1), history.step_time, atol=slack)
    # Every replica's update ends at about the same moment: the all-reduce
    # joins them, so a replica that finished computing early waits.
    finish = history.update_end.max(axis=1) - history.update_end.min(axis=1)
    early = history.compute_end.max(axis=1) - history.compute_end.min(axis=1)
    assert np.median(finish) < max(np.median(early), 1e-3)


def test_without_recording_times_it_trains_the_same():
    x, y = parabola_data()
    timed = trainer_for(2, record_times=True)
    plain = trainer_for(2)                          # the default: no timestamps
    timed.fit(x, y, steps=50, steps_per_call=10)
    history = plain.fit(x, y, steps=50, steps_per_call=10)
    assert max_gap(timed.model.get_weights(), plain.model.get_weights()) == 0
    assert np.isnan(history.compute).all() and (history.step_time > 0).all()
    with pytest.raises(ValueError, match="record_times=True"):
        plots.device_timeline(history)


def test_fit_continues_where_the_last_call_stopped():
    x, y = mlp_data(n=256, features=4)
    once, twice = trainer_for(1, lambda: mlp(4, 16)), trainer_for(1, lambda: mlp(4, 16))
    once.fit(x, y, steps=8, batch_size=64)
    twice.fit(x, y, steps=4, batch_size=64)
    twice.fit(x, y, steps=4, batch_size=64)
    assert max_gap(once.model.get_weights(), twice.model.get_weights()) == 0


def test_fit_sees_changes_made_to_the_arrays_between_calls():
    x, y = parabola_data()
    changed, reference = trainer_for(2), trainer_for(2)
    changed.fit(x, y, steps=1)
    reference.fit(x, y.copy(), steps=1)
    y *= 0.5                                   # in place: the same array object
    changed.fit(x, y, steps=1)
    reference.fit(x, y.copy(), steps=1)
    assert max_gap(changed.model.get_weights(), reference.model.get_weights()) == 0


def test_a_straggler_sets_the_step_time():
    x, y = mlp_data()
    common = dict(batch_size=512, steps_per_call=5)
    even = trainer_for(2, mlp, record_times=True)
    even.fit(x, y, steps=5, **common)
    base = even.fit(x, y, steps=30, **common)
    slow = trainer_for(2, mlp, stragglers={1: 6}, record_times=True)
    slow.fit(x, y, steps=5, **common)
    history = slow.fit(x, y, steps=30, **common)

    def slowest(h):                      # when the last replica finished computing
        return (h.launch + h.compute).max(axis=1)

    assert (history.step_time >= slowest(history)).all()
    # The straggler is the last to finish computing in (almost) every step ...
    assert np.mean(history.compute_end.argmax(axis=1) == 1) >= 0.8
    # ... the step time grows with the slowest replica ...
    longer = np.median(slowest(history)) - np.median(slowest(base))
    assert longer > 0
    assert np.median(history.step_time) - np.median(base.step_time) > 0.6 * longer
    # ... and the other replica spends the difference waiting.
    assert np.median(history.wait[:, 0]) > np.median(history.wait[:, 1]) + 0.5 * longer


# -- bad input --------------------------------------------------------------------

def test_an_uneven_global_batch_is_refused():
    x, y = parabola_data()
    trainer = trainer_for(4)
    with pytest.raises(ValueError, match="multiple of 4.*48 or 52"):
        trainer.fit(x, y, steps=1)
    trainer = trainer_for(2, accumulation_steps=3)
    with pytest.raises(ValueError, match="2 replicas x 3 micro-batches"):
        trainer.fit(x, y, steps=1)


def test_more_replicas_than_devices_is_refused():
    with pytest.raises(DevicesNotReadyError, match=r"pargrad.logical_devices\(8\)"):
        sync_strategy(8)


def test_a_model_built_outside_the_scope_is_refused():
    strategy = sync_strategy(2)
    model = parabola_model(seed=0)
    with pytest.raises(ValueError, match="outside this strategy's scope"):
        SyncTrainer(model, strategy)


def test_an_optimizer_created_outside_the_scope_is_refused():
    strategy = sync_strategy(2)
    with strategy.scope():
        model = parabola_model(seed=0)
    with pytest.raises(ValueError, match="optimizer was created outside"):
        SyncTrainer(model, strategy, optimizer=keras.optimizers.SGD(0.01))


@pytest.mark.parametrize("options, message", [
    (dict(accumulation_steps=0), "accumulation_steps"),
    (dict(stragglers={7: 2.0}), "replicas are 0..1"),
    (dict(stragglers={0: 0.5}), "factor must be a whole number >= 1"),
    (dict(stragglers={0: 2.5}), "factor must be a whole number >= 1"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        trainer_for(2, **options)


def test_no_strategy_is_refused():
    with pytest.raises(TypeError, match="sync_strategy"):
        SyncTrainer(parabola_model(), strategy=None)


# -- all-reduce --------------------------------------------------------------------

@pytest.mark.parametrize("replicas", [2, 3, 4, 5])
def test_ring_all_reduce_gives_every_replica_the_sum(replicas):
    rng = np.random.default_rng(replicas)
    vectors = rng.standard_normal((replicas, 3 * replicas))
    result, states, sent = ring_all_reduce(vectors)
    assert np.allclose(result, vectors.sum(axis=0))
    assert len(states) == 2 * (replicas - 1) + 1 and len(sent) == 2 * (replicas - 1)
    # every replica sends one chunk a step: 2 (n - 1) / n of its vector in all
    assert all(sorted(s for s, _, _ in step) == list(range(replicas)) for step in sent)


# -- XLA ----------------------------------------------------------------------------

# XLA fuses and reorders the float32 arithmetic of a step, so the runs may
# drift apart by float32 roundings of the weights (a few 1e-7 after 200
# steps on the machine that wrote this), far below the book's bound.
JIT_TOLERANCE = TOLERANCE


@pytest.mark.parametrize("accumulation_steps, steps_per_call", [(1, 1), (1, 100), (5, 1), (5, 100)])
def test_jit_compile_equals_the_plain_step_and_the_full_batch(accumulation_steps, steps_per_call):
    x, y = parabola_data()
    steps = 200
    losses, weights = fit_one_device(x, y, steps=steps)
    plain = trainer_for(2, accumulation_steps=accumulation_steps)
    compiled = trainer_for(2, accumulation_steps=accumulation_steps, jit_compile=True)
    plain_history = plain.fit(x, y, steps=steps, steps_per_call=steps_per_call)
    history = compiled.fit(x, y, steps=steps, steps_per_call=steps_per_call)
    assert max_gap(compiled.model.get_weights(), plain.model.get_weights()) < JIT_TOLERANCE
    assert np.max(np.abs(history.loss - plain_history.loss)) < JIT_TOLERANCE
    assert max_gap(compiled.model.get_weights(), weights) < JIT_TOLERANCE
    assert np.max(np.abs(history.loss - losses)) < JIT_TOLERANCE
    assert history.loss[-1] < history.loss[0] / 2             # it did train


def test_jit_compile_takes_minibatches_like_one_device():
    x, y = mlp_data(n=256, features=4)
    single = trainer_for(1, lambda: mlp(4, 16))
    double = trainer_for(2, lambda: mlp(4, 16), jit_compile=True)
    single.fit(x, y, steps=10, batch_size=64)
    double.fit(x, y, steps=10, batch_size=64, steps_per_call=5)
    assert max_gap(single.model.get_weights(), double.model.get_weights()) < JIT_TOLERANCE


def test_jit_compile_traces_once_per_replica_and_records_times():
    x, y = mlp_data()
    trainer = trainer_for(2, mlp, jit_compile=True, record_times=True)
    for _ in range(3):
        history = trainer.fit(x, y, steps=10, batch_size=512, steps_per_call=5)
    # One XLA computation per replica, compiled once, not once per call.
    assert trainer._replica_gradients.experimental_get_tracing_count() == 2
    assert (history.compute > 0).all() and (history.wait > -1e-4).all()
