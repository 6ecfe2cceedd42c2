"""The figures of the chapters "Asynchronous training" and "Stale gradients in depth".

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker


def async_timeline(history, ax=None, title="Who read and applied when"):
    """Each update as a bar from its read to its apply, one row a worker.

    ``history`` is what :meth:`pargrad.AsyncTrainer.fit` returned (an
    :class:`pargrad.asynchronous.AsyncHistory`); the number
    in a bar is that update's staleness.  Drawn in the chapter
    "Asynchronous training".
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * (int(np.max(history.worker)) + 1)))
    workers = np.asarray(history.worker)
    for worker, start, end, staleness in zip(workers, history.read_time, history.time,
                                             history.staleness):
        ax.barh(worker, end - start, left=start, height=0.6, color=f"C{worker % 10}",
                alpha=0.75, edgecolor="black")
        ax.text((start + end) / 2, worker, str(staleness), ha="center", va="center", fontsize=9)
    ax.set_yticks(range(int(workers.max()) + 1),
                  [f"d{w}" for w in range(int(workers.max()) + 1)])
    ax.invert_yaxis()
    ax.set_xlabel("time (read → apply); number = staleness")
    ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure


# The balls of :func:`stale_gradient` at t0, t1 and t2.
STALE_FILLS = ("black", "0.6", "white")


def _gradient_arrows(ax, weights, path, height, lift, readers):
    """The gradients read at t0, one arrow a reader, pointing downhill."""
    direction = np.sign(path[1] - path[0])
    span = 0.12 * (weights.max() - weights.min())
    for k, reader in enumerate(readers):
        y = height[0] + (4 + 3 * k) * lift
        ax.annotate("", xy=(path[0] + direction * span, y), xytext=(path[0], y),
                    arrowprops=dict(arrowstyle="-|>", color="0.3", lw=1.2))
        ax.text(path[0] + direction * 1.08 * span, y, reader, va="center", fontsize=9,
                ha="right" if direction < 0 else "left")


def _update_arrows(ax, weights, losses, path, height, lift, step_labels):
    """The updates t0 -> t1 -> ..., each a curved arrow with its label above it."""
    for i, label in enumerate(step_labels):
        bend = 0.4 if path[i + 1] < path[i] else -0.4
        ax.annotate(
            "", xy=(path[i + 1], height[i + 1] + lift), xytext=(path[i], height[i] + lift),
            arrowprops=dict(arrowstyle="-|>", color="C3", lw=1.5,
                            connectionstyle=f"arc3,rad={bend}", shrinkA=7, shrinkB=7),
        )
        middle = (path[i] + path[i + 1]) / 2
        ax.text(middle, np.interp(middle, weights, losses) + 0.2 * abs(path[i + 1] - path[i])
                * (losses.max() - losses.min()) / (weights.max() - weights.min()) + 6 * lift
                + 5 * lift * i, label, ha="center", color="C3", fontsize=9)


def _stale_panel(ax, weights, losses, path, title, step_labels, readers):
    """One panel of :func:`stale_gradient`: the curve, the balls at t0, t1, ..., the gradients, the steps."""
    path = np.asarray(path, float)
    height = np.interp(path, weights, losses)
    lift = 0.03 * (losses.max() - losses.min())
    lowest = weights[np.argmin(losses)]
    ax.plot(weights, losses, color="black", lw=1.5, zorder=1)
    ax.axvline(lowest, color="0.5", ls=":", lw=1)
    ax.text(lowest, losses.max(), " minimum", color="0.4", va="top", fontsize=9)
    _gradient_arrows(ax, weights, path, height, lift, readers)
    _update_arrows(ax, weights, losses, path, height, lift, step_labels)
    for i, (w, h) in enumerate(zip(path, height)):
        ax.scatter([w], [h + lift], s=150, color=STALE_FILLS[i], edgecolors="black",
                   zorder=3, linewidths=1.2)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("parameter w")


def _double_step(ax, weights, losses, double):
    """Panel (c)'s synchronous step at 2η, dashed, landing where the stale pair does."""
    double = np.asarray(double, float)
    height = np.interp(double, weights, losses)
    lift = 0.03 * (losses.max() - losses.min())
    ax.annotate("", xy=(double[1], height[1] + lift), xytext=(double[0], height[0] + lift),
                arrowprops=dict(arrowstyle="-|>", color="C1", lw=1.3, ls="--",
                                connectionstyle="arc3,rad=0.5", shrinkA=7, shrinkB=7))
    ax.scatter([double[1]], [height[1] + lift], s=150, color="white", edgecolors="C1",
               zorder=3, linewidths=1.5)
    ax.text(double[1], height[1] + 9 * lift, "one step at 2η", color="C1",
            ha="center", fontsize=9)


def _staleness_sweep(ax, sweep):
    """Panel (d): the distance to the minimum after each run, against rate x curvature."""
    x = np.asarray(sweep["step_times_curvature"], float)
    styles = {"async": ("C3", "async, stale (2 updates)"),
              "fresh": ("C0", "fresh (2 updates)"), "sync": ("C2", "sync (1 step)")}
    for key, (color, label) in styles.items():
        ax.plot(x, np.asarray(sweep[key], float), "o-", color=color, markersize=3, label=label)
    if "sync_double" in sweep:
        ax.plot(x, np.asarray(sweep["sync_double"], float), "--", color="C1", lw=1.5,
                label="sync at 2η (1 step)")
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    both = ((np.asarray(sweep["async"]) > np.asarray(sweep["fresh"]))
            & (np.asarray(sweep["async"]) <= np.asarray(sweep["sync"])))
    if both.any():  # stale loses to fresh, yet beats sync in the same time
        ax.axvspan(x[both].min(), x[both].max(), color="0.85", zorder=0,
                   label="stale worse than fresh,\nbetter than sync")
    ax.set_xlabel("learning rate × curvature")
    ax.set_ylabel("|w - w*| after / before")
    ax.set_title("(d) distance to the minimum", fontsize=10)
    ax.legend(fontsize=9)


def stale_gradient(weights, losses, async_path, fresh_path, sync_path, sweep=None,
                   async_workers=("d0", "d1"), sync_double_path=None):
    """The stale-gradient article's figure, with the two runs it needs beside it, and where staleness costs.

    ``weights`` and ``losses`` trace the loss curve of a one-parameter model.
    ``async_path`` holds the parameter at t0 (both workers read it), t1 (the
    first worker's update landed) and t2 (the second worker's stale update
    landed), as an asynchronous run recorded it; ``fresh_path`` the same two
    updates applied one after the other, each gradient taken where the
    parameter is (no staleness); ``sync_path`` the start and the parameter
    after one synchronous step, which takes the same wall time as the
    asynchronous pair.  ``sweep``, if given, is a dict with the key
    ``"step_times_curvature"`` (the x values) and one array per run
    (``"async"``, ``"fresh"``, ``"sync"``): the distance to the minimum after
    each, relative to the start, drawn in a fourth panel (with a key
    ``"sync_double"``, also the synchronous step at twice the rate).
    ``sync_double_path``, if given, is the start and the parameter after
    one synchronous step at twice the learning rate (the linearly scaled
    rate of a two-device batch), drawn in panel (c) beside the step at
    the asynchronous rate.  Drawn in the chapter "Asynchronous training".
    """
    weights, losses = np.asarray(weights, float), np.asarray(losses, float)
    panels = 4 if sweep is not None else 3
    figure, axes = plt.subplots(1, panels, figsize=(3.6 * panels, 3.6))
    first, second = async_workers
    _stale_panel(axes[0], weights, losses, async_path, "(a) asynchronous: stale",
                 [f"{first}'s update", f"{second}'s stale update"],
                 [f"{first}'s gradient", f"{second}'s gradient"])
    _stale_panel(axes[1], weights, losses, fresh_path, "(b) the same two updates, fresh",
                 [f"{first}'s update", f"{second}'s update,\ngradient read at t1"],
                 [f"{first}'s gradient"])
    _stale_panel(axes[2], weights, losses, sync_path, "(c) synchronous, same wall time",
                 [f"one step at η, mean of\n{first}'s and {second}'s gradients"],
                 [f"{first}'s gradient", f"{second}'s gradient"])
    if sync_double_path is not None:  # the same step at 2η lands where the stale pair does
        _double_step(axes[2], weights, losses, sync_double_path)
    axes[0].set_ylabel("loss")
    for ax in axes[1:3]:
        ax.sharey(axes[0])
    handles = [plt.Line2D([], [], marker="o", ls="", markersize=9, markerfacecolor=fill,
                          markeredgecolor="black", label=label)
               for fill, label in zip(STALE_FILLS, ["t0: w read by both", "t1: after the first update",
                                                    "t2: after the second update"])]
    figure.legend(handles=handles, fontsize=9, loc="lower center", ncol=3, frameon=False)
    if sweep is not None:
        _staleness_sweep(axes[3], sweep)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    return figure


def staleness_histograms(stalenesses, title="Staleness of each update"):
    """One histogram per run: the share of updates with each staleness.

    ``stalenesses`` maps a label (such as "4 workers") to the recorded
    staleness of every update.  Drawn in the chapter "Asynchronous training".
    """
    figure, axes = plt.subplots(1, len(stalenesses), figsize=(2.4 * len(stalenesses), 2.6),
                                sharey=True, squeeze=False)
    for ax, (label, staleness) in zip(axes[0], stalenesses.items()):
        staleness = np.asarray(staleness, int)
        counts = np.bincount(staleness)
        ax.bar(np.arange(len(counts)), counts / counts.sum(), color="C0", width=0.8)
        ax.axvline(staleness.mean(), color="C3", lw=1.5)
        ax.set_title(f"{label}\nmean {staleness.mean():.2f}", fontsize=9)
        ax.set_xlabel("staleness")
        ax.set_xlim(-0.8, max(len(counts), 3) - 0.2)
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    axes[0][0].set_ylabel("share of updates")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def loss_against_updates(runs, title="Loss against updates", window=1, ax=None):
    """Loss against update number on a log scale, one line per run.

    ``runs`` maps a label to the loss of each update (as recorded by the
    asynchronous trainer); ``window`` > 1 draws a running mean over that many
    updates, which evens out the different shards of the workers.  Values
    that overflowed are cut at the top of the plot.  Drawn in the chapter
    "Asynchronous training".
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    top = 0.0
    for label, losses in runs.items():
        losses = np.asarray(losses, float)
        if window > 1:
            losses = np.convolve(losses, np.ones(window) / window, mode="valid")
        finite = losses[np.isfinite(losses)]
        top = max(top, finite[: max(1, len(finite) // 10)].max() if len(finite) else 0)
        ax.plot(np.arange(window, window + len(losses)), losses, label=label)
    ax.set_yscale("log")
    ax.set_ylim(top=10 * top)
    ax.set_xlabel("update")
    ax.set_ylabel("loss" if window == 1 else f"loss (mean of {window} updates)")
    ax.set_title(title)
    ax.legend(fontsize=9)
    return ax.figure


def stability_bound(bound, rates_times_curvature, growth, measured, stable_rate_ratios,
                    title="Where a delayed gradient stops converging"):
    """The delayed-gradient stability bound against measured runs (chapter "Stale gradients in depth").

    ``bound(τ)`` is :func:`pargrad.book.delay.stable_rate_bound`.  Panel (a):
    ``growth`` maps a staleness τ to the growth of ``|w - w*|`` per update
    (above 1: diverging) at each of ``rates_times_curvature``, from the
    float64 recursion, with a vertical line at the bound; ``measured`` maps τ
    to ``[(η λ, growth)]`` of runs of the trainer, drawn as dots.  Panel (b):
    ``stable_rate_ratios`` maps a number of workers n to the per-seed ratios
    of the largest stable learning rate with n workers to one worker's, on
    the y = x² network, against the bound's ratio ``bound(n - 1) / bound(0)``
    and against ``2n - 1``, what momentum ``1 - 1/n`` at rate ``η / n`` would allow.
    """
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.asarray(rates_times_curvature, float)
    for k, (tau, values) in enumerate(sorted(growth.items())):
        color = f"C{k}"
        left.plot(x, values, color=color, label=f"τ = {tau}, recursion")
        left.axvline(bound(tau), color=color, ls=":", lw=1)
        points = np.asarray(measured.get(tau, []), float).reshape(-1, 2)
        if len(points):
            left.scatter(points[:, 0], points[:, 1], color=color, edgecolors="black", zorder=3,
                         label=f"τ = {tau}, AsyncTrainer")
    left.axhline(1.0, color="0.4", lw=0.8)
    left.set_yscale("log")
    left.set_xlabel("learning rate × curvature, ηλ  (dotted: the bound)")
    left.set_ylabel("growth of |w − w*| per update")
    left.set_title("(a) one parameter, a parabola", fontsize=10)
    left.legend(fontsize=9)
    workers = np.array(sorted(stable_rate_ratios))
    for n in workers:
        ratios = np.asarray(stable_rate_ratios[n], float)
        right.scatter(np.full(len(ratios), n) + np.linspace(-0.15, 0.15, len(ratios)), ratios,
                      s=10, color="C0", alpha=0.6, label="measured, one dot a seed" if n == workers[0]
                      else None)
    grid = np.arange(1, workers.max() + 1)
    right.plot(grid, [bound(n - 1) / bound(0) for n in grid], "k-", lw=1.5,
               label="bound(n − 1) / bound(0)")
    right.plot(grid, 2 * grid - 1, "C3--", lw=1.2, label="momentum 1 − 1/n at η/n: 2n − 1")
    right.set_yscale("log")
    right.set_xlabel("workers n (staleness n − 1)")
    right.set_ylabel("largest stable rate / one worker's")
    right.set_title("(b) the y = x² network", fontsize=10)
    right.legend(fontsize=9)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    return figure


def paired_scores(panels, title="One dot a seed: the same initial weights, two methods"):
    """Per-seed scores of two methods against each other, one panel a comparison.

    ``panels`` maps a panel title to ``(first_name, first_scores,
    second_name, second_scores)``; each dot is one seed (lower is better, log
    axes), the diagonal is a tie, and the panel counts the seeds on each
    side.  Drawn in the chapter "Stale gradients in depth".
    """
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.9), squeeze=False)
    for ax, (panel, (first, a, second, b)) in zip(axes[0], panels.items()):
        a, b = np.asarray(a, float), np.asarray(b, float)
        ax.scatter(b, a, s=14, color="C0")
        low, high = min(a.min(), b.min()) / 1.5, max(a.max(), b.max()) * 1.5
        ax.plot([low, high], [low, high], color="0.4", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1, 2 and 5 of a decade, no minor ones
            axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
        ax.tick_params(labelsize=9)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel(f"{second}: final loss")
        ax.set_ylabel(f"{first}: final loss")
        ax.set_title(panel, fontsize=10)
        ax.text(0.04, 0.96, f"{first} lower: {int(np.sum(a < b))}", transform=ax.transAxes,
                va="top", fontsize=9)
        ax.text(0.96, 0.04, f"{second} lower: {int(np.sum(b < a))}", transform=ax.transAxes,
                ha="right", fontsize=9)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    return figure
