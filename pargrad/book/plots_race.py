"""The figures of the chapters "Sync vs async in the same time" and "The race in depth".

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np


def race_curves(results, key="accuracy", ax=None, title=None, target=None, xlabel="time",
                ylim=None):
    """Test accuracy (or ``key="loss"``) against time, one line a method.

    ``results`` are :func:`pargrad.book.race.race` results of one scenario,
    several seeds a method: the line is the median over the seeds of the
    value at each moment (a checkpoint's value holds until the next), the
    band spans the lowest and the highest seed.  ``target`` draws the
    time-to-target line.  Drawn in the chapter "Sync vs async in the same time".
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.4))
    methods = {}
    for result in results:
        methods.setdefault(result["method"], []).append(result)
    end = max(float(r["time"][-1]) for r in results)
    grid = np.linspace(0.0, end, 400)
    for index, (method, runs) in enumerate(methods.items()):
        values = np.array([
            np.asarray(r[key], float)[np.clip(np.searchsorted(r["time"], grid, side="right") - 1,
                                              0, len(r["time"]) - 1)]
            for r in runs])
        style = ("-" if method.startswith("sync") else ":" if method.startswith("sequential")
                 else "--")
        ax.plot(grid, np.median(values, axis=0), style, color=f"C{index}", linewidth=2,
                label=f"{method} ({len(runs)} seeds)", zorder=3)
        if len(runs) > 1:  # faint, so that overlapping bands do not merge into one wash
            ax.fill_between(grid, values.min(axis=0), values.max(axis=0), color=f"C{index}",
                            alpha=0.07, linewidth=0)
    if target is not None:
        ax.axhline(target, color="black", linewidth=0.8, linestyle=":")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy" if key == "accuracy" else f"test {key}")
    if title:
        ax.set_title(title, fontsize=11)
    ax.legend(fontsize=9)
    return ax.figure


def time_to_target_chart(table, ax=None, title="Time to the target accuracy", unit="time"):
    """DAWNBench's measure as a chart: one row a (scenario, method).

    ``table`` is :func:`pargrad.book.race.time_to_target_table`'s result; a dot
    marks each seed's time, a bar the median; a seed that never reached the
    target is drawn at the right edge as an ×.  Drawn in the chapter "The race in depth".
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.32 * len(table) + 1.0))
    finite = [t for row in table for t in row["times"] if np.isfinite(t)]
    edge = 1.08 * max(finite) if finite else 1.0
    scenarios = list(dict.fromkeys(row["scenario"] for row in table))
    labels = []
    for i, row in enumerate(table):
        color = f"C{scenarios.index(row['scenario'])}"
        if np.isfinite(row["median"]):
            ax.barh(i, row["median"], color=color, alpha=0.35, height=0.7)
        times = np.asarray(row["times"], float)
        ax.plot(times[np.isfinite(times)], [i] * int(np.isfinite(times).sum()), "o",
                color=color, markersize=3)
        ax.plot([edge] * int((~np.isfinite(times)).sum()), [i] * int((~np.isfinite(times)).sum()),
                "x", color="black", markersize=5)
        labels.append(f"{row['scenario']}: {row['method']}")
    ax.set_yticks(range(len(table)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, edge * 1.03)
    ax.set_xlabel(f"{unit} to the target (× : never, within the budget)")
    ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure
