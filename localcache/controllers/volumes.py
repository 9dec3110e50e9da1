"""Download and serving PV/PVC pairs of a cache: plan them, create what is missing, replace
what is broken, delete what is no longer wanted.

Per node group of the cache (that exists) there is one download pair; per (InferenceService
namespace, node group) one serving pair. Names and owners come from the `Scope`. Specs are
copied from the LocalModelNodeGroup; the PVC's `volumeName` names its PV and the PV is
pre-bound to the PVC (`claimRef` by namespace and name), so no other claim can take it.
Every object we create carries `OWNER_ANNOTATION` (the cache id) and `ROLE_ANNOTATION`.

`reconcile_volumes` is level-based, reading the PV/PVC stores:
- a missing PV, then a missing PVC, is created (an object that already exists under the
  name, ours or KServe's, is never updated);
- a pair whose PV is `Released`/`Failed` or whose PVC is `Lost` is deleted as a whole and
  recreated once both are gone (their delete events bring the cache back), so a claim is
  never pointed at a PV bound to an earlier claim [P3]; while either is terminating the
  pair waits;
- annotated objects of the cache that are not wanted any more (a namespace without
  InferenceServices, a group removed from the spec) are deleted, PVC and PV alike, for both
  cache kinds [P3]. Serving objects are left alone when `manage_serving` is false
  (`disableVolumeManagement`).
- a write the apiserver refuses (422 Invalid, 403 Forbidden by RBAC or quota, ...) does not
  stop the others: it is returned as a `conditions.Refusal` (for the cache's status and
  Events) with the first such error to raise (retry with backoff); a PVC whose PV was
  refused is not attempted. Transport errors (no answer) are raised at once.
`ownerless_pvs` lists what the finalizer must delete itself (garbage collection handles the
rest).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import structlog

from localcache.api import nodegroup
from localcache.caching import conditions
from localcache.caching import keys as cache_keys
from localcache.controllers import scope, state
from localcache.runtime import errors, kube
from localcache.runtime import keys as runtime_keys

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
Role = Literal["download", "serving"]
BROKEN_PV_PHASES: Final = frozenset({"Released", "Failed"})
BROKEN_PVC_PHASES: Final = frozenset({"Lost"})
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
) -> Pair:
    pv_spec = copy.deepcopy(group.spec.persistent_volume_spec)
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


def plan(
    sc: scope.Scope,
    cache: scope.CacheModel,
    *,
    groups: Mapping[str, nodegroup.LocalModelNodeGroup],
    serving: Iterable[tuple[str, str]],
    job_namespace: str,
) -> list[Pair]:
    """The wanted pairs: download per existing group, serving per (namespace, group)."""
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
            )
        )
    return pairs


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _terminating(obj: Obj | None) -> bool:
    return obj is not None and bool(_meta(obj).get("deletionTimestamp"))


def _phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "")


def _role(obj: Obj) -> str:
    return str((_meta(obj).get("annotations") or {}).get(state.ROLE_ANNOTATION) or "")


def _annotated(objs: Iterable[Obj], owner: str) -> list[Obj]:
    return [
        o for o in objs if (_meta(o).get("annotations") or {}).get(state.OWNER_ANNOTATION) == owner
    ]


@dataclass(slots=True)
class Outcome:
    """What `reconcile_volumes` did: the writes sent, the writes the apiserver refused, and
    the first refusal's error (to raise once the status reports them)."""

    writes: int = 0
    refused: list[conditions.Refusal] = field(default_factory=list)
    error: errors.ApiError | None = None


class _Writer:
    """Create/delete with idempotent error handling; counts writes and collects refusals."""

    def __init__(self, api: state.Api) -> None:
        self.api = api
        self.outcome = Outcome()

    def _refused(
        self, verb: Literal["create", "delete"], res: kube.Resource, obj: Obj, exc: errors.ApiError
    ) -> None:
        meta = _meta(obj)
        _log.warning(
            "volume_write_refused",
            verb=verb,
            kind=res.kind,
            name=meta.get("name"),
            namespace=meta.get("namespace"),
            code=exc.status,
            reason=exc.reason,
            error=exc.message,
        )
        self.outcome.refused.append(
            conditions.Refusal(
                verb=verb,
                kind=res.kind,
                name=str(meta.get("name") or ""),
                namespace=str(meta.get("namespace") or ""),
                code=exc.status,
                reason=exc.reason,
                message=exc.message,
            )
        )
        if self.outcome.error is None:
            self.outcome.error = exc

    async def create(self, res: kube.Resource, obj: Obj) -> bool:
        """Create `obj` (an existing one is fine); False when the apiserver refused it."""
        meta = _meta(obj)
        try:
            await self.api.create(res, obj, namespace=meta.get("namespace") or None)
            _log.info(
                "volume_created", kind=res.kind, name=meta["name"], namespace=meta.get("namespace")
            )
        except errors.Conflict as exc:
            if not exc.already_exists:
                self._refused("create", res, obj, exc)
                return False
        except errors.ApiError as exc:
            self._refused("create", res, obj, exc)
            return False
        self.outcome.writes += 1
        return True

    async def delete(self, res: kube.Resource, obj: Obj) -> None:
        meta = _meta(obj)
        if meta.get("deletionTimestamp"):
            return
        try:
            await self.api.delete(res, str(meta["name"]), namespace=meta.get("namespace") or None)
            _log.info(
                "volume_deleted", kind=res.kind, name=meta["name"], namespace=meta.get("namespace")
            )
        except errors.NotFound:
            pass
        except errors.ApiError as exc:
            self._refused("delete", res, obj, exc)
            return
        self.outcome.writes += 1


async def reconcile_volumes(
    api: state.Api,
    *,
    stores: state.Stores,
    owner: str,
    pairs: Sequence[Pair],
    manage_serving: bool,
) -> Outcome:
    """Drive the cache's PVs/PVCs towards `pairs` (module docstring)."""
    writer = _Writer(api)
    pv_store, pvc_store = stores.persistent_volumes, stores.persistent_volume_claims
    pvcs, pvs = kube.PERSISTENT_VOLUME_CLAIMS, kube.PERSISTENT_VOLUMES
    for pair in pairs:
        pv = pv_store.get(runtime_keys.ObjectKey("", pair.pv_name))
        pvc = pvc_store.get(pair.pvc_key)
        if _terminating(pv) or _terminating(pvc):
            continue  # recreated once gone: the delete event brings us back
        if _phase(pv) in BROKEN_PV_PHASES or _phase(pvc) in BROKEN_PVC_PHASES:
            _log.info(
                "volume_pair_replaced", pv=pair.pv_name, pv_phase=_phase(pv), pvc_phase=_phase(pvc)
            )
            if pvc is not None:
                await writer.delete(pvcs, pvc)
            if pv is not None:
                await writer.delete(pvs, pv)
            continue
        if pv is None and not await writer.create(pvs, pair.pv):
            continue  # a claim pre-bound to a PV that could not be made would wait for ever
        if pvc is None:
            await writer.create(pvcs, pair.pvc)
    wanted_pvcs = {p.pvc_key for p in pairs}
    wanted_pvs = {p.pv_name for p in pairs}
    roles = {"download", "serving"} if manage_serving else {"download"}
    for obj in _annotated(pvc_store.by_index(state.BY_OWNER, owner), owner):
        if _role(obj) in roles and runtime_keys.ObjectKey.of(obj) not in wanted_pvcs:
            await writer.delete(pvcs, obj)
    for obj in _annotated(pv_store.by_index(state.BY_OWNER, owner), owner):
        if _role(obj) in roles and runtime_keys.ObjectKey.of(obj).name not in wanted_pvs:
            await writer.delete(pvs, obj)
    return writer.outcome


def ownerless_pvs(sc: scope.Scope, cache: scope.CacheModel, *, stores: state.Stores) -> list[str]:
    """Names of the PVs the finalizer deletes: our annotated PVs without an ownerReference
    to the cache, and for a namespace cache the PVs its spec implies (objects KServe created)
    when they are claimed by that cache's own PVCs: a name alone proves nothing."""
    owner = sc.owner_id(cache)
    names = {
        _meta(pv)["name"]
        for pv in _annotated(stores.persistent_volumes.by_index(state.BY_OWNER, owner), owner)
        if not _meta(pv).get("ownerReferences")
    }
    if not sc.pvs_owned:
        for group in cache.spec.node_groups:
            _, download_claim = sc.download_pvc(cache, group, job_namespace=cache.namespace)
            download = (sc.download_pv_name(cache, group), download_claim)
            serving = (
                sc.serving_pv_name(cache, group, cache.namespace),
                sc.serving_pvc_name(cache, group),
            )
            for pv_name, claim in (download, serving):
                pv = stores.persistent_volumes.get(runtime_keys.ObjectKey("", pv_name))
                if pv is not None and _claimed_by(pv, cache.namespace, claim):
                    names.add(pv_name)
    return sorted(names)


def _claimed_by(pv: Obj, namespace: str, claim: str) -> bool:
    """Whether `pv` is bound (or pre-bound) to PVC `namespace/claim`: a name the spec implies
    may belong to another cache (cluster cache `llama-cpu` owns `llama-cpu-gpu-download`,
    which is also namespace cache `llama`'s name in `gpu` on group `cpu`)."""
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    return ref.get("namespace") == namespace and ref.get("name") == claim


async def delete_pvs(api: state.Api, names: Iterable[str]) -> None:
    """Delete PVs by name; those already gone are fine."""
    for name in names:
        try:
            await api.delete(kube.PERSISTENT_VOLUMES, name)
            _log.info("volume_deleted", kind="PersistentVolume", name=name)
        except errors.NotFound:
            continue
