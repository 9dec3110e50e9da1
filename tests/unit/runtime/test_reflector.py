"""Reflector: client-go's list/watch state machine, on a scripted source and a fake clock.

Matrix: first list at RV "0", watch from the list RV with bookmarks and a 300-600 s server
timeout; every event (bookmarks too) moves the resume point; a clean end re-watches without a
relist; 410 in the watch relists at the last RV; a second consecutive expiry relists at RV ""
in pages; an expired list retries at once as a quorum read; an expired continue token falls back
to one unpaged list; 429/5xx/transport errors back off (0.8 s doubling, Retry-After honoured)
and re-watch from the same RV; other API errors relist; an unexpected exception never ends
the loop; the backoff doubles to its cap and resets after quiet.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from localcache.runtime import clock, errors, reflector
from tests.unit.runtime.fake_source import (
    HANG,
    FakeSource,
    bookmark,
    cm,
    event,
    page,
    settle,
)

Obj = dict[str, Any]


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def replace(self, objs: list[Obj], resource_version: str) -> None:
        self.calls.append(("replace", ([o["metadata"]["name"] for o in objs], resource_version)))

    def upsert(self, obj: Obj) -> None:
        self.calls.append(("upsert", obj["metadata"]["name"]))

    def delete(self, obj: Obj) -> None:
        self.calls.append(("delete", obj["metadata"]["name"]))


class Rig:
    def __init__(self, source: FakeSource, *, jitter: float = 0.0) -> None:
        self.clock = clock.FakeClock()
        self.source = source
        self.sink = RecordingSink()
        self.backoff = reflector.Backoff(clock=self.clock, jitter=jitter)
        self.reflector = reflector.Reflector(
            source, self.sink, clock=self.clock, backoff=self.backoff, rng=random.Random(7)
        )

    @property
    def list_rvs(self) -> list[str]:
        return [c.resource_version for c in self.source.list_calls]

    @property
    def watch_rvs(self) -> list[str]:
        return [c.resource_version for c in self.source.watch_calls]


@pytest.fixture
async def rig_factory() -> AsyncIterator[Any]:
    tasks: list[asyncio.Task[None]] = []

    async def start(source: FakeSource, **kwargs: Any) -> Rig:
        rig = Rig(source, **kwargs)
        tasks.append(asyncio.create_task(rig.reflector.run(), name="reflector-under-test"))
        await settle()
        return rig

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_first_list_asks_rv_zero_then_watches_from_list_rv_with_bookmarks(
    rig_factory: Any,
) -> None:
    source = FakeSource(lists=[page("10", cm("a", "9"))])
    rig = await rig_factory(source)
    call = source.list_calls[0]
    assert (call.resource_version, call.limit) == ("0", None)
    assert rig.sink.calls == [("replace", (["a"], "10"))]
    watch = source.watch_calls[0]
    assert watch.resource_version == "10"
    assert 300 <= watch.timeout_seconds <= 600
    assert watch.read_deadline == reflector.READ_DEADLINE_S


async def test_every_event_and_bookmark_moves_the_resume_point(rig_factory: Any) -> None:
    source = FakeSource(
        lists=[page("10")],
        watches=[[event("ADDED", cm("a", "11")), event("MODIFIED", cm("a", "12")), bookmark("20")]],
    )
    rig = await rig_factory(source)
    assert rig.sink.calls[1:] == [("upsert", "a"), ("upsert", "a")]
    assert rig.watch_rvs == ["10", "20"]
    assert rig.reflector.stats().events == 3


async def test_clean_end_of_stream_rewatches_without_relist(rig_factory: Any) -> None:
    source = FakeSource(
        lists=[page("10")],
        watches=[[event("DELETED", cm("a", "11"))], [event("ADDED", cm("b", "12"))]],
    )
    rig = await rig_factory(source)
    assert len(source.list_calls) == 1
    assert rig.watch_rvs == ["10", "11", "12"]
    assert rig.sink.calls[1:] == [("delete", "a"), ("upsert", "b")]


async def test_gone_in_the_stream_relists_at_the_last_resource_version(rig_factory: Any) -> None:
    gone = errors.Gone(410, "too old resource version", reason="Expired")
    source = FakeSource(
        lists=[page("10"), page("30", cm("b", "29"))],
        watches=[[event("ADDED", cm("a", "11")), gone]],
    )
    rig = await rig_factory(source)
    assert rig.list_rvs == ["0", "11"]
    assert rig.watch_rvs == ["10", "30"]
    assert rig.sink.calls[-1] == ("replace", (["b"], "30"))


async def test_second_consecutive_expiry_relists_with_empty_rv_in_pages(rig_factory: Any) -> None:
    gone = errors.Gone(410, "too old resource version")
    source = FakeSource(
        lists=[page("10"), page("12"), page("40", cm("a", "39"), token="t1"), page("40")],
        watches=[[gone], [gone]],
    )
    rig = await rig_factory(source)
    assert [(c.resource_version, c.limit, c.continue_token) for c in source.list_calls] == [
        ("0", None, ""),
        ("10", None, ""),
        ("", reflector.PAGE_SIZE, ""),
        ("", reflector.PAGE_SIZE, "t1"),
    ]
    assert rig.watch_rvs == ["10", "12", "40"]


async def test_expired_list_retries_at_once_as_a_quorum_read(rig_factory: Any) -> None:
    source = FakeSource(
        lists=[page("10"), errors.Gone(410, "expired"), page("50")],
        watches=[[errors.Gone(410, "too old")]],
    )
    rig = await rig_factory(source)
    assert rig.list_rvs == ["0", "10", ""]
    assert rig.clock.sleepers == 0  # no backoff between the two lists
    assert rig.watch_rvs == ["10", "50"]


async def test_too_large_resource_version_is_treated_as_expired(rig_factory: Any) -> None:
    too_large = errors.ServerError(
        504,
        "Too large resource version",
        reason="Timeout",
        body={"details": {"causes": [{"reason": "ResourceVersionTooLarge"}]}},
    )
    source = FakeSource(
        lists=[page("10"), too_large, page("50")], watches=[[errors.Gone(410, "too old")]]
    )
    rig = await rig_factory(source)
    assert rig.list_rvs == ["0", "10", ""]


async def test_expired_continue_token_falls_back_to_one_unpaged_list(rig_factory: Any) -> None:
    source = FakeSource(
        lists=[
            page("10"),
            page("12"),
            page("40", cm("a", "1"), token="t1"),
            errors.Gone(410, "continue expired"),
            page("45", cm("a", "1"), cm("b", "2")),
        ],
        watches=[[errors.Gone(410, "x")], [errors.Gone(410, "y")]],
    )
    rig = await rig_factory(source)
    assert [(c.limit, c.continue_token) for c in source.list_calls[2:]] == [
        (reflector.PAGE_SIZE, ""),
        (reflector.PAGE_SIZE, "t1"),
        (None, ""),
    ]
    assert rig.sink.calls[-1] == ("replace", (["a", "b"], "45"))


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(errors.TransportError("connection refused"), id="refused"),
        pytest.param(errors.ApiTimeout("silent for 90s"), id="read-deadline"),
        pytest.param(errors.ServerError(503, "unavailable"), id="5xx"),
        pytest.param(errors.TooManyRequests(429, "slow down"), id="429"),
    ],
)
async def test_retryable_errors_back_off_and_rewatch_from_the_same_rv(
    rig_factory: Any, error: Exception
) -> None:
    source = FakeSource(lists=[page("10")], watches=[[event("ADDED", cm("a", "11")), error]])
    rig = await rig_factory(source)
    assert rig.watch_rvs == ["10"]
    await rig.clock.advance(0.79)
    await settle()
    assert rig.watch_rvs == ["10"]
    await rig.clock.advance(0.02)
    await settle()
    assert rig.watch_rvs == ["10", "11"]
    assert len(source.list_calls) == 1
    assert rig.reflector.stats().errors == 1


async def test_failing_watch_opens_back_off_doubling(rig_factory: Any) -> None:
    refused = errors.TransportError("connection refused")
    source = FakeSource(lists=[page("10")], watches=[refused, refused, refused])
    rig = await rig_factory(source)
    for expected_calls, delay in ((2, 0.8), (3, 1.6), (4, 3.2)):
        await rig.clock.advance(delay - 0.01)
        await settle()
        assert len(source.watch_calls) == expected_calls - 1
        await rig.clock.advance(0.02)
        await settle()
        assert len(source.watch_calls) == expected_calls
    assert set(rig.watch_rvs) == {"10"}


async def test_too_many_requests_waits_at_least_retry_after(rig_factory: Any) -> None:
    slow_down = errors.TooManyRequests(429, "slow down", retry_after=5.0)
    source = FakeSource(lists=[page("10")], watches=[slow_down])
    rig = await rig_factory(source)
    await rig.clock.advance(4.9)
    await settle()
    assert len(source.watch_calls) == 1
    await rig.clock.advance(0.2)
    await settle()
    assert len(source.watch_calls) == 2


async def test_forbidden_watch_backs_off_then_relists(rig_factory: Any) -> None:
    source = FakeSource(lists=[page("10"), page("20")], watches=[errors.Forbidden(403, "no")])
    rig = await rig_factory(source)
    assert len(source.list_calls) == 1
    await rig.clock.advance(1.0)
    await settle()
    assert rig.list_rvs == ["0", "10"]


async def test_an_unexpected_exception_never_ends_the_loop(rig_factory: Any) -> None:
    source = FakeSource(
        lists=[page("10"), page("20")], watches=[[event("ADDED", {"metadata": {}})]]
    )
    rig = await rig_factory(source)

    def broken_upsert(obj: Obj) -> None:
        raise KeyError("name")

    rig.sink.upsert = broken_upsert
    await rig.clock.advance(2.0)
    await settle()
    assert rig.list_rvs == ["0", "10"]
    assert rig.reflector.stats().errors == 1


async def test_failed_list_backs_off_and_retries(rig_factory: Any) -> None:
    source = FakeSource(lists=[errors.TransportError("refused"), page("10")])
    rig = await rig_factory(source)
    assert rig.list_rvs == ["0"]
    await rig.clock.advance(0.81)
    await settle()
    assert rig.list_rvs == ["0", "0"]
    assert rig.watch_rvs == ["10"]


async def test_very_short_empty_watch_backs_off(rig_factory: Any) -> None:
    source = FakeSource(lists=[page("10")], watches=[[], []])
    rig = await rig_factory(source)
    assert rig.watch_rvs == ["10"]
    await rig.clock.advance(0.81)
    await settle()
    assert rig.watch_rvs == ["10", "10"]


async def test_backoff_doubles_to_its_cap_and_resets_after_quiet() -> None:
    clk = clock.FakeClock()
    backoff = reflector.Backoff(clock=clk, jitter=0.0)
    delays = [backoff.next_delay() for _ in range(8)]
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0])
    await clk.advance(121.0)
    assert backoff.next_delay() == pytest.approx(0.8)


def test_backoff_jitter_stays_within_one_base_delay() -> None:
    backoff = reflector.Backoff(clock=clock.FakeClock(), rng=random.Random(3))
    for base in (0.8, 1.6, 3.2):
        delay = backoff.next_delay()
        assert base <= delay < 2 * base


async def test_reflector_cannot_run_twice(rig_factory: Any) -> None:
    rig = await rig_factory(FakeSource(lists=[page("1")], watches=[[HANG]]))
    with pytest.raises(RuntimeError, match="already running"):
        await rig.reflector.run()
