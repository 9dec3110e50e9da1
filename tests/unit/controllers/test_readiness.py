"""The node readiness-label reconciler and the waiting-pod Event."""

from __future__ import annotations

from typing import Any

from localcache.caching import readiness
from localcache.controllers import readiness as ctl
from localcache.controllers import state
from localcache.runtime import keys, kube, store

Obj = dict[str, Any]


class Api:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Obj]] = []

    async def patch(self, res: kube.Resource, name: str, patch: kube.Patch) -> Obj:
        assert res == kube.NODES
        assert isinstance(patch, dict)
        self.patches.append((name, patch))
        return {}


def node(name: str, labels: dict[str, str]) -> Obj:
    return {"metadata": {"name": name, "labels": labels}}


def lmn(name: str, entries: list[str], states: dict[str, str]) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"localModels": [{"sourceModelUri": "s3://b", "modelName": e} for e in entries]},
        "status": {"modelStatus": states},
    }


async def test_labels_follow_the_local_model_node_and_the_setting() -> None:
    nodes, lmns, api = store.Store(), store.Store(state.LOCAL_MODEL_NODE_INDEXERS), Api()
    enabled = [True]
    nodes.upsert(node("n1", {"team": "gpu", readiness.label_key("gone"): "true"}))
    lmns.upsert(lmn("n1", ["iris", "slow"], {"iris": "ModelDownloaded", "slow": "x"}))
    rec = ctl.NodeLabels(
        api=api, nodes=nodes.view(), local_model_nodes=lmns.view(), enabled=lambda: enabled[0]
    )
    await rec.reconcile(keys.ObjectKey("", "n1"))
    assert api.patches == [
        (
            "n1",
            {
                "metadata": {
                    "labels": {
                        readiness.label_key("gone"): None,
                        readiness.label_key("iris"): "true",
                    }
                }
            },
        )
    ]
    nodes.upsert(node("n1", {"team": "gpu", readiness.label_key("iris"): "true"}))
    await rec.reconcile(keys.ObjectKey("", "n1"))
    assert len(api.patches) == 1  # nothing differs: no write
    enabled[0] = False
    await rec.reconcile(keys.ObjectKey("", "n1"))
    assert api.patches[-1] == ("n1", {"metadata": {"labels": {readiness.label_key("iris"): None}}})
    await rec.reconcile(keys.ObjectKey("", "unknown"))
    assert len(api.patches) == 2


def test_the_waiting_message_names_the_cache_and_the_nodes_still_downloading() -> None:
    lmns = [
        lmn("n2", ["team-a/llama"], {"team-a/llama": "ModelDownloading"}),
        lmn("n1", ["team-a/llama"], {"team-a/llama": "ModelDownloaded"}),
        lmn("n3", ["team-a/llama"], {}),
    ]
    message = ctl.waiting_message("team-a/llama", lmns)
    assert message == (
        "waiting for a complete copy of LocalModelNamespaceCache team-a/llama; nodes still "
        "downloading: n2 (ModelDownloading), n3 (not reported yet); complete on: n1 (other "
        "constraints keep the pod off)"
    )
    done = lmn("n1", ["iris"], {"iris": "ModelDownloaded"})
    assert ctl.waiting_message("iris", [done]).startswith(
        "waiting for a complete copy of LocalModelCache iris; nodes still downloading: none;"
    )
    assert "no node of its node groups" in ctl.waiting_message("iris", [])


def test_only_unscheduled_pods_that_the_scheduler_refused_count_as_waiting() -> None:
    refused = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    assert ctl.is_unschedulable({"status": {"phase": "Pending", "conditions": [refused]}})
    assert not ctl.is_unschedulable({"status": {"phase": "Pending", "conditions": []}})
    assert not ctl.is_unschedulable(
        {"spec": {"nodeName": "n1"}, "status": {"phase": "Pending", "conditions": [refused]}}
    )
    annotated = {"metadata": {"annotations": {readiness.WAITS_FOR_ANNOTATION: "a,ns/b"}}}
    assert ctl.waits_for(annotated) == ["a", "ns/b"]
    assert ctl.waits_for({}) == []


def test_a_local_model_node_change_refreshes_only_the_pods_waiting_for_its_caches() -> None:
    refused = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}

    def pod(name: str, waits: str, *, pending: bool = True) -> Obj:
        return {
            "metadata": {
                "name": name,
                "namespace": "team-a",
                "annotations": {readiness.WAITS_FOR_ANNOTATION: waits},
            },
            "status": {"phase": "Pending", "conditions": [refused] if pending else []},
        }

    pods = store.Store(ctl.POD_INDEXERS)
    for obj in (pod("a", "iris"), pod("b", "llama"), pod("c", "iris", pending=False)):
        pods.upsert(obj)
    found = ctl.pods_waiting_for(pods.view(), lmn("n1", ["iris"], {}))
    assert found == [keys.ObjectKey("team-a", "a")]
