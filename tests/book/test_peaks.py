"""pargrad.book.peaks: the memory probes of the chapters "Accumulation in TF2 and across replicas"
and "Accumulation in depth"."""

import keras
import pytest

from pargrad.book import peaks


def test_peak_memory_validates_its_arguments():
    with pytest.raises(ValueError, match="increasing"):
        peaks.peak_memory([256, 64], 16)
    with pytest.raises(ValueError, match="micro_batch_size"):
        peaks.peak_memory([64], micro_batch_size=0)


@pytest.mark.parametrize("width", [16, 1024])
def test_parameter_bytes_are_the_probe_models_float32_parameters(width):
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width),
                              keras.layers.Dense(width), keras.layers.Dense(10)])
    assert peaks.probe_parameter_bytes(width) == 4 * model.count_params()


@pytest.mark.parametrize("arguments", [dict(accumulation_steps=0), dict(accumulation_steps=2.0),
                                       dict(accumulation_steps=True), dict(accumulation_steps=2,
                                                                           micro_batch=0)])
def test_bad_arguments_are_refused_before_any_process_starts(arguments):
    with pytest.raises((TypeError, ValueError), match="whole number >= 1"):
        peaks.sync_update_peak_memory(**arguments)


def test_a_wider_model_raises_the_peak_more():
    small = peaks.sync_update_peak_memory(1, width=64)
    large = peaks.sync_update_peak_memory(1, width=1024)
    assert small["device"] in ("CPU", "GPU")
    if large["resettable"]:
        assert large["rise_mb"] > small["rise_mb"]


def test_the_whole_batch_peak_grows_faster_than_the_accumulated_one():
    measured = peaks.peak_memory([64, 4096], 64)
    assert measured["device"] in ("CPU", "GPU")
    assert len(measured["whole_mb"]) == len(measured["accumulated_mb"]) == 2
    if measured["resettable"]:
        whole = measured["whole_mb"][1] - measured["whole_mb"][0]
        accumulated = measured["accumulated_mb"][1] - measured["accumulated_mb"][0]
        assert whole > accumulated


@pytest.mark.parametrize("arguments", [dict(replica_counts=(1, 0)), dict(replica_counts=(2.0,)),
                                       dict(optimizer="sgd")])
def test_counted_state_table_refuses_bad_arguments_before_any_process_starts(arguments):
    with pytest.raises((TypeError, ValueError), match="whole number|optimizer"):
        peaks.counted_state_table(**arguments)


@pytest.mark.parametrize("arguments", [dict(stages=(4,)), dict(stages=()), dict(stages=(1.0,)),
                                       dict(width=0), dict(steps=True)])
def test_stage_peaks_refuses_bad_arguments_before_any_process_starts(arguments):
    with pytest.raises((TypeError, ValueError), match="whole number|stages"):
        peaks.stage_peaks(**arguments)


def test_the_peak_probe_model_has_50_million_parameters_in_8_layers():
    assert peaks.PEAK_LAYERS >= 8 and peaks.peak_parameters() >= 50_000_000


def test_the_prediction_adds_state_gradient_forms_and_activations():
    row = {"stage": 3, "parameters": 1000, "counted": {"total": 16_000}, "layers": 8,
           "per_replica": 4, "width": 10}
    whole = peaks.predicted_peak_bytes(row)
    assert whole == {"state": 16_000, "gradient_forms": 4 * 2 * 4000, "owners_sums": 4000,
                     "built_model": 4000, "activations": 4 * 4 * 8 * 4 * 10,
                     "total": 16_000 + 32_000 + 4000 + 4000 + 5_120}
    unit = peaks.predicted_peak_bytes(dict(row, unit_bytes=500))
    assert unit["gradient_forms"] == 4 * 2 * 500 and unit["owners_sums"] == 500
    assert peaks.predicted_peak_bytes(dict(row, stage=2, unit_bytes=500))["owners_sums"] == 4000
    counted = peaks.predicted_peak_bytes(dict(row, transient_bytes=1234))
    assert counted["gradient_forms"] == 4 * 1234
    mirrored = peaks.predicted_peak_bytes(dict(row, stage=0))
    assert mirrored["gradient_forms"] == 4 * 4000 and mirrored["owners_sums"] == 0
    assert mirrored["built_model"] == 0         # the mirrored run's model is its state


def test_small_runs_hold_what_the_formula_counts():
    from pargrad import memory

    rows = peaks.stage_peaks((0, 3), width=64, layers=8, steps=2)
    for stage, row in zip((0, 3), rows):
        assert row["stage"] == stage and row["parameters"] == peaks.peak_parameters(64, 8)
        per_device = memory.state_bytes(row["parameters"], replicas=peaks.REPLICAS, stage=stage)
        assert row["counted"]["total"] == peaks.REPLICAS * per_device["total"]
        assert row["peak_mb"] >= 0 and row["idle_mb"] >= 0
        # The trainer's count of a step's tensors at stage 3: three copies of the largest unit.
        if stage == 3:
            assert row["transient_bytes"] == 3 * row["unit_bytes"] == 3 * 4 * (64 * 64 + 64)
