"""Argument checks shared by the trainers: one message style, TypeError for a wrong type, ValueError for a wrong value.

Taught in the chapter "Your own model".  Each check returns the value in
the form the trainer uses (an ``int``, a ``bool``, a ``float``) or raises an
error that names the argument and says what to pass instead.
"""

import math
import numbers

import numpy as np


def check_whole_number(name, value, minimum=1):
    """``value`` as an ``int`` if it is a whole number >= ``minimum``.

    ``TypeError`` for a bool, a float (a float that holds a whole number,
    ``16.0``, is told "pass 16") or anything else; ``ValueError`` below ``minimum``.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        if value < minimum:
            raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}.")
        return int(value)
    if (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
            and math.isfinite(value) and float(value).is_integer()):
        raise TypeError(f"{name} must be an int, got the float {value!r}; pass {int(value)}.")
    raise TypeError(f"{name} must be a whole number >= {minimum} (an int), got {value!r}.")


def check_flag(name, value):
    """``value`` as a ``bool`` if it is one (``True`` or ``False``); ``TypeError`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_positive(name, value):
    """``value`` as a ``float`` if it is a finite number > 0.

    ``TypeError`` for what is not a number (or is a bool), ``ValueError``
    for zero, a negative number, NaN or infinity.
    """
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a positive number, got {value!r}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def check_choice(name, value, choices):
    """``value`` if it is one of ``choices``; ``ValueError`` naming them otherwise."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")
    return value
