"""The shared value checks: one message shape for every configuration's bad value."""

import math

import pytest

from perfkit.core import checks
from perfkit.core.errors import BadInputError


def test_one_of_lists_the_choices_in_order_and_names_what_it_got():
    checks.one_of("format", "lmdb", ("parquet", "lmdb"))
    with pytest.raises(BadInputError, match=r"^format must be one of 'parquet', 'lmdb', got 'tfrecord'$"):
        checks.one_of("format", "tfrecord", ("parquet", "lmdb"))


@pytest.mark.parametrize("value", [True, 1.0, "2", -1])
def test_integer_at_least_refuses_bools_floats_strings_and_small_values(value):
    with pytest.raises(BadInputError, match=rf"^steps must be an integer >= 0, got {value!r}$"):
        checks.integer_at_least("steps", value, 0)


def test_integer_at_least_takes_the_bound_itself():
    checks.integer_at_least("steps", 1, 1)


@pytest.mark.parametrize("value", [-0.001, math.nan, math.inf, False, "1"])
def test_seconds_at_least_zero_refuses_negative_non_finite_and_non_numbers(value):
    with pytest.raises(BadInputError, match="^delay_s must be a number of seconds >= 0"):
        checks.seconds_at_least_zero("delay_s", value)
    checks.seconds_at_least_zero("delay_s", 0)
    checks.seconds_at_least_zero("delay_s", 0.5)
