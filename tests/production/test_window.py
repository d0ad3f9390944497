"""Durations in Prometheus's notation (tuner/production/_window.py) and the audit's window (pure)."""

from __future__ import annotations

import pytest

from tuner.production import HOUR_S, WindowError, parse_duration, window_bounds
from tuner.production._window import format_duration, promql_range, retention_s


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("7d", 7 * 86400),
        ("36h", 36 * 3600),
        ("1h30m", 5400),
        ("2w", 14 * 86400),
        ("1y", 365 * 86400),
        ("90s", 90),
    ],
)
def test_a_duration_reads_as_prometheus_writes_it(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text, why",
    [
        ("abc", "not a duration"),
        ("7", "not a duration"),
        ("7 d", "not a duration"),
        ("-7d", "not a duration"),
        ("", "not a duration"),
        ("0h", "the duration must be longer than zero"),
    ],
)
def test_a_bad_duration_is_one_line_naming_the_flag(text, why):
    with pytest.raises(WindowError, match=f"^--window '{text}': {why}"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text, seconds",
    [("15d", 15 * 86400), ("30d or 10GiB", 30 * 86400), ("10GiB", None), (None, None), ("", None)],
)
def test_the_time_limit_of_prometheus_retention(text, seconds):
    assert retention_s(text) == seconds


def test_the_window_is_whole_steps_ending_on_a_step():
    assert window_bounds(7 * 86400, end=1_000_000 * HOUR_S) == (
        1_000_000 * HOUR_S - 7 * 86400,
        1_000_000 * HOUR_S,
    )
    start, end = window_bounds(2 * HOUR_S)
    assert end % HOUR_S == 0 and end - start == 2 * HOUR_S
    with pytest.raises(WindowError, match="^--window 90m: a whole number of 1h steps"):
        window_bounds(5400)
    with pytest.raises(WindowError, match="^--window 30m: a whole number of 1h steps"):
        window_bounds(1800)


@pytest.mark.parametrize(
    "seconds, text", [(604800, "1w"), (86400 * 3, "3d"), (5400, "90m"), (7200, "2h"), (1.5, "1.5s")]
)
def test_a_duration_is_said_in_its_largest_whole_unit(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds, text", [(3600, "[3600000ms]"), (1209600, "[1209600000ms]"), (33.8144, "[33814ms]")])
def test_a_promql_range_is_whole_milliseconds_that_prometheus_accepts(seconds, text):
    # `:g` wrote two weeks as 1.2096e+06s and a replay's window as 33.814s: Prometheus refused both
    assert promql_range(seconds) == text
