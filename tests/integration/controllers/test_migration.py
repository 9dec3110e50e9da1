"""Migration from KServe's localmodel add-on on the real control plane: the PVs and PVCs that
KServe's controller created (names of reference §2.2, its ownerReferences, PVC.volumeName,
the binder's claimRef, no annotations of ours) are adopted in place, KServe's download pair
in its own job namespace is replaced by one in ours, and a stranger holding a wanted name is
reported and left alone. With CSI volumes (the default), an adopted pair that shows the whole
models root is replaced by a CSI pair over the same names once no pod mounts its claim."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from localcache.caching import names
from localcache.controllers import state, volumeplan
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, kube
from tests.integration.controllers.conftest import Env, exists, gone, phase_is

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]
OUR_ANNOTATIONS = {state.OWNER_ANNOTATION, state.ROLE_ANNOTATION, volumeplan.STORAGE_KEY_ANNOTATION}


@pytest.fixture
async def plain_namespaces(control_plane: ControlPlane) -> AsyncIterator[Callable[[str], str]]:
    """Namespaces without `-` (KServe's names are kept only for single-word parts), deleted
    after the test; request it before `env` so that `env` is cleaned up first."""
    made: list[str] = []

    def make(name: str) -> str:
        control_plane.create_namespace(name)
        made.append(name)
        return name

    yield make
    for name in made:
        await asyncio.to_thread(control_plane.delete_namespace, name)


def _owner(cache: Obj) -> Obj:
    """The controller reference KServe's `SetControllerReference` writes."""
    return {
        "apiVersion": cache["apiVersion"],
        "kind": cache["kind"],
        "name": cache["metadata"]["name"],
        "uid": cache["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def _kserve_pair(
    env: Env,
    group: Obj,
    *,
    pv: str,
    pvc: tuple[str, str],
    pv_owner: Obj | None,
    pvc_owner: Obj | None,
) -> None:
    """A PV and PVC as KServe's controller creates them: the node group's specs, the PVC's
    volumeName naming the PV, no claimRef (the binder sets it, with the claim's uid)."""
    pv_meta: Obj = {"name": pv}
    if pv_owner is not None:
        pv_meta["ownerReferences"] = [pv_owner]
    await env.api.create(
        kube.PERSISTENT_VOLUMES,
        {"metadata": pv_meta, "spec": copy.deepcopy(group["spec"]["persistentVolumeSpec"])},
    )
    namespace, name = pvc
    pvc_meta: Obj = {"name": name, "namespace": namespace}
    if pvc_owner is not None:
        pvc_meta["ownerReferences"] = [pvc_owner]
    spec = {**copy.deepcopy(group["spec"]["persistentVolumeClaimSpec"]), "volumeName": pv}
    await env.api.create(
        kube.PERSISTENT_VOLUME_CLAIMS, {"metadata": pvc_meta, "spec": spec}, namespace=namespace
    )


async def _must_get(env: Env, res: kube.Resource, name: str, namespace: str | None = None) -> Obj:
    found = await env.get(res, name, namespace)
    assert found is not None, f"{res.kind} {namespace or ''}/{name} exists"
    return found


def _adopted(env: Env, res: kube.Resource, name: str, namespace: str | None, uid: str) -> Any:
    async def check() -> bool:
        obj = await env.get(res, name, namespace)
        meta = (obj or {}).get("metadata") or {}
        return meta.get("uid") == uid and set(meta.get("annotations") or {}) >= OUR_ANNOTATIONS

    return check


async def _events(env: Env, cache: Obj, reason: str) -> list[Obj]:
    meta = cache["metadata"]
    found = await env.api.list(kube.EVENTS, namespace=meta.get("namespace") or "default")
    return [
        e
        for e in found.items
        if (e.get("involvedObject") or {}).get("uid") == meta["uid"] and e.get("reason") == reason
    ]


def _degraded_naming(env: Env, name: str, namespace: str | None, text: str) -> Any:
    async def check() -> Obj | None:
        conds = (await env.cache_status(name, namespace)).get("conditions") or []
        degraded = next((c for c in conds if c["type"] == "Degraded"), None)
        ok = (
            degraded is not None
            and degraded["status"] == "True"
            and degraded["reason"] == "VolumeNameTaken"
            and text in degraded["message"]
        )
        return degraded if ok else None

    return check


async def test_kserves_volumes_are_adopted_replaced_or_reported_and_freed_on_deletion(
    plain_namespaces: Callable[[str], str], env: Env
) -> None:
    sfx = env.suffix
    group_name = await env.group(f"gpu{sfx}", f"gpu{sfx}")
    # KServe's sample node group releases with Delete: adoption must not change that, and a
    # download PV is set to Retain before its claim is released
    await env.api.patch(
        state.LOCAL_MODEL_NODE_GROUPS,
        group_name,
        {"spec": {"persistentVolumeSpec": {"persistentVolumeReclaimPolicy": "Delete"}}},
    )
    group = await _must_get(env, state.LOCAL_MODEL_NODE_GROUPS, group_name)
    prod, team, other = (plain_namespaces(f"{base}{sfx}") for base in ("prod", "team", "other"))
    kserve_jobs = await env.namespace_("kserve-localmodel-jobs")
    iris, llama = f"iris{sfx}", f"llama{sfx}"
    cluster = await env.cache(iris, [group_name])
    namespaced = await env.cache(llama, [group_name], namespace=team)

    # what KServe's controller left (ref §2.2), all bound by kube-controller-manager
    serving_pv, serving_pvc = f"{iris}-{group_name}-{prod}", (prod, f"{iris}-{group_name}")
    download_pv, old_download = (
        f"{iris}-{group_name}-download",
        (kserve_jobs, f"{iris}-{group_name}"),
    )
    ns_serving_pv, ns_serving_pvc = f"{llama}-{group_name}-{team}", (team, f"{llama}-{group_name}")
    ns_download_pv = f"{llama}-{group_name}-{team}-download"
    ns_download_pvc = (kserve_jobs, ns_download_pv)
    assert serving_pv == names.serving_pv(iris, group_name, prod), "KServe's name is ours"
    assert download_pv == names.download_pv(iris, group_name, None)
    assert ns_serving_pv == names.serving_pv(llama, group_name, team)
    assert ns_download_pv == names.download_pv(llama, group_name, team)
    owner, ns_owner = _owner(cluster), _owner(namespaced)
    for pv, pvc, pv_owner, pvc_owner in (
        (serving_pv, serving_pvc, owner, owner),
        (download_pv, old_download, owner, owner),
        (ns_serving_pv, ns_serving_pvc, None, ns_owner),
        (ns_download_pv, ns_download_pvc, None, None),  # jobNamespace != cache namespace
    ):
        await _kserve_pair(env, group, pv=pv, pvc=pvc, pv_owner=pv_owner, pvc_owner=pvc_owner)
        await wait_until(
            phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc[1], pvc[0], "Bound"),
            what=f"KServe's PVC {pvc[0]}/{pvc[1]} is bound to {pv}",
        )
    await env.isvc("served", prod, cache=iris)
    await env.isvc("served", team, cache=llama, cache_namespace=team)
    # a tenant's claim under the name the cluster cache wants in `other`
    await env.isvc("served", other, cache=iris)
    stranger_key = (other, f"{iris}-{group_name}")
    await env.api.create(
        kube.PERSISTENT_VOLUME_CLAIMS,
        {
            "metadata": {"name": stranger_key[1], "namespace": other},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": f"tenant-{sfx}",
            },
        },
        namespace=other,
    )
    before = {
        key: await _must_get(env, res, name, ns)
        for key, (res, name, ns) in {
            "pv": (kube.PERSISTENT_VOLUMES, serving_pv, None),
            "pvc": (kube.PERSISTENT_VOLUME_CLAIMS, serving_pvc[1], prod),
            "ns_pv": (kube.PERSISTENT_VOLUMES, ns_serving_pv, None),
            "ns_pvc": (kube.PERSISTENT_VOLUME_CLAIMS, ns_serving_pvc[1], team),
            "download": (kube.PERSISTENT_VOLUMES, download_pv, None),
            "stranger": (kube.PERSISTENT_VOLUME_CLAIMS, stranger_key[1], other),
            "ns_download": (kube.PERSISTENT_VOLUMES, ns_download_pv, None),
        }.items()
    }

    try:
        # volumeSource hostPath: KServe's kind of volume is what localcache wants, so adopted
        # pairs stay as they are (with csi, unused ones are then replaced: the next test)
        await env.start(volumeSource="hostPath")
        # 1. the serving pairs are adopted in place: same objects, specs untouched
        for key, res, name, ns in (
            ("pv", kube.PERSISTENT_VOLUMES, serving_pv, None),
            ("pvc", kube.PERSISTENT_VOLUME_CLAIMS, serving_pvc[1], prod),
            ("ns_pv", kube.PERSISTENT_VOLUMES, ns_serving_pv, None),
            ("ns_pvc", kube.PERSISTENT_VOLUME_CLAIMS, ns_serving_pvc[1], team),
        ):
            uid = before[key]["metadata"]["uid"]
            await wait_until(
                _adopted(env, res, name, ns, uid),
                what=f"{res.kind} {ns or ''}/{name} is adopted (annotated, same uid {uid})",
            )
            now = await _must_get(env, res, name, ns)
            assert now["spec"] == before[key]["spec"]
            assert now["metadata"]["labels"] == {state.MANAGED_BY_LABEL: state.MANAGED_BY}
            assert now["status"]["phase"] == "Bound"
        marks = (await _must_get(env, kube.PERSISTENT_VOLUMES, serving_pv))["metadata"]
        assert marks["annotations"][state.OWNER_ANNOTATION] == f"LocalModelCache/{iris}"
        assert marks["annotations"][state.ROLE_ANNOTATION] == "serving"
        for cache in (cluster, namespaced):
            await wait_until(
                functools.partial(_count, env, cache, "VolumeAdopted", 2),
                what=f"two VolumeAdopted events on {cache['metadata']['name']}",
            )

        # 2. KServe's download pair is replaced by one in the configured job namespace
        wanted_download = (env.namespace, names.download_pvc(iris, group_name, namespaced=False))
        await wait_until(
            phase_is(
                env, kube.PERSISTENT_VOLUME_CLAIMS, wanted_download[1], env.namespace, "Bound"
            ),
            what=f"the download PVC {wanted_download} in the job namespace is bound",
        )
        await wait_until(
            gone(env, kube.PERSISTENT_VOLUME_CLAIMS, old_download[1], kserve_jobs),
            what="KServe's download PVC in its job namespace is deleted",
        )
        new_pv = await _must_get(env, kube.PERSISTENT_VOLUMES, download_pv)
        assert new_pv["metadata"]["uid"] != before["download"]["metadata"]["uid"]
        assert new_pv["spec"]["claimRef"]["namespace"] == env.namespace
        assert new_pv["metadata"]["annotations"][state.ROLE_ANNOTATION] == "download"

        # 3. names held by objects that are not provably the cache's: reported, left alone
        stranger_text = f"PersistentVolumeClaim {other}/{stranger_key[1]} is not this cache's"
        await wait_until(
            _degraded_naming(env, iris, None, stranger_text),
            what="the cluster cache is Degraded with VolumeNameTaken naming the tenant's PVC",
        )
        ns_text = f"PersistentVolume {ns_download_pv} is not this cache's"
        await wait_until(
            _degraded_naming(env, llama, team, ns_text),
            what="the namespace cache is Degraded with VolumeNameTaken naming KServe's "
            "download PV (bound to an ownerless claim in KServe's job namespace)",
        )
        await wait_until(
            functools.partial(_count, env, cluster, "VolumeNameTaken", 1),
            what="one VolumeNameTaken event on the cluster cache",
        )
        for key, res, name, ns in (
            ("stranger", kube.PERSISTENT_VOLUME_CLAIMS, stranger_key[1], other),
            ("ns_download", kube.PERSISTENT_VOLUMES, ns_download_pv, None),
        ):
            now = await _must_get(env, res, name, ns)
            assert now["metadata"]["resourceVersion"] == before[key]["metadata"]["resourceVersion"]
        assert (
            await env.get(kube.PERSISTENT_VOLUMES, names.serving_pv(iris, group_name, other))
            is None
        )
        assert await env.get(kube.PERSISTENT_VOLUME_CLAIMS, *ns_download_pvc[::-1]) is not None
        assert len(await _events(env, cluster, "VolumeAdopted")) == 2, "adopted once"

        # 4. deleting the namespace cache deletes the PVs it adopted, and nothing else
        await env.api.delete(state.LOCAL_MODEL_NAMESPACE_CACHES, llama, namespace=team)
        await wait_until(
            gone(env, state.LOCAL_MODEL_NAMESPACE_CACHES, llama, team),
            what="the namespace cache is deleted",
        )
        await wait_until(
            gone(env, kube.PERSISTENT_VOLUMES, ns_serving_pv),
            what=f"the adopted serving PV {ns_serving_pv} is deleted with its cache",
        )
        await wait_until(
            gone(env, kube.PERSISTENT_VOLUME_CLAIMS, ns_serving_pvc[1], team),
            what="the adopted serving PVC is garbage-collected",
        )
        assert await exists(env, kube.PERSISTENT_VOLUMES, ns_download_pv)(), (
            "KServe's download PV, never proven the cache's, is left alone"
        )
    finally:
        for res, name, ns in (
            (kube.PERSISTENT_VOLUME_CLAIMS, ns_download_pvc[1], kserve_jobs),
            (kube.PERSISTENT_VOLUMES, ns_download_pv, None),
        ):
            with contextlib.suppress(errors.NotFound):
                await env.api.delete(res, name, namespace=ns)


async def _count(env: Env, cache: Obj, reason: str, want: int) -> bool:
    return len(await _events(env, cache, reason)) == want


async def test_an_adopted_hostpath_pair_becomes_a_csi_pair_once_no_pod_mounts_its_claim(
    plain_namespaces: Callable[[str], str], env: Env
) -> None:
    sfx = env.suffix
    group_name = await env.group(f"gpu{sfx}", f"gpu{sfx}")
    group = await _must_get(env, state.LOCAL_MODEL_NODE_GROUPS, group_name)
    prod = plain_namespaces(f"prod{sfx}")
    iris = f"iris{sfx}"
    cluster = await env.cache(iris, [group_name])
    pv, claim = names.serving_pv(iris, group_name, prod), names.serving_pvc(iris, group_name)
    await _kserve_pair(
        env, group, pv=pv, pvc=(prod, claim), pv_owner=_owner(cluster), pvc_owner=_owner(cluster)
    )
    await wait_until(
        phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, claim, prod, "Bound"),
        what=f"KServe's PVC {prod}/{claim} is bound",
    )
    await env.isvc("served", prod, cache=iris)
    # a model server's pod (no kubelet here: it stays Pending, which pvc-protection counts)
    await env.api.create(
        kube.PODS,
        {
            "metadata": {"name": "server", "namespace": prod},
            "spec": {
                "containers": [{"name": "c", "image": "server"}],
                "volumes": [{"name": "m", "persistentVolumeClaim": {"claimName": claim}}],
            },
        },
        namespace=prod,
    )
    old = await _must_get(env, kube.PERSISTENT_VOLUME_CLAIMS, claim, prod)
    old_pv = await _must_get(env, kube.PERSISTENT_VOLUMES, pv)
    await env.start()
    await wait_until(
        _adopted(env, kube.PERSISTENT_VOLUME_CLAIMS, claim, prod, old["metadata"]["uid"]),
        what="KServe's serving claim is adopted",
    )
    await wait_until(
        functools.partial(_count, env, cluster, "VolumeAdopted", 2),
        what="the pair is adopted (two VolumeAdopted events)",
    )
    kept = await _must_get(env, kube.PERSISTENT_VOLUMES, pv)
    assert kept["metadata"]["uid"] == old_pv["metadata"]["uid"], "replaced under its pod"
    assert "csi" not in kept["spec"]

    await env.api.delete(kube.PODS, "server", namespace=prod)

    async def replaced() -> Obj | None:
        now_claim = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, claim, prod)
        now_pv = await env.get(kube.PERSISTENT_VOLUMES, pv)
        if now_claim is None or now_pv is None:
            return None
        fresh = now_claim["metadata"]["uid"] != old["metadata"]["uid"]
        bound = (now_claim.get("status") or {}).get("phase") == "Bound"
        return now_pv if fresh and bound and now_pv["spec"].get("csi") else None

    new_pv = await wait_until(
        replaced,
        timeout=90,
        what=f"claim {prod}/{claim} made anew and bound to a CSI PV {pv} once the pod is gone",
    )
    assert new_pv is not None
    assert new_pv["metadata"]["uid"] != old_pv["metadata"]["uid"]
    assert new_pv["spec"]["csi"]["volumeAttributes"], new_pv["spec"]["csi"]
