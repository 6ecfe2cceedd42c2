"""Gradient descent with a delayed gradient on a quadratic: the stability bound.

On a loss with curvature λ (``L(w) = λ w² / 2``), a worker whose gradient is
``τ`` updates old applies ``w(t+1) = w(t) − η λ w(t − τ)``.  This module runs
that recursion exactly (float64) and gives the largest ``η λ`` for which it
converges.  Taught in the chapter "Asynchronous training"; the staleness
playground of the rendered book computes the same recursion in JavaScript.
"""

import math

import numpy as np

from pargrad.checks import check_whole_number


def stable_rate_bound(staleness):
    """The largest ``η λ`` for which ``w(t+1) = w(t) − η λ w(t − τ)`` converges.

    ``2 sin(π / (2 (2τ + 1)))``: 2 for fresh gradients (τ = 0), 1 for τ = 1,
    about 0.445 for τ = 3 and 0.209 for τ = 7.  Shown in the chapter
    "Stale gradients in depth".
    """
    staleness = _staleness(staleness)
    return 2.0 * math.sin(math.pi / (2.0 * (2 * staleness + 1)))


def delayed_gradient_path(rate_times_curvature, staleness, start=1.0, updates=50):
    """The parameter after each update of gradient descent with delay ``τ``.

    Returns a float64 array of ``updates + 1`` values, ``w(0) = start`` first.
    Before ``τ`` updates have been applied, every gradient was computed at
    the start (all workers read the same parameters at time 0, as in the
    stale-gradient article).  Taught in the chapter "Asynchronous training".
    """
    staleness = _staleness(staleness)
    updates = check_whole_number("updates", updates, minimum=0)
    path = np.empty(updates + 1, dtype=np.float64)
    path[0] = float(start)
    for t in range(updates):
        read = path[max(t - staleness, 0)]
        path[t + 1] = path[t] - float(rate_times_curvature) * read
    return path


def _staleness(staleness):
    return check_whole_number("staleness (in updates; 0 = fresh)", staleness, minimum=0)


def growth_per_update(path, staleness):
    """How much ``|w - w*|`` grows per update along ``path`` (``w* = 0``): below 1 converges.

    ``(max |w| over the last τ + 1 values / |w(0)|) ** (1 / updates)``, the
    largest over the last ``τ + 1`` values because a delayed recursion
    oscillates.  Taught in the chapter "Asynchronous training".
    """
    staleness = _staleness(staleness)
    path = np.abs(np.asarray(path, dtype=np.float64))
    if path.ndim != 1 or len(path) < staleness + 2 or not path[0] > 0:
        raise ValueError(f"path needs w(0) != 0 and at least τ + 2 = {staleness + 2} values, "
                         f"got {len(path)} starting at {path[:1]}.")
    return float((path[-(staleness + 1):].max() / path[0]) ** (1.0 / (len(path) - 1)))
