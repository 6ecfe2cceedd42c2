"""pargrad.book.plots_synchronous: the Part II schematic, the ring, the measured timeline, the depth page's figures."""

import types

import numpy as np
import pytest
from figure_checks import assert_readable, closing, drawn_texts

from pargrad.book import plots_synchronous as plots


def test_the_schematic_is_readable_and_marks_waiting_and_a_late_apply():
    assert_readable("sync_async_timelines", plots.sync_async_timelines())
    with closing(plots.sync_async_timelines()) as figure:
        labels = [text.get_text() for text in drawn_texts(figure)]
    # the read was current; the apply came after the other device's update
    assert any(label.startswith("applied late") for label in labels)
    assert "waits" in labels


def test_schematic_schedule_waits_for_the_slowest_and_has_stale_updates():
    spans, ends = plots._schematic_sync_spans()
    fast, slow = np.argmin(plots.SCHEMATIC_COMPUTE), np.argmax(plots.SCHEMATIC_COMPUTE)
    waits = [span for span in spans if span[3] == "wait"]
    assert waits and all(device == fast for device, *_ in waits)
    assert all(device != slow for device, *_ in waits)
    assert len(ends) >= 2 and np.allclose(np.diff(ends), max(plots.SCHEMATIC_COMPUTE)
                                          + plots.SCHEMATIC_ALL_REDUCE)
    updates = plots._schematic_async_spans()
    assert updates[0][4] == 0                       # the first update is computed on fresh weights
    assert any(staleness > 0 for *_, staleness in updates)
    assert {device for device, *_ in updates} == {0, 1}
    counts = [sum(device == d for device, *_ in updates) for d in (fast, slow)]
    assert counts[0] > counts[1]                    # the fast device applies more often


def timed_history(stragglers, steps=5, replicas=3):
    """An instrumented history's per-replica times: launch, compute, wait, one row a step."""
    rng = np.random.default_rng(0)
    start = np.cumsum(rng.uniform(0.01, 0.02, steps))
    compute_start = start[:, None] + rng.uniform(0, 0.001, (steps, replicas))
    compute_end = compute_start + rng.uniform(0.003, 0.005, (steps, replicas))
    update_end = compute_end + rng.uniform(0.001, 0.002, (steps, replicas))
    return types.SimpleNamespace(start=start, step_time=update_end.max(axis=1) - start,
                                 compute_start=compute_start, compute_end=compute_end,
                                 update_end=update_end, compute=compute_end - compute_start,
                                 stragglers=stragglers)


@pytest.mark.parametrize("stragglers", [[], [1]], ids=["even", "one straggler"])
def test_the_timeline_draws_three_bars_a_replica_a_step_and_names_a_straggler(stragglers):
    history = timed_history(stragglers)
    with closing(plots.device_timeline(history, steps=range(2))) as figure:
        ax = figure.axes[0]
        assert len(ax.patches) == 2 * 3 * 3          # steps x replicas x (launch, compute, wait)
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        assert ("compute, straggler" in legend) == bool(stragglers)
        assert [label.get_text() for label in ax.get_yticklabels()] == [
            "replica 0", "replica 1", "replica 2"]
        bars = sorted(ax.patches, key=lambda bar: bar.get_x())
        assert bars[0].get_x() == pytest.approx(0.0)   # ms from the first step drawn
    assert_readable("device_timeline", plots.device_timeline(history))


def test_the_timeline_of_a_history_without_times_says_how_to_record_them():
    with pytest.raises(ValueError, match="record_times=True"):
        plots.device_timeline(types.SimpleNamespace(step_time=np.ones(4)))
