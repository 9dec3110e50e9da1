"""A claim is the cache's only when the cache's PV records its uid (security review finding 1,
the claim-before-the-cache and `ephemeral` variants), on the real apiserver and
kube-controller-manager, with the claims forged by a tenant holding the `edit` role."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from localcache.caching import conditions, names
from localcache.controllers import state, volumeplan, volumes
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import Env, phase_is

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]


async def _as_tenant(env: Env, namespace: str, obj: Obj) -> Obj:
    """Create `obj` as user `thief-<namespace>`, bound to the `edit` ClusterRole there."""
    user = f"thief-{namespace}"
    await asyncio.to_thread(
        env.plane.kubectl, "create", "rolebinding", user, "--clusterrole=edit",
        f"--user={user}", "-n", namespace,
    )  # fmt: skip
    done = await asyncio.to_thread(
        env.plane.kubectl, "create", f"--as={user}", "-n", namespace, "-o", "json", "-f", "-",
        input_text=yaml.safe_dump(obj),
    )  # fmt: skip
    made: Obj = json.loads(done.stdout)
    return made


async def _bed(env: Env) -> tuple[str, str, str]:
    """A node group with one node, a tenant namespace, the controllers; the cache's name."""
    group = env.name("gpu1")
    await env.group(group, group)
    await env.node(env.name("node-1"), group)
    tenant = await env.namespace_("tenant")
    await env.start()
    return group, tenant, env.name("model")


def _forged_claim(name: str, *, owner: str, role: str, volume: str, **meta: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "annotations": {state.OWNER_ANNOTATION: owner, state.ROLE_ANNOTATION: role},
            **meta,
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "2Gi"}},
            "storageClassName": "standard",
            "volumeName": volume,
        },
    }


async def test_a_claim_forged_before_its_cache_is_replaced_and_never_bound(env: Env) -> None:
    group, tenant, name = await _bed(env)
    pv_name = names.download_pv(name, group, tenant)
    pvc_name = names.download_pvc(name, group, namespaced=True)
    forged = await _as_tenant(
        env,
        tenant,
        _forged_claim(
            pvc_name,
            owner=state.owner_id("LocalModelNamespaceCache", tenant, name),
            role="download",
            volume=pv_name,
        ),
    )
    await env.cache(name, [group], namespace=tenant)

    async def replaced() -> Obj | None:
        pvc = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, tenant)
        if pvc is None or pvc["metadata"]["uid"] == forged["metadata"]["uid"]:
            return None
        return pvc if (pvc.get("status") or {}).get("phase") == "Bound" else None

    ours = await wait_until(replaced, what=f"the forged claim {pvc_name} was replaced, bound")
    assert ours is not None
    pv = await env.get(kube.PERSISTENT_VOLUMES, pv_name)
    assert pv is not None
    assert pv["spec"]["claimRef"]["uid"] == ours["metadata"]["uid"]
    annotations = ours["metadata"]["annotations"]
    assert annotations[volumes.VOLUME_UID_ANNOTATION] == pv["metadata"]["uid"]
    assert annotations[volumeplan.STORAGE_KEY_ANNOTATION], "ours, made by the controller"


async def test_a_claim_owned_by_a_tenants_pod_is_taken_and_gets_no_volume(env: Env) -> None:
    """The `ephemeral` variant: the claim carries our annotation and is owned by the pod."""
    group, tenant, name = await _bed(env)
    pv_name = names.serving_pv(name, group, tenant)
    pvc_name = names.serving_pvc(name, group)
    pod = await env.api.create(
        kube.PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "thief", "namespace": tenant},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
        namespace=tenant,
    )
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "thief", "uid": pod["metadata"]["uid"],
             "controller": True}  # fmt: skip
    await _as_tenant(
        env,
        tenant,
        _forged_claim(
            pvc_name,
            owner=state.owner_id("LocalModelNamespaceCache", tenant, name),
            role="serving",
            volume=pv_name,
            ownerReferences=[owner],
        ),
    )
    await env.cache(name, [group], namespace=tenant)
    await env.isvc("isvc", tenant, cache=name, cache_namespace=tenant)

    async def reported() -> bool:
        cache = await env.get_cache(name, tenant)
        found = ((cache or {}).get("status") or {}).get("conditions") or []
        return any(
            c.get("type") == conditions.DEGRADED
            and c.get("reason") == conditions.REASON_VOLUME_NAME_TAKEN
            and f"{tenant}/{pvc_name}" in c.get("message", "")
            and "Pod thief" in c.get("message", "")
            for c in found
        )

    await wait_until(reported, what="the cache reports the claim's name taken by Pod thief")
    assert await env.get(kube.PERSISTENT_VOLUMES, pv_name) is None, "no PV for a stranger's claim"
    assert await phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, tenant, "Pending")()
