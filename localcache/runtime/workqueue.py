"""The work queue between event handlers and workers, with client-go's semantics.

It carries keys, never events. Three structures, as in client-go's `util/workqueue/queue.go`:

- `_queue`: keys ready to be handed out, in FIFO order (a key appears at most once);
- `_dirty`: keys that need processing (with when they were added, for the queue-duration
  metric). Every key in `_queue` is dirty; a key that is dirty *and* processing is not in
  `_queue`: `done()` puts it back;
- `_processing`: keys handed out by `get()` and not yet `done()`.

Guarantees (client-go `doc.go`):

- fair: keys are handed out in the order they were first added;
- stingy: adding a key several times before it is processed yields one processing, and a key
  is never handed to two workers at once;
- a key added while it is being processed is processed again after `done()`;
- `add_after(key, delay)` adds the key once the delay has passed; if the key is already
  waiting, the earlier deadline wins (a deadline is never postponed);
- `add_rate_limited(key)` is `add_after(key, rate_limiter.when(key))`; `forget(key)` resets
  the key's backoff (call it on success);
- after `shutdown()`, adds are ignored, keys still queued are handed out, then `get()` raises
  `ShutDown`; with `drain=True` `shutdown()` also waits until every key handed out is done.

Delayed keys and the periodic metrics update are driven by `run()`, a coroutine that the
queue's owner (normally `Controller.run`) runs as one named task in its TaskGroup; it returns
on shutdown. Keys added with a delay before `run()` starts wait until it does.

Not promised: thread safety (one event loop), persistence, or any priority between keys.
Time comes from an injected `Clock`; metrics go to an optional `QueueMetrics` sink whose
methods map one-to-one onto controller-runtime's `workqueue_*` metrics.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from localcache.runtime import clock as clock_mod
from localcache.runtime import keys, ratelimit

#: How long the delay loop sleeps when no key is waiting (client-go `maxWait`).
HEARTBEAT_SECONDS = 10.0
#: How often unfinished-work gauges are refreshed (client-go `defaultUnfinishedWorkUpdatePeriod`).
METRICS_UPDATE_SECONDS = 0.5
#: A deadline this close to now counts as due, and the loop wakes this much early: absorbs the
#: float rounding of summed delays (1000.0 + 29.9 + 0.1 < 1000.0 + 30.0).
DEADLINE_TOLERANCE = 1e-6


class ShutDown(Exception):
    """`get()` on a queue that is shut down and has nothing left to hand out."""


class QueueMetrics(Protocol):
    """Where the queue reports; one method per controller-runtime `workqueue_*` metric."""

    def set_depth(self, depth: int) -> None: ...
    def inc_adds(self) -> None: ...
    def observe_queue_duration(self, seconds: float) -> None: ...
    def observe_work_duration(self, seconds: float) -> None: ...
    def inc_retries(self) -> None: ...
    def set_unfinished_work(self, seconds: float) -> None: ...
    def set_longest_running_processor(self, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue, for health checks, metrics and tests."""

    name: str
    depth: int
    """Keys that need processing (queued, or dirty while processing): `workqueue_depth`."""
    processing: int
    """Keys handed out by `get()` and not yet `done()`."""
    waiting: int
    """Keys waiting for an `add_after` deadline."""
    adds: int
    """Genuinely new adds since creation (`workqueue_adds_total`)."""
    retries: int
    """`add_after`/`add_rate_limited` calls since creation (`workqueue_retries_total`)."""
    longest_running_seconds: float
    """Age of the oldest key in processing."""
    unfinished_work_seconds: float
    """Sum of the ages of all keys in processing."""
    shutting_down: bool


class WorkQueue:
    """A rate-limiting, delaying work queue of `ObjectKey`s (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        clock: clock_mod.Clock,
        rate_limiter: ratelimit.RateLimiter | None = None,
        metrics: QueueMetrics | None = None,
    ) -> None:
        """`rate_limiter` defaults to `ratelimit.default_controller_rate_limiter(clock)`."""
        self.name = name
        self._clock = clock
        self._limiter = rate_limiter or ratelimit.default_controller_rate_limiter(clock)
        self._metrics = metrics
        self._queue: deque[keys.ObjectKey] = deque()
        self._dirty: dict[keys.ObjectKey, float] = {}  # key -> when it became dirty (metrics)
        self._processing: dict[keys.ObjectKey, float] = {}  # key -> when get() handed it out
        self._getters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False
        self._drained: asyncio.Event | None = None
        # Delayed keys: deadline per key, and a heap with lazy deletion of superseded entries.
        self._deadlines: dict[keys.ObjectKey, float] = {}
        self._heap: list[tuple[float, int, keys.ObjectKey]] = []
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self._next_wake = math.inf  # when run() plans to wake next
        self._running = False
        self._adds = 0
        self._retries = 0

    # -- the basic queue -----------------------------------------------------------------

    def add(self, key: keys.ObjectKey) -> None:
        """Mark `key` as needing processing. Ignored after shutdown; coalesces duplicates."""
        if self._shutting_down:
            return
        metrics = self._metrics
        dirty = self._dirty
        size = len(dirty)
        # "if key in dirty: return", with one hash of the key instead of two
        dirty.setdefault(key, 0.0 if metrics is None else self._clock.now())
        if len(dirty) == size:
            return
        self._adds += 1
        if metrics is not None:
            metrics.inc_adds()
            metrics.set_depth(len(dirty))
        if self._processing and key in self._processing:
            return  # done() re-queues it
        self._queue.append(key)
        if self._getters:
            self._wake_one_getter()

    async def get(self) -> keys.ObjectKey:
        """Wait for the next key and mark it processing; the caller must call `done(key)`.

        Raises `ShutDown` once the queue is shut down and nothing is left to hand out.
        """
        while not self._queue:
            if self._shutting_down:
                raise ShutDown(self.name)
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._getters:
                    self._getters.remove(waiter)
                elif self._queue:
                    self._wake_one_getter()  # we were woken for a key we will not take
                raise
        return self._take()

    def try_get(self) -> keys.ObjectKey | None:
        """`get()` without waiting: the next key if one is ready now (the caller must then call
        `done(key)`), else None (also once shut down with nothing left)."""
        return self._take() if self._queue else None

    def _take(self) -> keys.ObjectKey:
        key = self._queue.popleft()
        now = self._clock.now()
        added = self._dirty.pop(key, now)  # a queued key is dirty
        self._processing[key] = now
        if self._metrics is not None:
            self._metrics.set_depth(len(self._dirty))
            self._metrics.observe_queue_duration(max(0.0, now - added))
        return key

    def done(self, key: keys.ObjectKey) -> None:
        """Finish processing `key`; if it was added meanwhile, queue it again."""
        try:
            started = self._processing.pop(key)
        except KeyError:
            raise ValueError(f"done({key}) for a key that is not being processed") from None
        if self._metrics is not None:
            self._metrics.observe_work_duration(max(0.0, self._clock.now() - started))
        if self._dirty and key in self._dirty:
            self._queue.append(key)
            self._wake_one_getter()
        if not self._processing and self._drained is not None:
            self._drained.set()

    def __len__(self) -> int:
        """Keys ready to be handed out now."""
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    async def shutdown(self, *, drain: bool = False) -> None:
        """Stop accepting adds and wake every waiting `get()`; drop keys waiting for a delay.

        With `drain`, also wait until every key handed out has been `done()` (workers must keep
        calling `done`, or this waits forever: bound it with a timeout). Idempotent.
        """
        self._shutting_down = True
        self._deadlines.clear()
        self._heap.clear()
        self._wakeup.set()
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        if drain:
            if self._drained is None:
                self._drained = asyncio.Event()
            # Loop: keys still queued are handed out after shutdown, so processing can empty
            # and refill before this task resumes.
            while self._processing:
                self._drained.clear()
                await self._drained.wait()

    def reopen(self) -> None:
        """Make a shut-down queue fresh: empty, accepting adds again (a controller restarted
        after its process lost and regained leadership). The rate limiter keeps its per-key
        memory. Only once `run()` has returned and every key handed out is `done()`."""
        if self._running or self._processing:
            raise RuntimeError(f"workqueue {self.name}: reopen() while still in use")
        self._queue.clear()
        self._dirty.clear()
        self._deadlines.clear()
        self._heap.clear()
        self._getters.clear()
        self._drained = None
        self._shutting_down = False
        if self._metrics is not None:
            self._metrics.set_depth(0)

    # -- delaying and rate limiting ------------------------------------------------------

    def add_after(self, key: keys.ObjectKey, delay: float) -> None:
        """Add `key` once `delay` seconds have passed; an earlier pending deadline wins."""
        if self._shutting_down:
            return
        self._retries += 1
        if self._metrics is not None:
            self._metrics.inc_retries()
        if delay <= 0:
            self.add(key)
            return
        deadline = self._clock.now() + delay
        current = self._deadlines.get(key)
        if current is not None and current <= deadline:
            return
        self._deadlines[key] = deadline
        heapq.heappush(self._heap, (deadline, next(self._seq), key))
        if deadline < self._next_wake:
            self._wakeup.set()  # the loop must wake earlier than it planned

    def add_rate_limited(self, key: keys.ObjectKey) -> None:
        """Add `key` after the rate limiter's delay for it (one more recorded failure)."""
        if self._shutting_down:
            return
        self.add_after(key, self._limiter.when(key))

    def forget(self, key: keys.ObjectKey) -> None:
        """Reset the rate limiter's memory of `key` (it was processed successfully)."""
        self._limiter.forget(key)

    def num_requeues(self, key: keys.ObjectKey) -> int:
        """Failures the rate limiter has recorded for `key` since it was last forgotten."""
        return self._limiter.num_requeues(key)

    async def run(self) -> None:
        """Move delayed keys into the queue when due and refresh the unfinished-work gauges.

        Runs until `shutdown()` (then returns) or cancellation. Run it exactly once, as a
        named task of the owner's TaskGroup.
        """
        if self._running:
            raise RuntimeError(f"workqueue {self.name}: run() is already running")
        self._running = True
        next_tick = self._clock.now()
        try:
            while not self._shutting_down:
                self._wakeup.clear()
                now = self._clock.now()
                # Sleep until exactly the next deadline (not a heartbeat step), so a clock that
                # jumps, like FakeClock, fires every deadline it passes.
                next_deadline = self._add_due_keys(now)
                wake_at = now + HEARTBEAT_SECONDS if next_deadline is None else next_deadline
                if self._metrics is not None:
                    if now >= next_tick - DEADLINE_TOLERANCE:
                        self._update_unfinished_metrics()
                        next_tick = now + METRICS_UPDATE_SECONDS
                    wake_at = min(wake_at, next_tick)
                self._next_wake = wake_at
                # Waking a hair early is harmless: a deadline within the tolerance is due.
                await self._wait(wake_at - now - DEADLINE_TOLERANCE)
        finally:
            self._running = False
            self._next_wake = math.inf

    def stats(self) -> QueueStats:
        now = self._clock.now()
        ages = [max(0.0, now - started) for started in self._processing.values()]
        return QueueStats(
            name=self.name,
            depth=len(self._dirty),
            processing=len(self._processing),
            waiting=len(self._deadlines),
            adds=self._adds,
            retries=self._retries,
            longest_running_seconds=max(ages, default=0.0),
            unfinished_work_seconds=sum(ages),
            shutting_down=self._shutting_down,
        )

    # -- internals -----------------------------------------------------------------------

    def _wake_one_getter(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _add_due_keys(self, now: float) -> float | None:
        """Add every key whose deadline has passed; return the next deadline, if any."""
        while self._heap:
            deadline, _, key = self._heap[0]
            if self._deadlines.get(key) != deadline:
                heapq.heappop(self._heap)  # superseded by an earlier deadline
                continue
            if deadline > now + DEADLINE_TOLERANCE:
                return deadline
            heapq.heappop(self._heap)
            del self._deadlines[key]
            self.add(key)
        return None

    def _update_unfinished_metrics(self) -> None:
        if self._metrics is None:
            return
        stats = self.stats()
        self._metrics.set_unfinished_work(stats.unfinished_work_seconds)
        self._metrics.set_longest_running_processor(stats.longest_running_seconds)

    async def _wait(self, seconds: float) -> None:
        """Sleep on the clock for `seconds`, or less if `_wakeup` is set meanwhile."""
        sleeper = asyncio.create_task(
            self._clock.sleep(seconds), name=f"workqueue-{self.name}-sleep"
        )
        waker = asyncio.create_task(self._wakeup.wait(), name=f"workqueue-{self.name}-wakeup")
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, waker):
                task.cancel()
            await asyncio.gather(sleeper, waker, return_exceptions=True)
