"""WorkQueue invariants on a fake clock, one test each.

Matrix: FIFO order; duplicate adds coalesce; a key is never handed to two workers at once;
a re-add during processing runs again after done; done() of an unknown key is refused;
try_get() hands out a ready key like get() and never waits;
add_after waits for its deadline, keeps the earliest one, wakes the delay loop sooner for an
earlier deadline and works on the real clock too; rate-limited adds back off per
key and forget resets them; shutdown: adds ignored, queued keys still handed out, get raises
ShutDown once empty, waiting getters are woken, drain waits for in-flight keys; stats and the
metrics sink report what controller-runtime reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from localcache.runtime import clock, keys, ratelimit, workqueue
from tests.unit.runtime.fake_source import settle

A = keys.ObjectKey("ns", "a")
B = keys.ObjectKey("ns", "b")
C = keys.ObjectKey("", "c")


@pytest.fixture
def fake_clock() -> clock.FakeClock:
    return clock.FakeClock()


@pytest.fixture
def queue(fake_clock: clock.FakeClock) -> workqueue.WorkQueue:
    return workqueue.WorkQueue(
        "test", clock=fake_clock, rate_limiter=ratelimit.ItemExponentialFailureRateLimiter()
    )


@pytest.fixture
async def running_queue(queue: workqueue.WorkQueue) -> AsyncIterator[workqueue.WorkQueue]:
    """The queue with its delay loop running; shut down and awaited afterwards."""
    loop_task = asyncio.create_task(queue.run(), name="test-workqueue-run")
    await settle()
    try:
        yield queue
    finally:
        await queue.shutdown()
        await asyncio.wait_for(loop_task, timeout=5)


async def test_keys_are_handed_out_in_the_order_they_were_added(
    queue: workqueue.WorkQueue,
) -> None:
    for key in (B, A, C):
        queue.add(key)
    assert [await queue.get() for _ in range(3)] == [B, A, C]


async def test_duplicate_adds_coalesce_into_one_processing(queue: workqueue.WorkQueue) -> None:
    queue.add(A)
    queue.add(B)
    queue.add(A)
    queue.add(A)
    assert (queue.stats().depth, queue.stats().adds, len(queue)) == (2, 2, 2)
    assert await queue.get() == A
    assert await queue.get() == B
    assert len(queue) == 0


async def test_a_key_is_never_handed_to_two_workers_at_once(queue: workqueue.WorkQueue) -> None:
    queue.add(A)
    first = await queue.get()
    queue.add(A)
    second_worker = asyncio.create_task(queue.get(), name="test-second-worker")
    await settle()
    assert not second_worker.done(), "A was handed out while still being processed"
    queue.done(first)
    assert await asyncio.wait_for(second_worker, timeout=5) == A


async def test_concurrent_workers_never_process_one_key_concurrently(
    queue: workqueue.WorkQueue,
) -> None:
    in_flight: set[keys.ObjectKey] = set()
    overlaps: list[keys.ObjectKey] = []
    processed = 0
    enough = asyncio.Event()

    async def worker() -> None:
        nonlocal processed
        while True:
            try:
                key = await queue.get()
            except workqueue.ShutDown:
                return
            if key in in_flight:
                overlaps.append(key)
            in_flight.add(key)
            queue.add(key)  # an event arrives while we work
            await asyncio.sleep(0)
            in_flight.discard(key)
            processed += 1
            if processed >= 50:
                enough.set()
            queue.done(key)

    queue.add(A)
    async with asyncio.TaskGroup() as tg:
        for i in range(4):
            tg.create_task(worker(), name=f"test-worker-{i}")
        await asyncio.wait_for(enough.wait(), timeout=5)
        await queue.shutdown()
    assert overlaps == []


async def test_key_added_during_processing_is_processed_again_after_done(
    queue: workqueue.WorkQueue,
) -> None:
    queue.add(A)
    key = await queue.get()
    queue.add(A)
    assert len(queue) == 0, "a key in processing must wait for done()"
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == A


async def test_key_not_added_during_processing_is_not_processed_again(
    queue: workqueue.WorkQueue,
) -> None:
    queue.add(A)
    queue.done(await queue.get())
    assert len(queue) == 0
    assert queue.stats().depth == 0


async def test_done_for_a_key_not_being_processed_is_refused(queue: workqueue.WorkQueue) -> None:
    queue.add(A)
    with pytest.raises(ValueError, match="not being processed"):
        queue.done(A)


async def test_add_after_adds_the_key_only_when_its_delay_has_passed(
    running_queue: workqueue.WorkQueue, fake_clock: clock.FakeClock
) -> None:
    running_queue.add_after(A, 5.0)
    await fake_clock.advance(4.999)
    assert len(running_queue) == 0
    assert running_queue.stats().waiting == 1
    await fake_clock.advance(0.001)
    await settle()
    assert len(running_queue) == 1
    assert running_queue.stats().waiting == 0


async def test_add_after_keeps_the_earliest_deadline(
    running_queue: workqueue.WorkQueue, fake_clock: clock.FakeClock
) -> None:
    running_queue.add_after(A, 10.0)
    running_queue.add_after(A, 5.0)
    running_queue.add_after(A, 20.0)  # later: must not postpone
    assert running_queue.stats().waiting == 1
    await fake_clock.advance(5.0)
    await settle()
    assert await running_queue.get() == A
    running_queue.done(A)
    await fake_clock.advance(20.0)
    await settle()
    assert len(running_queue) == 0, "a superseded deadline fired a second add"


async def test_add_after_with_no_delay_adds_at_once_and_counts_a_retry(
    queue: workqueue.WorkQueue,
) -> None:
    queue.add_after(A, 0)
    assert len(queue) == 1
    assert queue.stats().retries == 1


async def test_delayed_keys_are_handed_out_in_deadline_order(
    running_queue: workqueue.WorkQueue, fake_clock: clock.FakeClock
) -> None:
    running_queue.add_after(A, 3.0)
    running_queue.add_after(B, 1.0)
    running_queue.add_after(C, 2.0)
    await fake_clock.advance(3.0)
    await settle()
    assert [await running_queue.get() for _ in range(3)] == [B, C, A]


async def test_an_earlier_deadline_wakes_the_delay_loop_sooner(
    running_queue: workqueue.WorkQueue, fake_clock: clock.FakeClock
) -> None:
    running_queue.add_after(A, 60.0)
    await settle()  # the loop now sleeps towards t+60
    running_queue.add_after(B, 1.0)
    await fake_clock.advance(1.0)
    await settle()
    assert len(running_queue) == 1, "B was not added at its deadline"
    assert await running_queue.get() == B
    assert running_queue.stats().waiting == 1


async def test_delayed_keys_arrive_on_the_real_clock_too() -> None:
    queue = workqueue.WorkQueue("real", clock=clock.SystemClock())
    loop_task = asyncio.create_task(queue.run(), name="test-workqueue-run")
    try:
        queue.add_after(A, 0.01)
        assert await asyncio.wait_for(queue.get(), timeout=5) == A
    finally:
        await queue.shutdown()
        await asyncio.wait_for(loop_task, timeout=5)


async def test_rate_limited_adds_back_off_per_key_and_forget_resets(
    running_queue: workqueue.WorkQueue, fake_clock: clock.FakeClock
) -> None:
    for expected_delay in (0.005, 0.01, 0.02):
        running_queue.add_rate_limited(A)
        await fake_clock.advance(expected_delay - 0.0001)
        assert len(running_queue) == 0
        await fake_clock.advance(0.0001)
        await settle()
        running_queue.done(await running_queue.get())
    assert running_queue.num_requeues(A) == 3
    assert running_queue.num_requeues(B) == 0
    running_queue.forget(A)
    assert running_queue.num_requeues(A) == 0


async def test_try_get_hands_out_a_ready_key_like_get_and_never_waits(
    queue: workqueue.WorkQueue,
) -> None:
    assert queue.try_get() is None
    queue.add(A)
    queue.add(B)
    assert queue.try_get() == A
    queue.add(A)  # while processing: not handed out again until done()
    assert queue.try_get() == B
    assert queue.try_get() is None
    assert queue.stats().processing == 2
    queue.done(A)
    assert queue.try_get() == A
    await queue.shutdown()
    assert queue.try_get() is None


async def test_get_after_shutdown_raises_shut_down(queue: workqueue.WorkQueue) -> None:
    await queue.shutdown()
    with pytest.raises(workqueue.ShutDown):
        await queue.get()


async def test_shutdown_still_hands_out_queued_keys_then_raises(
    queue: workqueue.WorkQueue,
) -> None:
    queue.add(A)
    await queue.shutdown()
    assert await queue.get() == A
    with pytest.raises(workqueue.ShutDown):
        await queue.get()


async def test_adds_after_shutdown_are_ignored(queue: workqueue.WorkQueue) -> None:
    await queue.shutdown()
    queue.add(A)
    queue.add_after(B, 1.0)
    queue.add_rate_limited(C)
    stats = queue.stats()
    assert (stats.depth, stats.waiting, stats.adds, stats.retries) == (0, 0, 0, 0)
    assert stats.shutting_down


async def test_shutdown_wakes_every_waiting_get(queue: workqueue.WorkQueue) -> None:
    getters = [asyncio.create_task(queue.get(), name=f"test-getter-{i}") for i in range(3)]
    await settle()
    await queue.shutdown()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, workqueue.ShutDown) for r in results)


async def test_shutdown_with_drain_waits_for_in_flight_keys(queue: workqueue.WorkQueue) -> None:
    queue.add(A)
    key = await queue.get()
    draining = asyncio.create_task(queue.shutdown(drain=True), name="test-drain")
    await settle()
    assert not draining.done(), "drain returned while A was still processing"
    queue.done(key)
    await asyncio.wait_for(draining, timeout=5)


async def test_drain_also_waits_for_keys_handed_out_after_shutdown(
    queue: workqueue.WorkQueue,
) -> None:
    queue.add(A)
    queue.add(B)
    first = await queue.get()
    draining = asyncio.create_task(queue.shutdown(drain=True), name="test-drain")
    await settle()
    queue.done(first)
    second = await queue.get()  # B was queued before shutdown: still handed out
    await settle()
    assert not draining.done(), "drain returned while B was still processing"
    queue.done(second)
    await asyncio.wait_for(draining, timeout=5)


async def test_shutdown_with_drain_returns_at_once_when_idle(queue: workqueue.WorkQueue) -> None:
    await asyncio.wait_for(queue.shutdown(drain=True), timeout=5)


async def test_shutdown_ends_the_delay_loop_and_drops_waiting_keys(
    queue: workqueue.WorkQueue,
) -> None:
    loop_task = asyncio.create_task(queue.run(), name="test-workqueue-run")
    queue.add_after(A, 60.0)
    await settle()
    await queue.shutdown()
    await asyncio.wait_for(loop_task, timeout=5)
    assert queue.stats().waiting == 0


async def test_cancelled_get_does_not_swallow_a_wakeup(queue: workqueue.WorkQueue) -> None:
    first = asyncio.create_task(queue.get(), name="test-getter-cancelled")
    second = asyncio.create_task(queue.get(), name="test-getter-kept")
    await settle()
    queue.add(A)
    first.cancel()  # woken for A, but cancelled before it could take it
    await settle()
    assert await asyncio.wait_for(second, timeout=5) == A
    assert first.cancelled()


async def test_stats_report_in_flight_work_ages(
    queue: workqueue.WorkQueue, fake_clock: clock.FakeClock
) -> None:
    queue.add(A)
    queue.add(B)
    await queue.get()
    await fake_clock.advance(3.0)
    await queue.get()
    await fake_clock.advance(1.0)
    stats = queue.stats()
    assert stats.processing == 2
    assert stats.longest_running_seconds == pytest.approx(4.0)
    assert stats.unfinished_work_seconds == pytest.approx(5.0)


class RecordingMetrics:
    """A QueueMetrics sink that keeps what it was told."""

    def __init__(self) -> None:
        self.depth: list[int] = []
        self.adds = 0
        self.retries = 0
        self.queue_durations: list[float] = []
        self.work_durations: list[float] = []
        self.unfinished = 0.0
        self.longest = 0.0

    def set_depth(self, depth: int) -> None:
        self.depth.append(depth)

    def inc_adds(self) -> None:
        self.adds += 1

    def observe_queue_duration(self, seconds: float) -> None:
        self.queue_durations.append(seconds)

    def observe_work_duration(self, seconds: float) -> None:
        self.work_durations.append(seconds)

    def inc_retries(self) -> None:
        self.retries += 1

    def set_unfinished_work(self, seconds: float) -> None:
        self.unfinished = seconds

    def set_longest_running_processor(self, seconds: float) -> None:
        self.longest = seconds


async def test_metrics_sink_sees_adds_depth_durations_and_retries(
    fake_clock: clock.FakeClock,
) -> None:
    sink = RecordingMetrics()
    queue = workqueue.WorkQueue(
        "metered",
        clock=fake_clock,
        rate_limiter=ratelimit.ItemExponentialFailureRateLimiter(),
        metrics=sink,
    )
    loop_task = asyncio.create_task(queue.run(), name="test-workqueue-run")
    try:
        queue.add(A)
        queue.add(A)  # coalesced: no second add
        await fake_clock.advance(2.0)
        key = await queue.get()
        await fake_clock.advance(1.5)
        await settle()
        assert sink.unfinished == pytest.approx(1.5)
        assert sink.longest == pytest.approx(1.5)
        queue.done(key)
        queue.add_after(B, 0.25)
        await fake_clock.advance(0.5)
        await settle()
        assert sink.adds == 2
        assert sink.retries == 1
        assert sink.depth == [1, 0, 1]
        assert sink.queue_durations == [pytest.approx(2.0)]
        assert sink.work_durations == [pytest.approx(1.5)]
        assert sink.unfinished == 0.0
    finally:
        await queue.shutdown()
        await asyncio.wait_for(loop_task, timeout=5)


async def test_run_refuses_to_run_twice(running_queue: workqueue.WorkQueue) -> None:
    with pytest.raises(RuntimeError, match="already running"):
        await running_queue.run()
