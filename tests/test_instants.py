"""tuner.instants: the points in a recording's time a person writes (traffic.since/until, --since)."""

from __future__ import annotations

import datetime

import pytest

from tuner.errors import TrafficError
from tuner.instants import instant_text, parse_instant

NOON = 1_764_676_800.0  # 2025-12-02 12:00:00 UTC


@pytest.mark.parametrize("value", ["2025-12-02T12:00", "2025-12-02 12:00:00", "2025-12-02T12:00:00Z",
                                   "2025-12-02T13:00:00+01:00", " 2025-12-02T12:00:00.000 ", NOON, int(NOON),
                                   str(NOON), datetime.datetime(2025, 12, 2, 12, tzinfo=datetime.UTC)])
def test_every_way_of_writing_noon_utc_reads_the_same(value):
    assert parse_instant(value) == NOON


def test_a_date_alone_is_its_midnight_utc_and_small_numbers_are_the_recordings_own_clock():
    assert parse_instant("2025-12-02") == NOON - 12 * 3600
    assert parse_instant(datetime.date(2025, 12, 2)) == NOON - 12 * 3600
    assert parse_instant("12.5") == 12.5  # a Triton trace's steady clock, in seconds


@pytest.mark.parametrize("value", ["yesterday", "2025-13-02", "", "nan", "inf", True])
def test_what_is_not_a_time_is_one_line_naming_it(value):
    with pytest.raises(TrafficError, match=r"^--since: ") as exc:
        parse_instant(value, "--since")
    assert "\n" not in str(exc.value)


def test_a_time_reads_as_a_utc_date_when_it_looks_like_unix_seconds():
    assert instant_text(NOON) == "2025-12-02 12:00:00 UTC"
    assert instant_text(12.5) == "12.5 s"
