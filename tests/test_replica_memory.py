"""The memory probe of the chapter "Accumulate and distribute"."""

import keras
import pytest

from pargrad.book import replica_memory


@pytest.mark.parametrize("width", [16, 1024])
def test_parameter_bytes_are_the_probe_models_float32_parameters(width):
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width),
                              keras.layers.Dense(width), keras.layers.Dense(10)])
    assert replica_memory.probe_parameter_bytes(width) == 4 * model.count_params()


@pytest.mark.parametrize("arguments", [dict(accumulation_steps=0), dict(accumulation_steps=2.0),
                                       dict(accumulation_steps=True), dict(accumulation_steps=2,
                                                                           micro_batch=0)])
def test_bad_arguments_are_refused_before_any_process_starts(arguments):
    with pytest.raises(ValueError, match="whole number >= 1"):
        replica_memory.sync_update_peak_memory(**arguments)


def test_a_wider_model_raises_the_peak_more():
    small = replica_memory.sync_update_peak_memory(1, width=64)
    large = replica_memory.sync_update_peak_memory(1, width=1024)
    assert small["device"] in ("CPU", "GPU")
    if large["resettable"]:
        assert large["rise_mb"] > small["rise_mb"]
