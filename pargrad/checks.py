"""The one set of argument checks every part of pargrad uses.

Taught in the chapter "Your own model".  A bad argument stops before any
work with one message style, ``"<name> must be ..., got <value!r>."``
followed by what to pass instead, and one rule for the exception:

* the wrong *type* (a float where a count goes, a string where a flag
  goes) raises :class:`ArgumentTypeError`, a ``TypeError``;
* the right type with a wrong *value* (``batch_size=0``) raises
  ``ValueError``.

Catch ``(TypeError, ValueError)`` to catch both.

Every check returns the value in the form the caller uses (an ``int``, a
``bool``, a ``float``), so a call reads ``steps = check_whole_number("steps",
steps)``.  ``advice`` (keyword-only) adds what to pass in this place
("pass 1 for no accumulation").  The module imports neither TensorFlow nor
the book (only NumPy, for its booleans).
"""

import math
import numbers

import numpy as np

__all__ = ["ArgumentTypeError", "check_choice", "check_flag", "check_positive",
           "check_share", "check_whole_number"]


class ArgumentTypeError(TypeError):
    """An argument of the wrong type (a float where a count goes); a ``TypeError`` only."""


def _message(name, wanted, value, advice):
    """``"<name> must be <wanted>, got <value!r>."`` plus the advice, if any."""
    return f"{name} must be {wanted}, got {value!r}." + (f" {advice}" if advice else "")


def _is_bool(value):
    """True for Python's and NumPy's booleans (both are Integral or look it)."""
    return isinstance(value, (bool, np.bool_))


def check_whole_number(name, value, minimum=1, *, advice=""):
    """``value`` as an int if it is a whole number >= ``minimum``.

    A float that holds a whole number (``16.0``) is refused too, saying
    "got the float 16.0; pass 16": quietly taking it would hide a computation that went wrong
    upstream.  A bool, a float, a string or None raises
    :class:`ArgumentTypeError`; an int below ``minimum`` raises
    ``ValueError``.
    """
    wanted = f"a whole number >= {minimum}"
    if _is_bool(value):
        raise ArgumentTypeError(_message(name, f"{wanted}, not the bool", value, advice))
    if isinstance(value, numbers.Integral):
        if value < minimum:
            raise ValueError(_message(name, wanted, value, advice))
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        raise ArgumentTypeError(f"{name} must be {wanted} (an int), got the float {value!r}; "
                                f"pass {int(value)}." + (f" {advice}" if advice else ""))
    raise ArgumentTypeError(_message(name, f"{wanted} (an int)", value, advice))


def check_flag(name, value, *, advice=""):
    """``value`` if it is True or False; any other value (1, "yes", None) is refused."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(_message(name, "True or False", value, advice))
    return value


def check_positive(name, value, *, unit="", advice=""):
    """``value`` as a float if it is a real number > 0 and finite.

    ``unit`` names what the number counts ("seconds") in the message.  A
    bool or a non-number raises :class:`ArgumentTypeError`; zero, a negative
    number, NaN or infinity raises ``ValueError``.
    """
    wanted = f"a positive number of {unit}" if unit else "a positive number"
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(_message(name, wanted, value, advice))
    if not (math.isfinite(value) and value > 0):
        raise ValueError(_message(name, wanted, value, advice))
    return float(value)


def check_share(name, value, *, strict=False, advice=""):
    """``value`` as a float from 0 to 1 (strictly between them with ``strict``).

    For shares (an overlap from 0 to 1, an efficiency strictly between 0
    and 1).  A bool or a non-number raises :class:`ArgumentTypeError`, a
    number outside the range ``ValueError``.
    """
    wanted = "a share strictly between 0 and 1" if strict else "a share from 0 to 1"
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(_message(name, wanted, value, advice))
    if not (0 < value < 1 if strict else 0 <= value <= 1):
        raise ValueError(_message(name, wanted, value, advice))
    return float(value)


def check_choice(name, value, choices, *, advice=""):
    """``value`` if it is one of ``choices``; else ``ValueError`` listing them."""
    choices = tuple(choices)
    try:
        known = value in choices
    except (TypeError, ValueError):   # a value that cannot be compared (an array)
        known = False
    if not known:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(_message(name, f"one of {listed}", value, advice))
    return value
