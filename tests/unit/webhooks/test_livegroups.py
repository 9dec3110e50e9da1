"""A node group the validator's store has not caught up with is read from the apiserver.

The race a CI run hit: `kubectl apply` of a group and a cache that names it, in one file; the
cache's admission came before the group's watch event, and was denied "LocalModelNodeGroup
… not found". These tests stand in for the apiserver with a reader; the integration test
(tests/integration/webhooks/test_live_node_groups.py) reads a real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from localcache.devenv import waiting
from localcache.runtime import errors
from localcache.webhooks import livegroups, validation
from tests.unit.webhooks.test_validation import Stores, cache_obj, group_obj, groups, lmc, request

Obj = dict[str, Any]


class Apiserver:
    """The groups that exist, and the names asked for."""

    def __init__(self, *objs: Obj) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}
        self.asked: list[str] = []

    async def read(self, name: str) -> Obj | None:
        self.asked.append(name)
        return self.objs.get(name)


def validator(stores: Stores, api: Apiserver | None) -> validation.CacheValidator:
    return stores.validator(namespaced=False, read_node_group=api.read if api else None)


async def test_a_group_created_a_moment_before_its_cache_is_found_and_the_cache_admitted() -> None:
    stores = Stores()  # holds gpu1 and gpu2; "fresh" exists, but its event has not arrived
    api = Apiserver(group_obj("fresh"))
    created = request("CREATE", obj=cache_obj("m", groups=("gpu1", "fresh")))
    assert (await validator(stores, api)(created)).allowed
    assert api.asked == ["fresh"], "only the group the store lacks is read"
    # without the read, the old answer: the race CI hit
    denied = await validator(stores, None)(created)
    assert not denied.allowed
    assert denied.message == "spec.nodeGroups[1]: LocalModelNodeGroup fresh not found"


async def test_a_group_that_does_not_exist_is_still_denied_naming_the_field() -> None:
    api = Apiserver()
    answer = await validator(Stores(), api)(
        request("CREATE", obj=cache_obj("m", groups=("nowhere",)))
    )
    assert not answer.allowed
    assert answer.field == "spec.nodeGroups[0]"
    assert answer.message == "spec.nodeGroups[0]: LocalModelNodeGroup nowhere not found"
    assert api.asked == ["nowhere"]


async def test_nothing_is_read_when_the_store_has_every_group_or_an_update_adds_none() -> None:
    api = Apiserver(group_obj("gone"))
    stores = Stores()
    assert (await validator(stores, api)(request("CREATE", obj=cache_obj("m")))).allowed
    # an update of a cache whose group was deleted since: the group is not read again
    old = cache_obj("m", groups=("gone",))
    new = cache_obj("m", groups=("gone",), size="2Gi")
    assert (await validator(stores, api)(request("UPDATE", obj=new, old=old))).allowed
    assert api.asked == []


async def test_a_group_read_live_is_held_to_its_storage_limit() -> None:
    api = Apiserver(group_obj("small", "1Gi"))
    answer = await validator(Stores(), api)(
        request("CREATE", obj=cache_obj("m", groups=("small",), size="2Gi"))
    )
    assert not answer.allowed
    assert answer.field == "spec.modelSize"
    assert "small" in (answer.message or "")


async def test_reads_are_bounded_and_only_for_names_a_group_can_have() -> None:
    api = Apiserver()
    wanted = ["../../api/v1/secrets", "UPPER", "a" * 254, *(f"g{i}" for i in range(10))]
    cache = lmc("m", groups=tuple(wanted))
    found = await livegroups.complete({}, cache, None, api.read)
    assert found == {}
    assert api.asked == [f"g{i}" for i in range(livegroups.MAX_LIVE_READS)]


async def test_an_answer_that_is_not_the_group_asked_for_is_not_taken() -> None:
    other = group_obj("other")

    async def read(name: str) -> Obj | None:
        return other

    found = await livegroups.complete({}, lmc("m", groups=("fresh",)), None, read)
    assert found == {}


async def test_known_groups_are_kept_and_without_a_reader_nothing_changes() -> None:
    known = groups(gpu1="10Gi")
    found = await livegroups.complete(known, lmc("m", groups=("gpu1", "x")), None, None)
    assert found == known


async def test_the_reads_of_one_request_run_at_once() -> None:
    """Sequential reads could take 4 times 2 s, past the handler's own 8 s."""
    together = asyncio.Barrier(3)

    async def read(name: str) -> Obj | None:
        async with asyncio.timeout(2):
            await together.wait()  # only returns once all three are waiting
        return group_obj(name)

    found = await livegroups.complete({}, lmc("m", groups=("a", "b", "c")), None, read)
    assert sorted(found) == ["a", "b", "c"]


async def test_an_update_of_a_cache_being_deleted_reads_nothing() -> None:
    api = Apiserver(group_obj("fresh"))
    old = cache_obj("m", deleting=True)
    new = cache_obj("m", groups=("gpu1", "fresh"), deleting=True)
    assert (await validator(Stores(), api)(request("UPDATE", obj=new, old=old))).allowed
    assert api.asked == []


class StalledClient:
    """Stands in for the controller's client: `get` waits until released, or fails."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self.release = asyncio.Event()
        self.calls = 0

    async def get(self, res: object, name: str, **kw: object) -> Obj:
        self.calls += 1
        if self.failure is not None:
            raise self.failure
        await self.release.wait()
        return group_obj(name)


async def test_past_the_reads_in_flight_of_the_process_a_read_is_skipped() -> None:
    client = StalledClient()
    read = livegroups.reader(client)  # type: ignore[arg-type]
    held = [asyncio.ensure_future(read(f"g{i}")) for i in range(livegroups.MAX_READS_IN_FLIGHT)]
    try:
        await waiting.wait_until(
            lambda: client.calls == livegroups.MAX_READS_IN_FLIGHT, timeout=5, what="reads held"
        )
        assert await read("one-more") is None
        assert client.calls == livegroups.MAX_READS_IN_FLIGHT
    finally:
        client.release.set()
        answers = await asyncio.gather(*held)
    assert [a["metadata"]["name"] for a in answers if a] == [f"g{i}" for i in range(8)]
    assert await read("again") is not None, "the gate opens once the reads are done"


async def test_any_failure_of_a_read_leaves_the_group_missing() -> None:
    for failure in (
        errors.Forbidden(403, "no", reason="Forbidden"),
        errors.ApiTimeout("deadline"),
        RuntimeError("Session is closed"),
    ):
        read = livegroups.reader(StalledClient(failure))  # type: ignore[arg-type]
        assert await read("fresh") is None, failure
