"""A controller: N workers taking keys from a work queue and calling a Reconciler.

The worker loop is controller-runtime's (`pkg/internal/controller/controller.go`): `get()` a
key, reconcile it under a per-reconcile timeout with `controller`, `key` and a fresh
`reconcile_id` bound into the structlog context, then a four-way switch on the outcome:

    outcome                              queue                          result label
    raised errors.TerminalError          forget (no requeue)            error  (+ terminal)
    raised anything else / timed out     add_rate_limited (backoff)     error
    Result(requeue_after=s), s > 0       forget, add_after(s)           requeue_after
    Result() / requeue_after 0 or None   forget                         success

Errors of either kind count in `controller_runtime_reconcile_errors_total`; a timeout also
counts in `controller_runtime_reconcile_timeouts_total`. `done(key)` is always called, so a
key added during its reconcile runs again afterwards. An ExceptionGroup whose members are all
TerminalErrors is terminal; any other member makes it a retryable error.

Lifecycle: `run()` starts the queue's delay loop and the workers as named tasks of one
TaskGroup. It returns when the queue has been shut down and emptied; when cancelled it
cancels in-flight reconciles, shuts the queue down and re-raises. Either way no task is
left behind. Not promised: that a cancelled reconcile ran to completion (reconcilers must be
idempotent), or any ordering between keys.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, reconcile, workqueue
from localcache.runtime import logging as log_setup

#: Default per-reconcile timeout in seconds (`None` disables the timeout).
DEFAULT_RECONCILE_TIMEOUT = 120.0

_log = structlog.get_logger(__name__)


class ControllerMetrics(Protocol):
    """Where a controller reports; one method per controller-runtime `controller_runtime_*`
    series. `metrics.Metrics.controller(name)` returns one."""

    def set_max_concurrent_reconciles(self, value: int) -> None: ...
    def inc_active_workers(self) -> None: ...
    def dec_active_workers(self) -> None: ...
    def inc_reconcile_total(self, result: str) -> None: ...
    def inc_reconcile_errors(self) -> None: ...
    def inc_terminal_reconcile_errors(self) -> None: ...
    def inc_reconcile_timeouts(self) -> None: ...
    def observe_reconcile_time(self, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class ControllerStats:
    """A snapshot of one controller, for health checks and tests."""

    name: str
    workers: int
    """Configured number of workers (max concurrent reconciles)."""
    active_workers: int
    """Workers inside a reconcile right now."""
    reconciles: int
    """Reconciles finished (any outcome) since creation."""
    errors: int
    """Reconciles that raised or timed out, terminal ones included."""
    terminal_errors: int
    timeouts: int
    longest_running_reconcile_seconds: float
    """Age of the oldest reconcile in flight (0 when idle)."""
    running: bool


class Controller:
    """Runs `reconciler` for keys from `queue` on `workers` concurrent workers."""

    def __init__(
        self,
        name: str,
        reconciler: reconcile.Reconciler,
        queue: workqueue.WorkQueue,
        *,
        clock: clock_mod.Clock,
        workers: int = 1,
        reconcile_timeout: float | None = DEFAULT_RECONCILE_TIMEOUT,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a controller needs at least one worker")
        self.name = name
        self.queue = queue
        self._reconciler = reconciler
        self._clock = clock
        self._workers = workers
        self._timeout = reconcile_timeout
        self._metrics = metrics
        self._in_flight: dict[int, float] = {}  # worker index -> reconcile start time
        self._reconciles = 0
        self._errors = 0
        self._terminal = 0
        self._timeouts = 0
        self._running = False

    async def run(self) -> None:
        """Run the queue's delay loop and the workers until the queue is shut down and
        drained (then return) or until cancelled (then re-raise). Call at most once at a time."""
        if self._running:
            raise RuntimeError(f"controller {self.name} is already running")
        self._running = True
        if self._metrics is not None:
            self._metrics.set_max_concurrent_reconciles(self._workers)
        _log.info("controller_started", controller=self.name, workers=self._workers)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.queue.run(), name=f"controller-{self.name}-queue")
                for index in range(self._workers):
                    tg.create_task(
                        self._worker(index), name=f"controller-{self.name}-worker-{index}"
                    )
        finally:
            await self.queue.shutdown()  # no drain: never suspends, safe while cancelled
            self._running = False
            _log.info("controller_stopped", controller=self.name)

    def stats(self) -> ControllerStats:
        now = self._clock.now()
        return ControllerStats(
            name=self.name,
            workers=self._workers,
            active_workers=len(self._in_flight),
            reconciles=self._reconciles,
            errors=self._errors,
            terminal_errors=self._terminal,
            timeouts=self._timeouts,
            longest_running_reconcile_seconds=max(
                (max(0.0, now - t) for t in self._in_flight.values()), default=0.0
            ),
            running=self._running,
        )

    def stuck_check(self, limit: float) -> Callable[[], str | None]:
        """A liveness check for `httpserver`: fails while a reconcile has run past `limit` s."""

        def check() -> str | None:
            longest = self.stats().longest_running_reconcile_seconds
            if longest > limit:
                return (
                    f"controller {self.name}: a worker is stuck in a reconcile for {longest:.0f}s"
                )
            return None

        return check

    # -- the worker loop -----------------------------------------------------------------

    async def _worker(self, index: int) -> None:
        while True:
            try:
                key = await self.queue.get()
            except workqueue.ShutDown:
                return
            try:
                await self._process(index, key)
            finally:
                self.queue.done(key)

    async def _process(self, index: int, key: keys.ObjectKey) -> None:
        started = self._clock.now()
        self._in_flight[index] = started
        if self._metrics is not None:
            self._metrics.inc_active_workers()
        try:
            with log_setup.reconcile_context(
                controller=self.name, key=key, reconcile_id=str(uuid.uuid4())
            ):
                await self._reconcile_handler(key)
        finally:
            del self._in_flight[index]
            self._reconciles += 1
            if self._metrics is not None:
                self._metrics.dec_active_workers()
                self._metrics.observe_reconcile_time(max(0.0, self._clock.now() - started))

    async def _reconcile_handler(self, key: keys.ObjectKey) -> None:
        deadline = asyncio.timeout(self._timeout)
        try:
            async with deadline:
                result = await self._reconciler.reconcile(key)
        except Exception as exc:
            timed_out = isinstance(exc, TimeoutError) and deadline.expired()
            self._on_error(key, exc, timed_out=timed_out)
            return
        if result.requeue_after:
            self.queue.forget(key)
            self.queue.add_after(key, result.requeue_after)
            self._count("requeue_after")
            _log.debug("reconcile_requeue_after", requeue_after=result.requeue_after)
        else:
            self.queue.forget(key)
            self._count("success")
            _log.debug("reconcile_succeeded")

    def _on_error(self, key: keys.ObjectKey, exc: Exception, *, timed_out: bool) -> None:
        self._errors += 1
        self._count("error")
        if self._metrics is not None:
            self._metrics.inc_reconcile_errors()
        if _is_terminal(exc):
            self._terminal += 1
            if self._metrics is not None:
                self._metrics.inc_terminal_reconcile_errors()
            self.queue.forget(key)
            _log.error("reconcile_terminal_error", error=str(exc), error_type=type(exc).__name__)
            return
        if timed_out:
            self._timeouts += 1
            if self._metrics is not None:
                self._metrics.inc_reconcile_timeouts()
        self.queue.add_rate_limited(key)
        # Expected failures (API errors, transport) log without a traceback; bugs with one.
        _log.error(
            "reconcile_timed_out" if timed_out else "reconcile_failed",
            error=str(exc),
            error_type=type(exc).__name__,
            requeues=self.queue.num_requeues(key),
            exc_info=None if timed_out or isinstance(exc, errors.LocalcacheError) else exc,
        )

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.inc_reconcile_total(result)


def _is_terminal(exc: BaseException) -> bool:
    if isinstance(exc, errors.TerminalError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(errors.TerminalError)
        return rest is None
    return False
