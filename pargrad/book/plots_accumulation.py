"""The figures of Part III (accumulation): peak memory against the batch, the token diagram.

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np


def peak_memory_against_batch(batch_sizes, big_batch_mb, accumulated_mb, micro_batch_size,
                              device="CPU", title="Peak memory of one update"):
    """Peak memory against batch size: one big batch vs accumulated micro-batches.

    Chapter "Accumulation in TF2 and across replicas".  ``big_batch_mb`` and
    ``accumulated_mb`` are the peaks (MB) that ``pargrad.book.peaks.peak_memory``
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
