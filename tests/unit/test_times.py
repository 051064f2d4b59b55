"""`berth.api.times.read_time`: every time a user may write where Berth reads one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.api.times import read_time

NOON = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T12:00:30Z", NOON),
        ("2026-01-01t12:00:30z", NOON),  # the schema's date-time lets lower case in
        ("2026-01-01T12:00:30.250000Z", NOON + timedelta(milliseconds=250)),
        ("2026-01-01T14:00:30+02:00", NOON),  # in UTC
        ("1969-12-31T23:59:59Z", datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ("9998-12-31T23:59:59Z", datetime(9998, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ("9999-12-31T23:59:59.999999Z", None),  # a second later overflows
        ("0001-01-01T00:00:00+14:00", None),  # before year 1 in UTC
        ("9999-12-31T23:00:00-10:00", None),  # after year 9999 in UTC
        ("0000-01-01T00:00:00Z", None),  # the schema lets year 0 in
        ("2026-01-01T12:00:30x5Z", None),  # and any character before a fraction
        ("2026-01-01T12:00:30", None),  # no zone
        ("soon", None),
        ("", None),
        (None, None),
        (1767268830, None),
    ],
)
def test_a_time_is_read_in_utc_or_not_at_all(text: object, expected: datetime | None) -> None:
    moment = read_time(text)
    assert moment == expected
    if moment is not None:
        assert moment.utcoffset() == timedelta(0)
        assert moment + timedelta(seconds=1) > moment  # never at the edge
