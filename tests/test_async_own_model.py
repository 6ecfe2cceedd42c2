"""AsyncTrainer on a reader's own model and data: targets, losses, regularization, state, casts, errors, optimizers."""

import threading

import keras
import numpy as np
import pytest

import pargrad
from pargrad.asynchronous import AsyncTrainer, tf
from pargrad.book.parabola import squared_error
from pargrad.scenario import Scenario
from pargrad.training import NonFiniteLossError

from linear_problem import linear_data, linear_model, numpy_gradient

# Runs are compared bit for bit, so with deterministic kernels (not all of a GPU's are by default).
pytestmark = pytest.mark.usefixtures("deterministic_ops")

RATE = 0.05
TRUE_KERNEL = np.array([1.0, -2.0, 0.5])


def async_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pargrad-async")]


def regression_data(n=64):
    """``n`` seeded points of y = x @ [1, -2, 0.5] + 0.1 + noise; y of shape (n,), float64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    return x, x @ TRUE_KERNEL + 0.1 + 0.01 * rng.standard_normal(n)


def regression_model(*layers, seed=0, **dense):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(shape=(3,)), *layers, keras.layers.Dense(1, **dense)])


def keras_fit(model, x, y, steps, optimizer=None):
    """What Keras fit does with loss="mse", the whole data as one batch a step."""
    model.compile(optimizer or keras.optimizers.SGD(RATE), loss="mse")
    model.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    return model.get_weights()


# -- targets of shape (N,), and the loss in every form Keras takes ----

def test_targets_of_shape_n_train_as_keras_fit_with_mse(devices):
    """y of shape (N,) with pargrad.book.parabola.squared_error (the docstring's example) = Keras mse."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), squared_error, devices[:1], RATE,
                           progress=False)
    history = trainer.fit(x, y, steps=40)
    expected = keras_fit(regression_model(), x, y, 40)
    assert np.all(np.isfinite(history["loss"]))
    for got, want in zip(trainer.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    column = AsyncTrainer(regression_model(), squared_error, devices[:1], RATE,
                          progress=False)
    column.fit(x, y[:, None], steps=40)
    for got, want in zip(trainer.get_weights(), column.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("loss", [
    "mse", "mean_squared_error", keras.losses.MeanSquaredError(), keras.losses.mean_squared_error,
    squared_error, lambda y, p: tf.square(y - p)[:, 0],  # per example, reduced by the trainer
], ids=["mse", "mean_squared_error", "MeanSquaredError()", "function", "squared_error",
        "per-example lambda"])
def test_loss_takes_strings_keras_losses_and_callables(devices, loss):
    """The loss forms SyncTrainer takes (strings, Keras loss objects, callables) all train alike."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), loss, devices[:2], RATE, progress=False)
    trainer.fit(x, y, steps=20)
    reference = AsyncTrainer(regression_model(), squared_error, devices[:2], RATE,
                             progress=False)
    reference.fit(x, y[:, None], steps=20)
    for got, want in zip(trainer.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- the model's own losses (regularization) ---------------------------

@pytest.mark.claim
def test_regularization_is_in_each_workers_loss_at_the_parameters_it_read(devices):
    """model.losses (an L2 penalty) is added to each worker's loss, at its read parameters."""
    penalty = 0.3
    x, y = linear_data(12)
    model = linear_model()
    regularized = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(
        1, kernel_regularizer=keras.regularizers.L2(penalty))])
    regularized.set_weights(model.get_weights())
    trainer = AsyncTrainer(regularized, "mse", devices[:2], RATE, progress=False)
    history = trainer.fit(x, y, steps=6)
    # By hand, as in test_asynchronous.py: w[k+1] = w[k] - lr * g(w[read]), where
    # g now includes the penalty's gradient 2 * penalty * w at the read version.
    shards = [(x[0::2], y[0::2]), (x[1::2], y[1::2])]
    versions, losses = [model.get_weights()], []
    for k, read in enumerate([0, 0, 1, 2, 3, 4]):
        w, b = versions[-1]
        w_read, b_read = versions[read]
        dw, db = numpy_gradient(w_read, b_read, *shards[k % 2])
        dw = dw + 2 * penalty * w_read
        losses.append(np.mean((shards[k % 2][0] @ w_read + b_read - shards[k % 2][1]) ** 2)
                      + penalty * np.sum(w_read ** 2))
        versions.append((w - RATE * dw, b - RATE * db))
    np.testing.assert_allclose(trainer.get_weights()[0], versions[-1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.get_weights()[1], versions[-1][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], losses, rtol=1e-5)


# -- training mode --------------------------------------------------------

def test_dropout_is_active_and_each_worker_drops_its_own_units(devices):
    """The workers run the model with training=True, so Dropout drops units."""
    x, y = regression_data(32)
    x, y = np.repeat(x, 2, axis=0), np.repeat(y, 2)  # worker 0's shard = worker 1's shard

    def dropout_model():
        keras.utils.set_random_seed(0)  # before the Dropout layer draws its seed
        return regression_model(keras.layers.Dense(16, activation="relu"),
                                keras.layers.Dropout(0.5))

    trainer = AsyncTrainer(dropout_model(), "mse", devices[:2], RATE, progress=False)
    history = trainer.fit(x, y, steps=2)
    at_start = float(keras.losses.mean_squared_error(y[:, None], dropout_model()(x)).numpy().mean())
    # Both updates were computed at version 0, on the same examples: without
    # dropout their losses would both equal the inference-mode loss.
    assert history["read_version"].tolist() == [0, 0]
    assert history["loss"][0] != pytest.approx(at_start, rel=1e-4)
    assert history["loss"][0] != pytest.approx(history["loss"][1], rel=1e-4)
    # Scheduled runs repeat exactly, dropout masks included; a later fit draws new masks.
    again = AsyncTrainer(dropout_model(), "mse", devices[:2], RATE, progress=False)
    np.testing.assert_array_equal(again.fit(x, y, steps=2)["loss"], history["loss"])
    assert not np.array_equal(again.fit(x, y, steps=2)["loss"][:1], history["loss"][:1])
    # The trained model still predicts in inference mode: no dropout there.
    np.testing.assert_array_equal(trainer.model(x[:4]), trainer.model(x[:4]))


def test_batch_normalization_trains_on_batch_statistics_and_keeps_them(devices):
    """BatchNormalization normalises by the batch and updates its moving mean in training."""
    x, y = regression_data()
    x = x + 3.0  # features with mean 3: the moving mean must move away from 0
    model = regression_model(keras.layers.BatchNormalization(momentum=0.5))
    trainer = AsyncTrainer(model, "mse", devices[:2], RATE, progress=False)
    trainer.fit(x, y, steps=16)
    moving_mean = model.layers[0].moving_mean.numpy()
    np.testing.assert_allclose(moving_mean, x.mean(axis=0), atol=0.3)


# -- dtypes ---------------------------------------------------------------

def test_lists_integers_and_float64_are_cast_to_the_models_dtypes(devices):
    """Python lists, integer and float64 features and targets train as float32 arrays do."""
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, size=(24, 3))
    y = x @ np.array([1, -2, 1]) + 1  # integers
    reference = AsyncTrainer(regression_model(), "mse", devices[:2], 0.01, progress=False)
    reference.fit(x.astype(np.float32), y.astype(np.float32), steps=10)
    for features, targets in [(x.tolist(), y.tolist()), (x, y), (x.astype(np.float64), y * 1.0)]:
        trainer = AsyncTrainer(regression_model(), "mse", devices[:2], 0.01, progress=False)
        trainer.fit(features, targets, steps=10)
        for got, want in zip(trainer.get_weights(), reference.get_weights()):
            np.testing.assert_array_equal(got, want)


def test_a_mixed_float16_model_is_refused_with_what_to_do(devices):
    """Float16 gradients need loss scaling, which AsyncTrainer lacks: a clear refusal."""
    model = keras.Sequential([keras.Input(shape=(3,)),
                              keras.layers.Dense(4, dtype="mixed_float16"),
                              keras.layers.Dense(1, dtype="float32")])
    with pytest.raises(ValueError, match="float32.*policy"):
        AsyncTrainer(model, "mse", devices[:2], RATE, progress=False)


# -- a non-finite loss ------------------------------------------------------

@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_a_non_finite_loss_stops_training_naming_the_update_and_worker(devices, mode):
    """NonFiniteLossError names the update and the worker; no NaN is applied; no thread lives on."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], learning_rate=5.0,
                           progress=False)
    with pytest.raises(NonFiniteLossError) as caught:
        trainer.fit(x, y, steps=10**6, mode=mode)
    error = caught.value
    # Scheduled: the run stops right there.  Free-running: an update another
    # worker was already applying may still land.
    assert error.step <= trainer.version <= error.step + (mode == "free-running") < 10**6
    assert f"update {error.step}" in str(error) or f"step {error.step}" in str(error)
    assert "worker" in str(error.who) and str(error.who) in str(error)
    assert not np.isfinite(error.loss)
    assert all(np.all(np.isfinite(w)) for w in trainer.get_weights())
    for weight, parameter in zip(trainer.model.get_weights(), trainer.get_weights()):
        np.testing.assert_array_equal(weight, parameter)
    assert async_threads() == []


def test_the_caller_can_opt_out_and_train_on(devices):
    """stop_on_non_finite=False keeps the old behaviour: every update applied, NaN recorded."""
    x, y = regression_data()
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], learning_rate=5.0,
                           progress=False, stop_on_non_finite=False)
    history = trainer.fit(x, y, steps=200)
    assert trainer.version == 200
    assert not np.all(np.isfinite(history["loss"]))


# -- errors that say what to pass instead -------------------------------------

@pytest.mark.parametrize("bad, message", [
    (dict(loss="msee"), "msee"),
    (dict(loss=3), "loss"),
    (dict(loss=keras.losses.MeanSquaredError), "MeanSquaredError()"),
    (dict(optimizer=keras.optimizers.Adagrad(keras.optimizers.schedules.ExponentialDecay(
        0.1, 10, 0.9)), staleness_aware=True), "fixed rate"),
    (dict(optimizer="adagrad"), "keras.optimizers"),
    (dict(optimizer=keras.optimizers.SGD(0.1), learning_rate=0.1), "optimizer"),
    (dict(metrics=["accuracy"]), "keras.metrics"),
])
def test_bad_constructor_arguments_say_what_to_pass(devices, bad, message):
    """Unknown loss names, non-losses, optimizer and metric strings are refused clearly."""
    arguments = dict(model=regression_model(), loss="mse", devices=devices[:2])
    with pytest.raises((ValueError, TypeError), match=message):
        AsyncTrainer(**{**arguments, **bad})


@pytest.mark.parametrize("bad, message", [
    (dict(x=tf.data.Dataset.from_tensor_slices(np.zeros((8, 3)))), "arrays"),
    (dict(x=tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros(8))).batch(4),
          y=None), "arrays"),
    (dict(y=None), "targets y"),
    (dict(batch_size=16.0), "pass 16"),
    (dict(steps=2.5), "whole number"),
    (dict(x=np.zeros((0, 3)), y=np.zeros(0)), "no examples"),
    (dict(x=np.array([["a", "b", "c"]] * 8), y=np.zeros(8)), "not numbers"),
    (dict(y=np.zeros(5)), "one target row per example"),
    (dict(validation_data=np.zeros(3)), "validation_data"),
])
def test_bad_fit_inputs_say_what_to_pass(devices, bad, message):
    """A dataset, a float batch size, empty or string data get errors naming the fix."""
    x, y = regression_data(32)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:2], progress=False)
    arguments = dict(x=x, y=y, steps=3, batch_size=4)
    with pytest.raises((ValueError, TypeError), match=message):
        trainer.fit(**{**arguments, **bad})
    assert async_threads() == []


# -- a Keras optimizer, validation and metrics ----------------------------------

def test_a_keras_optimizer_trains_as_keras_does_with_slots_on_the_parameter_device(devices):
    """optimizer=keras.optimizers.Adagrad: Keras's update, slots on the parameter device."""
    x, y = regression_data()
    optimizer = keras.optimizers.Adagrad(0.1)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:1], optimizer=optimizer,
                           parameter_device=devices[1], progress=False)
    history = trainer.fit(x, y, steps=25)
    expected = keras_fit(regression_model(), x, y, 25, keras.optimizers.Adagrad(0.1))
    for got, want in zip(trainer.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    where = tf.DeviceSpec.from_string(devices[1])
    slots = [v for v in optimizer.variables if "accumulator" in v.path]
    assert len(slots) == 2  # one for the kernel, one for the bias
    for variable in slots:
        assert tf.DeviceSpec.from_string(variable.value.device).device_index == where.device_index
    assert int(optimizer.iterations) == trainer.version == 25
    np.testing.assert_allclose(history["learning_rate"], 0.1)


@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_optimizer_updates_are_atomic_and_staleness_is_recorded(devices, mode):
    """With a Keras optimizer every update is applied once, under the lock, with its staleness."""
    x, y = regression_data()
    optimizer = keras.optimizers.Adagrad(0.05)
    trainer = AsyncTrainer(regression_model(), "mse", devices[:4], optimizer=optimizer,
                           progress=False)
    history = trainer.fit(x, y, steps=40, batch_size=4, mode=mode,
                          scenario=Scenario((1.0,) * 4, jitter=0.5))
    assert trainer.version == int(optimizer.iterations) == 40
    assert history["applied_version"].tolist() == list(range(40))
    np.testing.assert_array_equal(history["staleness"],
                                  history["applied_version"] - history["read_version"])
    assert history["staleness"].max() > 0
    assert async_threads() == []


def test_staleness_aware_keras_sgd_is_the_plain_rule(devices):
    """staleness_aware divides the optimizer's rate by staleness + 1; with SGD = the plain path."""
    x, y = regression_data()
    options = dict(steps=30, batch_size=8, scenario=Scenario((1.0,) * 4, jitter=1.0), seed=4)
    plain = AsyncTrainer(regression_model(), "mse", devices[:4], learning_rate=0.1,
                         staleness_aware=True, progress=False)
    plain_history = plain.fit(x, y, **options)
    keras_sgd = AsyncTrainer(regression_model(), "mse", devices[:4], staleness_aware=True,
                             optimizer=keras.optimizers.SGD(0.1), progress=False)
    history = keras_sgd.fit(x, y, **options)
    assert plain_history["staleness"].max() > 0
    np.testing.assert_array_equal(history["staleness"], plain_history["staleness"])
    np.testing.assert_allclose(history["learning_rate"], 0.1 / (history["staleness"] + 1))
    for got, want in zip(keras_sgd.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["scheduled", "free-running"])
def test_validation_data_and_keras_metrics(devices, mode):
    """fit(validation_data=, validation_every=) and metrics= give val_loss and val_<metric>."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((120, 3)).astype(np.float32)
    labels = (x @ TRUE_KERNEL > 0).astype(np.int64)  # shape (N,), integers
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(2)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = AsyncTrainer(model, loss, devices[:2], learning_rate=0.5, progress=False,
                           metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    history = trainer.fit(x[:80], labels[:80], steps=12, batch_size=8,
                          validation_data=(x[80:], labels[80:]), validation_every=5, mode=mode)
    assert history["val_version"].tolist() == [5, 10, 12]
    assert len(history["loss"]) == 12
    logits = model(x[80:])
    np.testing.assert_allclose(history["val_loss"][-1], float(loss(labels[80:], logits)), rtol=1e-5)
    accuracy = np.mean(np.argmax(logits, axis=1) == labels[80:])
    assert history["val_accuracy"][-1] == pytest.approx(accuracy)
    assert history["val_accuracy"][-1] > 0.8
    assert async_threads() == []
