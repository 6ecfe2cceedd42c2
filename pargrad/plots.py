"""The book's figures: one function a figure, each returning a matplotlib Figure.

Each figure is drawn from numbers that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np


def loss_curve(losses, ax=None, label=None, title="Training loss"):
    """Loss against steps on a log scale (chapter "The training loop")."""
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
