"""Upload slots and the shared byte rate."""

from __future__ import annotations

import asyncio

from localcache.agent.peer import throttle
from localcache.runtime import clock


def test_slots_cap_concurrent_streams_and_free_on_exit() -> None:
    limit = [2]
    slots = throttle.UploadSlots(lambda: limit[0])
    first, second = slots.try_acquire(), slots.try_acquire()
    assert first is not None
    assert second is not None
    assert slots.try_acquire() is None
    with first:
        pass
    assert slots.in_use == 1
    first.release()  # a second release is a no-op
    assert slots.in_use == 1
    assert slots.try_acquire() is not None


def test_a_changed_limit_applies_to_new_streams() -> None:
    limit = [1]
    slots = throttle.UploadSlots(lambda: limit[0])
    assert slots.try_acquire() is not None
    assert slots.try_acquire() is None
    limit[0] = 3
    assert slots.try_acquire() is not None
    limit[0] = 0  # counts as 1: nothing new while two run
    assert slots.try_acquire() is None


def test_retry_after_is_between_one_and_five_seconds() -> None:
    slots = throttle.UploadSlots(lambda: 1)
    assert all(1 <= slots.retry_after() <= 5 for _ in range(200))


async def test_unlimited_bucket_never_waits() -> None:
    fake = clock.FakeClock()
    bucket = throttle.TokenBucket(lambda: None, clock=fake)
    await bucket.take(10**12)
    assert fake.sleepers == 0


async def test_bucket_paces_bytes_to_the_rate() -> None:
    fake = clock.FakeClock()
    bucket = throttle.TokenBucket(lambda: 1000, clock=fake)
    taker = asyncio.create_task(bucket.take(2500), name="take-2500")
    await asyncio.sleep(0)
    assert not taker.done()
    await fake.advance(2.4)
    assert not taker.done()
    await fake.advance(0.2)
    await taker


async def test_bucket_debt_is_shared_by_the_next_taker() -> None:
    fake = clock.FakeClock()
    bucket = throttle.TokenBucket(lambda: 100, clock=fake)
    first = asyncio.create_task(bucket.take(100), name="first")
    second = asyncio.create_task(bucket.take(100), name="second")
    await asyncio.sleep(0)
    await fake.advance(1.0)
    await first
    assert not second.done()
    await fake.advance(1.0)
    await second


async def test_bucket_bursts_at_most_one_second_after_idling() -> None:
    fake = clock.FakeClock()
    bucket = throttle.TokenBucket(lambda: 100, clock=fake)
    await fake.advance(60)
    await bucket.take(100)  # one second's worth was saved up
    taker = asyncio.create_task(bucket.take(100), name="after-burst")
    await asyncio.sleep(0)
    assert not taker.done()
    await fake.advance(1.0)
    await taker
