"""Clock protocol and implementations, so time-based logic is testable on a fake clock.

`Clock.now()` is monotonic seconds; `Clock.sleep()` waits on that timeline. `FakeClock` only
moves when a test calls `advance()`, waking sleepers whose deadline has passed, in order.

Wall-clock timestamps as the API writes them (the one RFC 3339 formatter): `rfc3339(dt)` is
metav1.Time (seconds, UTC, `Z`: `2026-03-01T10:00:00Z`), `rfc3339_micro(dt)` metav1.MicroTime
(`2026-03-01T10:00:00.123456Z`, Leases), `now_rfc3339()` the current time as metav1.Time, and
`parse_rfc3339(value)` reads either back as an aware datetime (None when it is not one).
"""

from __future__ import annotations

import asyncio
import datetime
import heapq
import itertools
import time
from typing import Any, Protocol


def rfc3339(value: datetime.datetime) -> str:
    """`value` as metav1.Time: RFC 3339 in UTC with second precision (a naive `value` is
    taken as local time)."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(value: datetime.datetime) -> str:
    """`value` as metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    """The wall-clock time now, as metav1.Time."""
    return rfc3339(datetime.datetime.now(datetime.UTC))


def parse_rfc3339(value: Any) -> datetime.datetime | None:
    """An RFC 3339 timestamp as an aware datetime (UTC when it names no zone), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real monotonic clock."""

    now = staticmethod(time.monotonic)  # called several times per event: no extra frame

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only on `advance()`; sleepers wake when their deadline is reached."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward and let every task woken by it run until it blocks again."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
        for _ in range(10):
            await asyncio.sleep(0)
