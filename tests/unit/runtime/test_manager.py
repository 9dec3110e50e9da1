"""Manager without a network: phase order, shutdown order within the deadline, exit codes for
a failed component and a cache that never syncs, and health checks wired automatically."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from localcache.devenv.waiting import wait_until
from localcache.runtime import (
    clock,
    controller,
    informer,
    keys,
    manager,
    metrics,
    reconcile,
    workqueue,
)
from localcache.runtime.serving import httpserver
from tests.unit.runtime.fake_source import HANG, FakeSource, page


@dataclass
class Probe:
    """A runnable that records when it starts and when it is cancelled."""

    name: str
    log: list[str]
    fail: bool = False
    ignore_cancel: bool = False
    running: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        self.log.append(f"start {self.name}")
        self.running.set()
        if self.fail:
            raise RuntimeError(f"{self.name} broke")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.log.append(f"stop {self.name}")
            raise


def fake_informer(*, synced: bool = True) -> informer.Informer:
    source = FakeSource(lists=[page("1")] if synced else [], watches=[[HANG]])
    return informer.Informer(source, clock=clock.FakeClock())


def idle_controller(name: str) -> controller.Controller:
    async def noop(key: keys.ObjectKey) -> reconcile.Result:
        return reconcile.Result()

    sys_clock = clock.SystemClock()
    queue = workqueue.WorkQueue(name, clock=sys_clock)
    return controller.Controller(name, reconcile.ReconcilerFunc(noop), queue, clock=sys_clock)


async def test_components_start_after_sync_and_stop_in_reverse_order() -> None:
    log: list[str] = []
    mgr = manager.Manager(handle_signals=False)
    inf = mgr.add_informer(fake_informer())
    mgr.add_runnable("free", Probe("free", log), needs_leader=False)
    leader_only = Probe("leader-only", log)
    mgr.add_runnable("leader-only", leader_only, needs_leader=True)
    task = asyncio.create_task(mgr.run(), name="manager-under-test")
    await wait_until(mgr.started.is_set, timeout=5, what="manager started")
    assert inf.synced.is_set()
    assert log == ["start free", "start leader-only"]
    mgr.stop()
    assert await asyncio.wait_for(task, timeout=5) == 0
    assert sorted(log[2:]) == ["stop free", "stop leader-only"]
    assert mgr.phase == "stopped"


async def test_a_failing_component_stops_everything_with_exit_code_one() -> None:
    log: list[str] = []
    mgr = manager.Manager(handle_signals=False)
    mgr.add_informer(fake_informer())
    mgr.add_runnable("ok", Probe("ok", log), needs_leader=True)
    mgr.add_runnable("broken", Probe("broken", log, fail=True), needs_leader=True)
    code = await asyncio.wait_for(mgr.run(), timeout=5)
    assert code == 1
    assert "stop ok" in log


async def test_a_cache_that_never_syncs_fails_start_up() -> None:
    mgr = manager.Manager(handle_signals=False, cache_sync_timeout=0.2)
    mgr.add_informer(fake_informer(synced=False))
    log: list[str] = []
    mgr.add_runnable("never", Probe("never", log), needs_leader=False)
    assert await asyncio.wait_for(mgr.run(), timeout=5) == 1
    assert log == []


async def test_health_checks_are_registered_for_informers_and_controllers() -> None:
    http = httpserver.HttpServer(host="127.0.0.1", port=0, metrics=metrics.Metrics())
    mgr = manager.Manager(http_server=http, handle_signals=False)
    inf = mgr.add_informer(fake_informer(synced=False))
    mgr.add_informer(fake_informer(synced=False))
    mgr.add_controller(idle_controller("ctl"))
    assert httpserver.run_checks(http._readiness) == [
        f"informer {inf.name} synced: informer {inf.name} has not synced",
        f"informer {inf.name}#2 synced: informer {inf.name} has not synced",
    ]
    assert httpserver.run_checks(http._liveness) == []
    assert sorted(http._liveness) == [
        "controller ctl",
        f"informer {inf.name}",
        f"informer {inf.name}#2",
    ]


async def test_a_manager_runs_only_once() -> None:
    mgr = manager.Manager(handle_signals=False)
    task = asyncio.create_task(mgr.run(), name="manager-under-test")
    await wait_until(mgr.started.is_set, timeout=5, what="manager started")
    with pytest.raises(RuntimeError, match="only once"):
        await mgr.run()
    mgr.stop()
    assert await task == 0


async def test_the_webhook_server_runs_from_before_the_informers_until_after_them() -> None:
    log: list[str] = []

    @contextlib.asynccontextmanager
    async def webhook_server() -> AsyncIterator[None]:
        log.append("webhook up")
        yield
        log.append("webhook down")

    mgr = manager.Manager(webhook_server=webhook_server(), handle_signals=False)
    mgr.add_informer(fake_informer())
    mgr.add_runnable("work", Probe("work", log), needs_leader=True)
    task = asyncio.create_task(mgr.run(), name="manager-under-test")
    await wait_until(mgr.started.is_set, timeout=5, what="manager started")
    mgr.stop()
    assert await asyncio.wait_for(task, timeout=5) == 0
    assert log == ["webhook up", "start work", "stop work", "webhook down"]
