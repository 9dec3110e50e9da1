"""Rate limiters for the work queue: how long to wait before an item is retried.

A `RateLimiter` is three methods, as in client-go's `util/workqueue/default_rate_limiters.go`:

- `when(item)` returns the delay in seconds before `item` may be processed again, and
  records one more failure for it (so calling it *is* a retry);
- `forget(item)` clears what the limiter remembers about `item` (call it on success, or the
  per-item backoff keeps growing);
- `num_requeues(item)` says how many failures have been recorded for `item`.

Implementations compose: `ItemExponentialFailureRateLimiter` (per item, 5 ms doubling to a
1000 s cap), `BucketRateLimiter` (one token bucket for all items, 10 qps with a burst of 100)
and `MaxOfRateLimiter` (the largest delay of several). `default_controller_rate_limiter()`
is client-go's `DefaultControllerRateLimiter`: the maximum of the first two.

Time comes from an injected `Clock`, so the bucket is exact on a `FakeClock`. Not promised:
thread safety (everything runs on one event loop) and fairness between items beyond what the
bucket gives.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from localcache.runtime import clock as clock_mod


class RateLimiter(Protocol):
    """Decides how long an item waits before it is retried."""

    def when(self, item: Hashable) -> float:
        """Seconds to wait before `item` is processed again; records one more failure."""
        ...

    def forget(self, item: Hashable) -> None:
        """Stop tracking `item` (it succeeded)."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many failures are currently recorded for `item`."""
        ...


class ItemExponentialFailureRateLimiter:
    """Per-item exponential backoff: `base_delay * 2**failures`, capped at `max_delay`.

    With the defaults the delays are 5 ms, 10 ms, 20 ms, … reaching the 1000 s cap at the
    19th consecutive failure of the same item. `forget(item)` starts the item over at 5 ms.
    """

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError("need 0 < base_delay <= max_delay")
        self._base = base_delay
        self._max = max_delay
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        try:
            backoff = self._base * 2.0**exp
        except OverflowError:
            return self._max
        return min(backoff, self._max)

    def forget(self, item: Hashable) -> None:
        if self._failures:  # called after every success: skip hashing when nothing failed
            self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """One token bucket shared by all items: `burst` immediate calls, then `qps` per second.

    Like Go's `rate.Limiter.Reserve().Delay()`: every `when()` takes a token, even when
    another limiter's delay is larger; when the bucket is empty the token is borrowed from the
    future and the delay says when it becomes available. Items are not tracked, so `forget`
    does nothing and `num_requeues` is always 0.
    """

    def __init__(self, qps: float = 10.0, burst: int = 100, *, clock: clock_mod.Clock) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("need qps > 0 and burst >= 1")
        self._qps = qps
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.now()

    def when(self, item: Hashable) -> float:
        now = self._clock.now()
        elapsed = max(0.0, now - self._last)
        self._tokens = min(self._burst, self._tokens + elapsed * self._qps)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self._qps

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The largest delay of several limiters; every limiter sees every call."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self._limiters = limiters

    def when(self, item: Hashable) -> float:
        return max([limiter.when(item) for limiter in self._limiters])

    def forget(self, item: Hashable) -> None:
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self._limiters)


def default_controller_rate_limiter(clock: clock_mod.Clock) -> MaxOfRateLimiter:
    """client-go's default: max(per-item 5 ms → 1000 s, bucket 10 qps / burst 100)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(10.0, 100, clock=clock),
    )
