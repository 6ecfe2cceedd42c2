"""The figures of the chapter "Beyond one machine": a parameter server's updates, and recovery.

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np


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
