"""pargrad.book.digits: the offline classification task of the sync-vs-async chapter."""

import numpy as np
import pytest

from pargrad.book import digits


def test_the_split_is_fixed_by_the_seed_and_stratified():
    first = digits.digits_data(seed=3)
    again = digits.digits_data(seed=3)
    other = digits.digits_data(seed=4)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])
    x_train, y_train, x_test, y_test = first
    assert x_train.shape[1] == 64 and len(x_train) + len(x_test) == 1797
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    counts = np.bincount(y_test, minlength=10)
    assert counts.min() >= 43 and counts.max() <= 46  # about 45 of each of the 10 classes


def test_bad_test_fraction_is_refused():
    with pytest.raises(ValueError, match="test_fraction must be a share strictly between 0 and 1"):
        digits.digits_data(test_fraction=1.5)
    with pytest.raises(TypeError, match="test_fraction must be a share"):
        digits.digits_data(test_fraction="a quarter")


def test_the_model_is_seeded_and_accuracy_counts_correct_labels():
    a, b = digits.digits_model(seed=1), digits.digits_model(seed=1)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    logits = np.array([[0.0, 2.0], [3.0, 1.0], [0.0, 1.0]])
    assert digits.accuracy(logits, None, [1, 0, 0]) == pytest.approx(2 / 3)


def test_time_to_target_is_the_first_time_the_target_is_reached():
    times = [1.0, 2.0, 3.0, 4.0]
    assert digits.time_to_target(times, [0.5, 0.91, 0.89, 0.95], 0.9) == 2.0
    assert digits.time_to_target(times, [0.5, 0.6, 0.7, 0.8], 0.9) == float("inf")
    with pytest.raises(ValueError, match="increasing"):
        digits.time_to_target([2.0, 1.0], [0.1, 0.2], 0.5)


def test_cross_entropy_of_a_confident_right_answer_is_small():
    logits = np.array([[10.0, 0.0], [0.0, 10.0]], np.float32)
    assert float(digits.cross_entropy(np.array([0, 1]), logits)) < 1e-3
    assert float(digits.cross_entropy(np.array([1, 0]), logits)) > 9


def test_the_loss_per_example_is_minus_the_log_softmax_of_the_label_and_its_mean_the_loss():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], np.float32)
    labels = np.array([[0], [2]])                     # a column of labels, as the targets come
    per_example = digits.cross_entropy_per_example(labels, logits).numpy()
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(per_example, -log_softmax[[0, 1], [0, 2]], rtol=1e-6)
    assert float(digits.cross_entropy(labels, logits)) == pytest.approx(per_example.mean(), rel=1e-6)
