"""The CRD schema check: its Event (name, message) and its reconciler, on an in-memory store
and event API (the real controller on a real apiserver: tests/integration/crdcheck)."""

from __future__ import annotations

import copy
from typing import Any

import structlog

from localcache.runtime import errors, keys, kube, metrics, store
from localcache.runtime.crds import crdcheck, schemadiff
from tests import kserveshape

Obj = dict[str, Any]

FIX = "install localcache's CRDs: kubectl apply --server-side -f manifests/crds"


def _finding(*fields: str, rules: tuple[str, ...] = ()) -> schemadiff.SchemaFinding:
    return schemadiff.SchemaFinding("localmodelnodes.serving.kserve.io", fields, rules)


def test_event_message_names_the_missing_fields_rules_and_the_fix() -> None:
    message = crdcheck.event_message(
        _finding("status.modelProgress", "status.summary", rules=("spec.x: must be > 0",)), FIX
    )
    assert "status.modelProgress, status.summary" in message
    assert "spec.x: must be > 0" in message
    assert message.endswith(FIX)


def test_a_long_event_message_is_cut_but_keeps_the_fix() -> None:
    many = tuple(f"status.field{i:03d}" for i in range(200))
    message = crdcheck.event_message(_finding(*many), FIX)
    assert len(message) <= crdcheck.MAX_MESSAGE
    assert "status.field000" in message
    assert " ..." in message
    assert message.endswith(FIX)


def test_event_name_is_stable_per_crd_object_and_finding() -> None:
    crd = "localmodelnodes.serving.kserve.io"
    first = crdcheck.event_name(crd, "uid-1", _finding("status.summary"))
    assert first == crdcheck.event_name(crd, "uid-1", _finding("status.summary"))
    assert first.startswith(f"{crd}.")
    assert first != crdcheck.event_name(crd, "uid-2", _finding("status.summary"))
    assert first != crdcheck.event_name(crd, "uid-1", _finding("status.modelProgress"))


# ---------------------------------------------------------------- the reconciler


class FakeEvents:
    """Events in memory, answering like the apiserver: 409 AlreadyExists on a taken name."""

    def __init__(self, *, forbidden: bool = False) -> None:
        self.events: dict[str, Obj] = {}
        self.forbidden = forbidden

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj:
        return copy.deepcopy(self.events[name])

    async def create(self, res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        if self.forbidden:
            raise errors.Forbidden(403, "events is forbidden", reason="Forbidden")
        name = obj["metadata"]["name"]
        if name in self.events:
            raise errors.Conflict(409, f"{name} exists", reason="AlreadyExists")
        self.events[name] = copy.deepcopy(obj)
        return obj

    async def patch(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj:
        assert isinstance(patch, dict)
        self.events[name].update(patch)
        return self.events[name]


NODES = "localmodelnodes.serving.kserve.io"
WANTED = {c["metadata"]["name"]: c for c in kserveshape.our_crds()}


def _served(crd: Obj, uid: str = "uid-1") -> Obj:
    return {**crd, "metadata": {**crd["metadata"], "uid": uid, "resourceVersion": "1"}}


class World:
    def __init__(self, api: FakeEvents | None = None) -> None:
        self.store = store.Store()
        self.api = api or FakeEvents()
        self.registry = metrics.Metrics()
        self.check = crdcheck.CrdSchemaCheck(
            {NODES: WANTED[NODES]},
            {NODES: self.store.view()},
            api=self.api,
            registry=self.registry,
            fix=FIX,
        )

    async def reconcile(self) -> None:
        await self.check.reconcile(keys.ObjectKey("", NODES))

    def gauge(self) -> float | None:
        return self.registry.value(crdcheck.DEGRADED_METRIC, crd=NODES)


async def test_a_degraded_crd_is_logged_counted_and_evented_once_while_unchanged() -> None:
    world = World()
    world.store.upsert(_served(kserveshape.kserve_shaped(WANTED[NODES])))
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            await world.reconcile()
    assert [line["event"] for line in logs] == ["crd_schema_degraded"]
    assert world.gauge() == 1
    assert world.registry.value(crdcheck.MISSING_METRIC, crd=NODES) == 3
    (event,) = world.api.events.values()
    assert event["count"] == 1
    assert event["involvedObject"]["uid"] == "uid-1"


async def test_after_a_fix_a_new_degradation_is_reported_and_the_event_bumped() -> None:
    world = World()
    world.store.upsert(_served(kserveshape.kserve_shaped(WANTED[NODES])))
    await world.reconcile()
    world.store.upsert(_served(WANTED[NODES]))
    with structlog.testing.capture_logs() as logs:
        await world.reconcile()
    assert [line["event"] for line in logs] == ["crd_schema_complete"]
    assert world.gauge() == 0
    world.store.upsert(_served(kserveshape.kserve_shaped(WANTED[NODES])))
    await world.reconcile()
    assert world.gauge() == 1
    (event,) = world.api.events.values()
    assert event["count"] == 2


async def test_a_missing_crd_removes_the_series_and_is_said() -> None:
    world = World()
    world.store.upsert(_served(WANTED[NODES]))
    await world.reconcile()
    world.store.delete(keys.ObjectKey("", NODES))
    with structlog.testing.capture_logs() as logs:
        await world.reconcile()
    assert [line["event"] for line in logs] == ["crd_schema_not_checked"]
    assert world.gauge() is None


async def test_an_event_forbidden_by_rbac_is_logged_not_retried() -> None:
    world = World(FakeEvents(forbidden=True))
    world.store.upsert(_served(kserveshape.kserve_shaped(WANTED[NODES])))
    with structlog.testing.capture_logs() as logs:
        await world.reconcile()  # does not raise: nothing to retry
    assert [line["event"] for line in logs] == [
        "crd_schema_degraded",
        "crd_schema_event_not_recorded",
    ]
    assert world.gauge() == 1
