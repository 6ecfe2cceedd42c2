"""pargrad.data without a strategy: finite data, sources, the per-epoch order, grouped calls, the position."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from pargrad.data import (
    EpochReader,
    Feed,
    NonFiniteDataError,
    TrainingPosition,
    check_finite_data,
    epoch_permutation,
    first_non_finite_row,
    fit_source,
    host_rows,
    validation_source,
)


def test_the_first_non_finite_row_is_found_in_any_shape():
    images = np.zeros((5, 4, 4, 1), np.float32)
    images[3, 2, 1, 0] = np.inf
    images[4, 0, 0, 0] = np.nan
    assert first_non_finite_row(images) == (3, np.inf)
    assert first_non_finite_row(np.arange(6).reshape(3, 2)) is None      # integers: finite
    with pytest.raises(NonFiniteDataError, match=r"nan at row 1 of y(.|\n)*np.isfinite"):
        check_finite_data(np.zeros((2, 1)), np.array([[0.0], [np.nan]]))


def model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def arrays(n=10):
    x = np.arange(2 * n, dtype="float32").reshape(n, 2)
    return x, x[:, :1] * 10


def read(reader):
    """Every call of one epoch (or of the steps) as (first_row, batch_size, steps, rows of x)."""
    out = []
    with contextlib.closing(reader.calls()) as calls:
        for call in calls:
            out.append((call.first_row, call.batch_size, call.steps, call.x.numpy()[:, 0]))
            reader.advance(call, call.steps)
    return out


def test_the_per_epoch_permutation_depends_on_seed_and_epoch_only():
    first = epoch_permutation(3, 0, 50)
    assert sorted(first) == list(range(50))
    np.testing.assert_array_equal(first, epoch_permutation(3, 0, 50))
    assert not np.array_equal(first, epoch_permutation(3, 1, 50))
    assert not np.array_equal(first, epoch_permutation(4, 0, 50))


def test_arrays_by_steps_are_read_in_order_and_continue_where_they_stopped():
    x, y = arrays(10)
    feed, position = Feed(), TrainingPosition()
    source = fit_source(x, y, 4, by_epoch=False, shuffle=False, model=model(), feed=feed)
    calls = read(EpochReader(source, position, feed, steps_per_call=2, steps=3))
    assert [(c[0], c[1], c[2]) for c in calls] == [(0, 4, 2), (8, 4, 1)]
    assert position.numbers()["position"] == (0 + 3 * 4) % 10 == 2
    assert position.numbers()["step"] == 3 and position.numbers()["epoch_step"] == 0
    again = read(EpochReader(source, position, feed, steps=1))
    assert again[0][0] == 2


def test_an_epoch_of_arrays_ends_with_a_smaller_batch_and_is_grouped_by_steps_per_call():
    x, y = arrays(10)
    feed, position = Feed(), TrainingPosition()
    source = fit_source(x, y, 4, by_epoch=True, shuffle=False, model=model(), feed=feed)
    calls = read(EpochReader(source, position, feed, steps_per_call=5))
    assert [(c[0], c[1], c[2]) for c in calls] == [(0, 4, 2), (8, 2, 1)]
    assert position.numbers()["epoch_step"] == 3


def test_a_shuffled_epoch_uses_the_permutation_of_its_seed_and_number():
    x, y = arrays(10)
    feed, position = Feed(), TrainingPosition()
    position.draw_seed(7)
    position.epoch.assign(2)
    source = fit_source(x, y, 5, by_epoch=True, shuffle=True, model=model(), feed=feed)
    rows = read(EpochReader(source, position, feed, shuffle=True))[0][3]
    np.testing.assert_array_equal(rows, x[epoch_permutation(7, 2, 10), 0])


def test_an_epoch_resumes_at_its_next_step():
    x, y = arrays(12)
    feed, position = Feed(), TrainingPosition()
    position.epoch_step.assign(2)
    source = fit_source(x, y, 4, by_epoch=True, shuffle=False, model=model(), feed=feed)
    assert [c[0] for c in read(EpochReader(source, position, feed))] == [8]


def test_a_dataset_groups_equal_batches_and_starts_again_when_read_by_steps():
    x, y = arrays(10)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)      # 4, 4, 2
    feed, position = Feed(), TrainingPosition()
    source = fit_source(dataset, None, None, by_epoch=True, shuffle=False, model=model(),
                        feed=feed)
    reader = EpochReader(source, position, feed, steps_per_call=3)
    assert [(c[1], c[2]) for c in read(reader)] == [(4, 2), (2, 1)]
    assert reader.iterator is None
    by_steps = EpochReader(source, TrainingPosition(), feed, steps=5)
    assert [c[3][0] for c in read(by_steps)] == [0, 8, 16, 0, 8]     # again from the start
    assert by_steps.position.numbers()["position"] == 2


def test_a_batch_that_does_not_split_over_the_replicas_is_refused():
    x, y = arrays(10)
    feed = Feed(replicas=2, accumulation_steps=2)
    with pytest.raises(ValueError, match="multiple of 4"):
        fit_source(x, y, 6, by_epoch=False, shuffle=False, model=model(), feed=feed)
    with pytest.raises(ValueError, match="last batch of 2"):
        fit_source(x, y, 8, by_epoch=True, shuffle=False, model=model(), feed=feed)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(3)
    source = fit_source(dataset, None, None, by_epoch=True, shuffle=False, model=model(),
                        feed=feed)
    with pytest.raises(ValueError, match="drop_remainder=True"):
        read(EpochReader(source, TrainingPosition(), feed))


def test_a_non_finite_dataset_batch_is_refused_after_the_steps_before_it():
    x, y = arrays(8)
    x[5, 0] = np.nan
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    feed = Feed(finite_hint="Pass stop_on_non_finite=False.")
    source = fit_source(dataset, None, None, by_epoch=True, shuffle=False, model=model(),
                        feed=feed)
    reader, seen = EpochReader(source, TrainingPosition(), feed), []
    with pytest.raises(ValueError, match="row 1 of the dataset batch's features"):
        for call in reader.calls():
            seen.append(call.steps)
    assert seen == [1] and reader.iterator is None


@pytest.mark.parametrize("data, error, message", [
    (np.zeros(3), TypeError, r"\(x_val, y_val\)"),
    ((np.zeros((0, 2)), np.zeros((0, 1))), ValueError, "no examples"),
    ((np.zeros((4, 2)), np.zeros((3, 1))), ValueError, "4 examples but y has 3"),
])
def test_one_validation_data_check(data, error, message):
    with pytest.raises(error, match=message):
        validation_source(data, None, model())


def test_validation_arrays_are_cut_in_batches_of_at_most_their_length():
    x, y = arrays(10)
    assert validation_source((x, y), None, model()).batch_size == 10
    assert validation_source((x, y), 4, model()).batch_size == 4
    assert validation_source(None, None, model()) is None


def test_shuffle_with_steps_and_a_repeating_dataset_by_epoch_are_refused():
    x, y = arrays(10)
    with pytest.raises(ValueError, match="shuffle=True needs epochs="):
        fit_source(x, y, 5, by_epoch=False, shuffle=True, model=model(), feed=Feed())
    forever = tf.data.Dataset.from_tensor_slices((x, y)).batch(5).repeat()
    with pytest.raises(ValueError, match="pass steps=N"):
        fit_source(forever, None, None, by_epoch=True, shuffle=False, model=model(), feed=Feed())


def test_a_drawn_seed_is_kept_and_a_given_one_replaces_it():
    position = TrainingPosition()
    assert not position.has_seed()
    np.random.seed(0)
    position.draw_seed()
    drawn = position.numbers()["seed"]
    position.draw_seed()
    assert position.numbers()["seed"] == drawn >= 0
    position.draw_seed(5)
    assert position.numbers()["seed"] == 5


def test_the_position_follows_the_data_and_only_the_reader_moves_it():
    x, y = arrays(10)
    feed, position = Feed(), TrainingPosition()
    source = fit_source(x, y, 4, by_epoch=False, shuffle=False, model=model(), feed=feed)
    read(EpochReader(source, position, feed, steps=2))
    assert position.numbers()["position"] == 8
    read(EpochReader(source, position, feed, steps=1))          # the same arrays continue
    assert position.numbers()["position"] == 2
    other = fit_source(x.copy(), y, 4, by_epoch=False, shuffle=False, model=model(), feed=feed)
    reader = EpochReader(other, position, feed, steps=1)         # other arrays: row 0 again
    assert position.numbers()["position"] == 0 and position.numbers()["step"] == 3
    with contextlib.closing(reader.calls()) as calls:
        call = next(calls)
    reader.advance(call, 0)                                      # a call stopped at its first step
    assert position.numbers()["position"] == 0 and position.numbers()["step"] == 3


def test_host_rows_wrap_around_the_end_of_the_data():
    x, y = arrays(5)
    xb, yb = host_rows(tf.constant(x), tf.constant(y), 3, 4, "/CPU:0")
    np.testing.assert_array_equal(xb.numpy()[:, 0], x[[3, 4, 0, 1], 0])
    np.testing.assert_array_equal(yb.numpy()[:, 0], y[[3, 4, 0, 1], 0])
