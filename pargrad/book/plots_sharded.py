"""The figures of the chapter "When the model does not fit".

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker


def sharded_step_diagram(replicas=4, title="One step of sharded training, replica by replica"):
    """Who holds what in one step of ZeRO stage 2: reduce-scatter, update, all-gather.

    Rows are replicas, columns the ``replicas`` equal parts of the
    parameters; replica ``r`` owns part ``r``.  Four panels: every replica's
    own gradient (all parts), the reduce-scatter (each owner holds the sum
    of its part only), the owner's update of its part with the optimizer
    state it alone keeps, and the all-gather (every replica holds the new
    weights).  A drawing, not a measurement.  (Chapter "When the model does
    not fit".)
    """
    n = int(replicas)
    if n < 2:
        raise ValueError(f"replicas must be at least 2 to draw a sharded step, got {replicas!r}.")
    own = np.eye(n, dtype=bool)
    panels = [
        ("1. gradients\n(own shard of the batch)", np.ones((n, n), bool), "#9ecae1",
         lambda r, c: f"g{r}"),
        ("2. reduce-scatter\n(owner gets the sum)", own, "#3182bd", lambda r, c: "Σg"),
        ("3. owner updates its part\n(its optimizer state)", own, "#e6550d", lambda r, c: "w′"),
        ("4. all-gather\n(everyone gets the new w)", np.ones((n, n), bool), "#31a354",
         lambda r, c: "w′"),
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(2.35 * len(panels), 0.55 * n + 1.7))
    for ax, (label, held, colour, text) in zip(axes, panels):
        for r in range(n):
            for c in range(n):
                ax.add_patch(plt.Rectangle((c - 0.45, r - 0.45), 0.9, 0.9,
                                           facecolor=colour if held[r, c] else "white",
                                           edgecolor="#555555", linewidth=0.8))
                if held[r, c]:
                    ax.text(c, r, text(r, c), ha="center", va="center", fontsize=9,
                            color="white" if colour != "#9ecae1" else "black")
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_ylim(n - 0.4, -0.6)
        ax.set_aspect("equal")
        ax.set_xticks(range(n))
        ax.set_xticklabels([f"part {c}" if n <= 2 else f"p{c}" for c in range(n)], fontsize=9)
        ax.set_yticks(range(n))
        ax.set_yticklabels([f"replica {r}" for r in range(n)] if ax is axes[0] else [],
                           fontsize=9)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_title(label, fontsize=9)
    figure.suptitle(title + f": replica r owns part r of {n}", fontsize=10)
    figure.tight_layout()
    return figure


def memory_against_replicas(counted, formula, unit=2**10, unit_name="KiB",
                            title="Training state a device holds, counted and by the formula"):
    """Bytes a device holds against the replicas, one line a ZeRO stage (0 = data parallelism).

    ``counted`` maps a stage to ``{replicas: bytes}`` counted from the
    variables a device holds (drawn as points); ``formula`` maps a stage to
    ``{replicas: bytes}`` from :func:`pargrad.memory.state_bytes` (drawn as
    lines).  Both axes are logarithmic.  (Chapter "When the model does not fit".)
    """
    figure, ax = plt.subplots(figsize=(6.2, 3.9))
    colours = ["#555555", "#3182bd", "#e6550d", "#31a354"]
    names = {0: "data parallel", 1: "stage 1", 2: "stage 2", 3: "stage 3"}
    for stage in sorted(formula):
        colour = colours[stage % len(colours)]
        replicas = sorted(formula[stage])
        ax.plot(replicas, [formula[stage][n] / unit for n in replicas], color=colour,
                linewidth=1.6, label=names.get(stage, f"stage {stage}"))
        if stage in counted:
            points = sorted(counted[stage])
            ax.plot(points, [counted[stage][n] / unit for n in points], "o", color=colour,
                    markersize=6, markerfacecolor="white", markeredgewidth=1.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    every = sorted({n for lines in formula.values() for n in lines})
    ax.set_xticks(every)
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%d"))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.tick_params(labelsize=9)
    ax.set_xlabel("replicas N", fontsize=10)
    ax.set_ylabel(f"{unit_name} a device", fontsize=10)
    ax.set_title(title, fontsize=10)
    ax.plot([], [], "o", color="#333333", markerfacecolor="white", label="counted")
    ax.legend(fontsize=9, frameon=False, loc="lower left")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
    figure.tight_layout()
    return figure
