"""LocalModelNamespaceCache on the real control plane: reference §8.1 scenarios 6 to 11 with
the spec's names (download PVC in the cache's own namespace, spec §3) and isolation."""

from __future__ import annotations

import functools

import pytest

from localcache.api import modelcache
from localcache.caching import names
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import URI, Env, gone, phase_is, wait_bound_pair

pytestmark = pytest.mark.kcm


async def _one_group(env: Env) -> tuple[str, str]:
    group = env.name("gpu1")
    await env.group(group, group)
    node = await env.node(env.name("node-1"), group)
    return group, node


async def test_namespace_cache_volumes_live_in_its_namespace_and_status_uses_its_key(
    env: Env,
) -> None:
    """Scenarios 6 and 10: download PV (ownerless) and PVC in the cache's namespace, entry
    with namespace and nodeGroup, status key ns/name, finalizer set."""
    group, node = await _one_group(env)
    tenant = await env.namespace_("tenant")
    await env.start()
    name = env.name("model")
    await env.cache(name, [group], namespace=tenant, serviceAccountName="puller")
    pv_name, pvc_name = (
        names.download_pv(name, group, tenant),
        names.download_pvc(name, group, namespaced=True),
    )
    await wait_bound_pair(env, pv=pv_name, pvc=pvc_name, namespace=tenant, role="download")
    pv = await env.get(kube.PERSISTENT_VOLUMES, pv_name)
    assert pv is not None
    assert "ownerReferences" not in pv["metadata"]
    pvc = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, tenant)
    assert pvc is not None
    assert [r["kind"] for r in pvc["metadata"]["ownerReferences"]] == ["LocalModelNamespaceCache"]
    in_job_ns = await env.api.list(kube.PERSISTENT_VOLUME_CLAIMS, namespace=env.namespace)
    assert in_job_ns.items == [], "nothing of a namespace cache lives in jobNamespace"
    cache = await env.get_cache(name, tenant)
    assert cache is not None
    assert modelcache.NAMESPACE_CACHE_FINALIZER in cache["metadata"]["finalizers"]

    entries = await wait_until(
        functools.partial(env.entries, node), what=f"LocalModelNode {node} lists {name}"
    )
    assert entries[(tenant, name)] == {
        "sourceModelUri": URI,
        "modelName": name,
        "namespace": tenant,
        "nodeGroup": group,
        "serviceAccountName": "puller",
    }
    await env.set_model_status(node, {f"{tenant}/{name}": "ModelDownloaded"})
    await env.wait_status(
        name,
        tenant,
        copies={"available": 1, "total": 1, "failed": 0},
        nodeStatus={node: "NodeDownloaded"},
        what="the namespace cache reads its ns/name status key",
    )


async def test_only_inference_services_of_the_cache_namespace_are_tracked(env: Env) -> None:
    """Scenario 7: serving PV/PVC for the ISVC in the cache's namespace; an ISVC elsewhere
    that carries the cache's labels is ignored."""
    group, _ = await _one_group(env)
    tenant = await env.namespace_("tenant")
    other = await env.namespace_("other")
    await env.start()
    name = env.name("model")
    await env.cache(name, [group], namespace=tenant)
    await env.isvc("mine", tenant, cache=name, cache_namespace=tenant)
    await env.isvc("intruder", other, cache=name, cache_namespace=tenant)
    await wait_bound_pair(
        env,
        pv=names.serving_pv(name, group, tenant),
        pvc=names.serving_pvc(name, group),
        namespace=tenant,
        role="serving",
    )
    await env.wait_status(
        name,
        tenant,
        inferenceServices=[{"namespace": tenant, "name": "mine"}],
        what="only the same-namespace InferenceService is tracked",
    )
    assert (await env.api.list(kube.PERSISTENT_VOLUME_CLAIMS, namespace=other)).items == []
    assert await env.get(kube.PERSISTENT_VOLUMES, names.serving_pv(name, group, other)) is None


async def test_deleting_a_namespace_cache_runs_its_finalizer_cleanup(env: Env) -> None:
    """Scenario 8: the CR disappears, its entry leaves the node, its ownerless PVs are
    deleted by the finalizer and its PVCs are garbage-collected."""
    group, node = await _one_group(env)
    tenant = await env.namespace_("tenant")
    await env.start()
    name = env.name("model")
    await env.cache(name, [group], namespace=tenant)
    await env.isvc("user", tenant, cache=name, cache_namespace=tenant)
    pvs = [names.download_pv(name, group, tenant), names.serving_pv(name, group, tenant)]
    pvcs = [names.download_pvc(name, group, namespaced=True), names.serving_pvc(name, group)]
    for pvc in pvcs:
        await wait_until(
            phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc, tenant, "Bound"),
            what=f"PVC {pvc} is bound",
        )
    await wait_until(functools.partial(env.entries, node), what=f"{node} lists {name}")
    await env.api.delete(state.LOCAL_MODEL_NAMESPACE_CACHES, name, namespace=tenant)
    await wait_until(
        gone(env, state.LOCAL_MODEL_NAMESPACE_CACHES, name, tenant), what=f"{name} is deleted"
    )
    assert (tenant, name) not in await env.entries(node)
    for pv in pvs:
        await wait_until(gone(env, kube.PERSISTENT_VOLUMES, pv), what=f"ownerless PV {pv} goes")
    for pvc in pvcs:
        await wait_until(
            gone(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc, tenant),
            what=f"PVC {pvc} is garbage-collected",
        )


async def test_cluster_and_namespace_entries_coexist_with_their_own_status_keys(
    env: Env,
) -> None:
    """Scenario 9: a cluster cache and a namespace cache of the same name both have an entry
    on the node, and each reads its own status key."""
    group, node = await _one_group(env)
    tenant = await env.namespace_("tenant")
    await env.start()
    name = env.name("shared")
    await env.cache(name, [group])
    await env.cache(name, [group], namespace=tenant)

    async def both() -> bool:
        return set(await env.entries(node)) == {("", name), (tenant, name)}

    await wait_until(both, what=f"{node} lists the cluster and the namespace entry")
    await env.set_model_status(
        node, {name: "ModelDownloaded", f"{tenant}/{name}": "ModelDownloadError"}
    )
    await env.wait_status(
        name, nodeStatus={node: "NodeDownloaded"}, what="the cluster cache reads `name`"
    )
    found = await env.wait_status(
        name,
        tenant,
        nodeStatus={node: "NodeDownloadError"},
        copies={"available": 0, "total": 1, "failed": 1},
        what="the namespace cache reads `ns/name`",
    )
    degraded = {c["type"]: c for c in found["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "DownloadFailed")


async def test_serving_volumes_follow_the_inference_service(env: Env) -> None:
    """Scenario 11, plus the removal the reference does not assert: when the ISVC goes, its
    serving PVC and PV go and the status no longer lists it."""
    group, _ = await _one_group(env)
    tenant = await env.namespace_("tenant")
    await env.start()
    name = env.name("model")
    await env.cache(name, [group], namespace=tenant)
    await env.isvc("user", tenant, cache=name, cache_namespace=tenant)
    pv, pvc = names.serving_pv(name, group, tenant), names.serving_pvc(name, group)
    await wait_bound_pair(env, pv=pv, pvc=pvc, namespace=tenant, role="serving")
    await env.wait_status(
        name,
        tenant,
        inferenceServices=[{"namespace": tenant, "name": "user"}],
        what="the ISVC is tracked",
    )
    await env.api.delete(state.INFERENCE_SERVICES, "user", namespace=tenant)
    await wait_until(gone(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc, tenant), what="PVC removed")
    await wait_until(gone(env, kube.PERSISTENT_VOLUMES, pv), what="PV removed")
    await env.wait_status(name, tenant, inferenceServices=[], what="the ISVC is untracked")
    assert await env.get(kube.PERSISTENT_VOLUMES, names.download_pv(name, group, tenant))


async def test_a_namespace_cache_with_a_240_character_name_gets_valid_volume_names(
    env: Env,
) -> None:
    """Issue 14: `{cache}-{group}-{ns}-download` passed 253 characters and the controller
    looped on 422; now the names are shortened, and the pair binds."""
    group, _ = await _one_group(env)
    tenant = await env.namespace_("tenant")
    await env.start()
    name = "m" * 240
    await env.cache(name, [group], namespace=tenant)
    pv_name = names.download_pv(name, group, tenant)
    pvc_name = names.download_pvc(name, group, namespaced=True)
    assert len(pv_name) <= 253
    assert len(pvc_name) <= 253
    assert pv_name != pvc_name
    await wait_bound_pair(env, pv=pv_name, pvc=pvc_name, namespace=tenant, role="download")
    pvc = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, tenant)
    assert pvc is not None
    assert pvc["spec"]["volumeName"] == pv_name
