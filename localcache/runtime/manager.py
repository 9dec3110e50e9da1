"""The manager: starts everything in order under one TaskGroup and stops it within a deadline.

Start-up phases (controller-runtime's runnable groups), each waiting for the previous:

1. the metrics/health HTTP server: probes must answer while the rest starts (and /readyz
   says "not ready" until phase 3 is done); metrics are served even on non-leaders;
2. the webhook server, if any: the apiserver may call it as soon as objects are written,
   and informers do not depend on it;
   then the prerequisites (`add_prerequisite`), one after the other, with no time limit: e.g.
   the CRDs the informers watch being served (a process may start before them; it waits,
   live and ready, its servers answering, instead of crash-looping);
3. informers, until every one has synced (`cache_sync_timeout`): controllers must not
   reconcile against an empty cache;
4. components that do not need the lease; then leader election, if configured;
5. controllers and runnables that need the lease, each time this process wins it.

Leadership is a loop, not a one-off (unlike controller-runtime, which exits): when the lease
is lost, the leader-only components are cancelled and awaited, within the elector's
`stop_margin` (lease duration - renew deadline: the time before another replica can hold the
lease; a component still running after it fails the process, as two leaders must never
reconcile at once); servers, informers and the other components keep running, and the
elector campaigns again. On winning again, each leader-only controller gets a fresh queue
(`WorkQueue.reopen()`: empty, accepting adds) and every informer replays its store to its
handlers as initial adds, so the new term starts from a full resync exactly like the first
(handlers of components that run without the lease see those adds too; reconciles are
level-based, so that costs one reconcile per object, nothing more). Leader-only runnables must
therefore be restartable: `run()` is called again after a cancellation. Transitions are logged
(`manager_leading_started` / `manager_leading_stopped` with the term) and
`leader_election_master_status` follows them; `leading` says whether leader-only components
run now. /readyz does not depend on leadership: a follower serves webhooks and must be ready.

Health is wired automatically: /healthz fails when an informer's list/watch loop makes no
progress past its deadline or a controller's worker is stuck in a reconcile past
`stuck_worker_limit`; /readyz passes only once every informer has synced (or while a
prerequisite is awaited: the informers have not started then).

Stopping: `stop()` (SIGTERM and SIGINT call it) cancels controllers first, then the lease
(which is released), then informers, then the servers, all within `shutdown_timeout`; tasks
still alive at a step's deadline are logged by name. `run()` returns the exit code: 0 after a
requested stop, 1 when a cache did not sync, leader-only work did not stop in time after the
lease was lost, or any component failed (a failure cancels everything at once). Every task
is named and owned by the one TaskGroup; nothing else on the loop is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from localcache.runtime import controller, informer, leaderelection
from localcache.runtime.serving import httpserver

_log = structlog.get_logger(__name__)

PREREQUISITE_PHASE = "prerequisite"

DEFAULT_SHUTDOWN_TIMEOUT = 5.0
DEFAULT_CACHE_SYNC_TIMEOUT = 120.0
DEFAULT_STUCK_WORKER_LIMIT = 300.0


class Runnable(Protocol):
    """Something the manager runs: `run()` works until cancelled."""

    async def run(self) -> None: ...


class StartupError(Exception):
    """A start-up phase could not complete (e.g. a cache did not sync in time)."""


class LeaderStopTimeout(Exception):
    """Leader-only components outlived the stop margin after the lease was lost."""


@dataclass
class _Component:
    name: str
    runnable: Runnable
    needs_leader: bool
    task: asyncio.Task[None] | None = None
    reopen: Callable[[], None] | None = None
    """Makes the component ready to run again after a cancellation (a fresh queue)."""


class Manager:
    """Owns the lifecycle of servers, informers, the lease and controllers (module doc)."""

    def __init__(
        self,
        *,
        http_server: httpserver.HttpServer | None = None,
        webhook_server: AbstractAsyncContextManager[Any] | None = None,
        elector: leaderelection.LeaderElector | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        cache_sync_timeout: float = DEFAULT_CACHE_SYNC_TIMEOUT,
        stuck_worker_limit: float = DEFAULT_STUCK_WORKER_LIMIT,
        handle_signals: bool = True,
    ) -> None:
        """`webhook_server` is entered in phase 2 (it returns once listening, e.g.
        `tls.serve(app, ...)`) and exited after everything else stopped."""
        self._http = http_server
        self._webhook = webhook_server
        self._elector = elector
        self._shutdown_timeout = shutdown_timeout
        self._cache_sync_timeout = cache_sync_timeout
        self._stuck_limit = stuck_worker_limit
        self._handle_signals = handle_signals
        self._informers: list[tuple[str, informer.Informer]] = []
        self._controllers: list[_Component] = []
        self._runnables: list[_Component] = []
        self._prerequisites: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._informer_tasks: list[asyncio.Task[None]] = []
        self._elector_task: asyncio.Task[None] | None = None
        self._leadership_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.started = asyncio.Event()
        """Set once every phase has completed (controllers running)."""
        self.phase = "new"
        self.leading = False
        """True while the components that need the lease run (always, without an elector)."""
        self.terms = 0
        """How many times the leader-only components have been started."""
        self._ran = False

    # ---------------------------------------------------------------- registration

    def add_informer(self, inf: informer.Informer) -> informer.Informer:
        """Run `inf` in phase 3 and gate /readyz on its sync; returns it."""
        name = inf.name
        taken = {n for n, _ in self._informers}
        suffix = 2
        while name in taken:
            name, suffix = f"{inf.name}#{suffix}", suffix + 1
        self._informers.append((name, inf))
        if self._http is not None:
            self._http.add_liveness_check(f"informer {name}", inf.liveness_check())
            self._http.add_readiness_check(
                f"informer {name} synced", self._unless_waiting(inf.synced_check())
            )
        return inf

    def _unless_waiting(self, check: httpserver.HealthCheck) -> httpserver.HealthCheck:
        """`check`, passing while a prerequisite is awaited: the process serves then (its
        webhooks answer; with no CRD there are no objects to read), so an install that waits
        for readiness (`helm --wait`, `kubectl rollout status`) does not hang on CRDs that
        come later; the wait is logged by the prerequisite itself."""
        return lambda: None if self.phase.startswith(PREREQUISITE_PHASE) else check()

    def add_controller(
        self, ctl: controller.Controller, *, needs_leader: bool = True
    ) -> controller.Controller:
        """Run `ctl` in phase 5 (phase 4 if it does not need the lease); returns it."""
        self._controllers.append(_Component(ctl.name, ctl, needs_leader, reopen=ctl.queue.reopen))
        if self._http is not None:
            self._http.add_liveness_check(
                f"controller {ctl.name}", ctl.stuck_check(self._stuck_limit)
            )
        return ctl

    def add_prerequisite(self, what: str, wait: Callable[[], Awaitable[None]]) -> None:
        """Await `wait()` after the servers start and before the informers do, for as long as
        it takes (a stop cancels it); `what` names it in the phase and logs."""
        self._prerequisites.append((what, wait))

    def add_runnable(self, name: str, runnable: Runnable, *, needs_leader: bool) -> None:
        """Run any other long-lived coroutine alongside the controllers. One that needs the
        lease must be restartable: after losing it, `run()` is cancelled, and called again on
        the next win."""
        self._runnables.append(_Component(name, runnable, needs_leader))

    def stop(self) -> None:
        """Ask for a graceful stop (idempotent; safe from a signal handler)."""
        if not self._stop.is_set():
            _log.info("manager_stop_requested", phase=self.phase)
            self._stop.set()

    # ---------------------------------------------------------------- run

    async def run(self) -> int:
        """Start every phase, run until stopped or failed; return the exit code."""
        if self._ran:
            raise RuntimeError("a Manager runs only once")
        self._ran = True
        loop = asyncio.get_running_loop()
        signals = self._install_signals(loop)
        code = 0
        try:
            async with contextlib.AsyncExitStack() as servers, asyncio.TaskGroup() as tg:
                if await self._start(tg, servers):
                    await self._stop.wait()
                await self._shutdown()
        except* LeaderStopTimeout as group:
            _log.error("manager_exit_leader_stop_timeout", error=str(group.exceptions[0]))
            code = 1
        except* StartupError as group:
            _log.error("manager_startup_failed", error=str(group.exceptions[0]))
            code = 1
        except* Exception as group:
            _log.error("manager_component_failed", exc_info=group)
            code = 1
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            self.phase = "stopped"
            self.leading = False
            _log.info("manager_stopped")
        return code

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if not self._handle_signals:
            return []
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
        return installed

    async def _until_stopped(
        self, awaitable: Awaitable[Any], what: str, limit: float | None
    ) -> bool:
        """Wait for `awaitable` unless a stop comes first (False) or `limit` seconds pass."""
        waiter = asyncio.create_task(_wait_for(awaitable), name=f"manager waits for {what}")
        stopper = asyncio.create_task(self._stop.wait(), name="manager waits for stop")
        try:
            done, _ = await asyncio.wait(
                (waiter, stopper), timeout=limit, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for fut in (waiter, stopper):
                fut.cancel()
            await asyncio.gather(waiter, stopper, return_exceptions=True)
        if waiter in done:
            waiter.result()
            return True
        if stopper in done:
            return False
        raise StartupError(f"{what} did not happen within {limit or 0:.0f}s")

    async def _start(self, tg: asyncio.TaskGroup, servers: contextlib.AsyncExitStack) -> bool:
        """Run the start-up phases; False if a stop was requested meanwhile."""
        self.phase = "servers"
        if self._http is not None:
            await servers.enter_async_context(self._http)
        if self._webhook is not None:
            await servers.enter_async_context(self._webhook)
        for what, wait in self._prerequisites:
            self.phase = f"{PREREQUISITE_PHASE}: {what}"
            if not await self._until_stopped(wait(), what, None):
                return False
        self.phase = "informers"
        for name, inf in self._informers:
            self._informer_tasks.append(tg.create_task(inf.run(), name=f"informer {name}"))
        if not await self._until_stopped(
            self._all_synced(), "cache sync", self._cache_sync_timeout
        ):
            return False
        _log.info("manager_caches_synced", informers=len(self._informers))
        self._start_components(tg, needs_leader=False)
        if self._elector is None:
            self._start_leading(tg)
            return True
        self.phase = "leader-election"
        self._elector_task = tg.create_task(self._elector.run(), name="leader-election")
        self._leadership_task = tg.create_task(
            self._follow_leadership(tg, self._elector), name="manager follows leadership"
        )
        return True

    async def _follow_leadership(
        self, tg: asyncio.TaskGroup, elector: leaderelection.LeaderElector
    ) -> None:
        """Start the leader-only components on each win, stop them on each loss."""
        while True:
            await elector.leading.wait()
            self._start_leading(tg)
            await elector.not_leading.wait()
            await self._stop_leading(elector.config.stop_margin)

    def _start_leading(self, tg: asyncio.TaskGroup) -> None:
        """Start the leader-only components; after the first term with fresh queues and a
        replay of every informer's store (module doc)."""
        if self.terms:
            for comp in self._leader_components():
                if comp.reopen is not None:
                    comp.reopen()
            replayed = sum(inf.replay() for _, inf in self._informers)
            _log.info("manager_resync_replayed", objects=replayed)
        self.terms += 1
        self._start_components(tg, needs_leader=True)
        self.leading = True
        self.phase = "running"
        _log.info("manager_leading_started", term=self.terms, controllers=len(self._controllers))
        if not self.started.is_set():
            self.started.set()
            _log.info("manager_started", controllers=len(self._controllers))

    async def _stop_leading(self, margin: float) -> None:
        """Cancel and await the leader-only components within `margin` seconds."""
        self.phase = "leader-election"
        loop = asyncio.get_running_loop()
        began = loop.time()
        tasks = [c.task for c in self._leader_components() if c.task and not c.task.done()]
        for task in tasks:
            task.cancel()
        still: set[asyncio.Task[None]] = set()
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=margin)
        if still:
            names = sorted(t.get_name() for t in still)
            _log.error("manager_leading_stop_stuck", term=self.terms, tasks=names, margin=margin)
            raise LeaderStopTimeout(
                f"{', '.join(names)} still running {margin:g}s after losing the lease"
            )
        self.leading = False
        _log.info(
            "manager_leading_stopped",
            term=self.terms,
            seconds=round(loop.time() - began, 3),
        )

    def _leader_components(self) -> list[_Component]:
        return [c for c in self._controllers + self._runnables if c.needs_leader]

    async def _all_synced(self) -> None:
        for _, inf in self._informers:
            await inf.synced.wait()

    def _start_components(self, tg: asyncio.TaskGroup, *, needs_leader: bool) -> None:
        for comp in self._controllers:
            if comp.needs_leader == needs_leader:
                comp.task = tg.create_task(comp.runnable.run(), name=f"controller {comp.name}")
        for comp in self._runnables:
            if comp.needs_leader == needs_leader:
                comp.task = tg.create_task(comp.runnable.run(), name=f"runnable {comp.name}")

    async def _shutdown(self) -> None:
        """Cancel in reverse start order, each step bounded by what is left of the deadline."""
        self.phase = "stopping"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._shutdown_timeout
        steps: list[tuple[str, Callable[[], list[asyncio.Task[None]]]]] = [
            ("leadership", lambda: [self._leadership_task] if self._leadership_task else []),
            (
                "controllers",
                lambda: [c.task for c in self._controllers + self._runnables if c.task],
            ),
            ("leader-election", lambda: [self._elector_task] if self._elector_task else []),
            ("informers", lambda: self._informer_tasks),
        ]
        for step, tasks_of in steps:
            pending = [t for t in tasks_of() if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                _, still = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
                if still:
                    _log.error(
                        "manager_shutdown_stuck",
                        step=step,
                        tasks=sorted(t.get_name() for t in still),
                    )
        _log.info("manager_tasks_stopped", seconds_left=round(deadline - loop.time(), 3))


async def _wait_for(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
