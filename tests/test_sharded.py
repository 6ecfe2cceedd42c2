"""Tests of pargrad.sharded: ShardedTrainer (ZeRO stages 1-3) against SyncTrainer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import pargrad
from pargrad.sharded import ShardedHistory, ShardedTrainer, mirrored_slots

STEPS = 50


def small_model(strategy, optimizer="adam", inputs=2, hidden=5, layers=None, dtype="float64"):
    """A float64 2-5-1 tanh network (21 parameters: neither 2, 4 nor 8 divides it) and its optimizer."""
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((inputs,), dtype=dtype),
                                  *(layers or [keras.layers.Dense(hidden, activation="tanh",
                                                                  dtype=dtype),
                                               keras.layers.Dense(1, dtype=dtype)])])
        made = (keras.optimizers.Adam(1e-2) if optimizer == "adam"
                else keras.optimizers.SGD(1e-2, momentum=0.9))
    return model, made


def data(n=32, inputs=2):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, inputs))
    return x, np.sin(x.sum(axis=1, keepdims=True))


def weights(model):
    return [np.asarray(v.numpy()) for v in model.trainable_variables]


def assert_same(a, b):
    assert len(a) == len(b)
    for left, right in zip(a, b):
        assert np.array_equal(left, right), np.max(np.abs(left - right))


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_stages_equal_the_mirrored_run_bit_for_bit(replicas, optimizer):
    strategy = pargrad.sync_strategy(replicas)
    x, y = data()
    model, made = small_model(strategy, optimizer)
    reference = pargrad.SyncTrainer(model, strategy, optimizer=made, progress=False)
    expected = reference.fit(x, y, steps=STEPS, batch_size=16, steps_per_call=25)
    for stage in (1, 2, 3):
        sharded_model, sharded_optimizer = small_model(strategy, optimizer)
        trainer = ShardedTrainer(sharded_model, strategy, stage=stage, optimizer=sharded_optimizer,
                                 progress=False)
        assert trainer.parameter_count % replicas != 0
        history = trainer.fit(x, y, steps=STEPS, batch_size=16, steps_per_call=25)
        assert isinstance(history, ShardedHistory) and len(history) == STEPS
        assert np.array_equal(history.loss, expected.loss)
        assert_same(trainer.gathered_weights(), weights(model))
        slots, mirrored = trainer.gathered_slots(), mirrored_slots(reference.optimizer)
        assert slots.keys() == mirrored.keys()
        for name in slots:
            assert_same(slots[name], mirrored[name])
        # The padding of the flat vector: parameters and slots stay zero.
        for name, tail in trainer.padding().items():
            assert tail.size == replicas * trainer.shard_size - trainer.parameter_count
            assert not np.any(tail), name
        if stage < 3:
            for copy in trainer.replica_weights():
                assert_same(copy, weights(model))


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
def test_every_replica_holds_the_same_weights_after_every_step():
    strategy = pargrad.sync_strategy(4)
    x, y = data()
    model, made = small_model(strategy)
    trainer = ShardedTrainer(model, strategy, stage=2, optimizer=made, progress=False)
    seen = []

    class Check(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            copies = trainer.replica_weights()
            gathered = trainer.gathered_weights()
            seen.append(all(np.array_equal(a, b) for copy in copies
                            for a, b in zip(copy, gathered)))

    trainer.fit(x, y, steps=5, batch_size=16, callbacks=[Check()])
    assert seen == [True] * 5


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
def test_accumulation_stage_1_bit_for_bit_stages_2_and_3_within_rounding():
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy)
    reference = pargrad.SyncTrainer(model, strategy, optimizer=made, accumulation_steps=2,
                                    progress=False)
    reference.fit(x, y, steps=10, batch_size=16, steps_per_call=10)
    for stage in (1, 2, 3):
        sharded_model, sharded_optimizer = small_model(strategy)
        trainer = ShardedTrainer(sharded_model, strategy, stage=stage, optimizer=sharded_optimizer,
                                 accumulation_steps=2, progress=False)
        trainer.fit(x, y, steps=10, batch_size=16, steps_per_call=10)
        if stage == 1:   # the replica adds its micro-batches first, as SyncTrainer does
            assert_same(trainer.gathered_weights(), weights(model))
        else:            # the owner adds reduced micro-batch shards: another order
            gap = max(np.max(np.abs(a - b)) for a, b in zip(trainer.gathered_weights(),
                                                           weights(model)))
            assert gap <= pargrad.rounding_tolerance("float64", 10)
        sizes = {int(buffer.shape[0]) for buffer in trainer.gradient_buffers}
        assert sizes == ({trainer.parameter_count} if stage == 1 else {trainer.shard_size})


def test_bytes_sent_per_step_is_an_all_reduce_at_stage_1_and_half_as_much_again_at_stage_3():
    strategy = pargrad.sync_strategy(4)
    x, y = data()
    for stage, times in ((1, 1), (3, 1.5)):
        model, made = small_model(strategy)
        trainer = ShardedTrainer(model, strategy, stage=stage, optimizer=made, progress=False)
        history = trainer.fit(x, y, steps=2, batch_size=16)
        padded_bytes = 4 * trainer.shard_size * 8          # 4 shards of 6 float64 values
        assert history.parameter_bytes == padded_bytes == 192
        assert history.bytes_sent.tolist() == [times * 2 * 3 / 4 * padded_bytes] * 2
        assert history.stage == stage


@pytest.mark.parametrize("replicas, accumulation_steps", [(2, 1), (4, 1), (4, 2)])
def test_the_bytes_stage_3_moves_are_the_formulas_gathered_twice_and_reduce_scattered_once(
        replicas, accumulation_steps):
    """Counted where the step cuts its slices: N x sharded_step_bytes of the unpadded
    parameters with two gathers a micro-batch; N x bytes_sent when N divides them."""
    strategy = pargrad.sync_strategy(replicas)
    x, y = data()
    for inputs in (2, 1):           # 21 parameters (N does not divide them), then 16
        model, made = small_model(strategy, inputs=inputs)
        trainer = ShardedTrainer(model, strategy, stage=3, optimizer=made, progress=False,
                                 accumulation_steps=accumulation_steps)
        x_in = x[:, :inputs]
        history = trainer.fit(x_in, y, steps=2, batch_size=16)
        k = accumulation_steps
        assert trainer.collectives_per_step == (2 * k, k)
        formula = pargrad.allreduce.sharded_step_bytes(8 * trainer.parameter_count, replicas,
                                                       gathers=2 * k, reductions=k)
        assert history.bytes_moved.tolist() == [replicas * formula] * 2
        assert np.array_equal(history.bytes_sent, np.full(2, k * pargrad.allreduce.sharded_step_bytes(
            history.parameter_bytes, replicas, gathers=2)))
        if trainer.parameter_count % replicas == 0:
            assert np.array_equal(history.bytes_moved, replicas * history.bytes_sent)


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
def test_at_stage_3_no_replica_ever_holds_the_whole_model():
    """Every gather the trainer builds (forward, backward, evaluation) is one unit."""
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy, layers=[
        keras.layers.Dense(6, activation="tanh", dtype="float64"),
        keras.layers.Dense(4, activation="tanh", dtype="float64"),
        keras.layers.Dense(1, dtype="float64")])
    trainer = ShardedTrainer(model, strategy, stage=3, optimizer=made, progress=False)
    sizes = [unit.size for unit in trainer.units]
    assert sizes == [18, 28, 5] and sum(sizes) == trainer.parameter_count
    history = trainer.fit(x, y, steps=3, batch_size=16, validation_data=(x, y))
    assert set(trainer.gather_log) == set(sizes)
    assert history.gathered_values_max == max(sizes) == 28 < trainer.parameter_count
    assert set(trainer.transient_bytes().values()) == {28 * 8}
    assert {int(b.shape[0]) for b in trainer.gradient_buffers} == {trainer.shard_size}


def test_a_checkpoint_mid_run_restores_the_shards_exactly(tmp_path):
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy)
    whole = ShardedTrainer(model, strategy, stage=2, optimizer=made, progress=False)
    whole.fit(x, y, steps=8, batch_size=16)

    model, made = small_model(strategy)
    first = ShardedTrainer(model, strategy, stage=2, optimizer=made, progress=False)
    first.fit(x, y, steps=4, batch_size=16)
    path = tf.train.Checkpoint(trainer=first).write(str(tmp_path / "sharded"))

    model, made = small_model(strategy)
    second = ShardedTrainer(model, strategy, stage=2, optimizer=made, progress=False)
    tf.train.Checkpoint(trainer=second).read(path).assert_consumed()
    second.fit(x, y, steps=4, batch_size=16)
    assert_same(second.gathered_weights(), whole.gathered_weights())
    for name, values in whole.gathered_slots().items():
        assert_same(second.gathered_slots()[name], values)
    for copy in second.replica_weights():
        assert_same(copy, whole.gathered_weights())


def test_stage_3_frees_the_model_and_unshard_gives_it_back():
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy)
    trainer = ShardedTrainer(model, strategy, stage=3, optimizer=made, progress=False)
    assert all(v._value is None for v in model.trainable_variables)
    trainer.fit(x, y, steps=3, batch_size=16)
    loss = trainer.evaluate(x, y)["loss"]
    trained = trainer.gathered_weights()
    trainer.unshard()
    assert_same(weights(model), trained)
    assert loss == pargrad.SyncTrainer(model, strategy, progress=False).evaluate(x, y)["loss"]
    with pytest.raises(ValueError, match="unsharded"):
        trainer.fit(x, y, steps=1, batch_size=16)


@pytest.mark.parametrize("stage", [1, 3])
def test_the_released_model_says_to_unshard_and_unshard_then_save_round_trips(stage, tmp_path):
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy)
    trainer = ShardedTrainer(model, strategy, stage=stage, optimizer=made, progress=False)
    trainer.fit(x, y, steps=3, batch_size=16)
    for call in (model.get_weights, lambda: model.predict(x, verbose=0),
                 lambda: model.save(str(tmp_path / "no.keras"))):
        with pytest.raises(ValueError, match=rf"stage {stage}, 2 replicas.*call "
                                             r"trainer\.unshard\(\)"):
            call()
    with pytest.raises(ValueError, match="call unshard"):
        pargrad.SyncTrainer(model, strategy, progress=False)
    trainer.unshard()
    assert_same(model.get_weights(), trainer.gathered_weights())
    model.save(str(tmp_path / "model.keras"))
    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    assert_same(loaded.get_weights(), trainer.gathered_weights())
    assert np.array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize("stage, error", [(0, ValueError), (4, ValueError), ("1", TypeError),
                                          (True, TypeError), (None, TypeError)])
def test_bad_stage_is_refused(stage, error):
    strategy = pargrad.sync_strategy(2)
    model, made = small_model(strategy)
    before = weights(model)
    with pytest.raises(error, match="stage must be"):
        ShardedTrainer(model, strategy, stage=stage, optimizer=made)
    assert_same(weights(model), before)


def test_other_bad_input_is_refused_before_any_work():
    strategy = pargrad.sync_strategy(2)
    model, _ = small_model(strategy)
    outside = keras.optimizers.Adam(1e-2)
    with pytest.raises(ValueError, match="outside this strategy's scope"):
        ShardedTrainer(model, strategy, stage=1, optimizer=outside)
    with strategy.scope():
        inside = keras.optimizers.Adam(1e-2)
    with pytest.raises(ValueError, match="pass the learning rate to the optimizer"):
        ShardedTrainer(model, strategy, stage=1, optimizer=inside, learning_rate=0.1)
    with pytest.raises(TypeError, match="Keras optimizer"):
        ShardedTrainer(model, strategy, stage=1, optimizer="adam")
    normalized, made = small_model(strategy, layers=[
        keras.layers.Dense(3, dtype="float64"), keras.layers.BatchNormalization(dtype="float64"),
        keras.layers.Dense(1, dtype="float64")])
    with pytest.raises(ValueError, match="non-trainable state"):
        ShardedTrainer(normalized, strategy, stage=2, optimizer=made)
    with strategy.scope():
        with pytest.raises(ValueError, match="outside `with strategy.scope"):
            ShardedTrainer(model, strategy, stage=1, optimizer=inside)


def test_a_non_finite_loss_stops_before_the_update():
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy)

    def loss(target, prediction):     # infinite for a target above 100
        squared = tf.reduce_sum((target - prediction) ** 2, axis=-1)
        return tf.where(tf.reduce_max(target, axis=-1) > 100, tf.constant(np.inf, tf.float64),
                        squared)

    trainer = ShardedTrainer(model, strategy, stage=2, optimizer=made, loss=loss, progress=False)
    trainer.fit(x, y, steps=1, batch_size=16)
    before = trainer.gathered_weights()
    bad = y.copy()
    bad[[12, 28]] = 1000.0     # replica 1's rows of the next batch (8-15, or 24-31)
    with pytest.raises(pargrad.NonFiniteLossError, match="replica 1"):
        trainer.fit(x, bad, steps=1, batch_size=16)
    assert_same(trainer.gathered_weights(), before)


@pytest.mark.parametrize("name, value", [("metrics", [keras.metrics.MeanSquaredError()]),
                                         ("jit_compile", True),
                                         ("sample_weight", lambda x, y: tf.ones_like(y))])
def test_keras_arguments_it_cannot_honour_are_refused_by_name_with_the_reason(name, value):
    strategy = pargrad.sync_strategy(2)
    model, made = small_model(strategy)
    with pytest.raises(ValueError, match=rf"^{name} must be .* for ShardedTrainer, got .*\. \w"):
        ShardedTrainer(model, strategy, stage=1, optimizer=made, **{name: value})


def test_messages_name_the_trainer_that_refused():
    strategy = pargrad.sync_strategy(2)
    with pytest.raises(TypeError, match="^ShardedTrainer needs a Keras model"):
        ShardedTrainer("not a model", strategy, stage=1)
    x, y = data()
    model, made = small_model(strategy)
    trainer = ShardedTrainer(model, strategy, stage=3, optimizer=made, progress=False)
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="stop_on_non_finite=False to ShardedTrainer"):
        trainer.fit(x, bad, steps=1, batch_size=16)


def test_the_stage_is_read_as_what_it_shards():
    strategy = pargrad.sync_strategy(2)
    for stage in (1, 2, 3):
        model, made = small_model(strategy)
        trainer = ShardedTrainer(model, strategy, stage=stage, optimizer=made, progress=False)
        assert trainer.sharded == pargrad.memory.sharded_components(stage)
        components = {component for component, _ in trainer.variables_by_component()}
        assert "master_weights" not in components


def test_stage_1_on_one_device_holds_what_data_parallelism_holds():
    strategy = pargrad.sync_strategy(1)
    model, made = small_model(strategy)
    sync = pargrad.memory.bytes_by_device(pargrad.SyncTrainer(model, strategy, optimizer=made,
                                                              progress=False))
    for stage in (1, 2, 3):
        model, made = small_model(strategy)
        trainer = ShardedTrainer(model, strategy, stage=stage, optimizer=made, progress=False)
        assert pargrad.memory.bytes_by_device(trainer) == sync


# ----------------------------------------------------------------------------
# Checkpoints at every stage, resharded on restore
# ----------------------------------------------------------------------------

def _sharded(stage, replicas, **options):
    strategy = pargrad.sync_strategy(replicas)
    model, made = small_model(strategy, **options)
    return ShardedTrainer(model, strategy, stage=stage, optimizer=made, progress=False)


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
@pytest.mark.parametrize("saved_stage", [1, 2, 3])
def test_a_checkpoint_restores_at_every_stage_and_replica_count(saved_stage, tmp_path):
    """Saved at ``saved_stage`` on N replicas after 4 steps, restored at stages 1-3 on M:
    weights, slots and step count equal; 4 more steps equal the uninterrupted 8 steps on N
    bit for bit when M == N, within rounding when the replicas (the sums' order) change."""
    x, y = data()
    results = {}
    for n in (2, 4):
        whole = _sharded(saved_stage, n)
        whole.fit(x, y, steps=8, batch_size=16)
        first = _sharded(saved_stage, n)
        first.fit(x, y, steps=4, batch_size=16)
        path = tf.train.Checkpoint(trainer=first).write(str(tmp_path / f"s{saved_stage}n{n}"))
        for m in (2, 4):
            for stage in (1, 2, 3):
                second = _sharded(stage, m)
                tf.train.Checkpoint(trainer=second).read(path).assert_consumed()
                assert_same(second.gathered_weights(), first.gathered_weights())
                for name, values in first.gathered_slots().items():
                    assert_same(second.gathered_slots()[name], values)
                assert {int(o.iterations.numpy()) for o in second.owner_optimizers} == {4}
                second.fit(x, y, steps=4, batch_size=16)
                gap = max(np.max(np.abs(a - b)) for a, b in zip(second.gathered_weights(),
                                                                whole.gathered_weights()))
                if m == n:
                    assert gap == 0, (saved_stage, n, stage, m, gap)
                else:
                    assert gap <= pargrad.rounding_tolerance("float64", 4), (n, stage, m, gap)
                results[(saved_stage, n, stage, m)] = float(gap)
    assert len(results) == 12
    print("RESULT checkpoint matrix", results)


def test_a_checkpoint_before_fit_restores_at_another_stage(tmp_path):
    for stage in (1, 2, 3):
        path = tf.train.Checkpoint(trainer=_sharded(stage, 2)).write(str(tmp_path / f"{stage}"))
        other = _sharded(stage % 3 + 1, 4)
        tf.train.Checkpoint(trainer=other).read(path).assert_consumed()
        assert_same(other.gathered_weights(), _sharded(stage, 2).gathered_weights())


def test_a_checkpoint_of_another_model_or_optimizer_is_refused_in_one_sentence(tmp_path):
    path = tf.train.Checkpoint(trainer=_sharded(3, 2)).write(str(tmp_path / "adam"))
    for other in (_sharded(1, 4, hidden=4), _sharded(1, 4, optimizer="momentum")):
        with pytest.raises(ValueError, match=r"^This checkpoint, saved at stage 3 on 2 replicas, "
                                             r".* into this ShardedTrainer \(stage 1, 4 replicas\)"):
            tf.train.Checkpoint(trainer=other).read(path)


# ----------------------------------------------------------------------------
# Mixed precision (Keras's mixed_bfloat16 policy)
# ----------------------------------------------------------------------------

def bfloat16_model(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)),
                                  keras.layers.Dense(5, activation="tanh", dtype="mixed_bfloat16"),
                                  keras.layers.Dense(1, dtype="mixed_bfloat16")])
        return model, keras.optimizers.Adam(1e-2)


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
def test_mixed_bfloat16_equals_the_mirrored_run_and_holds_float32_state():
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    x, y = x.astype("float32"), y.astype("float32")
    model, made = bfloat16_model(strategy)
    reference = pargrad.SyncTrainer(model, strategy, optimizer=made, progress=False)
    expected = reference.fit(x, y, steps=10, batch_size=16)
    for stage in (1, 2, 3):
        sharded_model, sharded_optimizer = bfloat16_model(strategy)
        trainer = ShardedTrainer(sharded_model, strategy, stage=stage,
                                 optimizer=sharded_optimizer, progress=False)
        history = trainer.fit(x, y, steps=10, batch_size=16)
        assert np.array_equal(history.loss, expected.loss)
        assert_same(trainer.gathered_weights(), weights(model))
        expected_bytes = pargrad.memory.state_bytes(21, replicas=2, stage=stage,
                                                    precision="float32", optimizer="adam")
        for held in pargrad.memory.bytes_by_device(trainer).values():
            assert held == expected_bytes
    one = pargrad.memory.state_bytes(1, replicas=1, stage=0, precision="float32")
    assert one["total"] == 16 == pargrad.memory.state_bytes(1, replicas=1, stage=0,
                                                            precision="mixed")["total"]


def test_mixed_float16_is_refused_with_the_reason_and_what_to_do():
    strategy = pargrad.sync_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, dtype="mixed_float16")])
        made = keras.optimizers.Adam(1e-2)
    model.dtype_policy = keras.DTypePolicy("mixed_float16")
    with pytest.raises(ValueError, match="loss scaling.*mixed_bfloat16"):
        ShardedTrainer(model, strategy, stage=1, optimizer=made)


def test_transient_bytes_are_the_whole_model_at_stages_1_and_2_and_the_largest_unit_at_3():
    strategy = pargrad.sync_strategy(4)
    for stage, values in ((1, 21), (2, 21), (3, 15)):     # units: 2 x 5 + 5, then 5 + 1
        model, made = small_model(strategy)
        trainer = ShardedTrainer(model, strategy, stage=stage, optimizer=made, progress=False)
        expected = {"gathered_parameters": values * 8, "gradients": values * 8}
        if stage == 3:
            expected["gradient_slices"] = values * 8
        assert trainer.transient_bytes() == expected


@pytest.mark.usefixtures("deterministic_ops")
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_evaluate_and_validation_equal_the_mirrored_run_at_every_stage(stage):
    """The model is released at every stage: evaluation runs on the trainer's own weights."""
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    model, made = small_model(strategy)
    reference = pargrad.SyncTrainer(model, strategy, optimizer=made, progress=False)
    expected = reference.fit(x, y, steps=10, batch_size=16, validation_data=(x[:8], y[:8]))
    sharded_model, sharded_optimizer = small_model(strategy)
    trainer = ShardedTrainer(sharded_model, strategy, stage=stage, optimizer=sharded_optimizer,
                             progress=False)
    history = trainer.fit(x, y, steps=10, batch_size=16, validation_data=(x[:8], y[:8]))
    assert history.history["val_loss"] == expected.history["val_loss"]
    assert trainer.evaluate(x, y) == reference.evaluate(x, y)


# ----------------------------------------------------------------------------
# Stage 3's units
# ----------------------------------------------------------------------------

def deep_model(strategy, dtype="float64", optimizer="adam", regularizer=None):
    """Four Dense layers and a weightless Activation: 2-3-5-3-1 (51 parameters)."""
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((2,), dtype=dtype),
            keras.layers.Dense(3, activation="tanh", dtype=dtype, name="a",
                               kernel_regularizer=regularizer),
            keras.layers.Dense(5, dtype=dtype, name="b"),
            keras.layers.Activation("tanh", dtype=dtype, name="squash"),
            keras.layers.Dense(3, activation="tanh", dtype=dtype, name="c",
                               kernel_regularizer=regularizer),
            keras.layers.Dense(1, dtype=dtype, name="d")])
        made = (keras.optimizers.Adam(1e-2) if optimizer == "adam"
                else keras.optimizers.SGD(1e-2, momentum=0.9))
    return model, made


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_stage_3_unit_by_unit_equals_the_mirrored_run_bit_for_bit(dtype, replicas, optimizer):
    """Default units (one a layer) and a named grouping: the same products on the same
    gathered values, every gradient summed in replica order."""
    strategy = pargrad.sync_strategy(replicas)
    x, y = data()
    x, y = x.astype(dtype), y.astype(dtype)
    model, made = deep_model(strategy, dtype, optimizer)
    reference = pargrad.SyncTrainer(model, strategy, optimizer=made, progress=False)
    expected = reference.fit(x, y, steps=20, batch_size=16, steps_per_call=10)
    for units in (None, [["a", "b"], ["squash", "c", "d"]]):
        sharded_model, sharded_optimizer = deep_model(strategy, dtype, optimizer)
        trainer = ShardedTrainer(sharded_model, strategy, stage=3, optimizer=sharded_optimizer,
                                 units=units, progress=False)
        assert trainer.parameter_count == 51 and 51 % replicas != 0
        assert len(trainer.units) == (4 if units is None else 2)
        history = trainer.fit(x, y, steps=20, batch_size=16, steps_per_call=10)
        assert np.array_equal(history.loss, expected.loss)
        assert_same(trainer.gathered_weights(), weights(model))
        slots, mirrored = trainer.gathered_slots(), mirrored_slots(reference.optimizer)
        for name in mirrored:
            assert_same(slots[name], mirrored[name])
        assert history.gathered_values_max == max(u.size for u in trainer.units) < 51


@pytest.mark.claim
@pytest.mark.usefixtures("deterministic_ops")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_stage_3_with_accumulation_and_penalties_is_within_rounding(dtype):
    """Each micro-batch's reduced shard is added by the owner (the mirrored run adds the
    micro-batches on each replica first), and a unit's penalty gradient is added to its
    weights' in its own backward pass: the same sums in another order."""
    strategy = pargrad.sync_strategy(4)
    x, y = data()
    x, y = x.astype(dtype), y.astype(dtype)
    for accumulation_steps, regularizer in ((2, None), (1, "l2"), (2, "l2")):
        model, made = deep_model(strategy, dtype, regularizer=regularizer)
        reference = pargrad.SyncTrainer(model, strategy, optimizer=made, progress=False,
                                        accumulation_steps=accumulation_steps)
        expected = reference.fit(x, y, steps=10, batch_size=16)
        sharded_model, sharded_optimizer = deep_model(strategy, dtype, regularizer=regularizer)
        trainer = ShardedTrainer(sharded_model, strategy, stage=3, optimizer=sharded_optimizer,
                                 accumulation_steps=accumulation_steps, progress=False)
        history = trainer.fit(x, y, steps=10, batch_size=16)
        gap = max(np.max(np.abs(a - b)) for a, b in zip(trainer.gathered_weights(),
                                                       weights(model)))
        assert gap <= pargrad.rounding_tolerance(dtype, 10), (accumulation_steps, regularizer)
        assert np.allclose(history.loss, expected.loss, rtol=0,
                           atol=pargrad.rounding_tolerance(dtype, 10))


def test_bad_units_are_refused_with_what_to_pass():
    strategy = pargrad.sync_strategy(2)
    model, made = deep_model(strategy)
    a, b, squash, c, d = model.layers
    for units, error, match in [
            ("a", TypeError, "non-empty list of non-empty lists"),
            ([["a"], []], TypeError, "non-empty list of non-empty lists"),
            ([["a", "b"], ["c", "x"]], ValueError, "'x', which is not a layer"),
            ([["a", "b"], ["b", "c", "d"]], ValueError, "'b' is in units\\[0\\] and units\\[1\\]"),
            ([["a", "b"], ["c"]], ValueError, "\\['d'\\] are in no unit"),
            ([[c, d], [a, b]], ValueError, "not a run of consecutive layers"),
            ([["a", "c"], ["b", "d"]], ValueError, "not a run of consecutive layers"),
            ([["a", "b", "c", "d"], ["squash"]], ValueError, "not a run of consecutive layers")]:
        with pytest.raises(error, match=match):
            ShardedTrainer(model, strategy, stage=3, optimizer=made, units=units)
        assert all(v._value is not None for v in model.trainable_variables)   # not released
    with pytest.raises(ValueError, match="units are a stage-3 argument.*Pass stage=3"):
        ShardedTrainer(model, strategy, stage=2, optimizer=made, units=[["a", "b", "c", "d"]])


def test_a_model_that_is_not_a_chain_is_refused_at_stage_3_and_trains_at_stage_2():
    strategy = pargrad.sync_strategy(2)
    x, y = data()
    with strategy.scope():
        inputs = keras.Input((2,), dtype="float64")
        hidden = keras.layers.Dense(3, activation="tanh", dtype="float64")(inputs)
        outputs = keras.layers.Dense(1, dtype="float64")(
            keras.layers.Concatenate(dtype="float64")([inputs, hidden]))
        model = keras.Model(inputs, outputs)
        made = keras.optimizers.Adam(1e-2)
    with pytest.raises(ValueError, match="must be a chain of layers, a keras.Sequential.*stage=2"):
        ShardedTrainer(model, strategy, stage=3, optimizer=made)
    trainer = ShardedTrainer(model, strategy, stage=2, optimizer=made, progress=False)
    assert np.isfinite(trainer.fit(x, y, steps=2, batch_size=16).loss).all()


def test_a_checkpoint_saved_with_sgd_is_refused_by_an_adam_trainer_in_one_sentence(tmp_path):
    path = tf.train.Checkpoint(trainer=_sharded(2, 2, optimizer="momentum")).write(
        str(tmp_path / "sgd"))
    adam = _sharded(2, 2)
    with pytest.raises(ValueError, match=r"^This checkpoint, saved at stage 2 on 2 replicas, holds "
                                         r"21 parameters and SGD's state, so it cannot restore "
                                         r"into this ShardedTrainer \(stage 2, 2 replicas\), which "
                                         r"trains 21 parameters with Adam; [^.]*\.$"):
        tf.train.Checkpoint(trainer=adam).read(path)
