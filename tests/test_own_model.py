"""Issue 14 for SyncTrainer: a reader's own model and data, as a Keras user brings them.

One test (or a few) per item of the issue; each docstring names its item.
Every test failed on the code before the issue (the trainer cast nothing,
ignored ``model.losses``, had no ``epochs=``, ``validation_data=``,
``metrics=`` or ``callbacks=``, took no ``tf.data.Dataset`` and kept its
position in a Python int), except where a docstring says it guards
behaviour that was already right.  The session has 4 logical devices
(tests/conftest.py); the trainers here use 2 of them.
"""

import gc
import pathlib

import keras
import numpy as np
import pytest

import pargrad
import tensorflow as tf
from pargrad.book import digits
from pargrad.sync import SyncTrainer, sync_strategy
from pargrad.training import NonFiniteLossError

# Runs are compared bit for bit, so with deterministic kernels (not all of a GPU's are by default).
pytestmark = pytest.mark.usefixtures("deterministic_ops")

TRUE_KERNEL = np.array([[1.0], [-2.0], [0.5]], np.float32)


def regression_data(n=64, seed=0):
    """``n`` seeded points of y = x @ [1, -2, 0.5] + 0.25 + noise, y of shape (n, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = (x @ TRUE_KERNEL + 0.25 + 0.01 * rng.standard_normal((n, 1))).astype(np.float32)
    return x, y


def regression_model(*layers, inputs=3, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), *layers, keras.layers.Dense(1)])


def trainer(build=regression_model, replicas=2, **options):
    strategy = sync_strategy(replicas)
    with strategy.scope():
        model = build()
        metrics = options.pop("metrics", None)
        metrics = metrics() if callable(metrics) else metrics
        optimizer = options.pop("optimizer", None)
        optimizer = optimizer() if callable(optimizer) else optimizer
    given = {name: value for name, value in (("metrics", metrics), ("optimizer", optimizer))
             if value is not None}
    return SyncTrainer(model, strategy, progress=False, **given, **options)


def weights(trainer_or_model):
    model = getattr(trainer_or_model, "model", trainer_or_model)
    return [np.array(w) for w in model.get_weights()]


def assert_same(a, b):
    assert len(a) == len(b)
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p, q)


def max_gap(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


# -- targets of shape (N,) ----------------------------------------------------

@pytest.mark.parametrize("loss", [None, "mse"])
def test_targets_of_shape_n_train_as_n_by_1(loss):
    """y of shape (N,) for a one-output model trains exactly as (N, 1)."""
    x, y = regression_data()
    column, flat = trainer(loss=loss, learning_rate=0.1), trainer(loss=loss, learning_rate=0.1)
    column.fit(x, y, steps=50)
    flat.fit(x, y[:, 0], steps=50)
    assert_same(weights(flat), weights(column))
    assert np.allclose(weights(flat)[0], TRUE_KERNEL, atol=0.05)    # it learned the line


@pytest.mark.claim
def test_one_replica_matches_keras_fit_with_mse():
    """with (N,) targets, SyncTrainer(loss="mse") on 2 replicas matches Keras fit."""
    x, y = regression_data()
    steps = 50
    sync = trainer(loss="mse", learning_rate=0.1)
    sync.fit(x, y[:, 0], steps=steps)
    model = regression_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y[:, 0], batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    assert max_gap(weights(sync), weights(model)) < pargrad.rounding_tolerance("float32", steps)


def test_targets_and_predictions_of_other_shapes_are_named_in_the_error():
    """targets the default loss cannot pair with the predictions: both shapes named."""
    x, y = regression_data()
    with pytest.raises(ValueError, match=r"shape \(32, 3\).*shape \(32, 1\)"):
        trainer().fit(x, np.repeat(y, 3, axis=1), steps=1)


# -- regularization --------------------------------------------------------------

@pytest.mark.claim
def test_regularization_counts_once_over_the_replicas():
    """model.losses join the loss, divided by the replicas (counted once in all)."""
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([
            keras.Input((3,)), keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.5))])

    x, y = regression_data()
    steps, rate = 30, 0.05
    regularized = trainer(build, learning_rate=rate)
    history = regularized.fit(x, y, steps=steps)
    # The same on one device, by hand: mean squared error + the L2 penalty.
    reference = build()
    optimizer = keras.optimizers.SGD(rate)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(y - reference(x, training=True)), -1))
            loss += tf.add_n(reference.losses)
        optimizer.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                                      reference.trainable_variables))
    tolerance = pargrad.rounding_tolerance("float32", steps, scale=4)
    assert max_gap(weights(regularized), weights(reference)) < tolerance
    plain = trainer(learning_rate=rate)
    plain.fit(x, y, steps=steps)
    assert max_gap(weights(regularized), weights(plain)) > 0.1   # the penalty shrank the kernel
    assert np.abs(weights(regularized)[0]).sum() < np.abs(weights(plain)[0]).sum()
    assert history.loss[-1] > 0.1                                 # the loss includes the penalty


# -- training mode ----------------------------------------------------------------

def test_the_model_runs_in_training_mode():
    """dropout is on in a training step (guards behaviour that was already right)."""
    def build():
        return regression_model(keras.layers.Dense(16), keras.layers.Dropout(0.9))

    x, y = regression_data()
    dropped = trainer(build, learning_rate=0.0)    # no update: the loss at the start
    history = dropped.fit(x, y, steps=1)
    inference = float(np.mean(np.sum((y - dropped.model(x, training=False).numpy()) ** 2, -1)))
    assert abs(history.loss[0] - inference) > 1e-3


# -- dtypes ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["float64", "int64", "list"])
def test_float64_integer_and_list_targets_train(kind):
    """NumPy's default float64, integers and Python lists train like float32 arrays."""
    x, y = regression_data()
    y = np.round(y * 4)      # whole numbers of quarters: exact in every dtype (and as ints x 4)
    reference = trainer()
    reference.fit(x, y, steps=5)
    if kind == "float64":
        targets = y.astype(np.float64)
    elif kind == "int64":
        targets = y.astype(np.int64)
    else:
        targets = y.tolist()
    other = trainer()
    other.fit(x.astype(np.float64) if kind == "float64" else x, targets, steps=5)
    assert_same(weights(other), weights(reference))


def test_mixed_float16_trains_with_loss_scaling():
    """a mixed_float16 policy works; the optimizer gets Keras's loss scaling."""
    x, y = regression_data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = trainer(lambda: regression_model(keras.layers.Dense(8)), learning_rate=0.05)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(mixed.optimizer, keras.optimizers.LossScaleOptimizer)
    history = mixed.fit(x, y[:, 0], steps=40)
    assert np.isfinite(history.loss).all() and history.loss[-1] < history.loss[0] / 4


# -- non-finite losses -----------------------------------------------------------------

MARK = 1234.0


def divides_by_zero_at_mark(y, prediction):
    """Squared error, divided by 0 for a target equal to MARK: finite data, an infinite loss."""
    return tf.square(y - prediction) / tf.cast(tf.not_equal(y, MARK), y.dtype)


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_a_non_finite_loss_stops_before_its_update(steps_per_call):
    """an infinite loss in replica 1's shard at step 2 raises, naming step 2 and replica 1.

    The data are finite (a NaN in the data is refused before any step:
    tests/test_data_checks.py); the loss divides by zero for one example.
    """
    x, y = regression_data(32)
    y[21] = MARK                # batch 8, 2 replicas: step 2 is rows 16..23, replica 1 rows 20..23
    broken = trainer(loss=divides_by_zero_at_mark)
    with pytest.raises(NonFiniteLossError, match="replica 1 is inf at step 2") as caught:
        broken.fit(x, y, steps=4, batch_size=8, steps_per_call=steps_per_call)
    assert (caught.value.step, caught.value.who) == (2, "replica 1")
    assert "stop_on_non_finite=False" in str(caught.value)
    reference = trainer(loss=divides_by_zero_at_mark)
    reference.fit(x, y, steps=2, batch_size=8)
    assert_same(weights(broken), weights(reference))           # step 2 was not applied
    assert broken.position.numbers()["step"] == 2


def test_stop_on_non_finite_false_trains_on():
    """stop_on_non_finite=False trains on, as Keras does (NaN weights)."""
    x, y = regression_data(32)
    y[3] = np.inf
    history = trainer(stop_on_non_finite=False).fit(x, y, steps=2)
    assert not np.isfinite(history.loss).all()


# -- resuming ----------------------------------------------------------------------------

def test_a_resumed_run_is_bit_equal_to_an_uninterrupted_one(tmp_path):
    """10 steps, checkpoint, restore into a NEW trainer, 10 steps == 20 steps, exactly."""
    x, y = regression_data(40)
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731  (state beyond the weights)
    whole = trainer(optimizer=adam)
    whole.fit(x, y, steps=20, batch_size=8)

    first = trainer(optimizer=adam)
    first.fit(x, y, steps=10, batch_size=8)
    path = tf.train.Checkpoint(model=first.model, optimizer=first.optimizer,
                               trainer=first).save(str(tmp_path / "run"))
    second = trainer(optimizer=adam, )
    keras.utils.set_random_seed(7)                  # other weights, before the restore
    second.model.set_weights([w + 1 for w in second.model.get_weights()])
    tf.train.Checkpoint(model=second.model, optimizer=second.optimizer,
                        trainer=second).restore(path).assert_consumed()
    assert second.position.numbers()["position"] == 80 % 40
    second.fit(x, y, steps=10, batch_size=8)
    assert_same(weights(second), weights(whole))


def test_resuming_shuffled_epochs_is_bit_equal(tmp_path):
    """epochs with seeded shuffling: 2 epochs, restore, 2 epochs == 4 epochs."""
    x, y = regression_data(48)
    whole = trainer()
    whole.fit(x, y, epochs=4, batch_size=8, seed=3)
    first = trainer()
    first.fit(x, y, epochs=2, batch_size=8, seed=3)
    path = tf.train.Checkpoint(model=first.model, optimizer=first.optimizer,
                               trainer=first).save(str(tmp_path / "run"))
    second = trainer()
    tf.train.Checkpoint(model=second.model, optimizer=second.optimizer,
                        trainer=second).restore(path)
    history = second.fit(x, y, epochs=2, batch_size=8)   # the seed comes from the checkpoint
    assert history.epoch == [2, 3]
    assert_same(weights(second), weights(whole))


# -- errors that say what to pass --------------------------------------------------------

@pytest.mark.parametrize("loss", ["mse", "mean_squared_error", keras.losses.MeanSquaredError()])
def test_keras_loss_names_and_objects_train_as_the_default_loss(loss):
    """loss="mse" and a Keras loss object train as the default squared error."""
    x, y = regression_data()
    named, default = trainer(loss=loss), trainer()
    named.fit(x, y[:, 0], steps=3)
    default.fit(x, y, steps=3)
    assert_same(weights(named), weights(default))


@pytest.mark.parametrize("call, error, message", [
    (lambda t, x, y: t.fit(x, y, steps=1, batch_size=16.0), TypeError, "pass 16"),
    (lambda t, x, y: t.fit(x[:0], y[:0], steps=1), ValueError, "x has no examples"),
    (lambda t, x, y: t.fit(x, y[:10], steps=1), ValueError, "64 examples but y has 10"),
    (lambda t, x, y: t.fit(np.array([["a", "b", "c"]] * 64), y, steps=1), TypeError,
     "not numbers"),
    (lambda t, x, y: t.fit(x, y), ValueError, "exactly one of steps= .* and epochs="),
    (lambda t, x, y: t.fit(x, y, steps=2, epochs=2), ValueError, "exactly one of steps="),
    (lambda t, x, y: t.fit(x, y, steps=2, shuffle=True), ValueError, "shuffle=True needs epochs="),
    (lambda t, x, y: t.fit(x[:63], y[:63], epochs=1, batch_size=30), ValueError,
     "last batch of 3, which does not split"),
    (lambda t, x, y: t.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), y, steps=1),
     ValueError, "pass no y"),
    (lambda t, x, y: t.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(7), steps=1),
     ValueError, "batch of 7 examples.*drop_remainder=True"),
    (lambda t, x, y: t.fit(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8),
                           epochs=1), ValueError, "pass steps=N"),
    (lambda t, x, y: t.fit(x, y, steps=1, validation_data=x), TypeError, r"\(x_val, y_val\)"),
])
def test_bad_fit_input_says_what_to_pass(call, error, message):
    """each bad input raises an error that says what to pass instead."""
    x, y = regression_data()
    with pytest.raises(error, match=message):
        call(trainer(), x, y)


@pytest.mark.parametrize("options, error, message", [
    (dict(loss=3), TypeError, "a Keras loss name such as 'mse'"),
    (dict(loss=keras.losses.MeanSquaredError), TypeError, r"MeanSquaredError\(\)"),
    (dict(loss="no_such_loss"), ValueError, "knows no loss"),
    (dict(metrics=["accuracy"]), TypeError, "Keras metric objects"),
    (dict(optimizer="adam"), TypeError, "Keras optimizer instance"),
    (dict(stop_on_non_finite="yes"), TypeError, "True or False"),
])
def test_bad_trainer_arguments_say_what_to_pass(options, error, message):
    """bad constructor arguments are refused with what to pass."""
    with pytest.raises(error, match=message):
        trainer(**options)


def test_metrics_made_outside_the_scope_are_refused():
    """a metric whose variables are not the strategy's cannot be summed over replicas."""
    with pytest.raises(ValueError, match="create it inside"):
        trainer(metrics=[keras.metrics.MeanAbsoluteError()])


# -- tf.data, epochs, validation, metrics, callbacks ---------------------------------------

@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_a_dataset_of_batches_trains_as_the_arrays(steps_per_call):
    """a tf.data.Dataset of the same global batches gives bit-equal weights."""
    x, y = regression_data()
    arrays, dataset = trainer(), trainer()
    arrays.fit(x, y, steps=10, batch_size=16)       # 4 batches a pass: wraps around
    data = tf.data.Dataset.from_tensor_slices((x, y[:, 0])).batch(16)
    dataset.fit(data, steps=6, steps_per_call=steps_per_call)
    dataset.fit(data, steps=4, steps_per_call=steps_per_call)   # continues with batch 3
    assert_same(weights(dataset), weights(arrays))


def test_epochs_of_a_dataset_and_of_arrays_agree():
    """epochs= over a dataset (one pass each) equals epochs= over arrays unshuffled."""
    x, y = regression_data()
    arrays, dataset = trainer(), trainer()
    a = arrays.fit(x, y, epochs=3, batch_size=16, shuffle=False)
    d = dataset.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=3)
    assert_same(weights(dataset), weights(arrays))
    assert a.epoch == d.epoch == [0, 1, 2] and len(d.loss) == 12
    np.testing.assert_array_equal(a.history["loss"], d.history["loss"])


def test_seeded_shuffling_is_reproducible_and_the_seed_matters():
    """shuffle=True with a seed: the same seed, the same run; another seed, another."""
    x, y = regression_data()
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        t = trainer()
        t.fit(x, y, epochs=2, batch_size=16, seed=seed)
        runs[name] = weights(t)
    assert_same(runs["a"], runs["b"])
    assert max_gap(runs["a"], runs["c"]) > 0


def digits_trainer(**options):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                 keras.layers.Dense(10)])

    return trainer(build, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=lambda: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                   optimizer=lambda: keras.optimizers.Adam(1e-2), **options)


def test_validation_and_metrics_per_epoch_like_keras():
    """history.history has loss, accuracy, val_loss and val_accuracy per epoch."""
    x_train, y_train, x_test, y_test = digits.digits_data(seed=0)
    t = digits_trainer()
    history = t.fit(x_train[:1344], y_train[:1344], epochs=3, batch_size=64, seed=0,
                    validation_data=(x_test, y_test))
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert all(len(values) == 3 for values in history.history.values())
    assert history.history["val_accuracy"][-1] > 0.85
    # The metric is summed over the replicas: it equals accuracy on all of the test set.
    logits = t.model(x_test, training=False).numpy()
    assert history.history["val_accuracy"][-1] == pytest.approx(
        np.mean(logits.argmax(1) == y_test), abs=1e-6)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y_test, logits)
    assert history.history["val_loss"][-1] == pytest.approx(float(loss), rel=1e-5)


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin", self.params["epochs"], self.model is not None))

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("batch_end", batch, "loss" in logs))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, sorted(logs)))

    def on_train_end(self, logs=None):
        self.calls.append(("train_end",))


def test_keras_callbacks_get_the_calls_of_keras_fit_by_epochs():
    """a keras.callbacks.Callback sees the calls and logs that Keras fit makes."""
    x, y = regression_data()
    recorder = Recorder()
    trainer().fit(x, y, epochs=2, batch_size=32, shuffle=False, callbacks=[recorder],
                  validation_data=(x[:8], y[:8]))
    keys = ["loss", "val_loss"]
    assert recorder.calls == [
        ("train_begin", 2, True),
        ("epoch_begin", 0), ("batch_end", 0, True), ("batch_end", 1, True),
        ("epoch_end", 0, keys),
        ("epoch_begin", 1), ("batch_end", 0, True), ("batch_end", 1, True),
        ("epoch_end", 1, keys), ("train_end",)]


class BatchRecorder(keras.callbacks.Callback):
    """The batch indices and the names in the batch logs, in the order of the calls."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch, sorted(logs)))


@pytest.mark.parametrize("per_call", [1, 2])
def test_fit_by_steps_gives_callbacks_the_batch_indices_and_logs_keras_fit_gives(per_call):
    """With steps=, batches are numbered 0 .. n-1 and their logs carry the metrics, as Keras's."""
    x, y = regression_data()
    keras_model = regression_model()
    keras_model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse",
                        metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
                        steps_per_execution=per_call)
    expected = BatchRecorder()
    keras_model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat(),
                    steps_per_epoch=4, epochs=1, verbose=0, shuffle=False, callbacks=[expected])
    recorded = BatchRecorder()
    trainer(metrics=lambda: [keras.metrics.MeanAbsoluteError(name="mae")]).fit(
        x, y, steps=4, batch_size=16, steps_per_call=per_call, callbacks=[recorded])
    assert recorded.calls == expected.calls
    assert [call[1] for call in recorded.calls if call[0] == "end"] == list(
        range(per_call - 1, 4, per_call))


def test_early_stopping_and_terminate_on_nan_stop_the_fit():
    """model.stop_training is honoured (EarlyStopping, TerminateOnNaN)."""
    x, y = regression_data()
    # A validation set the model cannot improve on: EarlyStopping ends early.
    history = trainer(learning_rate=0.1).fit(
        x, y, epochs=50, batch_size=32, shuffle=False, validation_data=(x, -y),
        callbacks=[keras.callbacks.EarlyStopping(patience=1)])
    assert 2 <= len(history.epoch) < 50
    y_bad = y.copy()
    y_bad[40] = np.nan
    history = trainer(stop_on_non_finite=False).fit(
        x, y_bad, epochs=5, batch_size=32, shuffle=False,
        callbacks=[keras.callbacks.TerminateOnNaN()])
    assert len(history.loss) == 2 and history.epoch == [0]


def test_model_checkpoint_and_tensorboard_write_their_files(tmp_path):
    """ModelCheckpoint saves the model, TensorBoard writes event files."""
    x, y = regression_data()
    path = tmp_path / "best.weights.h5"
    t = trainer()
    t.fit(x, y, epochs=2, batch_size=32, shuffle=False, validation_data=(x, y), callbacks=[
        keras.callbacks.ModelCheckpoint(str(path), save_weights_only=True),
        keras.callbacks.TensorBoard(log_dir=str(tmp_path / "logs"))])
    assert path.exists()
    restored = regression_model()
    restored.load_weights(str(path))
    assert_same(weights(restored), weights(t))
    assert list(pathlib.Path(tmp_path / "logs").rglob("events.out.tfevents.*"))


def test_dataset_iterators_never_hang_after_fit(run_python):
    """fit on a dataset twice, delete the trainer, collect: no hang (TF 2.21's
    garbage-collected multi-device iterator), in a fresh process with a time limit."""
    completed = run_python("""
        import gc
        import keras, numpy as np, pargrad
        import tensorflow as tf
        pargrad.logical_devices(2)
        strategy = pargrad.sync_strategy(2)
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        x = np.random.default_rng(0).standard_normal((64, 3)).astype("float32")
        data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16).prefetch(2)
        trainer = pargrad.SyncTrainer(model, strategy, progress=False)
        trainer.fit(data, steps=3)
        trainer.fit(data, epochs=2, validation_data=data)
        gc.collect()
        alive = [o for o in gc.get_objects() if isinstance(o, tf.data.Iterator)]
        assert not alive, alive
        del trainer
        gc.collect()
        print("finished")
    """, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().endswith("finished")


def test_a_dataset_read_by_steps_resumes_exactly_from_a_checkpoint(tmp_path):
    """a dataset read by steps resumes at its next batch after a restore."""
    x, y = regression_data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    whole = trainer()
    whole.fit(data, steps=10)
    first = trainer()
    first.fit(data, steps=5)
    path = tf.train.Checkpoint(model=first.model, optimizer=first.optimizer,
                               trainer=first).save(str(tmp_path / "run"))
    second = trainer()
    tf.train.Checkpoint(model=second.model, optimizer=second.optimizer,
                        trainer=second).restore(path)
    second.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), steps=5)
    assert_same(weights(second), weights(whole))


def test_no_iterator_survives_a_failing_fit():
    """a fit that stops with an error leaves no iterator behind."""
    x, y = regression_data()
    y[40] = MARK
    t = trainer(loss=divides_by_zero_at_mark)
    with pytest.raises(NonFiniteLossError):
        t.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).prefetch(2), epochs=1)
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, tf.data.Iterator)]
    assert t.position.numbers()["epoch_step"] == 2


def test_what_a_loss_function_returns_is_read_as_keras_reads_it():
    """a scalar is the batch's mean; extra axes are averaged per example."""
    y, prediction = tf.constant([[1.0], [3.0]]), tf.constant([[0.0], [0.0]])
    scalar = pargrad.per_example_loss(lambda t, p: tf.reduce_mean(tf.square(t - p)))
    np.testing.assert_allclose(scalar(y, prediction).numpy(), [5.0, 5.0])
    per_output = pargrad.per_example_loss(lambda t, p: tf.square(t - p))    # shape (2, 1)
    np.testing.assert_allclose(per_output(y, prediction).numpy(), [1.0, 9.0])
    flat = pargrad.per_example_loss("mse")(tf.constant([1.0, 3.0]), prediction)  # y of (N,)
    np.testing.assert_allclose(flat.numpy(), [1.0, 9.0])


def test_fit_arguments_after_y_are_keyword_only():
    """fit(x, y, 64) is refused: a Keras user means a batch of 64, not 64 updates."""
    x, y = regression_data()
    with pytest.raises(TypeError, match="positional"):
        trainer().fit(x, y, 64)


def test_an_optimizer_and_a_learning_rate_together_are_refused():
    """The optimizer carries its own rate; a second one would be ignored silently."""
    strategy = sync_strategy(2)
    with strategy.scope():
        model = regression_model()
        optimizer = keras.optimizers.SGD(1e-3)
    message = r"pass the learning rate to the optimizer.*SGD\(learning_rate=0.5\)"
    with pytest.raises(ValueError, match=message):
        SyncTrainer(model, strategy, optimizer=optimizer, learning_rate=0.5)


def test_evaluate_returns_the_loss_and_metrics_of_the_whole_data():
    """evaluate gives {"loss", metrics} in inference mode, as Keras's evaluate(return_dict=True)."""
    x, y = regression_data()
    t = trainer(loss="mse", metrics=lambda: [keras.metrics.MeanAbsoluteError(name="mae")])
    t.fit(x, y, steps=3, batch_size=16)
    result = t.evaluate(x, y, batch_size=16)
    error = y - t.model(x, training=False).numpy()
    assert sorted(result) == ["loss", "mae"]
    assert result["loss"] == pytest.approx(float(np.mean(error ** 2)), rel=1e-5)
    assert result["mae"] == pytest.approx(float(np.mean(np.abs(error))), rel=1e-5)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(10)
    assert t.evaluate(batches) == pytest.approx(result, rel=1e-5)
