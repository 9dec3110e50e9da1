"""LocalModelCache on the real control plane: reference §8.1 scenarios 1, 2, 4 and 5, plus node
membership (relabel, delete, NotReady, overlapping groups) and node-group usage."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from localcache.caching import names
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import (
    URI,
    Env,
    exists,
    gone,
    lists_exactly,
    wait_bound_pair,
)

pytestmark = pytest.mark.kcm


async def _two_groups(env: Env) -> tuple[str, str, str, str]:
    """Groups gpu1/gpu2 selecting instance types of the same names, one Ready node each."""
    g1, g2 = env.name("gpu1"), env.name("gpu2")
    await env.group(g1, g1)
    await env.group(g2, g2)
    n1 = await env.node(env.name("node-1"), g1)
    n2 = await env.node(env.name("node-2"), g2)
    return g1, g2, n1, n2


async def test_cache_creates_volumes_and_node_entries_and_reports_downloads(env: Env) -> None:
    """Scenario 1: PVs, PVCs, LocalModelNodes, status from the nodes, deletion."""
    g1, g2, n1, n2 = await _two_groups(env)
    await env.start()
    name = env.name("iris")
    await env.cache(name, [g1, g2])
    job_ns = env.namespace
    for group in (g1, g2):
        await wait_until(
            exists(env, kube.PERSISTENT_VOLUMES, names.download_pv(name, group, None)),
            what=f"download PV {name}-{group}-download exists",
        )
        await wait_until(
            exists(
                env,
                kube.PERSISTENT_VOLUME_CLAIMS,
                names.download_pvc(name, group, namespaced=False),
                job_ns,
            ),
            what=f"download PVC {name}-{group} exists in the job namespace",
        )
    for node, group in ((n1, g1), (n2, g2)):
        entries = await wait_until(
            functools.partial(env.entries, node), what=f"LocalModelNode {node} lists model {name}"
        )
        assert entries[("", name)] == {"sourceModelUri": URI, "modelName": name, "nodeGroup": group}
        lmn = await env.get(state.LOCAL_MODEL_NODES, node)
        assert lmn is not None
        assert [(r["kind"], r["name"]) for r in lmn["metadata"]["ownerReferences"]] == [
            ("Node", node)
        ]
    await env.wait_status(
        name,
        copies={"available": 0, "total": 2, "failed": 0},
        nodeStatus={n1: "NodeDownloadPending", n2: "NodeDownloadPending"},
        what="the cache reports two pending copies",
    )
    for node in (n1, n2):
        await env.set_model_status(node, {name: "ModelDownloaded"})
    found = await env.wait_status(
        name,
        copies={"available": 2, "total": 2, "failed": 0},
        nodeStatus={n1: "NodeDownloaded", n2: "NodeDownloaded"},
        what="the cache reports two downloaded copies",
    )
    ready = {c["type"]: c for c in found["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "ModelDownloaded")
    pvc = await env.get(
        kube.PERSISTENT_VOLUME_CLAIMS, names.download_pvc(name, g1, namespaced=False), job_ns
    )
    assert pvc is not None
    assert pvc["spec"]["volumeName"] == names.download_pv(name, g1, None)

    async def ready_event() -> bool:
        events = await env.api.list(
            kube.EVENTS, namespace="default", field_selector=f"involvedObject.name={name}"
        )
        return {"Ready", "ModelDownloaded"} <= {e["reason"] for e in events.items}

    await wait_until(ready_event, what=f"Events record the downloads and readiness of {name}")

    await env.api.delete(state.LOCAL_MODEL_CACHES, name)
    await wait_until(gone(env, state.LOCAL_MODEL_CACHES, name), what=f"cache {name} is deleted")
    for node in (n1, n2):
        assert ("", name) not in await env.entries(node)
    await wait_until(
        gone(env, kube.PERSISTENT_VOLUMES, names.download_pv(name, g1, None)),
        what="the owned download PV is garbage-collected",
    )


async def test_inference_services_get_serving_volumes_per_namespace_and_group(env: Env) -> None:
    """Scenario 2: default group without annotation, the annotated group otherwise."""
    g1, g2, _, _ = await _two_groups(env)
    isvc_ns = await env.namespace_("isvcs")
    await env.start()
    name = env.name("iris2")
    await env.cache(name, [g1, g2])
    await env.isvc("plain", isvc_ns, cache=name)
    await env.isvc("pinned", isvc_ns, cache=name, node_group=g2)
    for group in (g1, g2):
        await wait_bound_pair(
            env,
            pv=names.serving_pv(name, group, isvc_ns),
            pvc=names.serving_pvc(name, group),
            namespace=isvc_ns,
            role="serving",
        )
    await env.wait_status(
        name,
        inferenceServices=[
            {"namespace": isvc_ns, "name": "pinned"},
            {"namespace": isvc_ns, "name": "plain"},
        ],
        what="the cache lists both InferenceServices",
    )


async def test_disabled_volume_management_leaves_serving_volumes_alone(env: Env) -> None:
    """Scenario 4: with disableVolumeManagement, existing serving PV/PVC are not deleted."""
    g1, _, _, _ = await _two_groups(env)
    isvc_ns = await env.namespace_("isvcs")
    name = env.name("keep")
    cache = await env.cache(name, [g1])
    owner = {
        "apiVersion": cache["apiVersion"],
        "kind": cache["kind"],
        "name": name,
        "uid": cache["metadata"]["uid"],
        "controller": True,
    }
    annotations = {
        state.OWNER_ANNOTATION: f"LocalModelCache/{name}",
        state.ROLE_ANNOTATION: "serving",
    }
    pv_name, pvc_name = names.serving_pv(name, g1, isvc_ns), names.serving_pvc(name, g1)
    await env.api.create(
        kube.PERSISTENT_VOLUMES,
        {
            "metadata": {"name": pv_name, "annotations": annotations, "ownerReferences": [owner]},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/models"},
                "storageClassName": "standard",
            },
        },
    )
    await env.api.create(
        kube.PERSISTENT_VOLUME_CLAIMS,
        {
            "metadata": {
                "name": pvc_name,
                "namespace": isvc_ns,
                "annotations": annotations,
                "ownerReferences": [owner],
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "standard",
                "volumeName": pv_name,
            },
        },
    )
    controllers = await env.start(disableVolumeManagement=True)
    assert controllers.handle.stores.inference_services is None
    await wait_until(
        exists(env, kube.PERSISTENT_VOLUMES, names.download_pv(name, g1, None)),
        what="the download PV is still managed",
    )
    found = await env.wait_status(
        name, copies={"available": 0, "total": 1, "failed": 0}, what="the cache was reconciled"
    )
    assert "inferenceServices" not in found
    controllers.handle.resync()
    await wait_until(
        lambda: (
            controllers.handle.cluster.queue.stats().depth == 0
            and controllers.handle.cluster.stats().active_workers == 0
        ),
        what="the resync was processed",
    )
    for res, obj_name, ns in (
        (kube.PERSISTENT_VOLUMES, pv_name, None),
        (kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, isvc_ns),
    ):
        obj = await env.get(res, obj_name, ns)
        assert obj is not None, f"{res.kind} {obj_name} was deleted"
        assert not obj["metadata"].get("deletionTimestamp"), f"{res.kind} {obj_name} is deleted"


async def test_several_caches_share_node_entries_and_group_usage(env: Env) -> None:
    """Scenario 5: two caches on two nodes; deleting them empties the LocalModelNodes."""
    group = env.name("gpu")
    await env.group(group, group, limit="10Gi")
    nodes = [await env.node(env.name(f"node-{i}"), group) for i in (1, 2)]
    await env.start()
    first, second = env.name("model-a"), env.name("model-b")
    await env.cache(first, [group], uri="s3://bucket/a", size="1Gi")
    await env.cache(second, [group], uri="s3://bucket/b", size="3Gi")
    for node in nodes:
        await wait_until(
            lists_exactly(env, node, {("", first), ("", second)}),
            what=f"LocalModelNode {node} lists both models",
        )

    async def usage(used: str, available: str) -> bool:
        obj = await env.get(state.LOCAL_MODEL_NODE_GROUPS, group)
        return (obj or {}).get("status") == {"used": used, "available": available}

    await wait_until(lambda: usage("4Gi", "6Gi"), what=f"group {group} reports 4Gi used")
    await env.api.delete(state.LOCAL_MODEL_CACHES, first)
    for node in nodes:
        await wait_until(
            lists_exactly(env, node, {("", second)}),
            what=f"LocalModelNode {node} lists only {second}",
        )
    await wait_until(lambda: usage("3Gi", "7Gi"), what=f"group {group} reports 3Gi used")
    await env.api.delete(state.LOCAL_MODEL_CACHES, second)
    for node in nodes:
        await wait_until(lists_exactly(env, node, set()), what=f"LocalModelNode {node} is empty")
        assert await exists(env, state.LOCAL_MODEL_NODES, node)(), "the emptied object is kept"


async def test_nodes_joining_leaving_and_deleted_change_membership(env: Env) -> None:
    """A relabelled node gains or loses the model; a deleted Node takes its LocalModelNode
    along (garbage collection) and leaves nodeStatus and copies."""
    group = env.name("gpu")
    await env.group(group, group)
    stays = await env.node(env.name("stays"), group)
    moves = await env.node(env.name("moves"), None)
    await env.start()
    name = env.name("iris")
    await env.cache(name, [group])
    await env.wait_status(name, copies={"available": 0, "total": 1, "failed": 0}, what="1 copy")
    assert await env.entries(moves) == {}

    await env.label(moves, group)
    await wait_until(
        lists_exactly(env, moves, {("", name)}), what=f"relabelled node {moves} gets {name}"
    )
    await env.wait_status(
        name,
        copies={"available": 0, "total": 2, "failed": 0},
        what="the relabelled node counts as a member",
    )

    await env.label(moves, None)
    await wait_until(lists_exactly(env, moves, set()), what=f"node {moves} loses {name}")
    found = await env.wait_status(
        name, copies={"available": 0, "total": 1, "failed": 0}, what="the node left"
    )
    assert set(found["nodeStatus"]) == {stays}

    await env.label(moves, group)
    await env.wait_status(name, copies={"available": 0, "total": 2, "failed": 0}, what="back")
    await env.delete_node(moves)
    await wait_until(
        gone(env, state.LOCAL_MODEL_NODES, moves),
        what=f"LocalModelNode {moves} is garbage-collected with its Node",
    )
    found = await env.wait_status(
        name, copies={"available": 0, "total": 1, "failed": 0}, what="copies.total drops"
    )
    assert set(found["nodeStatus"]) == {stays}


async def test_not_ready_node_shows_node_not_ready(env: Env) -> None:
    """[P8]: a node that turns NotReady shows NodeNotReady, whatever it had; back when Ready."""
    group = env.name("gpu")
    await env.group(group, group)
    node = await env.node(env.name("node"), group)
    await env.start()
    name = env.name("iris")
    await env.cache(name, [group])
    await wait_until(lambda: env.entries(node), what=f"LocalModelNode {node} lists {name}")
    await env.set_model_status(node, {name: "ModelDownloaded"})
    await env.wait_status(name, nodeStatus={node: "NodeDownloaded"}, what="downloaded")
    await env.set_ready(node, False)
    found = await env.wait_status(
        name,
        nodeStatus={node: "NodeNotReady"},
        copies={"available": 0, "total": 1, "failed": 0},
        what="the NotReady node shows NodeNotReady",
    )
    ready = {c["type"]: c for c in found["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "NodesNotReady")
    await env.set_ready(node, True)
    await env.wait_status(name, nodeStatus={node: "NodeDownloaded"}, what="Ready again")


async def test_overlapping_groups_place_through_the_first_listed_group(env: Env) -> None:
    """[P9]: both groups select the node; the entry names the first group of the spec and
    stays put over reconciles (no flipping writes)."""
    shared = env.name("shared")
    first, second = env.name("b-first"), env.name("a-second")
    await env.group(first, shared)
    await env.group(second, shared)
    node = await env.node(env.name("node"), shared)
    controllers = await env.start()
    name = env.name("iris")
    await env.cache(name, [first, second])

    async def placed() -> Any:
        entry = (await env.entries(node)).get(("", name))
        return entry if entry and entry["nodeGroup"] == first else None

    await wait_until(placed, what=f"the entry on {node} names group {first}")
    before = await env.get(state.LOCAL_MODEL_NODES, node)
    assert before is not None
    for _ in range(3):
        controllers.handle.resync()
        await wait_until(
            lambda: (
                controllers.handle.cluster.queue.stats().depth == 0
                and controllers.handle.cluster.stats().active_workers == 0
            ),
            what="the resync was processed",
        )
    after = await env.get(state.LOCAL_MODEL_NODES, node)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert (await env.entries(node))[("", name)]["nodeGroup"] == first
