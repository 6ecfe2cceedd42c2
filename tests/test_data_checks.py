"""The trainers check the data themselves, and take every target a loss can take.

A NaN in the data is refused before any update uses it, whatever the kernels
would do with it (max-pooling on some CPUs returns the largest finite value of
a window holding a NaN, so a NaN image never reaches the loss there): these
tests put the NaN in a model without pooling and still look only at what the
trainer says and at the weights, not at the loss.  Integer targets shaped like
the predictions train like float targets in both trainers; an empty dataset is
refused.  The session has 4 logical devices (tests/conftest.py).
"""

import keras
import numpy as np
import pytest

import pargrad
import tensorflow as tf
from pargrad.asynchronous import AsyncTrainer
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer
from pargrad.training import NonFiniteDataError, check_finite_data, first_non_finite_row

# Runs are compared bit for bit, so with deterministic kernels (a GPU's are not by default).
pytestmark = pytest.mark.usefixtures("deterministic_ops")


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=(n, 1))
    return x, y


def sync_trainer(loss=None, replicas=2, **options):
    strategy = sync_strategy(replicas)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    return SyncTrainer(model, strategy, loss=loss, learning_rate=0.05, progress=False, **options)


def async_trainer(devices, loss=None, **options):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    return AsyncTrainer(model, loss, devices[:2], learning_rate=0.05, progress=False, **options)


def mean_squared(y, prediction):
    """A reader's own loss that does no casting of its own."""
    return tf.reduce_mean(tf.square(y - prediction))


# -- the data check ---------------------------------------------------------------

def test_the_first_non_finite_row_is_found_in_any_shape():
    images = np.zeros((5, 4, 4, 1), np.float32)
    images[3, 2, 1, 0] = np.inf
    images[4, 0, 0, 0] = np.nan
    assert first_non_finite_row(images) == (3, np.inf)
    assert first_non_finite_row(np.arange(6).reshape(3, 2)) is None      # integers: finite
    with pytest.raises(NonFiniteDataError, match=r"nan at row 1 of y(.|\n)*np.isfinite"):
        check_finite_data(np.zeros((2, 1)), np.array([[0.0], [np.nan]]))


@pytest.mark.parametrize("where", ["x", "y"])
def test_sync_refuses_non_finite_arrays_before_the_first_step_naming_the_row(where):
    x, y = data()
    y = y.astype(np.float32)
    (x if where == "x" else y)[17, 0] = np.nan
    trainer = sync_trainer()
    before = [w.copy() for w in trainer.model.get_weights()]
    with pytest.raises(NonFiniteDataError, match=f"row 17 of {where}(.|\\n)*stop_on_non_finite=False"):
        trainer.fit(x, y, steps=2, batch_size=16)
    for old, new in zip(before, trainer.model.get_weights()):
        np.testing.assert_array_equal(old, new)
    assert int(trainer.position.step.numpy()) == 0


def test_sync_trains_on_non_finite_data_when_asked():
    x, y = data()
    x[3, 1] = np.inf
    trainer = sync_trainer(stop_on_non_finite=False)
    history = trainer.fit(x, y.astype(np.float32), steps=2, batch_size=16)
    assert len(history.loss) == 2


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_sync_refuses_a_non_finite_dataset_batch_before_its_step(steps_per_call):
    x, y = data()
    x[21, 2] = np.nan                        # batch 2 (rows 16..23) of batches of 8
    dataset = tf.data.Dataset.from_tensor_slices((x, y.astype(np.float32))).batch(8)
    trainer = sync_trainer()
    with pytest.raises(NonFiniteDataError, match=r"row 5 of the dataset batch's features for step 2"):
        trainer.fit(dataset, steps=4, steps_per_call=steps_per_call)
    # The two batches before it were applied, the bad one was not.
    reference = sync_trainer()
    reference.fit(dataset.take(2), steps=2)
    for mine, theirs in zip(trainer.model.get_weights(), reference.model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    assert int(trainer.position.step.numpy()) == 2


def test_async_refuses_non_finite_arrays_naming_the_row(devices):
    x, y = data()
    x[9, 0] = -np.inf
    trainer = async_trainer(devices)
    before = [w.copy() for w in trainer.model.get_weights()]
    with pytest.raises(NonFiniteDataError, match=r"-inf at row 9 of x(.|\n)*stop_on_non_finite=False"):
        trainer.fit(x, y.astype(np.float32), steps=4)
    for old, new in zip(before, trainer.model.get_weights()):
        np.testing.assert_array_equal(old, new)
    history = async_trainer(devices, stop_on_non_finite=False).fit(
        np.nan_to_num(x, neginf=0.0), y.astype(np.float32), steps=4)
    assert len(history["loss"]) == 4


# -- integer targets and empty data ------------------------------------------------------

@pytest.mark.parametrize("loss", [None, mean_squared], ids=["default", "own function"])
def test_async_trains_on_integer_targets_as_on_floats(devices, loss):
    x, y = data()
    as_int = async_trainer(devices, loss).fit(x, y.astype(np.int64), steps=6, batch_size=8)
    as_float = async_trainer(devices, loss).fit(x, y.astype(np.float32), steps=6, batch_size=8)
    np.testing.assert_array_equal(as_int["loss"], as_float["loss"])


@pytest.mark.parametrize("loss", [None, mean_squared], ids=["default", "own function"])
def test_sync_trains_on_integer_targets_as_on_floats(loss):
    x, y = data()
    as_int = sync_trainer(loss).fit(x, y.astype(np.int64), steps=3, batch_size=16)
    as_float = sync_trainer(loss).fit(x, y.astype(np.float32), steps=3, batch_size=16)
    np.testing.assert_array_equal(as_int.loss, as_float.loss)


def test_class_indices_stay_integers_for_a_sparse_loss(devices):
    x, y = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    history = AsyncTrainer(model, "sparse_categorical_crossentropy", devices[:2],
                           learning_rate=0.05, progress=False).fit(x, y, steps=3)
    assert np.isfinite(history["loss"]).all()


@pytest.mark.parametrize("how", ["empty", "filtered to nothing"])
@pytest.mark.parametrize("length", ["steps", "epochs"])
def test_sync_refuses_an_empty_dataset(how, length):
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y.astype(np.float32))).batch(8)
    dataset = dataset.take(0) if how == "empty" else dataset.filter(lambda a, b: False)
    trainer = sync_trainer()
    with pytest.raises(ValueError, match="no batches"):
        trainer.fit(dataset, **{length: 1})


def test_accumulation_sums_the_sparse_gradients_of_an_embedding():
    strategy = sync_strategy(2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(10, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
    tokens = np.random.default_rng(0).integers(0, 10, size=(16, 4)).astype(np.int32)
    targets = np.ones((16, 1), np.float32)
    trainer = SyncTrainer(model, strategy, accumulation_steps=2, learning_rate=0.1, progress=False)
    history = trainer.fit(tokens, targets, steps=2, batch_size=8)
    assert np.isfinite(history.loss).all() and history.loss[1] < history.loss[0]
