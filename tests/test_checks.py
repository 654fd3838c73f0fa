"""ddnb._checks, the one validation helper: every problem of a call in one ValueError."""
import math

import pytest

from ddnb._checks import Checks, check_positive_ints, is_int, is_number


def test_predicates():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(2.5) and is_number(3) and not is_number(False) and not is_number(math.nan)
    assert not is_number(math.inf) and not is_number("1") and not is_number(1j)


def test_every_problem_in_one_error():
    with pytest.raises(ValueError) as info:
        with Checks("f") as check:
            check.integer("n", 0, min=1, max=64)
            check.number("t", math.inf, positive=True, why=" (seconds)")
            check.number("p", 1, min=0, below=1)
            check.number("mfu", 2, positive=True, max=1)
            check.choice("mode", "x", ("a", "b"))
            check.integers("sizes", [3], min=1, count=2)
            check.rule(False, "a rule")
    assert str(info.value) == ("f: n=0: need an integer >= 1 and <= 64; t=inf: need a finite number > 0 (seconds); "
                               "p=1: need a number >= 0 and < 1; mfu=2: need a number > 0 and <= 1; "
                               "mode='x' is not one of ('a', 'b'); sizes=[3]: need at least 2 integers >= 1; "
                               "a rule")


def test_good_values_pass_and_none_when_allowed():
    with Checks("f") as check:
        assert check.integer("n", None, none=True) and check.number("t", None, none=True)
        assert check.positive_ints(a=1, b=2) and check.positive_numbers(x=0.5)
        assert check.integers("sizes", (1, 2), min=1, count=2)
    with pytest.raises(ValueError, match=r"^g: a=0: need an integer >= 1; b=True: need an integer >= 1$"):
        check_positive_ints("g", a=0, b=True)
