"""The peer server's caps: upload slots (concurrent file streams) and one shared byte rate.

- `UploadSlots(limit)`: at most `limit()` download pods served at once (a pod's concurrent
  file streams share its slot); `limit` is a callable so the node group's
  `peerDistribution.maxUploads` can change while the server runs (a lowered cap ends no
  stream: it only refuses new ones until enough have finished). `try_acquire(holder)` gives a
  `Slot` (a context manager that ends the stream) or None when full; the server then
  answers 429 with `retry_after()` (a whole number of seconds in 1..5, spread so refused
  fetchers do not all come back at once).
- `TokenBucket(rate, clock=...)`: a bytes-per-second bucket shared by every stream;
  `rate()` None or <= 0 means unlimited. `await take(n)` returns once `n` bytes may be sent
  (waiting on the injected clock); a burst of at most one second's worth accumulates while
  idle. A `take` larger than the burst is paid off over time (it never deadlocks).

Not promised: fairness between streams beyond the event loop's FIFO wake-up order.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import TracebackType

from localcache.runtime import clock as clock_mod

RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 5
STREAMS_PER_HOLDER = 8
"""Concurrent file streams one download pod may hold (the fetcher opens at most 4 by default)."""


class Slot:
    """One held stream of an upload slot; leaving the `with` block (or `release()`) ends it,
    once."""

    def __init__(self, owner: UploadSlots, holder: object) -> None:
        self._owner: UploadSlots | None = owner
        self._holder = holder

    def release(self) -> None:
        if self._owner is not None:
            self._owner._release(self._holder)
            self._owner = None

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class UploadSlots:
    """At most `limit()` download pods served at once (a limit below 1 counts as 1): a slot
    belongs to a holder (the requesting pod), whose concurrent file streams, at most
    `STREAMS_PER_HOLDER`, share it; without a holder each stream is its own."""

    def __init__(
        self, limit: Callable[[], int], *, jitter: Callable[[int, int], int] = random.randint
    ) -> None:
        self._limit = limit
        self._jitter = jitter
        self._streams: dict[object, int] = {}

    @property
    def in_use(self) -> int:
        return len(self._streams)

    def try_acquire(self, holder: object | None = None) -> Slot | None:
        key = object() if holder is None else holder
        held = self._streams.get(key)
        if held is None and len(self._streams) >= max(1, self._limit()):
            return None
        if held is not None and held >= STREAMS_PER_HOLDER:
            return None
        self._streams[key] = (held or 0) + 1
        return Slot(self, key)

    def _release(self, holder: object) -> None:
        left = self._streams.get(holder, 1) - 1
        if left > 0:
            self._streams[holder] = left
        else:
            self._streams.pop(holder, None)

    def retry_after(self) -> int:
        """Seconds a refused requester should wait: 1..5."""
        return self._jitter(RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S)


class TokenBucket:
    """A shared bytes-per-second limit; see the module docstring."""

    def __init__(
        self, rate: Callable[[], int | None], *, clock: clock_mod.Clock | None = None
    ) -> None:
        self._rate = rate
        self._clock: clock_mod.Clock = clock or clock_mod.SystemClock()
        self._tokens = 0.0
        self._stamp = self._clock.now()

    def _refill(self, rate: int) -> None:
        now = self._clock.now()
        self._tokens = min(float(rate), self._tokens + (now - self._stamp) * rate)
        self._stamp = now

    async def take(self, amount: int) -> None:
        """Wait until `amount` bytes may be sent (at once when unlimited)."""
        rate = self._rate()
        if rate is None or rate <= 0:
            return
        self._refill(rate)
        # Take now (the balance may go negative); whoever comes next waits for the debt too,
        # which keeps the total rate bounded without a queue of our own.
        self._tokens -= amount
        if self._tokens < 0:
            await self._clock.sleep(-self._tokens / rate)
