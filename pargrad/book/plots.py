"""The book's figures: one function a figure, each returning a matplotlib Figure.

Each figure is drawn from numbers that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from pargrad.book.replay import AVERAGE, NESTEROV


def loss_curve(losses, ax=None, label=None, title="Training loss"):
    """Loss against steps on a log scale.

    Drawn in the chapters "The training loop", "Accumulating gradients in TF1
    graphs" and "Accumulation in TF2 and across replicas".
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(np.arange(1, len(losses) + 1), losses, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    if label is not None:
        ax.legend()
    return ax.figure


def parabola_fit(x, y, predictions, ax=None, title="Fitting y = x²"):
    """The 50 training points and the network's predictions (chapter "The training loop").

    ``predictions`` maps a label to the predicted y for each x.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    ax.scatter(x[:, 0], y[:, 0], s=12, color="black", label="data: y = x²")
    for label, prediction in predictions.items():
        ax.plot(x[:, 0], np.asarray(prediction)[:, 0], label=label)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(title)
    ax.legend()
    return ax.figure


# -- chapter "Asynchronous training" -------------------------------------------


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
    lowest = weights[np.argmin(losses)]
    fills = ["black", "0.6", "white"]

    def draw(ax, path, title, step_labels, readers):
        """The curve, the balls at t0, t1, ..., the gradients at t0 and the steps."""
        height = np.interp(path, weights, losses)
        lift = 0.03 * (losses.max() - losses.min())
        ax.plot(weights, losses, color="black", lw=1.5, zorder=1)
        ax.axvline(lowest, color="0.5", ls=":", lw=1)
        ax.text(lowest, losses.max(), " minimum", color="0.4", va="top", fontsize=9)
        direction = np.sign(path[1] - path[0])
        span = 0.12 * (weights.max() - weights.min())
        for k, reader in enumerate(readers):  # the gradients read at t0: downhill
            y = height[0] + (4 + 3 * k) * lift
            ax.annotate("", xy=(path[0] + direction * span, y), xytext=(path[0], y),
                        arrowprops=dict(arrowstyle="-|>", color="0.3", lw=1.2))
            ax.text(path[0] + direction * 1.08 * span, y, reader, va="center", fontsize=9,
                    ha="right" if direction < 0 else "left")
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
        for i, (w, h) in enumerate(zip(path, height)):
            ax.scatter([w], [h + lift], s=150, color=fills[i], edgecolors="black",
                       zorder=3, linewidths=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("parameter w")

    first, second = async_workers
    draw(axes[0], np.asarray(async_path, float), "(a) asynchronous: stale",
         [f"{first}'s update", f"{second}'s stale update"],
         [f"{first}'s gradient", f"{second}'s gradient"])
    draw(axes[1], np.asarray(fresh_path, float), "(b) the same two updates, fresh",
         [f"{first}'s update", f"{second}'s update,\ngradient read at t1"], [f"{first}'s gradient"])
    draw(axes[2], np.asarray(sync_path, float), "(c) synchronous, same wall time",
         [f"one step at η, mean of\n{first}'s and {second}'s gradients"],
         [f"{first}'s gradient", f"{second}'s gradient"])
    if sync_double_path is not None:  # the same step at 2η lands where the stale pair does
        double = np.asarray(sync_double_path, float)
        height = np.interp(double, weights, losses)
        lift = 0.03 * (losses.max() - losses.min())
        axes[2].annotate("", xy=(double[1], height[1] + lift), xytext=(double[0], height[0] + lift),
                         arrowprops=dict(arrowstyle="-|>", color="C1", lw=1.3, ls="--",
                                         connectionstyle="arc3,rad=0.5", shrinkA=7, shrinkB=7))
        axes[2].scatter([double[1]], [height[1] + lift], s=150, color="white", edgecolors="C1",
                        zorder=3, linewidths=1.5)
        axes[2].text(double[1], height[1] + 9 * lift, "one step at 2η", color="C1",
                     ha="center", fontsize=9)
    axes[0].set_ylabel("loss")
    for ax in axes[1:3]:
        ax.sharey(axes[0])
    handles = [plt.Line2D([], [], marker="o", ls="", markersize=9, markerfacecolor=fill,
                          markeredgecolor="black", label=label)
               for fill, label in zip(fills, ["t0: w read by both", "t1: after the first update",
                                              "t2: after the second update"])]
    figure.legend(handles=handles, fontsize=9, loc="lower center", ncol=3, frameon=False)
    if sweep is not None:
        ax = axes[3]
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
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    return figure


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


def peak_memory_against_batch(batch_sizes, big_batch_mb, accumulated_mb, micro_batch_size,
                              device="CPU", title="Peak memory of one update"):
    """Peak memory against batch size: one big batch vs accumulated micro-batches.

    Chapter "Accumulation in TF2 and across replicas".  ``big_batch_mb`` and
    ``accumulated_mb`` are the peaks (MB) that ``pargrad.book.memory.peak_memory``
    measured for the same ``batch_sizes``.
    """
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(batch_sizes, big_batch_mb, "o-", label="whole batch at once")
    ax.plot(batch_sizes, accumulated_mb, "s-",
            label=f"accumulated, micro-batches of {micro_batch_size}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("examples per update (batch size)")
    ax.set_ylabel("peak memory (MB)" if device == "GPU" else "peak resident memory (MB)")
    ax.set_title(title)
    ax.legend(fontsize=9)
    return fig


# -- chapter "Synchronous training" ---------------------------------------------

def ring_all_reduce_steps(states, sent, counts, title="Ring all-reduce, step by step"):
    """Each step of a ring all-reduce: replicas as rows, chunks as columns.

    ``states``, ``sent``: from :func:`pargrad.allreduce.ring_all_reduce` run on the
    replicas' vectors (one element a chunk); ``counts``: the states of the same
    run on vectors of ones, i.e. how many replicas each cell already holds.
    Arrows mark the chunk each replica sends to its neighbour in that step.
    (Chapter "Synchronous training".)
    """
    n = len(states[0])
    panels = len(states)
    fig, axes = plt.subplots(1, panels, figsize=(1.9 * panels, 0.55 * n + 1.2), squeeze=False)
    cmap = plt.get_cmap(SCHEMATIC_COLORS["summed"])
    for p, ax in enumerate(axes[0]):
        grid = np.asarray(counts[p])
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=n + 1.5, aspect="equal")
        for r in range(n):
            for c in range(grid.shape[1]):
                full = grid[r, c] == n
                ax.text(c, r, f"{states[p][r, c]:g}", ha="center", va="center", fontsize=9,
                        color="white" if full else "black", fontweight="bold" if full else None)
        if p > 0:
            for sender, receiver, chunk in sent[p - 1]:
                ax.add_patch(plt.Rectangle((chunk - 0.5, sender - 0.5), 1, 1, fill=False,
                                           edgecolor=SCHEMATIC_COLORS["sent"], linewidth=2))
        ax.set_xticks(range(grid.shape[1]))
        ax.set_xticklabels([f"c{c}" for c in range(grid.shape[1])], fontsize=9)
        ax.set_yticks(range(n))
        ax.set_yticklabels([f"r{r}" for r in range(n)] if p == 0 else [], fontsize=9)
        if p == 0:
            ax.set_title("start", fontsize=9)
        elif p < n:
            ax.set_title(f"reduce-scatter {p}", fontsize=9)
        else:
            ax.set_title(f"all-gather {p - n + 1}", fontsize=9)
    fig.suptitle(title + " (purple: the chunk each replica sends to the next)", fontsize=9)
    fig.tight_layout()
    return fig


def device_timeline(history, steps=range(4), ax=None, title="What each replica did, step by step"):
    """Per replica: launch, compute and waiting (all-reduce) bars for a few steps.

    ``history``: a :class:`pargrad.book.instruments.InstrumentedSyncHistory`;
    times are shown in ms from the start of the first step drawn; dotted
    lines end the steps.  (Chapter "Synchronous training".)
    """
    steps = list(steps)
    times = getattr(history, "compute_start", None)     # the core SyncHistory has none
    if times is None or np.isnan(times[steps]).any():
        raise ValueError(
            "This history has no per-replica times; train with "
            "pargrad.book.instruments.InstrumentedSyncTrainer(..., record_times=True) to draw its timeline."
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 * history.compute.shape[1] + 1.6))
    origin = history.start[steps[0]]
    ms = lambda t: (t - origin) * 1e3  # noqa: E731
    replicas = history.compute.shape[1]
    colors = {"launch": SCHEMATIC_COLORS["launch"], "compute": SCHEMATIC_COLORS["compute"],
              "straggler": SCHEMATIC_COLORS["compute"], "wait": SCHEMATIC_COLORS["update"]}
    for step in steps:
        for r in range(replicas):
            kind = "straggler" if r in history.stragglers else "compute"
            spans = [
                (history.start[step], history.compute_start[step, r], "launch"),
                (history.compute_start[step, r], history.compute_end[step, r], kind),
                (history.compute_end[step, r], history.update_end[step, r], "wait"),
            ]
            for begin, end, part in spans:
                ax.barh(r, ms(end) - ms(begin), left=ms(begin), height=0.6,
                        color=colors[part], alpha=0.45 if part == "wait" else 1.0,
                        hatch="xx" if part == "straggler" else None,
                        edgecolor="white" if part == "straggler" else "none")
        ax.axvline(ms(history.start[step] + history.step_time[step]), color="0.3",
                   linestyle=":", linewidth=1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k], alpha=0.45 if k == "wait" else 1.0)
               for k in ("launch", "compute", "wait")]
    labels = ["launch (before the replica starts)", "compute (forward + backward)",
              "wait (all-reduce + update)"]
    if history.stragglers:
        handles.insert(2, plt.Rectangle((0, 0), 1, 1, facecolor=colors["straggler"], hatch="xx",
                                        edgecolor="white"))
        labels.insert(2, "compute, straggler")
    ax.legend(handles, labels, fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=len(labels), frameon=False)
    ax.set_yticks(range(replicas))
    ax.set_yticklabels([f"replica {r}" for r in range(replicas)])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first step started (ms)")
    ax.set_title(title, pad=24)
    ax.figure.tight_layout()
    return ax.figure


def step_time_against_slowest(runs, ax=None, title="A step lasts as long as its slowest replica"):
    """Scatter of step time against the slowest replica's launch + compute, in ms.

    ``runs``: ``{label: history}``; the dashed line is step time = slowest
    replica.  (Chapter "Synchronous training in depth".)
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    top = 0.0
    for label, history in runs.items():
        slowest = (history.launch + history.compute).max(axis=1) * 1e3
        step = history.step_time * 1e3
        ax.scatter(slowest, step, s=12, alpha=0.7, label=label)
        top = max(top, slowest.max(), step.max())
    ax.plot([0, top], [0, top], "k--", linewidth=1, label="step = slowest replica")
    ax.set_xlabel("slowest replica: launch + compute (ms)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize=9)
    return ax.figure


def throughput_against_replicas(replicas, examples_per_second, ax=None,
                                title="Throughput against replicas on this machine"):
    """Measured examples per second against replicas, beside perfect scaling.

    (Chapter "Synchronous training in depth".)
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.4))
    replicas = np.asarray(replicas)
    rate = np.asarray(examples_per_second, dtype=float)
    ax.plot(replicas, rate, "o-", label="measured")
    ax.plot(replicas, rate[0] * replicas / replicas[0], "k--", linewidth=1,
            label="perfect scaling (a core or GPU per replica)")
    ax.set_xticks(replicas)
    ax.set_xlabel("replicas")
    ax.set_ylabel("examples per second")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=9)
    return ax.figure


# -- chapter "Sync vs async in the same time" ----------------------------------


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


def parameter_server_updates(result, kill_time=None, reference_loss=None,
                             title="Parameter-server training across processes"):
    """When each worker applied an update, and the loss per update (chapter "Beyond one machine").

    ``result``: what :func:`pargrad.book.parameter_server.train_parameter_server`
    returned (its ``finished`` times, ``worker`` and ``loss``);
    ``kill_time``: when a worker was killed, on the same clock
    (``time.time()``); ``reference_loss``: the loss of the same number of
    updates on one device, for comparison.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    finished = np.asarray(result["finished"], dtype=float)
    worker = np.asarray(result["worker"])
    start = finished.min()
    workers = [int(w) for w in np.unique(worker)]
    left.eventplot([finished[worker == w] - start for w in workers], lineoffsets=workers,
                   linelengths=0.7, linewidths=0.6, colors=[f"C{w}" for w in workers])
    if kill_time is not None:
        left.axvline(kill_time - start, color="k", linestyle="--", linewidth=1,
                     label="worker 1 killed")
        left.legend(fontsize=9, loc="center right")
    left.set_yticks(workers, [f"worker {w}" for w in workers])
    left.set_xlabel("seconds since the first update")
    left.set_title("Each tick: one update applied")
    right.plot(np.arange(1, len(result["loss"]) + 1), result["loss"], label="parameter servers")
    if reference_loss is not None:
        right.plot(np.arange(1, len(reference_loss) + 1), reference_loss, "k--", linewidth=1,
                   label="one device")
    right.set_xlabel("update")
    right.set_ylabel("loss read by the update")
    right.set_title("Loss")
    right.legend(fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def recovery_timeline(interrupted, resumed, kill_time, checkpoints,
                      title="A synchronous run killed, then resumed from its checkpoint"):
    """Steps done against wall-clock time for a killed run and its restart.

    ``interrupted`` and ``resumed``: ``(seconds, step)`` pairs of the two
    runs on one clock; ``kill_time``: when the worker was killed;
    ``checkpoints``: the steps at which checkpoints were saved before the
    kill.  (Chapter "Beyond one machine".)
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for label, points, style in (("first run", interrupted, "o-"),
                                 ("after the restart", resumed, "s-")):
        points = np.asarray(points, dtype=float).reshape(-1, 2)
        ax.plot(points[:, 0], points[:, 1], style, markersize=3, label=label)
    ax.axvline(kill_time, color="k", linestyle="--", linewidth=1, label="worker 1 killed")
    for i, step in enumerate(checkpoints):
        ax.axhline(step, color="gray", linestyle=":", linewidth=1,
                   label="checkpoints" if i == 0 else None)
    ax.set_xlabel("seconds since the first run started")
    ax.set_ylabel("steps done")
    ax.set_title(title)
    ax.legend(fontsize=9)
    return fig


def communication_patterns(replicas=4, title="Who sends what, in one all-reduce"):
    """Ring, tree and parameter server side by side (chapter "What communication costs").

    Ring: every replica sends a chunk of n/R to its right neighbour in each
    of 2(R-1) steps.  Tree: pairs at distance 1, 2, 4, ... reduce (solid)
    and then broadcast (dashed) the whole n.  Parameter server: every worker
    pushes n to the server and pulls n back.
    """
    figure, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    angles = np.pi / 2 - 2 * np.pi * np.arange(replicas) / replicas
    ring = np.stack([np.cos(angles), np.sin(angles)], axis=1)

    def node(ax, xy, label, color="#dbe9f6"):
        ax.add_patch(plt.Circle(xy, 0.17, color=color, ec="black", zorder=3))
        ax.text(*xy, label, ha="center", va="center", zorder=4, fontsize=10)

    def arrow(ax, start, end, text=None, style="-", color="black", bend=0.0):
        ax.annotate("", xy=end, xytext=start, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", linestyle=style, color=color, lw=1.4,
                                    shrinkA=13, shrinkB=13, connectionstyle=f"arc3,rad={bend}"))
        if text:
            middle = (np.asarray(start) + np.asarray(end)) / 2
            ax.text(*middle, text, ha="center", va="center", fontsize=9,
                    bbox=dict(fc="white", ec="none", pad=0.5), zorder=3)

    ax = axes[0]
    for r in range(replicas):
        node(ax, ring[r], f"r{r}")
        arrow(ax, ring[r], ring[(r + 1) % replicas], "n/R", bend=-0.25)
    ax.set_title(f"ring: 2(R-1) = {2 * (replicas - 1)} steps,\neach replica sends n/R a step")

    ax = axes[1]
    levels = int(np.ceil(np.log2(replicas)))
    spots = np.stack([np.linspace(-1.2, 1.2, replicas), np.full(replicas, -0.9)], axis=1)
    for r in range(replicas):
        node(ax, spots[r], f"r{r}")
    for level in range(levels):
        distance = 2 ** level
        height = 0.35 + 0.55 * level
        for receiver in range(0, replicas, 2 * distance):
            sender = receiver + distance
            if sender < replicas:
                top_r = spots[receiver] + [0, height]
                top_s = spots[sender] + [0, height]
                ax.plot(*np.stack([spots[sender], top_s, top_r]).T, color="black", lw=1.2)
                arrow(ax, top_r + [0.02, 0], spots[receiver] + [0.0, 0.0])
                ax.text(*(top_r + top_s) / 2 + [0, 0.09], f"round {level + 1}: n",
                        ha="center", fontsize=9)
    ax.text(0, 1.05, "reduce up (solid), then the same rounds\nback down as a broadcast",
            ha="center", fontsize=9)
    ax.set_title(f"tree: 2·ceil(log2 R) = {2 * levels} rounds,\neach of the whole n")

    ax = axes[2]
    server = np.array([0.0, 0.9])
    workers = np.stack([np.linspace(-1.2, 1.2, replicas), np.full(replicas, -0.9)], axis=1)
    node(ax, server, "ps", color="#f6e3c6")
    for w in range(replicas):
        node(ax, workers[w], f"w{w}")
        arrow(ax, workers[w], server, "push n" if w == 0 else None, bend=0.12)
        arrow(ax, server, workers[w], "pull n" if w == replicas - 1 else None, style="--",
              bend=0.12)
    ax.set_title("parameter server (S = 1): its link\ncarries W·n in and W·n out")

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


# -- Part II: a schematic of synchronous and asynchronous steps ----------------

# The tiny fixed schedule the schematic draws (time units, not measured):
# device 0 computes a gradient in 2 units, device 1 in 3; an all-reduce with
# its update takes 0.6 units, an asynchronous apply 0.3.
SCHEMATIC_COMPUTE = (2.0, 3.0)
SCHEMATIC_ALL_REDUCE = 0.6
SCHEMATIC_APPLY = 0.3
SCHEMATIC_END = 7.5
# One colour a meaning across the figures of the chapter "Synchronous training":
# the schematic, the ring all-reduce (a chunk sent) and the measured timeline.
SCHEMATIC_COLORS = {"compute": "tab:blue", "wait": "0.85", "update": "tab:red",
                    "stale": "tab:orange", "launch": "#e3d4a6", "sent": "tab:purple",
                    "summed": "Greens"}


def _schematic_sync_spans():
    """``(device, start, end, kind, label)`` bars of synchronous steps, and the steps' ends."""
    spans, ends, start = [], [], 0.0
    slowest = max(SCHEMATIC_COMPUTE)
    while start + slowest + SCHEMATIC_ALL_REDUCE <= SCHEMATIC_END:
        for device, compute in enumerate(SCHEMATIC_COMPUTE):
            spans.append((device, start, start + compute, "compute", f"w{len(ends)}"))
            if compute < slowest:
                spans.append((device, start + compute, start + slowest, "wait", "waits"))
            spans.append((device, start + slowest, start + slowest + SCHEMATIC_ALL_REDUCE,
                          "update", ""))
        start += slowest + SCHEMATIC_ALL_REDUCE
        ends.append(start)
    return spans, ends


def _schematic_async_spans():
    """``(device, read, apply, version read, staleness)`` of asynchronous updates in time order."""
    clocks, updates, version = [0.0, 0.0], [], 0
    read_version = [0, 0]
    while True:
        device = int(np.argmin([c + d for c, d in zip(clocks, SCHEMATIC_COMPUTE)]))
        apply_at = clocks[device] + SCHEMATIC_COMPUTE[device]
        if apply_at + SCHEMATIC_APPLY > SCHEMATIC_END:
            return updates
        updates.append((device, clocks[device], apply_at, read_version[device],
                        version - read_version[device]))
        version += 1
        clocks[device] = apply_at + SCHEMATIC_APPLY
        read_version[device] = version


def _schematic_axes(ax, title):
    """Two device rows, time along the bottom, no frame but the time axis."""
    ax.set_yticks([0, 1], ["device 0\n(fast)", "device 1\n(slow)"], fontsize=10)
    ax.set_ylim(1.7, -0.8)
    ax.set_xlim(-0.2, SCHEMATIC_END + 0.2)
    ax.tick_params(axis="x", labelsize=9)
    ax.set_title(title, fontsize=11, loc="left")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _draw_sync_schematic(ax):
    """Synchronous steps: compute on the same weights, the fast device waits, one update."""
    spans, ends = _schematic_sync_spans()
    for device, start, end, kind, label in spans:
        ax.barh(device, end - start, left=start, height=0.55, color=SCHEMATIC_COLORS[kind],
                hatch="//" if kind == "wait" else None,
                edgecolor="0.5" if kind == "wait" else "none")
        if label:
            ax.text((start + end) / 2, device, label, ha="center", va="center", fontsize=9,
                    color="white" if kind == "compute" else "black")
    for step, end in enumerate(ends):
        ax.axvline(end, color="0.3", linestyle=":", linewidth=1)
        ax.text(end - 0.08, -0.55, f"update {step + 1}", ha="right", fontsize=9, color="tab:red")
    _schematic_axes(ax, "synchronous: every step waits for the slowest device")


def _draw_async_schematic(ax):
    """Asynchronous updates: each device reads, computes and applies; late applies labelled."""
    for device, read, applied, version, staleness in _schematic_async_spans():
        ax.barh(device, applied - read, left=read, height=0.55,
                color=SCHEMATIC_COLORS["stale" if staleness else "compute"])
        ax.barh(device, SCHEMATIC_APPLY, left=applied, height=0.55,
                color=SCHEMATIC_COLORS["update"])
        ax.text((read + applied) / 2, device, f"w{version}", ha="center", va="center",
                fontsize=9, color="white")
        ax.plot([read], [device - 0.38], marker="v", color="black", markersize=5)
        if staleness:
            ax.text(applied, device + 0.5 if device else device - 0.5,
                    f"applied late: {staleness} update{'s' * (staleness > 1)} behind",
                    ha="right", va="center", fontsize=9, color=SCHEMATIC_COLORS["stale"])
    _schematic_axes(ax, "asynchronous: each device reads (▼), computes and applies on its own")
    ax.set_xlabel("time (units of a fixed schedule)", fontsize=10)


def sync_async_timelines(title="Two devices, a fast and a slow one: synchronous and asynchronous"):
    """A schematic of two devices' timelines, synchronous (top) against asynchronous (bottom).

    Drawn from the fixed schedule above, not measured.  Synchronous: both
    devices compute on the same weights, the fast one waits, an all-reduce
    and one update end every step.  Asynchronous: each device reads the
    weights, computes and applies on its own; an update computed on weights
    that others have updated since its read is marked stale, with its
    staleness.  Shown at the start of the chapter "Synchronous training".
    """
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 5.2), sharex=True)
    _draw_sync_schematic(top)
    _draw_async_schematic(bottom)
    kinds = ("compute", "wait", "update", "stale")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=SCHEMATIC_COLORS[kind],
                             hatch="//" if kind == "wait" else None, edgecolor="0.5")
               for kind in kinds]
    figure.legend(handles, ["compute a gradient on weights wk", "wait for the slowest",
                            "all-reduce + update / apply", "compute on stale weights"],
                  loc="lower center", ncol=2, fontsize=9, frameon=False)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout(rect=(0, 0.09, 1, 1))
    return figure


# -- chapter "Accumulating sequences" ------------------------------------------

DIAGRAM_LENGTHS = (8, 6, 2, 1)    # four sequences, padded to 8 tokens, two a micro-batch
DIAGRAM_PADDED = 8


def _diagram_losses():
    """Fixed per-token losses of the diagram's sequences (short sequences: higher losses)."""
    return [np.round(0.1 + 1.2 / n + 0.02 * np.arange(n), 2) for n in DIAGRAM_LENGTHS]


def _draw_micro_batch(ax, micro, losses):
    """Micro-batch ``micro``'s two padded sequences as rows of cells; returns its token losses."""
    rows = range(2 * micro, 2 * micro + 2)
    top = 2.5 * micro
    for offset, r in enumerate(rows):
        y = top + offset
        for t in range(DIAGRAM_PADDED):
            real = t < DIAGRAM_LENGTHS[r]
            ax.add_patch(plt.Rectangle((t, y), 0.95, 0.9, edgecolor="0.4", linewidth=0.6,
                                       facecolor=f"C{micro}" if real else "white",
                                       alpha=0.35 if real else 1.0, hatch=None if real else "//"))
            if real:
                ax.text(t + 0.47, y + 0.45, f"{losses[r][t]:.2f}", ha="center", va="center",
                        fontsize=9)
        ax.text(-0.2, y + 0.45, f"sequence {r + 1}", ha="right", va="center", fontsize=9)
    tokens = np.concatenate([losses[r] for r in rows])
    ax.text(DIAGRAM_PADDED + 0.3, top + 0.95,
            f"micro-batch {micro + 1}: {tokens.size} tokens\nmean {tokens.mean():.3f}",
            va="center", fontsize=10, color=f"C{micro}")
    return tokens


def token_weighting_diagram(title="Padded sequences cut into micro-batches: which mean?"):
    """Padded sequences of unequal length, cut into two micro-batches, and their means.

    Every cell is a position: a real token shows its loss, a padding cell is
    hatched and counts nothing.  Each micro-batch's token mean is written
    beside it; below, the mean of the two micro-batch means against the
    token-weighted mean (every token counts once), which is the big batch's.
    Drawn from fixed numbers.  Shown in the chapter "Accumulating sequences".
    """
    losses = _diagram_losses()
    figure, ax = plt.subplots(figsize=(8.5, 4.2))
    first, second = (_draw_micro_batch(ax, micro, losses) for micro in range(2))
    everything = np.concatenate(losses)
    ax.text(DIAGRAM_PADDED / 2, 5.4,
            f"mean of the micro-batch means: ({first.mean():.3f} + {second.mean():.3f}) / 2 = "
            f"{(first.mean() + second.mean()) / 2:.3f}\n"
            f"token-weighted mean: ({first.size} × {first.mean():.3f} + {second.size} × "
            f"{second.mean():.3f}) / {everything.size} = {everything.mean():.3f} = the big batch's",
            ha="center", va="top", fontsize=10)
    ax.set_xlim(-2.4, DIAGRAM_PADDED + 3.2)
    ax.set_ylim(7.0, -0.4)
    ax.axis("off")
    ax.set_title(title + "  (hatched: padding)", fontsize=11)
    figure.tight_layout()
    return figure


def _device_box(ax, xy, size, label, color, fontsize=10):
    ax.add_patch(plt.Rectangle(xy, *size, facecolor=color, edgecolor="black", lw=1.2))
    ax.text(xy[0] + size[0] / 2, xy[1] + size[1] / 2, label, ha="center", va="center",
            fontsize=fontsize)


def logical_devices_diagram(names=("/device:CPU:0", "/device:CPU:1", "/device:CPU:2",
                                   "/device:CPU:3"), cores=2,
                            title="One physical CPU, split into logical devices"):
    """One physical CPU and the logical devices made from it (chapter "Devices").

    Left: the physical device TensorFlow finds, with its ``cores``. Right: the
    logical devices ``names`` that ``pargrad.logical_devices`` returns; every
    one of them places its operations on the same cores.
    """
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    core_width = 2.6 / cores

    def cores_row(ax, y):
        for c in range(cores):
            _device_box(ax, (0.2 + c * core_width + 0.05, y), (core_width - 0.1, 0.7),
                        f"core {c}", "#f6e3c6")

    _device_box(left, (0.0, 0.0), (3.0, 2.6), "", "#eef3f8")
    left.text(1.5, 2.25, "physical device: the CPU\n(all its cores count as one)",
              ha="center", va="center", fontsize=10)
    cores_row(left, 0.4)
    left.set_title("what TensorFlow finds", fontsize=11)

    width = 3.0 / len(names)
    centres = []
    for i, name in enumerate(names):
        _device_box(right, (i * width + 0.04, 2.0), (width - 0.08, 0.6), name.split("/device:")[-1],
                    "#dbe9f6")
        centres.append(i * width + width / 2)
    right.text(1.5, 2.85, "logical devices: tf.device(name) places operations",
               ha="center", fontsize=10)
    cores_row(right, 0.4)
    for c in range(cores):
        core_top = (0.2 + c * core_width + core_width / 2, 1.1)
        for x in centres:
            right.annotate("", xy=core_top, xytext=(x, 2.0),
                           arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.9,
                                           shrinkA=2, shrinkB=2))
    right.text(1.5, 0.1, "the same cores: no extra hardware", ha="center", va="center",
               fontsize=10)
    right.set_title(f"after pargrad.logical_devices({len(names)})", fontsize=11)
    for ax in (left, right):
        ax.set_xlim(-0.15, 3.15)
        ax.set_ylim(-0.15, 3.1)
        ax.set_aspect("equal")
        ax.axis("off")
    figure.suptitle(title, fontsize=12)
    figure.tight_layout()
    return figure


# -- chapter "When the model does not fit" --------------------------------------


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
