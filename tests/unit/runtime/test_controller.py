"""Controller: the four-way result switch, timeouts, log context and lifecycle.

Matrix: success forgets the backoff; an exception requeues with per-key backoff and counts an
error; TerminalError (alone or as the only members of an ExceptionGroup) is not requeued but
counted; requeue_after forgets and re-adds after the delay; a reconcile past its timeout is an
error that is retried, and leaves the worker with no cancellation pending; the one timer a
worker keeps for its timeouts never cuts a later reconcile short; every reconcile gets its own
UUID-shaped reconcile_id with controller and key bound, on every log line it emits (the
controller's own included); one key never runs on two workers at once; run() returns after
queue shutdown and re-raises cancellation (never counted as a timeout), leaving no task;
stats() and stuck_check() expose a stuck worker.

Time: the queue and stats run on a FakeClock; only the reconcile timeout uses the loop's
real clock, with a 50 ms limit (1 s in the test of the shared timer).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
import structlog.testing

from localcache.devenv.waiting import wait_until
from localcache.runtime import clock, controller, errors, keys, metrics, ratelimit, reconcile
from localcache.runtime import workqueue as wq
from tests.unit.runtime.fake_source import settle

A = keys.ObjectKey("ns", "a")
NAME = "widget"


@dataclass
class ScriptedReconciler:
    """Returns or raises the next scripted outcome per call (then succeeds); records calls."""

    script: list[reconcile.Result | BaseException | Callable[[], Any]] = field(default_factory=list)
    calls: list[keys.ObjectKey] = field(default_factory=list)
    contexts: list[dict[str, Any]] = field(default_factory=list)

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        self.calls.append(key)
        self.contexts.append(structlog.contextvars.get_contextvars())
        step = self.script.pop(0) if self.script else reconcile.Result()
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            await step()
            return reconcile.Result()
        return step


@dataclass
class Harness:
    fake_clock: clock.FakeClock
    queue: wq.WorkQueue
    reconciler: ScriptedReconciler
    ctl: controller.Controller
    metrics: metrics.Metrics

    def total(self, result: str) -> float | None:
        return self.metrics.value(
            "controller_runtime_reconcile_total", controller=NAME, result=result
        )

    def counter(self, name: str) -> float | None:
        return self.metrics.value(name, controller=NAME)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    """A running single-worker controller on a fake clock; stopped and awaited afterwards."""
    fake = clock.FakeClock()
    registry = metrics.Metrics()
    queue = wq.WorkQueue(
        NAME,
        clock=fake,
        rate_limiter=ratelimit.ItemExponentialFailureRateLimiter(),
        metrics=registry.workqueue(NAME),
    )
    reconciler = ScriptedReconciler()
    ctl = controller.Controller(
        NAME,
        reconciler,
        queue,
        clock=fake,
        reconcile_timeout=0.05,
        metrics=registry.controller(NAME),
    )
    task = asyncio.create_task(ctl.run(), name="test-controller-run")
    await settle()
    try:
        yield Harness(fake, queue, reconciler, ctl, registry)
    finally:
        await queue.shutdown()
        await asyncio.wait_for(task, timeout=5)


async def reconciled(h: Harness, times: int) -> None:
    await wait_until(
        lambda: h.ctl.stats().reconciles >= times and h.ctl.stats().active_workers == 0,
        timeout=5,
        what=f"{times} reconcile(s) of {NAME} finished",
    )


async def test_success_forgets_the_backoff_and_does_not_requeue(harness: Harness) -> None:
    harness.reconciler.script = [RuntimeError("flaky"), reconcile.Result()]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.queue.num_requeues(A) == 1
    await harness.fake_clock.advance(0.005)
    await reconciled(harness, 2)
    assert harness.queue.num_requeues(A) == 0
    assert harness.queue.stats().waiting == 0
    assert harness.total("success") == 1
    await harness.fake_clock.advance(1000.0)
    await settle()
    assert harness.reconciler.calls == [A, A]


async def test_error_is_requeued_with_per_key_backoff(harness: Harness) -> None:
    harness.reconciler.script = [RuntimeError("boom"), RuntimeError("boom again")]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.queue.stats().waiting == 1
    await harness.fake_clock.advance(0.0049)
    await settle()
    assert len(harness.reconciler.calls) == 1, "retried before the 5 ms backoff"
    await harness.fake_clock.advance(0.0001)
    await reconciled(harness, 2)
    await harness.fake_clock.advance(0.0099)
    await settle()
    assert len(harness.reconciler.calls) == 2, "retried before the 10 ms backoff"
    await harness.fake_clock.advance(0.0001)
    await reconciled(harness, 3)
    assert harness.total("error") == 2
    assert harness.total("success") == 1
    assert harness.counter("controller_runtime_reconcile_errors_total") == 2
    assert harness.counter("controller_runtime_terminal_reconcile_errors_total") == 0
    assert harness.ctl.stats().errors == 2


async def test_terminal_error_is_not_requeued_but_counted(harness: Harness) -> None:
    harness.reconciler.script = [errors.TerminalError("spec can never work")]
    harness.queue.add_rate_limited(A)  # some earlier backoff that must be forgotten
    await harness.fake_clock.advance(0.005)
    await reconciled(harness, 1)
    await harness.fake_clock.advance(1000.0)
    await settle()
    assert harness.reconciler.calls == [A]
    assert harness.queue.stats().waiting == 0
    assert harness.queue.num_requeues(A) == 0
    assert harness.total("error") == 1
    assert harness.counter("controller_runtime_reconcile_errors_total") == 1
    assert harness.counter("controller_runtime_terminal_reconcile_errors_total") == 1
    assert harness.ctl.stats().terminal_errors == 1


async def test_exception_group_of_terminal_errors_is_terminal(harness: Harness) -> None:
    harness.reconciler.script = [
        ExceptionGroup("parts", [errors.TerminalError("x"), errors.TerminalError("y")])
    ]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.queue.stats().waiting == 0
    assert harness.ctl.stats().terminal_errors == 1


async def test_exception_group_with_a_retryable_member_is_retried(harness: Harness) -> None:
    harness.reconciler.script = [
        ExceptionGroup("parts", [errors.TerminalError("x"), errors.Conflict(409, "stale")])
    ]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.queue.stats().waiting == 1
    assert harness.ctl.stats().terminal_errors == 0


async def test_requeue_after_forgets_backoff_and_reconciles_again_after_the_delay(
    harness: Harness,
) -> None:
    harness.reconciler.script = [RuntimeError("first"), reconcile.Result(requeue_after=30.0)]
    harness.queue.add(A)
    await reconciled(harness, 1)
    await harness.fake_clock.advance(0.005)
    await reconciled(harness, 2)
    assert harness.queue.num_requeues(A) == 0
    assert harness.queue.stats().waiting == 1
    assert harness.total("requeue_after") == 1
    await harness.fake_clock.advance(29.9)
    await settle()
    assert len(harness.reconciler.calls) == 2, "requeued before requeue_after passed"
    await harness.fake_clock.advance(0.1)
    await reconciled(harness, 3)
    assert harness.total("success") == 1


async def test_reconcile_past_its_timeout_is_an_error_and_retried(harness: Harness) -> None:
    never = asyncio.Event()
    pending_cancellations: list[int] = []

    async def retry() -> None:
        task = asyncio.current_task()
        assert task is not None
        pending_cancellations.append(task.cancelling())

    harness.reconciler.script = [never.wait, retry]
    harness.queue.add(A)
    await reconciled(harness, 1)
    stats = harness.ctl.stats()
    assert (stats.errors, stats.timeouts, stats.terminal_errors) == (1, 1, 0)
    assert harness.total("error") == 1
    assert harness.counter("controller_runtime_reconcile_timeouts_total") == 1
    assert harness.queue.stats().waiting == 1
    await harness.fake_clock.advance(0.005)
    await reconciled(harness, 2)
    assert harness.total("success") == 1
    assert pending_cancellations == [0], "the timeout's cancellation was not withdrawn"


async def test_the_worker_timer_does_not_cut_a_later_reconcile_short() -> None:
    """The timer armed for A's deadline fires while B, started later, is still within its own
    timeout: B must run to completion."""
    fake = clock.FakeClock()
    queue = wq.WorkQueue(NAME, clock=fake)
    b = keys.ObjectKey("ns", "b")

    async def body(key: keys.ObjectKey) -> reconcile.Result:
        if key == b:
            await asyncio.sleep(0.6)  # from ~0.5 s to ~1.1 s: across A's deadline at 1 s
        return reconcile.Result()

    ctl = controller.Controller(
        NAME, reconcile.ReconcilerFunc(body), queue, clock=fake, reconcile_timeout=1.0
    )
    task = asyncio.create_task(ctl.run(), name="test-controller-run")
    queue.add(A)
    await wait_until(lambda: ctl.stats().reconciles == 1, timeout=5, what="A reconciled")
    await asyncio.sleep(0.5)  # real time must pass on the loop's clock: that is the test
    queue.add(b)
    await wait_until(lambda: ctl.stats().reconciles == 2, timeout=5, what="B reconciled")
    await queue.shutdown()
    await asyncio.wait_for(task, timeout=5)
    assert (ctl.stats().errors, ctl.stats().timeouts) == (0, 0)


async def test_timeout_error_raised_by_the_reconciler_is_not_counted_as_a_timeout(
    harness: Harness,
) -> None:
    harness.reconciler.script = [TimeoutError("apiserver slow")]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert (harness.ctl.stats().errors, harness.ctl.stats().timeouts) == (1, 0)


async def test_each_reconcile_binds_its_own_reconcile_id_with_controller_and_key(
    harness: Harness,
) -> None:
    harness.reconciler.script = [reconcile.Result(requeue_after=1.0)]
    harness.queue.add(A)
    await reconciled(harness, 1)
    await harness.fake_clock.advance(1.0)
    await reconciled(harness, 2)
    first, second = harness.reconciler.contexts
    assert first["controller"] == NAME
    assert first["key"] == "ns/a"
    assert len(first["reconcile_id"]) == 36
    uuid.UUID(first["reconcile_id"])  # shaped like the uuid4 controller-runtime uses
    assert first["reconcile_id"] != second["reconcile_id"]
    assert "reconcile_id" not in structlog.contextvars.get_contextvars()


async def test_every_log_line_of_a_reconcile_carries_its_context() -> None:
    fake = clock.FakeClock()
    queue = wq.WorkQueue(
        NAME, clock=fake, rate_limiter=ratelimit.ItemExponentialFailureRateLimiter()
    )

    async def chatty() -> None:
        structlog.get_logger("test.reconciler").info("reconciler_was_here")

    reconciler = ScriptedReconciler(script=[RuntimeError("boom"), chatty])
    merge = structlog.contextvars.merge_contextvars
    with structlog.testing.capture_logs(processors=[merge]) as logs:
        ctl = controller.Controller(NAME, reconciler, queue, clock=fake)
        task = asyncio.create_task(ctl.run(), name="test-controller-run")
        queue.add(A)
        await wait_until(lambda: ctl.stats().reconciles == 1, timeout=5, what="A failed")
        await fake.advance(0.005)
        await wait_until(lambda: ctl.stats().reconciles == 2, timeout=5, what="A retried")
        await queue.shutdown()
        await asyncio.wait_for(task, timeout=5)
    during = [line for line in logs if line["event"].startswith("reconcile")]
    assert [line["event"] for line in during] == [
        "reconcile_failed",
        "reconciler_was_here",
        "reconcile_succeeded",
    ]
    assert all((line["controller"], line["key"]) == (NAME, "ns/a") for line in during)
    failed, mine, succeeded = (line["reconcile_id"] for line in during)
    assert failed != mine == succeeded
    assert all("reconcile_id" not in line for line in logs if line not in during)


async def test_one_key_never_runs_on_two_workers_at_once() -> None:
    fake = clock.FakeClock()
    queue = wq.WorkQueue(NAME, clock=fake)
    running: set[keys.ObjectKey] = set()
    overlaps = 0
    runs = 0

    async def body(key: keys.ObjectKey) -> reconcile.Result:
        nonlocal overlaps, runs
        overlaps += key in running
        running.add(key)
        queue.add(key)  # an update arrives mid-reconcile
        await asyncio.sleep(0)
        running.discard(key)
        runs += 1
        return reconcile.Result()

    ctl = controller.Controller(NAME, reconcile.ReconcilerFunc(body), queue, clock=fake, workers=4)
    task = asyncio.create_task(ctl.run(), name="test-controller-run")
    queue.add(A)
    queue.add(keys.ObjectKey("ns", "b"))
    await wait_until(lambda: runs >= 100, timeout=5, what="100 reconciles")
    await queue.shutdown()
    await asyncio.wait_for(task, timeout=5)
    assert overlaps == 0


async def test_run_returns_after_queue_shutdown_once_queued_keys_are_done() -> None:
    fake = clock.FakeClock()
    queue = wq.WorkQueue(NAME, clock=fake)
    reconciler = ScriptedReconciler()
    ctl = controller.Controller(NAME, reconciler, queue, clock=fake, workers=2)
    queue.add(A)
    await queue.shutdown()
    await asyncio.wait_for(ctl.run(), timeout=5)
    assert reconciler.calls == [A]
    assert not ctl.stats().running


@pytest.mark.parametrize("reconcile_timeout", [None, 120.0], ids=["no-timeout", "timeout"])
async def test_cancelling_run_cancels_the_reconcile_and_shuts_the_queue_down(
    reconcile_timeout: float | None,
) -> None:
    fake = clock.FakeClock()
    queue = wq.WorkQueue(NAME, clock=fake)
    never = asyncio.Event()
    reconciler = ScriptedReconciler(script=[never.wait])
    ctl = controller.Controller(
        NAME, reconciler, queue, clock=fake, reconcile_timeout=reconcile_timeout
    )
    task = asyncio.create_task(ctl.run(), name="test-controller-run")
    queue.add(A)
    await wait_until(lambda: ctl.stats().active_workers == 1, timeout=5, what="A in flight")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queue.shutting_down
    assert ctl.stats().active_workers == 0
    assert ctl.stats().timeouts == 0
    assert queue.stats().processing == 0


async def test_stuck_check_reports_a_worker_stuck_past_the_limit() -> None:
    fake = clock.FakeClock()
    queue = wq.WorkQueue(NAME, clock=fake)
    release = asyncio.Event()
    ctl = controller.Controller(
        NAME, ScriptedReconciler(script=[release.wait]), queue, clock=fake, reconcile_timeout=None
    )
    check = ctl.stuck_check(300.0)
    task = asyncio.create_task(ctl.run(), name="test-controller-run")
    queue.add(A)
    await wait_until(lambda: ctl.stats().active_workers == 1, timeout=5, what="A in flight")
    await fake.advance(299.0)
    assert check() is None
    await fake.advance(2.0)
    assert ctl.stats().longest_running_reconcile_seconds == pytest.approx(301.0)
    assert check() == f"controller {NAME}: a worker is stuck in a reconcile for 301s"
    release.set()
    await wait_until(lambda: ctl.stats().active_workers == 0, timeout=5, what="A finished")
    assert check() is None
    await queue.shutdown()
    await asyncio.wait_for(task, timeout=5)


async def test_metrics_report_workers_and_reconcile_time(harness: Harness) -> None:
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.counter("controller_runtime_max_concurrent_reconciles") == 1
    assert harness.counter("controller_runtime_active_workers") == 0
    assert harness.counter("controller_runtime_reconcile_time_seconds_count") == 1
    assert harness.total("requeue") == 0  # pre-initialised, never used


def test_controller_needs_a_worker() -> None:
    queue = wq.WorkQueue(NAME, clock=clock.FakeClock())
    with pytest.raises(ValueError, match="at least one worker"):
        controller.Controller(NAME, ScriptedReconciler(), queue, clock=clock.FakeClock(), workers=0)


def test_result_rejects_a_negative_requeue_after() -> None:
    with pytest.raises(ValueError, match="requeue_after"):
        reconcile.Result(requeue_after=-1.0)


async def test_an_unexpected_exception_counts_as_a_panic(harness: Harness) -> None:
    harness.reconciler.script = [KeyError("a bug")]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.counter("controller_runtime_reconcile_panics_total") == 1
    assert harness.counter("controller_runtime_reconcile_errors_total") == 1
    assert harness.total("error") == 1
    assert harness.ctl.stats().panics == 1
    assert harness.queue.stats().waiting == 1, "a panic is retried like any error"


@pytest.mark.parametrize(
    "raised",
    [
        errors.Conflict(409, "stale"),
        errors.TransportError("connection refused"),
        errors.TerminalError("spec can never work"),
        ExceptionGroup("parts", [errors.Conflict(409, "stale"), errors.TerminalError("x")]),
    ],
    ids=["api-error", "transport-error", "terminal-error", "group-of-our-errors"],
)
async def test_expected_errors_are_not_panics(harness: Harness, raised: Exception) -> None:
    harness.reconciler.script = [raised]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.counter("controller_runtime_reconcile_errors_total") == 1
    assert harness.counter("controller_runtime_reconcile_panics_total") == 0
    assert harness.ctl.stats().panics == 0


async def test_a_group_with_an_unexpected_member_is_a_panic(harness: Harness) -> None:
    harness.reconciler.script = [
        ExceptionGroup("parts", [errors.Conflict(409, "stale"), ValueError("a bug")])
    ]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.counter("controller_runtime_reconcile_panics_total") == 1


async def test_a_timed_out_reconcile_is_not_a_panic(harness: Harness) -> None:
    never = asyncio.Event()  # the reconcile waits on it until its 50 ms timeout cuts it
    harness.reconciler.script = [never.wait]
    harness.queue.add(A)
    await reconciled(harness, 1)
    assert harness.counter("controller_runtime_reconcile_timeouts_total") == 1
    assert harness.counter("controller_runtime_reconcile_panics_total") == 0
