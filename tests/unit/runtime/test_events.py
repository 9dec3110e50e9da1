"""The one Event recorder: naming, the count bump in and across processes, and its limits."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localcache.runtime import errors, events, kube

Obj = dict[str, Any]
NOW = "2026-03-01T10:00:00Z"
LATER = "2026-03-01T10:05:00Z"
CACHE = events.involved_object(
    api_version="serving.kserve.io/v1alpha1",
    kind="LocalModelCache",
    name="iris",
    uid="uid-1",
    resource_version="7",
)


class FakeApi:
    """Events in memory, answering like the apiserver: 409 AlreadyExists on a taken name,
    404 on a patch of a missing one."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], Obj] = {}
        self.calls: list[str] = []

    async def create(self, res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        self.calls.append("create")
        key = (namespace or "", obj["metadata"]["name"])
        if key in self.events:
            raise errors.Conflict(409, "exists", reason="AlreadyExists")
        self.events[key] = copy.deepcopy(obj)
        return obj

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj:
        self.calls.append("get")
        return copy.deepcopy(self.events[(namespace or "", name)])

    async def patch(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj:
        self.calls.append("patch")
        assert isinstance(patch, dict)
        found = self.events.get((namespace or "", name))
        if found is None:
            raise errors.NotFound(404, "gone", reason="NotFound")
        found.update(patch)
        return found


def _recorder(api: events.Api, now: str = NOW, **kw: Any) -> events.Recorder:
    return events.Recorder(api, component="localcache-controller", now=lambda: now, **kw)


async def test_an_event_carries_the_component_the_instance_and_the_object() -> None:
    api = FakeApi()
    recorder = _recorder(api, instance="replica-0")
    await recorder.record(CACHE, type="Warning", reason="Degraded", message="node a failed")
    [(key, event)] = api.events.items()
    assert key[0] == "default", "a cluster-scoped object's Events go to default"
    assert event["metadata"]["name"].startswith("iris.")
    assert event["involvedObject"] == CACHE
    assert event["source"] == {"component": "localcache-controller"}
    assert (event["reportingComponent"], event["reportingInstance"]) == (
        "localcache-controller",
        "replica-0",
    )
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "Degraded",
        "node a failed",
    )
    assert (event["count"], event["firstTimestamp"], event["lastTimestamp"]) == (1, NOW, NOW)


async def test_a_host_is_named_in_the_source_and_a_namespaced_object_keeps_its_namespace() -> None:
    api = FakeApi()
    recorder = _recorder(api, host="node-1")
    involved = {**CACHE, "namespace": "team-a"}
    await recorder.record(involved, type="Normal", reason="Ready", message="ok")
    [((namespace, _), event)] = api.events.items()
    assert namespace == "team-a"
    assert event["source"] == {"component": "localcache-controller", "host": "node-1"}


async def test_a_repeat_bumps_the_count_instead_of_adding_an_event() -> None:
    api = FakeApi()
    await _recorder(api).record(CACHE, type="Warning", reason="Degraded", message="m")
    recorder = _recorder(api, now=LATER)
    await recorder.record(CACHE, type="Warning", reason="Degraded", message="m")
    await recorder.record(CACHE, type="Warning", reason="Degraded", message="m")
    [event] = api.events.values()
    assert (event["count"], event["firstTimestamp"], event["lastTimestamp"]) == (3, NOW, LATER)
    # another process: create, AlreadyExists, get, patch; then this one patches directly
    assert api.calls == ["create", "create", "get", "patch", "patch"]


async def test_different_messages_are_different_events() -> None:
    api = FakeApi()
    recorder = _recorder(api)
    await recorder.record(CACHE, type="Warning", reason="Degraded", message="node a")
    await recorder.record(CACHE, type="Warning", reason="Degraded", message="node b")
    await recorder.record(
        {**CACHE, "uid": "uid-2"}, type="Warning", reason="Degraded", message="node a"
    )
    assert len(api.events) == 3


async def test_an_expired_event_is_created_again() -> None:
    api = FakeApi()
    recorder = _recorder(api)
    await recorder.record(CACHE, type="Normal", reason="Recovered", message="m")
    api.events.clear()  # the apiserver's event TTL
    await recorder.record(CACHE, type="Normal", reason="Recovered", message="m")
    [event] = api.events.values()
    assert event["count"] == 1


async def test_a_caller_may_name_the_event_itself() -> None:
    api = FakeApi()
    await _recorder(api).record(CACHE, type="Warning", reason="X", message="m", name="crd.abc")
    assert list(api.events) == [("default", "crd.abc")]


async def test_a_refusal_is_raised_for_the_caller_to_judge() -> None:
    class Refusing(FakeApi):
        async def create(
            self, res: kube.Resource, obj: Obj, *, namespace: str | None = None
        ) -> Obj:
            raise errors.Forbidden(403, "events is forbidden", reason="Forbidden")

    with pytest.raises(errors.Forbidden):
        await _recorder(Refusing()).record(CACHE, type="Normal", reason="R", message="m")


def test_names_are_stable_valid_and_fit() -> None:
    recorder = _recorder(FakeApi())
    first = recorder.name_for(CACHE, type="Warning", reason="R", message="m")
    assert first == recorder.name_for(CACHE, type="Warning", reason="R", message="m")
    assert first != recorder.name_for(CACHE, type="Warning", reason="R", message="n")
    long = recorder.name_for({**CACHE, "name": "m" * 253}, type="Normal", reason="R", message="")
    assert len(long) == events.MAX_NAME
    assert events.event_name("iris", "0123456789abcdef") == "iris.0123456789abcdef"


async def test_event_volume_is_capped_per_object_and_spam_key_and_refills() -> None:
    """Issue 20: a tenant that makes an Event happen over and over (forged Jobs, a cache
    flipping) gets at most a burst, then one per refill period, and only out of its own key's
    budget: another tenant's Events about the same object still go out."""
    api, clock = FakeApi(), [0.0]
    recorder = _recorder(api, monotonic=lambda: clock[0])
    for i in range(events.SPAM_BURST + 10):
        await recorder.record(
            CACHE, type="Warning", reason="Forged", message=f"job {i}", spam_key="tenant-a"
        )
    assert len(api.events) == events.SPAM_BURST
    await recorder.record(CACHE, type="Warning", reason="Forged", message="b", spam_key="tenant-b")
    assert len(api.events) == events.SPAM_BURST + 1, "another key has its own budget"
    clock[0] += events.SPAM_REFILL_S
    await recorder.record(
        CACHE, type="Warning", reason="Forged", message="after", spam_key="tenant-a"
    )
    assert len(api.events) == events.SPAM_BURST + 2, "one token back per refill period"
    await recorder.record(
        CACHE, type="Warning", reason="Forged", message="again", spam_key="tenant-a"
    )
    assert len(api.events) == events.SPAM_BURST + 2
