"""The figures of Part I (one device): the training loop's loss and fit, and logical devices.

One function a figure, each returning a matplotlib Figure drawn from numbers
that code in the book computed.
"""

import matplotlib.pyplot as plt
import numpy as np


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
