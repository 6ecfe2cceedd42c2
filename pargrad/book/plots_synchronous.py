"""The figures of the chapters "Synchronous training" and "Synchronous training in depth".

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np


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


# One colour a part of a replica's step in :func:`device_timeline` (the schematic's).
TIMELINE_COLORS = {"launch": SCHEMATIC_COLORS["launch"], "compute": SCHEMATIC_COLORS["compute"],
                   "straggler": SCHEMATIC_COLORS["compute"], "wait": SCHEMATIC_COLORS["update"]}


def _timeline_bars(ax, history, step, ms):
    """One step of :func:`device_timeline`: each replica's launch, compute and wait bars."""
    for r in range(history.compute.shape[1]):
        kind = "straggler" if r in history.stragglers else "compute"
        spans = [
            (history.start[step], history.compute_start[step, r], "launch"),
            (history.compute_start[step, r], history.compute_end[step, r], kind),
            (history.compute_end[step, r], history.update_end[step, r], "wait"),
        ]
        for begin, end, part in spans:
            ax.barh(r, ms(end) - ms(begin), left=ms(begin), height=0.6,
                    color=TIMELINE_COLORS[part], alpha=0.45 if part == "wait" else 1.0,
                    hatch="xx" if part == "straggler" else None,
                    edgecolor="white" if part == "straggler" else "none")
    ax.axvline(ms(history.start[step] + history.step_time[step]), color="0.3",
               linestyle=":", linewidth=1)


def _timeline_legend(ax, stragglers):
    """The legend of :func:`device_timeline`, above its axes (a straggler's bars if any)."""
    colors = TIMELINE_COLORS
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k], alpha=0.45 if k == "wait" else 1.0)
               for k in ("launch", "compute", "wait")]
    labels = ["launch (before the replica starts)", "compute (forward + backward)",
              "wait (all-reduce + update)"]
    if stragglers:
        handles.insert(2, plt.Rectangle((0, 0), 1, 1, facecolor=colors["straggler"], hatch="xx",
                                        edgecolor="white"))
        labels.insert(2, "compute, straggler")
    ax.legend(handles, labels, fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=len(labels), frameon=False)


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
    for step in steps:
        _timeline_bars(ax, history, step, ms)
    _timeline_legend(ax, history.stragglers)
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
