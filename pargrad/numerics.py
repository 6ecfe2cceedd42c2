"""How close two runs that are equal in exact arithmetic must be in floating point.

Taught in the chapter "Synchronous training".  Synchronous training on R
devices computes the same sums as one device on the whole batch, only added
in another order; so do accumulation and the big batch.  Floating point
rounds every addition, and the order of additions depends on the CPU's
kernels (AVX2 or AVX-512, oneDNN or Eigen), on thread counts, and on a GPU
on its (nondeterministic) reductions, so two such runs agree only up to
rounding.  This module states "up to rounding" as a number.
"""

import numpy as np

from pargrad.checks import check_positive, check_whole_number

# How many times the measured gaps a tolerance allows.  Measured in the
# book on the y = x² network: 2000 steps of 1, 2 and 5 replicas against one
# device end 0.1 to 0.3 x steps x unit roundoff apart, in float32 and in
# float64 alike, on two different x86 CPUs.
SAFETY = 10


def unit_roundoff(dtype):
    """Half the distance from 1.0 to the next number: 2**-24 (float32), 2**-53 (float64)."""
    kind = np.dtype(dtype)
    if kind.kind != "f":
        raise ValueError(f"unit_roundoff needs a floating-point dtype, got {dtype!r}.")
    return float(np.finfo(kind).eps) / 2


def rounding_tolerance(dtype, steps, scale=1.0):
    """The largest gap that rounding explains after ``steps`` updates.

    Each update adds a rounding error of about one unit roundoff of the
    values (of size ``scale``).  How the errors of ``steps`` updates add up
    depends on the dynamics: a contracting run keeps them near linear
    growth, an expanding (chaotic, diverging) one amplifies them by its
    Jacobian without bound.  The linear form ``SAFETY x steps x unit_roundoff
    x scale`` is therefore an empirical bound for the book's converging
    runs (``SAFETY`` above records the measured margins), not a theorem:
    about 1e-3 for 2000 float32 steps of weights of size 1, and
    about 2e-12 for the same in float64, so a float64 run shows an equality
    that no machine's order of additions can hide.  Taught in the chapter
    "Synchronous training".
    """
    steps = check_whole_number("steps", steps, advice="Pass the number of updates compared.")
    scale = check_positive("scale", scale, advice="Pass the size of the compared values.")
    return SAFETY * steps * unit_roundoff(dtype) * scale
