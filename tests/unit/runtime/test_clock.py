"""The one RFC 3339 formatter: metav1.Time and MicroTime, and reading them back."""

from __future__ import annotations

import datetime

from localcache.runtime import clock

T = datetime.datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=datetime.UTC)


def test_times_are_written_as_the_api_writes_them() -> None:
    assert clock.rfc3339(T) == "2026-03-01T10:00:00Z"
    assert clock.rfc3339_micro(T) == "2026-03-01T10:00:00.123456Z"
    plus_two = T.astimezone(datetime.timezone(datetime.timedelta(hours=2)))
    assert clock.rfc3339(plus_two) == "2026-03-01T10:00:00Z", "always in UTC"


def test_now_is_utc_with_second_precision() -> None:
    parsed = clock.parse_rfc3339(clock.now_rfc3339())
    assert parsed is not None
    assert parsed.microsecond == 0
    assert abs(parsed - datetime.datetime.now(datetime.UTC)) < datetime.timedelta(minutes=1)


def test_timestamps_read_back_as_aware_datetimes_or_none() -> None:
    assert clock.parse_rfc3339("2026-03-01T10:00:00Z") == T.replace(microsecond=0)
    assert clock.parse_rfc3339(clock.rfc3339_micro(T)) == T
    assert clock.parse_rfc3339("2026-03-01T10:00:00") == T.replace(microsecond=0)
    for bad in ("", "yesterday", None, 5):
        assert clock.parse_rfc3339(bad) is None
