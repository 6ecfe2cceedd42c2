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

__all__ = ["ArgumentTypeError", "check_choice", "check_flag", "check_instance", "check_positive",
           "check_seeds", "check_share", "check_whole_number"]


class ArgumentTypeError(TypeError):
    """An argument of the wrong type (a float where a count goes); a ``TypeError`` only."""


def _message(name, wanted, value, advice):
    """``"<name> must be <wanted>, got <value!r>."`` plus the advice, if any."""
    return f"{name} must be {wanted}, got {value!r}." + (f" {advice}" if advice else "")


def _is_bool(value):
    """True for Python's and NumPy's booleans (both are Integral or look it)."""
    return isinstance(value, (bool, np.bool_))


def check_whole_number(name, value, minimum=1, *, maximum=None, advice=""):
    """``value`` as an int if it is a whole number >= ``minimum`` (and <= ``maximum``, if given).

    A float that holds a whole number (``16.0``) is refused too, saying
    "got the float 16.0; pass 16": quietly taking it would hide a computation that went wrong
    upstream.  A bool, a float, a string or None raises
    :class:`ArgumentTypeError`; an int below ``minimum`` or above
    ``maximum`` raises ``ValueError``.
    """
    wanted = (f"a whole number >= {minimum}" if maximum is None
              else f"a whole number from {minimum} to {maximum}")
    if _is_bool(value):
        raise ArgumentTypeError(_message(name, f"{wanted}, not the bool", value, advice))
    if isinstance(value, numbers.Integral):
        if value < minimum or (maximum is not None and value > maximum):
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


def check_instance(name, value, kind, wanted, *, optional=False, advice=""):
    """``value`` if it is an instance of ``kind`` (or None, with ``optional``).

    ``wanted`` names what to pass in the message (``"a Keras optimizer
    object"``); anything else raises :class:`ArgumentTypeError`.
    """
    if (optional and value is None) or (isinstance(value, kind) and not _is_bool(value)):
        return value
    raise ArgumentTypeError(_message(name, wanted + (" or None" if optional else ""), value,
                                     advice))


def check_seeds(seeds, *, name="seeds", distinct=False):
    """``seeds`` as a 1-D NumPy array of whole numbers >= 0: the one check of a list of seeds.

    A value that is not a list (a single number) raises
    :class:`ArgumentTypeError`, as does a seed that is not a whole number;
    an empty list, a negative seed or, with ``distinct``, a repeated one
    (it would count one run twice) raises ``ValueError``.  Used by the
    book's experiments (chapter "Sync vs async in the same time").
    """
    array = np.asarray(seeds)
    if array.ndim != 1:
        raise ArgumentTypeError(_message(name, "a non-empty list of whole numbers", seeds,
                                         "Pass for example numpy.arange(20)."))
    if len(array) == 0:
        raise ValueError(_message(name, "a non-empty list of whole numbers", seeds,
                                  "Pass for example numpy.arange(20)."))
    for seed in array.tolist():  # Python numbers: the message shows -1, not np.int64(-1)
        check_whole_number(f"each of {name}", seed, minimum=0)
    if distinct and len(np.unique(array)) != len(array):
        raise ValueError(f"{name} must differ from each other: a repeated seed counts one run "
                         "twice.")
    return array
