"""A controller: N workers taking keys from a work queue and calling a Reconciler.

The worker loop is controller-runtime's (`pkg/internal/controller/controller.go`): `get()` a
key, reconcile it under a per-reconcile timeout with `controller`, `key` and a fresh
`reconcile_id` bound into the structlog context (through `structlog.contextvars`, so every
line logged during the reconcile carries them), then a four-way switch on the outcome:

    outcome                              queue                          result label
    raised errors.TerminalError          forget (no requeue)            error  (+ terminal)
    raised anything else / timed out     add_rate_limited (backoff)     error
    Result(requeue_after=s), s > 0       forget, add_after(s)           requeue_after
    Result() / requeue_after 0 or None   forget                         success

Errors of either kind count in `controller_runtime_reconcile_errors_total`; a timeout also
counts in `controller_runtime_reconcile_timeouts_total`. An unexpected exception (our analogue
of a Go panic, which controller-runtime recovers and counts in
`controller_runtime_reconcile_panics_total`) is one that is not an `errors.LocalcacheError`,
nor a timeout, nor an ExceptionGroup of LocalcacheErrors only: it counts there too, and is the
only kind of failure logged with a traceback. `done(key)` is always called, so a
key added during its reconcile runs again afterwards. An ExceptionGroup whose members are all
TerminalErrors is terminal; any other member makes it a retryable error.

The loop is a hot path (a no-op reconcile must cost little next to decoding its watch event),
hence: a reconcile id is a per-controller random prefix plus a counter (UUID-shaped, unique
like a uuid4, at the cost of one format); the logger is resolved once per `run()`, after
`logging.configure()`, so a debug line below the level costs one no-op call; and one timer per
worker enforces the timeout (`_Deadline`) instead of one `asyncio.timeout` per reconcile.

Lifecycle: `run()` starts the queue's delay loop and the workers as named tasks of one
TaskGroup. It returns when the queue has been shut down and emptied; when cancelled it
cancels in-flight reconciles, shuts the queue down and re-raises. Either way no task is
left behind. Not promised: that a cancelled reconcile ran to completion (reconcilers must be
idempotent), or any ordering between keys.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog
from structlog import contextvars as log_context

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, reconcile, workqueue

#: Default per-reconcile timeout in seconds (`None` disables the timeout).
DEFAULT_RECONCILE_TIMEOUT = 120.0
#: A reconcile may be timed out this much before its deadline (absorbs timer granularity).
_DEADLINE_SLACK = 1e-3

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
    def inc_reconcile_panics(self) -> None: ...
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
    panics: int
    """Reconciles that raised an unexpected exception (see the module docstring)."""
    timeouts: int
    longest_running_reconcile_seconds: float
    """Age of the oldest reconcile in flight (0 when idle)."""
    running: bool


class _Deadline:
    """The per-reconcile timeout of one worker task, on the event loop's clock.

    Like `asyncio.timeout`: when a reconcile outlives its deadline the task is cancelled, and
    `stop()` withdraws that cancellation and says the reconcile timed out (unless someone else
    cancelled the task too). Unlike it, one timer serves every reconcile of the worker: armed
    once, it re-arms itself for the reconcile in flight when it fires early, and lapses when
    the worker is idle; so a fast reconcile schedules and cancels no timer of its own.
    `start()` and `stop()` bracket the reconcile's await in one task step each, so the timer
    only ever cancels the task while it is suspended inside a reconcile.
    """

    __slots__ = ("_cancelling", "_deadline", "_expired", "_handle", "_loop", "_task", "_timeout")

    def __init__(self, timeout: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a reconcile deadline belongs to a worker task")
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._timeout = timeout
        self._deadline = math.inf  # loop time the reconcile in flight must end by
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0  # the task's pending cancellations when the reconcile began
        self._expired = False

    def start(self) -> None:
        """A reconcile begins now."""
        self._deadline = self._loop.time() + self._timeout
        self._cancelling = self._task.cancelling()
        self._expired = False
        if self._handle is None:
            self._handle = self._loop.call_at(self._deadline, self._fire)

    def stop(self) -> bool:
        """The reconcile ended: True if it was cancelled for its deadline and by nothing else
        (its CancelledError then means "timed out"). The deadline's own cancellation is
        withdrawn either way."""
        self._deadline = math.inf
        if not self._expired:
            return False
        self._expired = False
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        if self._deadline == math.inf:
            return  # idle: the next start() arms a timer
        if self._loop.time() + _DEADLINE_SLACK < self._deadline:
            self._handle = self._loop.call_at(self._deadline, self._fire)
            return
        self._deadline = math.inf
        self._expired = True
        self._task.cancel()


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
        self._panics = 0
        self._timeouts = 0
        self._running = False
        self._log = _log
        # Reconcile ids: UUID-shaped, random per controller in the first 74 bits, then a count.
        self._id_prefix = str(uuid.uuid4())[:24]
        self._ids = itertools.count(1)

    async def run(self) -> None:
        """Run the queue's delay loop and the workers until the queue is shut down and
        drained (then return) or until cancelled (then re-raise). Call at most once at a time."""
        if self._running:
            raise RuntimeError(f"controller {self.name} is already running")
        self._running = True
        # Resolve the logger once (after logging.configure()): the worker loop logs with it.
        self._log = _log.bind()
        if self._metrics is not None:
            self._metrics.set_max_concurrent_reconciles(self._workers)
        self._log.info("controller_started", controller=self.name, workers=self._workers)
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
            self._log.info("controller_stopped", controller=self.name)

    def stats(self) -> ControllerStats:
        now = self._clock.now()
        return ControllerStats(
            name=self.name,
            workers=self._workers,
            active_workers=len(self._in_flight),
            reconciles=self._reconciles,
            errors=self._errors,
            terminal_errors=self._terminal,
            panics=self._panics,
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
        queue = self.queue
        deadline = None if self._timeout is None else _Deadline(self._timeout)
        try:
            while True:
                key = queue.try_get()  # no coroutine while keys are waiting
                if key is None:
                    try:
                        key = await queue.get()
                    except workqueue.ShutDown:
                        return
                try:
                    await self._process(index, key, deadline)
                finally:
                    queue.done(key)
        finally:
            if deadline is not None:
                deadline.close()

    async def _process(self, index: int, key: keys.ObjectKey, deadline: _Deadline | None) -> None:
        metrics = self._metrics
        started = self._clock.now()
        self._in_flight[index] = started
        if metrics is not None:
            metrics.inc_active_workers()
        tokens = log_context.bind_contextvars(
            controller=self.name,
            key=str(key),
            reconcile_id=f"{self._id_prefix}{next(self._ids):012x}",
        )
        try:
            if deadline is not None:
                deadline.start()
            try:
                result = await self._reconciler.reconcile(key)
            except asyncio.CancelledError:
                if deadline is None or not deadline.stop():
                    raise
                timeout = TimeoutError(f"reconcile exceeded its {self._timeout:g}s timeout")
                self._on_error(key, timeout, timed_out=True)
            except Exception as exc:
                expired = deadline is not None and deadline.stop()
                self._on_error(key, exc, timed_out=expired and isinstance(exc, TimeoutError))
            else:
                if deadline is not None:
                    deadline.stop()
                self._on_result(key, result)
        finally:
            log_context.reset_contextvars(**tokens)
            del self._in_flight[index]
            self._reconciles += 1
            if metrics is not None:
                metrics.dec_active_workers()
                metrics.observe_reconcile_time(max(0.0, self._clock.now() - started))

    def _on_result(self, key: keys.ObjectKey, result: reconcile.Result) -> None:
        self.queue.forget(key)
        if result.requeue_after:
            self.queue.add_after(key, result.requeue_after)
            self._count("requeue_after")
            self._log.debug("reconcile_requeue_after", requeue_after=result.requeue_after)
        else:
            if self._metrics is not None:
                self._metrics.inc_reconcile_total("success")
            self._log.debug("reconcile_succeeded")

    def _on_error(self, key: keys.ObjectKey, exc: Exception, *, timed_out: bool) -> None:
        self._errors += 1
        self._count("error")
        unexpected = not timed_out and _is_unexpected(exc)
        if self._metrics is not None:
            self._metrics.inc_reconcile_errors()
        if unexpected:
            self._panics += 1
            if self._metrics is not None:
                self._metrics.inc_reconcile_panics()
        if _is_terminal(exc):
            self._terminal += 1
            if self._metrics is not None:
                self._metrics.inc_terminal_reconcile_errors()
            self.queue.forget(key)
            self._log.error(
                "reconcile_terminal_error", error=str(exc), error_type=type(exc).__name__
            )
            return
        if timed_out:
            self._timeouts += 1
            if self._metrics is not None:
                self._metrics.inc_reconcile_timeouts()
        self.queue.add_rate_limited(key)
        # Expected failures (API errors, transport) log without a traceback; bugs with one; a
        # write refused because the object moved on (409) is retried on a newer copy: info.
        stale = isinstance(exc, errors.Conflict) and not exc.already_exists
        (self._log.info if stale else self._log.error)(
            "reconcile_conflict"
            if stale
            else "reconcile_timed_out"
            if timed_out
            else "reconcile_failed",
            error=str(exc),
            error_type=type(exc).__name__,
            requeues=self.queue.num_requeues(key),
            exc_info=exc if unexpected else None,
        )

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.inc_reconcile_total(result)


def _is_unexpected(exc: BaseException) -> bool:
    """Not one of our own errors: a bug (what a Go reconciler would panic on)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(errors.LocalcacheError)
        return rest is not None
    return not isinstance(exc, errors.LocalcacheError)


def _is_terminal(exc: BaseException) -> bool:
    if isinstance(exc, errors.TerminalError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(errors.TerminalError)
        return rest is None
    return False
