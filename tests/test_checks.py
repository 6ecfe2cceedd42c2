"""pargrad.checks: one message style, TypeError for a wrong type, ValueError for a wrong value."""

import math

import numpy as np
import pytest

from pargrad.checks import (
    ArgumentTypeError,
    check_choice,
    check_flag,
    check_instance,
    check_positive,
    check_seeds,
    check_share,
    check_whole_number,
)


@pytest.mark.parametrize("value, expected", [(1, 1), (7, 7), (np.int64(3), 3)])
def test_whole_numbers_come_back_as_ints(value, expected):
    result = check_whole_number("steps", value)
    assert result == expected and type(result) is int


def test_the_minimum_can_be_zero():
    assert check_whole_number("parameter_servers", 0, minimum=0) == 0
    with pytest.raises(ValueError, match=r"parameter_servers must be a whole number >= 0, got -1\."):
        check_whole_number("parameter_servers", -1, minimum=0)


@pytest.mark.parametrize("value", [0, -3])
def test_a_whole_number_too_small_is_a_value_error_not_a_type_error(value):
    with pytest.raises(ValueError, match=rf"steps must be a whole number >= 1, got {value}\.") as caught:
        check_whole_number("steps", value)
    assert not isinstance(caught.value, TypeError)


@pytest.mark.parametrize("value, says", [
    (16.0, "pass 16"), (True, "not the bool"), (np.bool_(False), "not the bool"),
    (2.5, r"\(an int\), got 2.5"), ("4", r"got '4'"), (None, "got None"),
    (math.nan, "got nan")])
def test_a_wrong_type_is_a_type_error_that_says_what_to_pass(value, says):
    with pytest.raises(TypeError, match=says) as caught:
        check_whole_number("batch_size", value)
    assert isinstance(caught.value, ArgumentTypeError)
    assert str(caught.value).startswith("batch_size must be a whole number >= 1")


def test_a_type_error_is_not_a_value_error():
    """One exception type a mistake: a wrong type is a TypeError, never also a ValueError."""
    assert not issubclass(ArgumentTypeError, ValueError)
    with pytest.raises(TypeError) as caught:
        check_whole_number("steps", 1.5)
    assert not isinstance(caught.value, ValueError)


def test_advice_follows_the_message():
    with pytest.raises(ValueError) as caught:
        check_whole_number("accumulation_steps", 0, advice="Pass 1 for no accumulation.")
    assert str(caught.value) == ("accumulation_steps must be a whole number >= 1, got 0. "
                                 "Pass 1 for no accumulation.")


def test_flags_are_true_or_false_only():
    assert check_flag("shuffle", True) is True and check_flag("shuffle", False) is False
    for value in (1, 0, "yes", None, np.bool_(True)):
        with pytest.raises(TypeError, match=rf"shuffle must be True or False, got {value!r}\."):
            check_flag("shuffle", value)


def test_positive_numbers():
    assert check_positive("timeout", 3) == 3.0 and isinstance(check_positive("timeout", 3), float)
    assert check_positive("timeout", np.float32(0.5)) == 0.5
    for value in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds") as caught:
            check_positive("timeout", value, unit="seconds")
        assert not isinstance(caught.value, TypeError)
    for value in (True, "3", None, [1.0]):
        with pytest.raises(TypeError, match="timeout must be a positive number"):
            check_positive("timeout", value)


def test_shares():
    assert check_share("overlap", 0) == 0.0 and check_share("overlap", 1) == 1.0
    with pytest.raises(ValueError, match=r"overlap must be a share from 0 to 1, got 1\.5\."):
        check_share("overlap", 1.5)
    for value in (0, 1, 1.2):
        with pytest.raises(ValueError, match="efficiency must be a share strictly between 0 and 1"):
            check_share("efficiency", value, strict=True)
    assert check_share("efficiency", 0.9, strict=True) == 0.9
    with pytest.raises(TypeError):
        check_share("overlap", "half")


def test_choices():
    assert check_choice("kind", "GPU", ("CPU", "GPU")) == "GPU"
    with pytest.raises(ValueError, match=r"kind must be one of 'CPU', 'GPU', got 'TPU'\."):
        check_choice("kind", "TPU", ("CPU", "GPU"))
    with pytest.raises(ValueError, match="kind must be one of"):
        check_choice("kind", np.zeros(2), ("CPU", "GPU"))


def test_a_maximum_bounds_a_whole_number():
    assert check_whole_number("backup_workers", 3, 0, maximum=3) == 3
    with pytest.raises(ValueError, match=r"^backup_workers must be a whole number from 0 to 3, "
                                         r"got 4\. A step needs one\.$"):
        check_whole_number("backup_workers", 4, 0, maximum=3, advice="A step needs one.")


def test_an_instance_of_the_wrong_kind_is_a_type_error_saying_what_to_pass():
    assert check_instance("link", None, float, "a float", optional=True) is None
    assert check_instance("link", 1.5, float, "a float") == 1.5
    with pytest.raises(ArgumentTypeError, match=r"^link must be a float or None, got 'x'\. "
                                                r"pass for example 1\.5\.$"):
        check_instance("link", "x", float, "a float", optional=True, advice="pass for example 1.5.")
    with pytest.raises(ArgumentTypeError, match="flag must be an int, got True"):
        check_instance("flag", True, int, "an int")            # a bool is no int here


def test_seeds_are_a_list_of_distinct_whole_numbers():
    assert check_seeds([0, 3]).tolist() == [0, 3]
    with pytest.raises(ArgumentTypeError, match="seeds must be a non-empty list of whole numbers, "
                                                "got 3. Pass for example numpy.arange"):
        check_seeds(3)
    with pytest.raises(ValueError, match="seeds must be a non-empty list"):
        check_seeds([])
    with pytest.raises(ArgumentTypeError, match="each of seeds must be a whole number >= 0 .*pass 1"):
        check_seeds([1.0])
    with pytest.raises(ValueError, match="each of seeds must be a whole number >= 0, got -1"):
        check_seeds([-1])
    assert check_seeds([1, 1]).tolist() == [1, 1]
    with pytest.raises(ValueError, match="seeds must differ from each other"):
        check_seeds([1, 1], distinct=True)


def test_the_checks_are_defined_once():
    """No module of pargrad keeps its own copy of a check this module holds."""
    import ast
    import pathlib

    import pargrad.checks

    package = pathlib.Path(pargrad.checks.__file__).parent
    names = set(pargrad.checks.__all__) - {"ArgumentTypeError"}
    copies = [f"{path.relative_to(package)}: {node.name}"
              for path in sorted(package.rglob("*.py")) if path.name != "checks.py"
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, (ast.FunctionDef, ast.ClassDef))
              and (node.name in names or node.name == "ArgumentTypeError")]
    assert len(names) == 7 and not copies, copies
