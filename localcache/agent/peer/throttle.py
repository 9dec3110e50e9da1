"""The peer server's caps: upload slots (concurrent file streams) and one shared byte rate.

- `UploadSlots(limit)`: at most `limit()` file streams at once; `limit` is a callable so the
  node group's `peerDistribution.maxUploads` can change while the server runs (a lowered cap
  ends no stream: it only refuses new ones until enough have finished). `try_acquire()` gives a
  `Slot` (a context manager that frees it) or None when full; the server then answers 429 with
  `retry_after()` (a whole number of seconds in 1..5, spread so refused fetchers do not all come
  back at once).
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


class Slot:
    """One held upload slot; leaving the `with` block (or `release()`) frees it, once."""

    def __init__(self, owner: UploadSlots) -> None:
        self._owner: UploadSlots | None = owner

    def release(self) -> None:
        if self._owner is not None:
            self._owner._release()
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
    """At most `limit()` concurrent streams (a limit below 1 counts as 1)."""

    def __init__(
        self, limit: Callable[[], int], *, jitter: Callable[[int, int], int] = random.randint
    ) -> None:
        self._limit = limit
        self._jitter = jitter
        self._held = 0

    @property
    def in_use(self) -> int:
        return self._held

    def try_acquire(self) -> Slot | None:
        if self._held >= max(1, self._limit()):
            return None
        self._held += 1
        return Slot(self)

    def _release(self) -> None:
        self._held -= 1

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
