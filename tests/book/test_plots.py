"""Figures a reader reads: the Part II schematic, the token diagram and the figures fixed for it.

Every figure returns a matplotlib Figure whose every text is at least 9 pt;
the schematic marks a late apply; the paired-scores axes' tick labels do not
overlap.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from pargrad.book import plots  # noqa: E402

SMALLEST_POINTS = 9


def drawn_texts(figure):
    """Every non-empty Text artist of ``figure`` after drawing it (tick labels exist only then)."""
    figure.canvas.draw()
    return [text for text in figure.findobj(Text) if text.get_visible() and text.get_text().strip()]


def paired_scores_figure():
    """Final losses between 0.035 and 0.6: the range in which the old log ticks overlapped."""
    rng = np.random.default_rng(0)
    one = np.exp(rng.uniform(np.log(0.035), np.log(0.6), 30))
    return plots.paired_scores({
        "rate 0.03": ("4 workers", one * np.exp(rng.normal(0.05, 0.1, 30)), "1 worker", one),
        "8 workers": ("8 workers", one * np.exp(rng.normal(1.0, 0.7, 30)), "1 worker", one),
    })


def race_curves_figure():
    """Three methods, five seeds each, accuracy rising along a virtual clock."""
    rng = np.random.default_rng(0)
    results = [{"method": method, "time": np.arange(0.0, 50.0, 5.0),
                "accuracy": 1 - 0.5 * np.exp(-np.arange(10) / (2 + i) + rng.normal(0, 0.1, 10))}
               for i, method in enumerate(("sync", "sync, 1 backup", "async")) for _ in range(5)]
    return plots.race_curves(results, title="equal devices", target=0.9)


def memory_against_replicas_figure():
    """Four stages' bytes a device against 1-8 replicas, as the sharded-training chapter draws them."""
    formula = {s: {n: 4 * 1153 * (4 - s) // n + 4 * 1153 * s for n in range(1, 9)} for s in range(4)}
    counted = {s: {n: formula[s][n] for n in (1, 2, 4, 8)} for s in range(4)}
    return plots.memory_against_replicas(counted, formula)


FIGURES = {
    "sync_async_timelines": plots.sync_async_timelines,
    "sharded_step_diagram": plots.sharded_step_diagram,
    "memory_against_replicas": memory_against_replicas_figure,
    "token_weighting_diagram": plots.token_weighting_diagram,
    "paired_scores": paired_scores_figure,
    "race_curves": race_curves_figure,
}


@pytest.mark.parametrize("name", FIGURES)
def test_figure_text_is_at_least_9_points(name):
    figure = FIGURES[name]()
    try:
        assert isinstance(figure, matplotlib.figure.Figure)
        small = [(text.get_text(), text.get_fontsize()) for text in drawn_texts(figure)
                 if text.get_fontsize() < SMALLEST_POINTS]
        assert not small, f"{name}: text under {SMALLEST_POINTS} pt: {small}"
    finally:
        plt.close(figure)


def test_schematic_marks_waiting_and_a_stale_read():
    figure = plots.sync_async_timelines()
    try:
        labels = [text.get_text() for text in drawn_texts(figure)]
    finally:
        plt.close(figure)
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


def test_token_diagram_states_both_means():
    losses = plots._diagram_losses()
    everything = np.concatenate(losses)
    means = [np.concatenate(losses[:2]).mean(), np.concatenate(losses[2:]).mean()]
    assert abs(np.mean(means) - everything.mean()) > 0.1   # the diagram shows a visible gap
    figure = plots.token_weighting_diagram()
    try:
        text = "\n".join(t.get_text() for t in drawn_texts(figure))
    finally:
        plt.close(figure)
    assert f"= {np.mean(means):.3f}" in text
    assert f"= {everything.mean():.3f} = the big batch's" in text
    assert f"{len(everything)}" in text


def test_paired_scores_tick_labels_do_not_overlap():
    figure = paired_scores_figure()
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        for ax in figure.axes:
            low, high = ax.get_xlim()
            labels = [label for label in ax.xaxis.get_ticklabels(which="both")
                      if label.get_visible() and label.get_text()
                      and low <= label.get_position()[0] <= high]
            boxes = sorted((label.get_window_extent(renderer) for label in labels),
                           key=lambda box: box.x0)
            assert len(boxes) >= 2
            assert all(left.x1 <= right.x0 for left, right in zip(boxes, boxes[1:]))
    finally:
        plt.close(figure)


def test_devices_diagram_links_every_logical_device_to_every_core_in_readable_text():
    names = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    figure = plots.logical_devices_diagram(names, cores=2)
    try:
        texts = drawn_texts(figure)
        labels = {text.get_text() for text in texts}
        assert {"CPU:0", "CPU:1", "CPU:2", "core 0", "core 1"} <= labels
        assert "after pargrad.logical_devices(3)" in labels
        arrows = [a for a in figure.axes[1].texts if isinstance(a, matplotlib.text.Annotation)]
        assert len(arrows) == len(names) * 2
        assert min(text.get_fontsize() for text in texts) >= SMALLEST_POINTS
    finally:
        plt.close(figure)


def font_sizes_set_in(path):
    """``(line, value)`` of every ``fontsize=``/``labelsize=``/``size=`` keyword in a Python file."""
    import ast

    tree = ast.parse(path.read_text())
    return [(node.lineno, ast.unparse(keyword.value)) for node in ast.walk(tree)
            if isinstance(node, ast.Call) for keyword in node.keywords
            if keyword.arg in ("fontsize", "labelsize", "size")]


def test_no_figure_code_sets_a_font_under_9_points():
    # Matplotlib's defaults (10 pt text, "medium" ticks and legends) are readable;
    # what can make a text small is a size set by hand: a number under 9 or a
    # relative size ("small" is 8.3 pt at the default 10).
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    files = [root / "pargrad" / "book" / "plots.py", *sorted((root / "chapters").glob("*.py"))]
    small = []
    for path in files:
        for line, value in font_sizes_set_in(path):
            readable = value.replace(".", "", 1).isdigit() and float(value) >= SMALLEST_POINTS
            named = value.strip("'\"") in ("medium", "large", "x-large", "xx-large", "larger")
            if not (readable or named or value.isidentifier()):
                small.append(f"{path.name}:{line}: {value}")
    assert not small, f"font sizes under {SMALLEST_POINTS} pt: {small}"
