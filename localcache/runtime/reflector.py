"""The reflector: LIST then WATCH one resource, forever, keeping a sink in step with the server.

Semantics are client-go's `tools/cache/reflector.go`:

- LIST: the first list asks for resourceVersion "0" (served from the watch cache); a relist
  asks for the last resourceVersion seen; if that has expired (410) or after two consecutive
  watch expiries, it lists with "" (a quorum read), in pages of `page_size`, following
  continue tokens (and falling back to one unpaged list if a token expires). The sink gets
  the complete state through `replace()`.
- WATCH from the list's resourceVersion with `allowWatchBookmarks`, a server `timeoutSeconds`
  drawn from [min_watch_timeout, 2*min_watch_timeout] and a client-side `read_deadline`, so a
  connection that goes silent is abandoned. The resourceVersion of every event, bookmarks
  included, becomes the resume point.
- A clean end of the stream → watch again from the last resourceVersion (no relist).
- 410 Gone (as a status or as an ERROR event) → relist from the last resourceVersion.
- 429, 5xx, transport errors and read-deadline expiries → back off (0.8 s doubling to a 30 s
  base, each delay jittered up to +100 %, reset after 2 min without trouble) and watch again
  from the same resourceVersion. Other API errors (e.g. 403) → back off and relist.
- No error ever ends `run()`; only cancellation does.

It reads through a `listwatch.ListerWatcher` and writes to a `listwatch.StoreSink`.

Not promised: that every intermediate state is seen (changes coalesce while disconnected; a
delete + re-create while disconnected arrives as an update), or ordering across resources.
Time (backoff sleeps, liveness) comes from an injected `Clock`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, listwatch

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]

PAGE_SIZE = 500
MIN_WATCH_TIMEOUT_S = 300
READ_DEADLINE_S = 90.0
"""Longer than the ~60 s between the apiserver's bookmarks, so a healthy idle watch survives."""
VERY_SHORT_WATCH_S = 1.0


class Backoff:
    """client-go's reflector backoff: base delay 0.8 s doubling up to 30 s, each delay
    jittered to [base, base*(1+jitter)), back to the start after `reset_after` s of quiet."""

    def __init__(
        self,
        *,
        clock: clock_mod.Clock,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 1.0,
        reset_after: float = 120.0,
        rng: random.Random | None = None,
    ) -> None:
        self._clock = clock
        self._initial = initial
        self._cap = cap
        self._factor = factor
        self._jitter = jitter
        self._reset_after = reset_after
        self._rng = rng or random.Random()
        self._base = initial
        self._last: float | None = None

    def next_delay(self) -> float:
        now = self._clock.now()
        if self._last is not None and now - self._last > self._reset_after:
            self._base = self._initial
        base = self._base
        self._base = min(base * self._factor, self._cap)
        self._last = now
        return base + self._rng.random() * self._jitter * base

    @property
    def max_delay(self) -> float:
        return self._cap * (1.0 + self._jitter)


@dataclass(frozen=True, slots=True)
class ReflectorStats:
    """A snapshot of one reflector, for `Informer.stats()`, health checks and tests."""

    resource_version: str
    lists: int
    """Successful LISTs; every one after the first is a relist."""
    watches: int
    """WATCH connections opened; every one after the first is a restart."""
    events: int
    """Watch events received, bookmarks included."""
    errors: int
    """Failed LIST or WATCH attempts."""
    last_event_at: float | None
    """Clock time of the last watch event (bookmarks included), None before the first."""
    last_progress_at: float
    """Clock time the loop last moved: an event, a list, a watch (re)opened, a retry begun."""


class Reflector:
    """Keeps a `listwatch.StoreSink` equal to the server's state of one resource (module
    docstring)."""

    def __init__(
        self,
        source: listwatch.ListerWatcher,
        sink: listwatch.StoreSink,
        *,
        clock: clock_mod.Clock,
        page_size: int = PAGE_SIZE,
        min_watch_timeout: int = MIN_WATCH_TIMEOUT_S,
        read_deadline: float = READ_DEADLINE_S,
        list_timeout: float = 60.0,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._source = source
        self._sink = sink
        self._clock = clock
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self.read_deadline = read_deadline
        self._list_timeout = list_timeout
        self._rng = rng or random.Random()
        self._backoff = backoff or Backoff(clock=clock, rng=self._rng)
        self._rv = ""
        self._rv_unavailable = False  # next list must be a quorum read (RV "")
        self._paginated = False  # the server paginated an RV "0" list: keep paging
        self._expiries = 0  # consecutive watch expiries without a good event in between
        self._lists = 0
        self._watches = 0
        self._events = 0
        self._errors = 0
        self._last_event_at: float | None = None
        self._last_progress_at = clock.now()
        self._running = False

    @property
    def description(self) -> str:
        return self._source.description

    @property
    def liveness_deadline(self) -> float:
        """Seconds without progress after which the loop must be considered stuck: longer
        than any single wait the loop makes (a read deadline, a list, the longest backoff)."""
        return self.read_deadline + self._list_timeout + self._backoff.max_delay + 10.0

    def stats(self) -> ReflectorStats:
        return ReflectorStats(
            resource_version=self._rv,
            lists=self._lists,
            watches=self._watches,
            events=self._events,
            errors=self._errors,
            last_event_at=self._last_event_at,
            last_progress_at=self._last_progress_at,
        )

    async def run(self) -> None:
        """List and watch until cancelled. Never returns otherwise; no error escapes."""
        if self._running:
            raise RuntimeError(f"reflector for {self.description} is already running")
        self._running = True
        try:
            while True:
                if await self._list():
                    await self._watch_until_relist()
        finally:
            self._running = False

    # ---------------------------------------------------------------- list

    async def _list(self) -> bool:
        """One LIST into the sink; on failure back off and return False."""
        self._progress()
        rv = "" if self._rv_unavailable else (self._rv or "0")
        try:
            try:
                items, list_rv = await self._list_at(rv)
            except errors.ApiError as exc:
                if rv == "" or not _is_expired(exc):
                    raise
                # Our resourceVersion is too old for the server: ask for a quorum read.
                _log.info("reflector_list_expired", resource=self.description, resource_version=rv)
                self._rv_unavailable = True
                items, list_rv = await self._list_at("")
            self._sink.replace(items, list_rv)
        except errors.LocalcacheError as exc:
            await self._failed("list", exc)
            return False
        except Exception as exc:  # a bug or a malformed answer: never kill the loop
            await self._failed("list", exc, unexpected=True)
            return False
        self._rv_unavailable = False
        self._rv = list_rv
        self._lists += 1
        self._progress()
        _log.debug(
            "reflector_listed",
            resource=self.description,
            objects=len(items),
            resource_version=list_rv,
        )
        return True

    async def _list_at(self, rv: str) -> tuple[list[Obj], str]:
        # Paging only for quorum reads (or when the cache paginated anyway): a list at a
        # specific resourceVersion is then served from the watch cache in one piece.
        paginate = rv == "" or self._paginated
        limit = self._page_size if paginate else None
        items: list[Obj] = []
        token = ""
        while True:
            try:
                page = await self._source.list(
                    resource_version=rv, limit=limit, continue_token=token
                )
            except errors.Gone:
                if not token:
                    raise
                # The continue token expired mid-list: one unpaged list instead.
                page = await self._source.list(resource_version=rv, limit=None, continue_token="")
                return page.items, page.resource_version
            items.extend(page.items)
            if not page.continue_token:
                return items, page.resource_version
            if rv == "0":
                self._paginated = True
            token = page.continue_token
            self._progress()

    # ---------------------------------------------------------------- watch

    async def _watch_until_relist(self) -> None:
        """Watch (and re-watch) from the last resourceVersion until a relist is needed."""
        while True:
            self._progress()
            timeout_s = self._rng.randint(self._min_watch_timeout, 2 * self._min_watch_timeout)
            started = self._clock.now()
            received = 0
            try:
                async with self._source.watch(
                    resource_version=self._rv,
                    timeout_seconds=timeout_s,
                    read_deadline=self.read_deadline,
                ) as stream:
                    self._watches += 1
                    self._progress()
                    async for event in stream:
                        received += 1
                        self._handle(event)
            except errors.Gone as exc:
                self._errors += 1
                self._expiries += 1
                if self._expiries >= 2:
                    self._rv_unavailable = True
                _log.info(
                    "reflector_watch_expired",
                    resource=self.description,
                    resource_version=self._rv,
                    consecutive=self._expiries,
                    error=str(exc),
                )
                return
            except (errors.TooManyRequests, errors.ServerError, errors.TransportError) as exc:
                await self._failed("watch", exc)
                continue
            except errors.LocalcacheError as exc:
                await self._failed("watch", exc)
                return
            except Exception as exc:  # a bug or a malformed event: relist, never die
                await self._failed("watch", exc, unexpected=True)
                return
            if received == 0 and self._clock.now() - started < VERY_SHORT_WATCH_S:
                # The server closed at once: do not hammer it.
                await self._failed(
                    "watch", errors.TransportError("watch closed at once, no events")
                )
            else:
                _log.debug("reflector_watch_ended", resource=self.description, events=received)

    def _handle(self, event: Obj) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise errors.TransportError(f"watch event without an object: {kind}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "ADDED" or kind == "MODIFIED":
            self._sink.upsert(obj)
        elif kind == "DELETED":
            self._sink.delete(obj)
        elif kind != "BOOKMARK":
            _log.warning("reflector_unknown_event", resource=self.description, event_type=kind)
            return
        if rv:
            self._rv = str(rv)
        self._expiries = 0
        self._events += 1
        self._last_event_at = self._last_progress_at = self._clock.now()

    # ---------------------------------------------------------------- helpers

    def _progress(self) -> None:
        self._last_progress_at = self._clock.now()

    async def _failed(self, phase: str, exc: BaseException, *, unexpected: bool = False) -> None:
        self._errors += 1
        delay = self._backoff.next_delay()
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(retry_after, int | float) and retry_after > delay:
            delay = float(retry_after)
        _log.warning(
            "reflector_list_failed" if phase == "list" else "reflector_watch_failed",
            resource=self.description,
            resource_version=self._rv,
            error=str(exc),
            error_type=type(exc).__name__,
            retry_in=round(delay, 3),
            exc_info=exc if unexpected else None,
        )
        self._progress()
        await self._clock.sleep(delay)
        self._progress()


def _is_expired(exc: errors.ApiError) -> bool:
    """410 Gone, or the "too large resource version" answer (504, cause
    ResourceVersionTooLarge): either way the list must be retried as a quorum read."""
    if isinstance(exc, errors.Gone):
        return True
    causes = (exc.body.get("details") or {}).get("causes") or []
    too_large = any(
        isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge" for c in causes
    )
    return too_large or "too large resource version" in exc.message.lower()
