"""The agent-tolerations reconcile: one merge patch of just the tolerations and the record, with
the read resourceVersion; nothing when in sync or absent; rejected tolerations reported once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcache.caching import agenttolerations as rules
from localcache.controllers import agenttolerations
from localcache.runtime import errors, events, keys, kube, store

Obj = dict[str, Any]
KEY = keys.ObjectKey("localcache", "localcache-agent")
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
INFRA = {"key": "dedicated", "operator": "Equal", "value": "infra"}


class FakeApi:
    def __init__(self) -> None:
        self.patches: list[tuple[kube.Resource, str, Any, str | None, str]] = []
        self.events: list[Obj] = []

    async def patch(
        self,
        res: kube.Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
    ) -> Obj:
        self.patches.append((res, name, patch, namespace, patch_type))
        return {}

    async def create(self, res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        self.events.append(obj)
        return obj

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj:
        raise AssertionError("not expected")


def _daemonset(tolerations: list[Obj] | None, record: str | None = None) -> Obj:
    full: Obj = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": KEY.name,
            "namespace": KEY.namespace,
            "uid": "u1",
            "resourceVersion": "41",
            "labels": {"app": "x"},
            "annotations": {"deprecated.daemonset.template.generation": "3"},
        },
        "spec": {"template": {"spec": {"containers": [{"name": "manager"}]}}},
    }
    if tolerations is not None:
        full["spec"]["template"]["spec"]["tolerations"] = tolerations
    if record is not None:
        full["metadata"]["annotations"][rules.RECORD_ANNOTATION] = record
    return agenttolerations.slim_daemonset(full)


def _group(name: str, tolerations: list[Any], rv: str = "1") -> Obj:
    meta = {"name": name, "uid": f"uid-{name}", "resourceVersion": rv}
    return {"metadata": meta, "spec": {"tolerations": tolerations}}


def _reconciler(
    daemonset: Obj | None, groups: list[Obj]
) -> tuple[agenttolerations.AgentTolerationsReconciler, FakeApi, store.Store]:
    api = FakeApi()
    ds_store, group_store = store.Store(), store.Store()
    if daemonset is not None:
        ds_store.upsert(daemonset)
    for group in groups:
        group_store.upsert(group)
    rec = agenttolerations.AgentTolerationsReconciler(
        api=api,  # type: ignore[arg-type]
        daemonsets=ds_store.view(),
        groups=group_store.view(),
        recorder=events.Recorder(api, component="test"),
    )
    return rec, api, group_store


def test_slim_daemonset_keeps_identity_record_and_tolerations_only() -> None:
    slim = _daemonset([INFRA], "[]")
    assert slim == {
        "metadata": {
            "name": KEY.name,
            "namespace": KEY.namespace,
            "uid": "u1",
            "resourceVersion": "41",
            "annotations": {rules.RECORD_ANNOTATION: "[]"},
        },
        "spec": {"template": {"spec": {"tolerations": [INFRA]}}},
    }


async def test_one_merge_patch_of_tolerations_and_record_with_the_resource_version() -> None:
    rec, api, _ = _reconciler(_daemonset([INFRA]), [_group("gpus", [GPU])])
    await rec.reconcile(KEY)
    ((res, name, body, namespace, patch_type),) = api.patches
    assert (res, name, namespace, patch_type) == (
        kube.DAEMON_SETS,
        KEY.name,
        KEY.namespace,
        "merge",
    )
    assert body == {
        "metadata": {
            "resourceVersion": "41",
            "annotations": {rules.RECORD_ANNOTATION: json.dumps([GPU], separators=(",", ":"))},
        },
        "spec": {"template": {"spec": {"tolerations": [INFRA, GPU]}}},
    }


async def test_nothing_is_written_when_in_sync_or_without_groups() -> None:
    record = rules.record_text([GPU])
    rec, api, _ = _reconciler(_daemonset([INFRA, GPU], record), [_group("gpus", [GPU])])
    await rec.reconcile(KEY)
    rec2, api2, _ = _reconciler(_daemonset(None), [])
    await rec2.reconcile(KEY)
    assert api.patches == api2.patches == []


async def test_the_last_group_toleration_removed_clears_the_list() -> None:
    rec, api, _ = _reconciler(_daemonset([GPU], rules.record_text([GPU])), [])
    await rec.reconcile(KEY)
    (patch,) = api.patches
    assert patch[2]["spec"]["template"]["spec"]["tolerations"] is None  # merge patch: removed
    assert patch[2]["metadata"]["annotations"][rules.RECORD_ANNOTATION] == "[]"


async def test_a_missing_daemonset_is_no_error() -> None:
    rec, api, _ = _reconciler(None, [_group("gpus", [GPU])])
    await rec.reconcile(KEY)
    assert api.patches == []


async def test_a_rejected_toleration_is_reported_once_per_group_version() -> None:
    bad = {"key": "bad key", "operator": "Exists"}
    rec, api, groups = _reconciler(_daemonset(None), [_group("gpus", [bad, GPU])])
    await rec.reconcile(KEY)
    await rec.reconcile(KEY)
    (event,) = api.events
    assert event["reason"] == agenttolerations.REJECTED_REASON
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "LocalModelNodeGroup"
    assert event["involvedObject"]["name"] == "gpus"
    assert "'bad key'" in event["message"]
    assert event["metadata"]["namespace"] == "default"
    groups.upsert(_group("gpus", [bad, GPU], rv="2"))
    await rec.reconcile(KEY)
    bumps = [p for p in api.patches if p[0] == kube.EVENTS]  # the same Event, count 2
    assert [p[1] for p in bumps] == [event["metadata"]["name"]]


async def test_a_conflict_is_raised_for_a_retry_with_backoff() -> None:
    class Conflicting(FakeApi):
        async def patch(self, res: kube.Resource, name: str, patch: Any, **_: Any) -> Obj:
            raise errors.Conflict(409, "the object has been modified", reason="Conflict")

    rec, _, _ = _reconciler(_daemonset([INFRA]), [_group("gpus", [GPU])])
    rec._api = Conflicting()  # type: ignore[assignment]
    with pytest.raises(errors.Conflict):
        await rec.reconcile(KEY)
