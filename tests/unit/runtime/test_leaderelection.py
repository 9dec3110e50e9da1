"""Lease configuration (client-go's defaults, its validation rules, the per-call timeout) and
the elector's state machine on a fake clock over an in-memory Lease API: stepping down at the
renew deadline or when another holder shows up, campaigning again instead of ending, and the
timing contract between two replicas. (Against the real apiserver: tests/integration/runtime.)"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from localcache.runtime import clock, leaderelection
from tests.unit.runtime.fake_leases import LeaseStore


def test_defaults_are_client_go_s() -> None:
    config = leaderelection.LeaderElectionConfig(namespace="ns", name="lock")
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (15, 10, 2)
    assert config.request_timeout == 5.0
    assert "_" in config.identity


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "message"),
    [
        pytest.param(10, 10, 2, "lease_duration", id="lease-not-longer-than-renew"),
        pytest.param(15, 2, 2, "renew_deadline", id="renew-within-jittered-retry"),
        pytest.param(15, 10, 0, "retry_period", id="zero-retry"),
    ],
)
def test_inconsistent_timings_are_refused(
    lease: float, renew: float, retry: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        leaderelection.LeaderElectionConfig(
            namespace="ns",
            name="lock",
            lease_duration=lease,
            renew_deadline=renew,
            retry_period=retry,
        )


def test_each_call_times_out_within_half_the_renew_deadline() -> None:
    short = leaderelection.LeaderElectionConfig(
        namespace="ns", name="lock", lease_duration=4, renew_deadline=3, retry_period=0.5
    )
    assert short.request_timeout == 1.5


def config(identity: str, **timings: float) -> leaderelection.LeaderElectionConfig:
    return leaderelection.LeaderElectionConfig(
        namespace="ns", name="lock", identity=identity, release_on_cancel=False, **timings
    )


def test_the_stop_margin_is_lease_duration_minus_renew_deadline() -> None:
    assert config("a").stop_margin == 5.0
    assert config("a", lease_duration=4, renew_deadline=3, retry_period=0.5).stop_margin == 1.0


async def step_until(
    fake: clock.FakeClock, pred: Callable[[], bool], *, what: str, limit: float = 120.0
) -> float:
    """Advance the fake clock in 50 ms steps until `pred()` holds; return the clock's time."""
    start = fake.now()
    while not pred():
        if fake.now() - start > limit:
            raise AssertionError(f"{what} did not happen within {limit:g}s of fake time")
        await fake.advance(0.05)
    return fake.now()


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_leader_that_cannot_renew_steps_down_at_the_deadline_and_campaigns_again() -> None:
    fake = clock.FakeClock()
    store = LeaseStore()
    client = store.client()
    elector = leaderelection.LeaderElector(
        client.as_kube(), config("a"), clock=fake, rng=random.Random(0)
    )
    task = asyncio.create_task(elector.run(), name="elector-a")
    try:
        await step_until(fake, lambda: elector.is_leader, what="a leads")
        assert not elector.not_leading.is_set()
        await step_until(fake, lambda: fake.now() >= 1010, what="10 s of leading")
        client.reachable = False
        outage_at = fake.now()
        lost_at = await step_until(fake, lambda: not elector.is_leader, what="a stepped down")
        # The last renewal that succeeded started at most one retry period before the outage.
        assert 10.0 - 2.0 - 0.1 <= lost_at - outage_at <= 10.0 + 0.1
        assert elector.not_leading.is_set()
        assert not task.done(), "the elector ended instead of campaigning again"
        await fake.advance(30)
        assert not elector.is_leader
        client.reachable = True
        await step_until(fake, lambda: elector.is_leader, what="a leads again")
        assert elector.terms == 2
        assert store.holder("ns", "lock") == "a"
    finally:
        await stop(task)


async def test_a_renewal_that_finds_another_holder_steps_down_at_once_and_waits_its_lease_out() -> (
    None
):
    fake = clock.FakeClock()
    store = LeaseStore()
    elector = leaderelection.LeaderElector(
        store.client().as_kube(), config("a"), clock=fake, rng=random.Random(0)
    )
    task = asyncio.create_task(elector.run(), name="elector-a")
    try:
        await step_until(fake, lambda: elector.is_leader, what="a leads")
        lease = store.leases[("ns", "lock")]
        lease["spec"].update(holderIdentity="thief", leaseDurationSeconds=60)
        store.put(lease)
        stolen_at = fake.now()
        lost_at = await step_until(fake, lambda: not elector.is_leader, what="a stepped down")
        assert lost_at - stolen_at <= 2.0 + 0.1, "stepped down only at the renew deadline"
        await step_until(fake, lambda: fake.now() - stolen_at > 55, what="55 s")
        assert not elector.is_leader, "took a valid lease of another holder"
        assert elector.holder == "thief"
        await step_until(fake, lambda: elector.is_leader, what="a leads after the thief's lease")
        assert fake.now() - stolen_at >= 60
        assert not task.done()
    finally:
        await stop(task)


async def test_a_partitioned_leader_steps_down_a_stop_margin_before_anyone_else_can_lead() -> None:
    fake = clock.FakeClock()
    store = LeaseStore()
    clients = {name: store.client() for name in ("a", "b")}
    electors = {
        name: leaderelection.LeaderElector(
            client.as_kube(), config(name), clock=fake, rng=random.Random(name)
        )
        for name, client in clients.items()
    }
    a, b = electors["a"], electors["b"]
    tasks = [asyncio.create_task(a.run(), name="elector-a")]
    try:
        await step_until(fake, lambda: a.is_leader, what="a leads")
        tasks.append(asyncio.create_task(b.run(), name="elector-b"))
        await step_until(fake, lambda: b.holder == "a", what="b saw a's lease")
        since = fake.now()
        await step_until(fake, lambda: fake.now() - since > 20, what="20 s of a leading")
        assert a.is_leader
        assert not b.is_leader
        clients["a"].reachable = False
        a_lost_at: float | None = None
        while not b.is_leader:
            assert not (a.is_leader and b.is_leader), "two leaders at once"
            if a_lost_at is None and not a.is_leader:
                a_lost_at = fake.now()
            await fake.advance(0.05)
            assert fake.now() < 2000, "b never took over"
        assert a_lost_at is not None
        assert fake.now() - a_lost_at >= config("a").stop_margin - 0.1
        assert store.holder("ns", "lock") == "b"
        clients["a"].reachable = True
        await step_until(fake, lambda: a.holder == "b", what="a saw b's lease")
        since = fake.now()
        await step_until(fake, lambda: fake.now() - since > 30, what="30 s of b leading")
        assert not a.is_leader
        assert b.is_leader
    finally:
        for task in tasks:
            await stop(task)
