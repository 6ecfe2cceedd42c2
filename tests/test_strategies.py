"""pargrad.strategies: the strategy, its all-reduce, and the checks and pieces every strategy trainer shares."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from pargrad.strategies import (
    DevicesNotReadyError,
    check_model_and_strategy,
    check_optimizer_in_scope,
    check_rate_or_optimizer,
    choose_cross_device_ops,
    gather_from_replicas,
    host_device,
    sync_strategy,
)


@pytest.mark.parametrize("kind, physical, expected", [
    ("CPU", [0, 0], "ReductionToOneDevice"),
    ("GPU", [0, 0, 0, 0], "ReductionToOneDevice"),   # logical GPUs of one GPU
    ("GPU", [0, 1], "NcclAllReduce"),                # a GPU each
    ("GPU", [0, 0, 1], "ReductionToOneDevice"),      # mixed: no NCCL on a shared GPU
    ("GPU", [0], "ReductionToOneDevice"),
])
def test_the_all_reduce_suits_the_devices(kind, physical, expected):
    assert type(choose_cross_device_ops(kind, physical)).__name__ == expected


def test_more_replicas_than_devices_is_refused():
    with pytest.raises(DevicesNotReadyError, match=r"pargrad.logical_devices\(8\)"):
        sync_strategy(8)


def small_model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


@pytest.mark.parametrize("trainer", ["SyncTrainer", "LocalSGDTrainer"])
def test_one_model_check_one_sentence_one_exception_type(trainer):
    strategy = sync_strategy(2)
    with pytest.raises(TypeError, match=f"{trainer} needs a tf.distribute strategy"):
        check_model_and_strategy(trainer, small_model(), None)
    with pytest.raises(TypeError, match=f"{trainer} needs a Keras model, got int"):
        check_model_and_strategy(trainer, 3, strategy)
    with pytest.raises(ValueError, match="no trainable variables yet"):
        check_model_and_strategy(trainer, keras.Sequential([keras.layers.Dense(1)]), strategy)
    with pytest.raises(ValueError, match="created outside this strategy's scope"):
        check_model_and_strategy(trainer, small_model(), strategy)
    with strategy.scope():
        check_model_and_strategy(trainer, small_model(), strategy)


def test_an_optimizer_is_checked_by_its_public_iterations_variable():
    strategy = sync_strategy(2)
    with pytest.raises(TypeError, match="outer_optimizer must be a Keras optimizer instance"):
        check_optimizer_in_scope("outer_optimizer", "adam", strategy)
    with pytest.raises(ValueError, match="The optimizer was created outside this strategy's"):
        check_optimizer_in_scope("optimizer", keras.optimizers.SGD(0.1), strategy)
    with strategy.scope():
        inside = keras.optimizers.SGD(0.1)
        scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    check_optimizer_in_scope("optimizer", inside, strategy)
    check_optimizer_in_scope("optimizer", scaled, strategy)
    with pytest.raises(ValueError, match="outside this strategy's scope"):
        check_optimizer_in_scope("optimizer", inside, sync_strategy(2))   # another strategy


def test_a_rate_beside_an_optimizer_is_one_sentence_for_every_trainer():
    check_rate_or_optimizer("SyncTrainer", None, 0.1)
    check_rate_or_optimizer("SyncTrainer", keras.optimizers.SGD(0.1), None)
    for trainer in ("SyncTrainer", "LocalSGDTrainer", "AsyncTrainer"):
        with pytest.raises(ValueError, match=rf"^pass the learning rate to the optimizer, not to "
                                             rf"{trainer}: keras.optimizers.Adam\(learning_rate=0.5\)"):
            check_rate_or_optimizer(trainer, keras.optimizers.Adam(0.1), 0.5)



def test_an_optimizer_of_the_wrong_type_is_named_before_any_rate_advice():
    """a string beside a rate: the type is wrong (TypeError), not the rate advice."""
    with pytest.raises(TypeError, match=r"inner_optimizer must be a Keras optimizer instance or "
                                        r"None, got 'adam'.*AdamW"):
        check_rate_or_optimizer("LocalSGDTrainer", "adam", 0.01, name="inner_optimizer",
                                example="keras.optimizers.AdamW(1e-3)", in_scope=False)


def test_every_replica_gathers_every_replicas_value_even_an_infinite_one():
    strategy = sync_strategy(2)
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant([1.0, np.inf]) * tf.cast(
            context.replica_id_in_sync_group + 1, tf.float32))

    @tf.function
    def gather():
        return strategy.run(lambda v: gather_from_replicas(v, 2), args=(values,))

    for result in strategy.experimental_local_results(gather()):
        np.testing.assert_array_equal(result.numpy(), [[1.0, np.inf], [2.0, np.inf]])


def test_the_host_is_the_cpu_of_the_replicas_process():
    assert tf.DeviceSpec.from_string(host_device(sync_strategy(2))).device_type == "CPU"
