"""Informer: store before handlers, synced after the first list is delivered, tombstones for
deletes missed while disconnected, catch-up for late handlers, failing handlers contained,
managedFields stripped, stats and the liveness/readiness checks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from localcache.runtime import clock, errors, informer, keys
from tests.unit.runtime.fake_source import HANG, FakeSource, cm, event, page, settle


def describe(ev: informer.Event) -> tuple[str, str, str]:
    obj = ev.obj
    name = obj["metadata"]["name"]
    rv = obj["metadata"]["resourceVersion"]
    if isinstance(ev, informer.Added):
        return ("added-initial" if ev.initial else "added", name, rv)
    if isinstance(ev, informer.Updated):
        return ("updated", name, rv)
    return ("tombstone" if ev.final_state_unknown else "deleted", name, rv)


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Any]]:
    tasks: list[asyncio.Task[None]] = []

    async def run(inf: informer.Informer) -> None:
        tasks.append(asyncio.create_task(inf.run(), name="informer-under-test"))
        await settle()

    yield run
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_synced_only_after_the_initial_list_reached_handlers(start: Any) -> None:
    source = FakeSource(lists=[page("5", cm("a", "1"), cm("b", "2"))], watches=[[HANG]])
    inf = informer.Informer(source, clock=clock.FakeClock())
    seen: list[tuple[str, str, str]] = []
    synced_when_seen: list[bool] = []

    def handler(ev: informer.Event) -> None:
        seen.append(describe(ev))
        synced_when_seen.append(inf.synced.is_set())

    inf.add_handler(handler)
    assert not inf.synced.is_set()
    await start(inf)
    assert inf.synced.is_set()
    assert seen == [("added-initial", "a", "1"), ("added-initial", "b", "2")]
    assert synced_when_seen == [False, False]


async def test_handlers_see_the_store_already_updated(start: Any) -> None:
    source = FakeSource(
        lists=[page("5", cm("a", "1"))],
        watches=[[event("MODIFIED", cm("a", "6")), event("DELETED", cm("a", "7"))]],
    )
    inf = informer.Informer(source, clock=clock.FakeClock())
    observed: list[tuple[tuple[str, str, str], str | None]] = []

    def handler(ev: informer.Event) -> None:
        cached = inf.store.get(keys.ObjectKey("ns", "a"))
        observed.append((describe(ev), cached["metadata"]["resourceVersion"] if cached else None))

    inf.add_handler(handler)
    await start(inf)
    assert observed == [
        (("added-initial", "a", "1"), "1"),
        (("updated", "a", "6"), "6"),
        (("deleted", "a", "7"), None),
    ]


async def test_relist_delivers_missed_deletes_as_tombstones_and_skips_unchanged(
    start: Any,
) -> None:
    source = FakeSource(
        lists=[
            page("5", cm("same", "1"), cm("changed", "2"), cm("vanished", "3")),
            page("9", cm("same", "1"), cm("changed", "8"), cm("new", "9")),
        ],
        watches=[[errors.Gone(410, "too old")]],
    )
    inf = informer.Informer(source, clock=clock.FakeClock())
    seen: list[tuple[str, str, str]] = []
    inf.add_handler(lambda ev: seen.append(describe(ev)))
    await start(inf)
    assert seen[3:] == [
        ("added", "new", "9"),
        ("updated", "changed", "8"),
        ("tombstone", "vanished", "3"),
    ]
    assert sorted(str(k) for k in inf.store) == ["ns/changed", "ns/new", "ns/same"]
    assert inf.stats().relists == 1


async def test_a_handler_added_after_sync_first_gets_the_current_content(start: Any) -> None:
    source = FakeSource(lists=[page("5", cm("a", "1"))], watches=[[HANG]])
    inf = informer.Informer(source, clock=clock.FakeClock())
    await start(inf)
    seen: list[tuple[str, str, str]] = []
    inf.add_handler(lambda ev: seen.append(describe(ev)))
    assert seen == [("added-initial", "a", "1")]


async def test_a_failing_handler_is_counted_and_others_still_run(start: Any) -> None:
    source = FakeSource(lists=[page("5", cm("a", "1"))], watches=[[HANG]])
    inf = informer.Informer(source, clock=clock.FakeClock())

    def broken(ev: informer.Event) -> None:
        raise RuntimeError("bug")

    seen: list[tuple[str, str, str]] = []
    inf.add_handler(broken)
    inf.add_handler(lambda ev: seen.append(describe(ev)))
    await start(inf)
    assert seen == [("added-initial", "a", "1")]
    assert inf.stats().errors == 1


async def test_managed_fields_are_stripped_before_caching(start: Any) -> None:
    obj = cm("a", "1", managedFields=[{"manager": "kubectl"}])
    source = FakeSource(lists=[page("5", obj)], watches=[[HANG]])
    inf = informer.Informer(source, clock=clock.FakeClock())
    await start(inf)
    cached = inf.store.get(keys.ObjectKey("ns", "a"))
    assert cached is not None
    assert "managedFields" not in cached["metadata"]


async def test_deletes_of_unknown_objects_are_not_delivered(start: Any) -> None:
    source = FakeSource(lists=[page("5")], watches=[[event("DELETED", cm("ghost", "6"))]])
    inf = informer.Informer(source, clock=clock.FakeClock())
    seen: list[informer.Event] = []
    inf.add_handler(seen.append)
    await start(inf)
    assert seen == []
    assert inf.stats().resource_version == "6"


async def test_stats_and_checks_report_sync_and_a_stalled_loop(start: Any) -> None:
    fake = clock.FakeClock()
    source = FakeSource(
        lists=[page("5", cm("a", "1"))], watches=[[event("ADDED", cm("b", "6")), HANG]]
    )
    inf = informer.Informer(source, clock=fake, read_deadline=30.0)
    ready, alive = inf.synced_check(), inf.liveness_check()
    assert ready() is not None
    await start(inf)
    assert ready() is None
    assert alive() is None
    await fake.advance(12.0)
    stats = inf.stats()
    assert (stats.objects, stats.resource_version, stats.synced) == (2, "6", True)
    assert stats.last_event_age == pytest.approx(12.0)
    assert (stats.relists, stats.watch_restarts, stats.errors) == (0, 0, 0)
    # The fake stream hangs beyond its read deadline, as a broken one would: after the
    # reflector's liveness deadline /healthz must say so.
    await fake.advance(200.0)
    reason = alive()
    assert reason is not None
    assert "silent" in reason


async def test_an_informer_runs_only_once(start: Any) -> None:
    inf = informer.Informer(FakeSource(lists=[page("1")]), clock=clock.FakeClock())
    await start(inf)
    with pytest.raises(RuntimeError, match="already started"):
        await inf.run()


def test_compact_shares_repeated_strings_and_keeps_the_content() -> None:
    raw = cm("a", "1", labels={"app": "web"}, managedFields=[{"manager": "x"}])
    first = informer.compact(json.loads(json.dumps(raw)))
    second = informer.compact(json.loads(json.dumps(raw)))
    expected = cm("a", "1", labels={"app": "web"})
    assert first == expected
    assert second == expected
    key_of = {k: k for k in first["metadata"]}
    assert all(k is key_of[k] for k in second["metadata"])
    assert first["metadata"]["namespace"] is second["metadata"]["namespace"]
    assert first["metadata"]["labels"]["app"] is second["metadata"]["labels"]["app"]
    assert first["kind"] is second["kind"]
