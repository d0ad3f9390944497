"""tuner.formats: a number reads the same wherever it is printed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.formats import figure, first_line, gain, hms, number


@pytest.mark.parametrize("value, spec, missing, text", [
    (12.3456, ".3g", "-", "12.3"),
    (np.float64(0.5), ".3g", "-", "0.5"),
    (1234567.8, ",.0f", "-", "1,234,568"),
    (7, ",.0f", "-", "7"),
    (None, ".3g", "-", "-"),
    (None, ".3g", "?", "?"),
    (math.nan, ".3g", "-", "nan"),  # only a missing value is a mark: NaN is printed as it is
])
def test_a_number_is_its_format_or_the_mark_of_a_missing_one(value, spec, missing, text):
    assert number(value, spec, missing=missing) == text


def test_a_gain_is_a_signed_percentage_and_inf_past_any_ratio():
    assert [gain(g) for g in (0.05, -0.1234, 0.0, math.inf, None)] == ["+5.0%", "-12.3%", "+0.0%", "inf", "-"]


def test_hms_rounds_to_the_second():
    assert [hms(s) for s in (0, 59.6, 3661.2, 86399)] == ["00:00:00", "00:01:00", "01:01:01", "23:59:59"]


@pytest.mark.parametrize("value, text", [
    (12.345, "12.3"), (0.0012345, "0.00123"), (123.4, "123"), (28195.4, "28,195"), (1234567.0, "1,234,567"),
    (7, "7"), (None, "-"), (math.nan, "-"), (math.inf, "-"), ("n/a", "n/a"),
])
def test_a_figure_of_a_table_has_three_digits_or_whole_thousands_and_a_mark_where_there_is_none(value, text):
    assert figure(value) == text


def test_an_error_is_its_first_non_blank_line_and_one_with_no_message_its_type():
    assert first_line(ValueError("\n  bad row 3  \nTraceback (most recent call last):\n  ...")) == "bad row 3"
    # an exception whose message is empty (pyarrow's and pandas' sometimes are) still gives a word, not an IndexError
    assert first_line(KeyError()) == "KeyError"
    assert first_line(OSError("")) == "OSError"
    assert first_line("") == ""
    assert first_line("one\ntwo") == "one"
