"""The PV/PVC pairs a cache wants: pure planning, no I/O (`volumes` makes them so).

Per node group of the cache (that exists) there is one download pair; per (InferenceService
namespace, node group) one serving pair. Names and owners come from the `Scope`. Specs are
copied from the LocalModelNodeGroup; the PVC's `volumeName` names its PV and the PV is
pre-bound to the PVC (`claimRef` by namespace and name), so no other claim can take it.
With `volumeSource: csi` (the default) the PV's `local`/`hostPath` source becomes a `csi` source
of localcache's driver, whose `volumeAttributes` name role, cache, storage key and the group's
models root (`csi.entitlement`): the node plugin then shows a pod only what it may read.
Every object carries `state.OWNER_ANNOTATION` (the cache id), `state.ROLE_ANNOTATION` and
`STORAGE_KEY_ANNOTATION`, and the managed-by label; PVCs (and PVs when the scope owns them)
carry the cache's ownerReference.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from localcache import csi
from localcache.api import nodegroup
from localcache.caching import keys as cache_keys
from localcache.controllers import adoption, scope, state
from localcache.csi import entitlement
from localcache.runtime import keys as runtime_keys

Obj = dict[str, Any]
Role = Literal["download", "serving"]
VolumeSource = Literal["csi", "hostPath"]
STORAGE_KEY_ANNOTATION: Final = "localmodel.kserve.io/storage-key"
"""The cache's storage key, on every PV and PVC we create: the admission policies in
`manifests/policies` allow a pod to mount our PVC only with this key's subPath (tenants cannot
edit PVs, so the PV's copy is the one trusted)."""


@dataclass(frozen=True, slots=True)
class Pair:
    """One wanted PV and its PVC."""

    role: Role
    pv: Obj
    pvc: Obj

    @property
    def pv_name(self) -> str:
        return str(self.pv["metadata"]["name"])

    @property
    def pvc_key(self) -> runtime_keys.ObjectKey:
        return runtime_keys.ObjectKey.of(self.pvc)

    def owner(self, owner_id: str) -> adoption.Owner:
        """The cache the pair is for (its PVC always carries the cache's ownerReference)."""
        return adoption.Owner.of_reference(owner_id, self.pvc["metadata"]["ownerReferences"][0])


def _metadata(sc: scope.Scope, cache: scope.CacheModel, role: Role, *, owned: bool) -> Obj:
    meta: Obj = {
        "labels": {state.MANAGED_BY_LABEL: state.MANAGED_BY},
        "annotations": {
            state.OWNER_ANNOTATION: sc.owner_id(cache),
            state.ROLE_ANNOTATION: role,
            STORAGE_KEY_ANNOTATION: cache_keys.storage_key(cache.spec.source_model_uri),
        },
    }
    if owned:
        meta["ownerReferences"] = [sc.owner_reference(cache)]
    return meta


def _pair(
    sc: scope.Scope,
    cache: scope.CacheModel,
    group: nodegroup.LocalModelNodeGroup,
    *,
    role: Role,
    pv_name: str,
    pvc_namespace: str,
    pvc_name: str,
    volume_source: VolumeSource,
) -> Pair:
    pv_spec = copy.deepcopy(group.spec.persistent_volume_spec)
    if volume_source == "csi":
        pv_spec = csi_source(
            pv_spec,
            role=role,
            pv_name=pv_name,
            status_key=sc.status_key(cache),
            storage_key=cache_keys.storage_key(cache.spec.source_model_uri),
            root=group.spec.local_path() or "",
        )
    pv_spec["claimRef"] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": pvc_namespace,
        "name": pvc_name,
    }
    pvc_spec = copy.deepcopy(group.spec.persistent_volume_claim_spec)
    pvc_spec["volumeName"] = pv_name
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, **_metadata(sc, cache, role, owned=sc.pvs_owned)},
        "spec": pv_spec,
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name,
            "namespace": pvc_namespace,
            **_metadata(sc, cache, role, owned=True),
        },
        "spec": pvc_spec,
    }
    return Pair(role, pv, pvc)


def csi_source(
    pv_spec: Obj, *, role: Role, pv_name: str, status_key: str, storage_key: str, root: str
) -> Obj:
    """`pv_spec` with its `local`/`hostPath` source replaced by localcache's CSI driver."""
    spec = {k: v for k, v in pv_spec.items() if k not in ("local", "hostPath")}
    spec["csi"] = {
        "driver": csi.DRIVER_NAME,
        "volumeHandle": pv_name,
        "readOnly": role == "serving",
        "volumeAttributes": {
            entitlement.ROLE: role,
            entitlement.CACHE: status_key,
            entitlement.STORAGE_KEY: storage_key,
            entitlement.ROOT: root,
        },
    }
    return spec


def plan(
    sc: scope.Scope,
    cache: scope.CacheModel,
    *,
    groups: Mapping[str, nodegroup.LocalModelNodeGroup],
    serving: Iterable[tuple[str, str]],
    job_namespace: str,
    volume_source: VolumeSource = "csi",
    legacy_serving: Iterable[tuple[str, str]] = (),
) -> list[Pair]:
    """The wanted pairs: download per existing group, serving per (namespace, group), and
    per (namespace, group) of `legacy_serving` the serving pair under its old names (kept
    while a user still names its claim, `caching.names` "Migration")."""
    pairs = []
    for name in dict.fromkeys(cache.spec.node_groups):
        group = groups.get(name)
        if group is None:
            continue
        pvc_ns, pvc_name = sc.download_pvc(cache, name, job_namespace=job_namespace)
        pv_name = sc.download_pv_name(cache, name)
        pairs.append(
            _pair(
                sc,
                cache,
                group,
                role="download",
                pv_name=pv_name,
                pvc_namespace=pvc_ns,
                pvc_name=pvc_name,
                volume_source=volume_source,
            )
        )
    for namespace, name in sorted(set(serving)):
        group = groups.get(name)
        if group is None:
            continue
        pairs.append(
            _pair(
                sc,
                cache,
                group,
                role="serving",
                pv_name=sc.serving_pv_name(cache, name, namespace),
                pvc_namespace=namespace,
                pvc_name=sc.serving_pvc_name(cache, name),
                volume_source=volume_source,
            )
        )
    for namespace, name in sorted(set(legacy_serving)):
        group = groups.get(name)
        pv_name, pvc_name = sc.legacy_serving_names(cache, name, namespace)
        if group is None or pvc_name == sc.serving_pvc_name(cache, name):
            continue
        pairs.append(
            _pair(
                sc,
                cache,
                group,
                role="serving",
                pv_name=pv_name,
                pvc_namespace=namespace,
                pvc_name=pvc_name,
                volume_source=volume_source,
            )
        )
    return pairs
