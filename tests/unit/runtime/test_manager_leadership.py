"""Manager leadership on a fake clock over an in-memory Lease API: losing the lease stops only
the leader-only components (the process keeps running), winning it again restarts them on
fresh queues with a full resync, and leader-only work that will not stop within the stop
margin fails the process rather than overlap with the next leader."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from localcache.devenv.waiting import wait_until
from localcache.runtime import (
    clock,
    controller,
    handlers,
    informer,
    keys,
    leaderelection,
    manager,
    reconcile,
    workqueue,
)
from tests.unit.runtime.fake_leases import LeaseClient, LeaseStore
from tests.unit.runtime.fake_source import HANG, FakeSource, cm, page
from tests.unit.runtime.test_leaderelection import step_until
from tests.unit.runtime.test_manager import Probe


@dataclass
class Recorder:
    seen: list[keys.ObjectKey] = field(default_factory=list)

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        self.seen.append(key)
        return reconcile.Result()


@dataclass
class Stubborn:
    """Swallows its first cancellation (a reconcile that will not stop)."""

    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            await asyncio.Event().wait()  # the next cancellation ends it


def elector(
    client: LeaseClient, fake: clock.FakeClock, **timings: float
) -> leaderelection.LeaderElector:
    config = leaderelection.LeaderElectionConfig(
        namespace="ns", name="lock", identity="me", release_on_cancel=False, **timings
    )
    return leaderelection.LeaderElector(client.as_kube(), config, clock=fake, rng=random.Random(0))


async def test_losing_the_lease_stops_only_leader_work_and_winning_restarts_it_with_a_resync() -> (
    None
):
    fake = clock.FakeClock()
    client = LeaseStore().client()
    el = elector(client, fake)
    mgr = manager.Manager(elector=el, handle_signals=False)
    source = FakeSource(lists=[page("1", cm("a", "1"))], watches=[[HANG]])
    inf = mgr.add_informer(informer.Informer(source, clock=clock.FakeClock()))
    rec = Recorder()
    sys_clock = clock.SystemClock()
    queue = workqueue.WorkQueue("ctl", clock=sys_clock)
    ctl = mgr.add_controller(
        controller.Controller(
            "ctl", reconcile.ReconcilerFunc(rec.reconcile), queue, clock=sys_clock
        )
    )
    inf.add_handler(handlers.enqueue_self(ctl.queue))
    log: list[str] = []
    mgr.add_runnable("free", Probe("free", log), needs_leader=False)
    mgr.add_runnable("leader-only", Probe("leader-only", log), needs_leader=True)
    task = asyncio.create_task(mgr.run(), name="manager-under-test")
    key = keys.ObjectKey("ns", "a")

    await step_until(fake, lambda: mgr.leading, what="the manager leads")
    await wait_until(lambda: rec.seen == [key], timeout=5, what="term 1 reconciled ns/a")
    assert mgr.started.is_set()
    assert mgr.terms == 1

    client.reachable = False  # the apiserver goes away for longer than the lease
    await step_until(fake, lambda: not mgr.leading, what="the manager stepped down")
    assert not el.is_leader
    assert not ctl.stats().running
    assert log == ["start free", "start leader-only", "stop leader-only"]
    assert mgr.phase == "leader-election"
    await fake.advance(30)
    assert not task.done(), "the manager exited on losing the lease"

    client.reachable = True
    await step_until(fake, lambda: mgr.leading, what="the manager leads again")
    assert mgr.terms == 2
    assert el.terms == 2
    await wait_until(lambda: ctl.stats().running, timeout=5, what="controller restarted")
    await wait_until(lambda: rec.seen == [key, key], timeout=5, what="term 2 resynced ns/a")
    assert log == ["start free", "start leader-only", "stop leader-only", "start leader-only"]
    assert not queue.shutting_down

    mgr.stop()
    assert await asyncio.wait_for(task, timeout=5) == 0
    assert "stop free" in log


async def test_leader_work_that_outlives_the_stop_margin_fails_the_process() -> None:
    fake = clock.FakeClock()
    client = LeaseStore().client()
    # stop margin: 3 - 2 = 1 s
    el = elector(client, fake, lease_duration=3, renew_deadline=2, retry_period=0.5)
    mgr = manager.Manager(elector=el, handle_signals=False)
    stubborn = Stubborn()
    mgr.add_runnable("stubborn", stubborn, needs_leader=True)
    task = asyncio.create_task(mgr.run(), name="manager-under-test")
    await step_until(fake, lambda: mgr.leading, what="the manager leads")
    client.reachable = False
    await step_until(fake, lambda: not el.is_leader, what="the elector stepped down")
    await wait_until(
        stubborn.cancelled.is_set, timeout=5, what="the stubborn runnable was cancelled"
    )
    assert await asyncio.wait_for(task, timeout=10) == 1
    assert mgr.phase == "stopped"
