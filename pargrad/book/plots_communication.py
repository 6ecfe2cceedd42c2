"""The figures of the chapters "What communication costs", "Communicating rarely" and its depth page.

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np

from pargrad.book.replay import AVERAGE, NESTEROV


def _node(ax, xy, label, color="#dbe9f6"):
    """A replica (or a server) of :func:`communication_patterns`: a labelled circle."""
    ax.add_patch(plt.Circle(xy, 0.17, color=color, ec="black", zorder=3))
    ax.text(*xy, label, ha="center", va="center", zorder=4, fontsize=10)


def _arrow(ax, start, end, text=None, style="-", color="black", bend=0.0):
    """A message of :func:`communication_patterns`, with what it carries written at its middle."""
    ax.annotate("", xy=end, xytext=start, zorder=2,
                arrowprops=dict(arrowstyle="-|>", linestyle=style, color=color, lw=1.4,
                                shrinkA=13, shrinkB=13, connectionstyle=f"arc3,rad={bend}"))
    if text:
        middle = (np.asarray(start) + np.asarray(end)) / 2
        ax.text(*middle, text, ha="center", va="center", fontsize=9,
                bbox=dict(fc="white", ec="none", pad=0.5), zorder=3)


def _ring_panel(ax, replicas):
    """The ring: every replica sends n/R to its right neighbour."""
    angles = np.pi / 2 - 2 * np.pi * np.arange(replicas) / replicas
    ring = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    for r in range(replicas):
        _node(ax, ring[r], f"r{r}")
        _arrow(ax, ring[r], ring[(r + 1) % replicas], "n/R", bend=-0.25)
    ax.set_title(f"ring: 2(R-1) = {2 * (replicas - 1)} steps,\neach replica sends n/R a step")


def _tree_panel(ax, replicas):
    """The tree: pairs at distance 1, 2, 4, ... reduce the whole n, round by round."""
    levels = int(np.ceil(np.log2(replicas)))
    spots = np.stack([np.linspace(-1.2, 1.2, replicas), np.full(replicas, -0.9)], axis=1)
    for r in range(replicas):
        _node(ax, spots[r], f"r{r}")
    for level in range(levels):
        distance = 2 ** level
        height = 0.35 + 0.55 * level
        for receiver in range(0, replicas, 2 * distance):
            sender = receiver + distance
            if sender < replicas:
                top_r = spots[receiver] + [0, height]
                top_s = spots[sender] + [0, height]
                ax.plot(*np.stack([spots[sender], top_s, top_r]).T, color="black", lw=1.2)
                _arrow(ax, top_r + [0.02, 0], spots[receiver] + [0.0, 0.0])
                ax.text(*(top_r + top_s) / 2 + [0, 0.09], f"round {level + 1}: n",
                        ha="center", fontsize=9)
    ax.text(0, 1.05, "reduce up (solid), then the same rounds\nback down as a broadcast",
            ha="center", fontsize=9)
    ax.set_title(f"tree: 2·ceil(log2 R) = {2 * levels} rounds,\neach of the whole n")


def _server_panel(ax, replicas):
    """The parameter server: every worker pushes n and pulls n back."""
    server = np.array([0.0, 0.9])
    workers = np.stack([np.linspace(-1.2, 1.2, replicas), np.full(replicas, -0.9)], axis=1)
    _node(ax, server, "ps", color="#f6e3c6")
    for w in range(replicas):
        _node(ax, workers[w], f"w{w}")
        _arrow(ax, workers[w], server, "push n" if w == 0 else None, bend=0.12)
        _arrow(ax, server, workers[w], "pull n" if w == replicas - 1 else None, style="--",
               bend=0.12)
    ax.set_title("parameter server (S = 1): its link\ncarries W·n in and W·n out")


def communication_patterns(replicas=4, title="Who sends what, in one all-reduce"):
    """Ring, tree and parameter server side by side (chapter "What communication costs").

    Ring: every replica sends a chunk of n/R to its right neighbour in each
    of 2(R-1) steps.  Tree: pairs at distance 1, 2, 4, ... reduce (solid)
    and then broadcast (dashed) the whole n.  Parameter server: every worker
    pushes n to the server and pulls n back.
    """
    figure, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, panel in zip(axes, (_ring_panel, _tree_panel, _server_panel)):
        panel(ax, replicas)
    for ax in axes:
        ax.set_xlim(-1.6, 1.6)
        ax.set_ylim(-1.45, 1.6)
        ax.set_aspect("equal")
        ax.axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def alpha_beta_fits(fits, title="Measured time against payload, and the fitted α + n/β lines"):
    """Each setting's measured times and fitted line (top) and relative residuals (bottom).

    ``fits`` maps a label to a :class:`pargrad.cost.LinkFit` (chapter "What
    communication costs").
    """
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.2), sharex=True,
                                         gridspec_kw={"height_ratios": [2.2, 1]})
    for (label, fit), color in zip(fits.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        sizes = np.geomspace(max(fit.nbytes.min(), 1), fit.nbytes.max(), 100)
        top.loglog(fit.nbytes, fit.seconds * 1e3, "o", color=color, label=label)
        top.loglog(sizes, fit.predict(sizes) * 1e3, "-", color=color, alpha=0.7)
        bottom.semilogx(fit.nbytes, 100 * fit.relative_residuals, "o-", color=color)
    top.set_ylabel("milliseconds")
    top.set_title(title)
    top.legend(fontsize=9)
    bottom.axhline(0, color="gray", lw=0.8)
    bottom.set_ylabel("residual (%)")
    bottom.set_xlabel("payload per replica (bytes)")
    figure.tight_layout()
    return figure


def dial_figure(curves, histories, fast, slow, step_seconds, shown=(1, 16, 256)):
    """The dial: loss against updates, bytes sent, and modelled time on a ``fast`` and a ``slow`` link.

    ``curves[H]`` is a dict of loss curves (one value a round, for example
    the median over seeds), one per outer step
    (:data:`pargrad.book.replay.OUTERS`); ``histories[H]`` the
    :class:`pargrad.LocalSGDHistory` of a trainer run with that ``H``,
    which gives every axis: its updates, its bytes (summed over rounds) and
    its clock charged on each link (:meth:`~pargrad.LocalSGDHistory.clock_on`).
    Only the ``H`` of ``shown`` are drawn, one distinct colour each (local
    SGD dashed, DiLoCo solid), so that every line can be told apart.
    Taught in the chapter "Communicating rarely".
    """
    missing = [steps for steps in shown if steps not in curves or steps not in histories]
    if missing:
        raise ValueError(f"shown must name H values that curves and histories hold, got "
                         f"{missing} missing; pass some of {sorted(curves)}.")
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharey=True)
    colours = ["#1b6ca8", "#d1495b", "#2a9d3f", "#8c564b", "#6a3d9a"]
    styles = {AVERAGE: ("--", "local SGD"), NESTEROV: ("-", "DiLoCo")}
    at_every_step = {AVERAGE: "synchronous SGD", NESTEROV: "synchronous SGD with momentum"}
    for colour, steps in zip(colours, shown):
        history = histories[steps]
        axes_x = [history.updates, np.cumsum(history.bytes_sent),
                  history.clock_on(fast, step_seconds), history.clock_on(slow, step_seconds)]
        for outer, curve in curves[steps].items():
            style, name = styles[outer]
            for ax, xs in zip(axes.flat, axes_x):
                ax.plot(xs, curve, style, color=colour, lw=1.8,
                        label=at_every_step[outer] if steps == 1 else f"{name}, H = {steps}")
    titles = ["(a) against local steps a replica", "(b) against bytes each replica sent",
              f"(c) modelled time: {fast.name}", f"(d) modelled time: {slow.name}"]
    labels = ["local steps a replica", "bytes sent a replica", "seconds", "seconds"]
    for ax, title, label in zip(axes.flat, titles, labels):
        ax.set(xscale="log", yscale="log")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(label, fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("loss on all points\n(median over seeds)", fontsize=10)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(shown), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def seeds_figure(experiments, titles, ylabel="loss on all points, last quarter of the time"):
    """Per-seed scores of every method, one panel an experiment (a strip of dots a method).

    ``experiments``: :class:`pargrad.book.experiments.Experiment` objects;
    a bar marks each method's median; ``ylabel`` names the score.  Drawn in the chapter "Communicating rarely in depth".
    """
    fig, axes = plt.subplots(1, len(experiments), figsize=(5 * len(experiments), 3.8),
                             squeeze=False)
    for ax, experiment, title in zip(axes[0], experiments, titles):
        names = list(experiment.scores)
        for i, name in enumerate(names):
            scores = np.asarray(experiment.scores[name])
            jitter = np.linspace(-0.15, 0.15, len(scores))
            ax.plot(i + jitter, scores, "o", ms=3, alpha=0.6)
            ax.plot([i - 0.25, i + 0.25], [np.median(scores)] * 2, "k-", lw=2)
        ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=9)
        ax.set(yscale="log", title=title, ylabel=ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
