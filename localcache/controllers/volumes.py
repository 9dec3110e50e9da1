"""Download and serving PV/PVC pairs of a cache: plan them, create what is missing, replace
what is broken, delete what is no longer wanted.

The wanted pairs are `volumeplan.plan()`'s (names, owners, specs, annotations).

`reconcile_volumes` is level-based, reading the PV/PVC stores:
- an object that exists under a wanted name is judged first (`adoption`): one that is not
  provably the cache's is never touched, and its pair is left alone (no create: a claim
  pre-bound by name could bind a stranger's volume, or wait for ever); it is returned as a
  `conditions.NameTaken` for the cache's status and Events, and the cache is looked at again
  after `TAKEN_RECHECK` seconds (the holder's deletion sends no event we can map);
- one that is the cache's but not annotated yet (KServe's, after a migration) is adopted: a
  merge patch, guarded by resourceVersion, adds our annotations and managed-by label and
  nothing else (spec untouched); returned in `volumewriter.Outcome.adopted` (log `volume_adopted`);
- a download PV of the cache bound to another claim than the wanted one (KServe's download
  PVC lived in KServe's job namespace) is replaced: its reclaim policy is set to Retain
  first (a separate write; the update event brings the cache back), then the old claim
  (provably the cache's, else the PV is `taken`) and the PV are deleted, and the pair is
  recreated once both are gone;
- a missing pair is created claim first: the PVC, then its PV with the claim's uid in
  `claimRef` (the record that proves the claim ours, `adoption.records`), then an annotation
  on the claim with the PV's uid (the PV controller binds a claim on the claim's events only;
  without this write it waits for its resync, 15 s by default). A PV that cannot be made takes
  its new claim with it (a claim no PV records serves nothing and is never ours again). An
  existing object's spec is never updated;
- a claim with our marks that no PV of the cache records (`unproven`: left by a crash between
  the two creates, or forged by a tenant) is deleted, and so is a PV of ours whose `claimRef`
  records no uid (made pre-bound by name by an earlier localcache: any claim of that name would
  bind it); the pair is then made anew. Claims this process created and whose PV the store
  has not shown yet are waited for (`CreatedClaims`);
- a pair of the cache whose PV shows a whole models root where a CSI volume is wanted (adopted
  from KServe's add-on, or made before CSI volumes) is deleted once no pod mounts its claim,
  and made anew (`legacy`); while one does, `Outcome.waiting` says to look again later;
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
  refused is not attempted. A guarded patch that meets a newer resourceVersion (409) is no
  refusal: it is returned as the error to raise, so the cache is looked at again with the
  newer object. Transport errors (no answer) are raised at once.
`ownerless_pvs` lists what the finalizer must delete itself (garbage collection handles the
rest).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from localcache.caching import conditions
from localcache.controllers import adoption, legacy, scope, state, volumeplan, volumewriter
from localcache.runtime import errors, kube
from localcache.runtime import keys as runtime_keys

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
BROKEN_PV_PHASES: Final = frozenset({"Released", "Failed"})
BROKEN_PVC_PHASES: Final = frozenset({"Lost"})
TAKEN_RECHECK: Final = 60.0
"""Seconds until a cache whose wanted names are taken is looked at again."""
VOLUME_UID_ANNOTATION: Final = "localmodel.kserve.io/volume-uid"
"""On a claim we created: the uid of the PV made for it."""
MAX_CREATED: Final = 4096


@dataclass(slots=True)
class CreatedClaims:
    """The uids of the claims this process created, until the store shows their PV: the
    stores lag behind our own writes, and a claim whose PV is not seen yet is not `unproven`."""

    uids: OrderedDict[runtime_keys.ObjectKey, str] = field(default_factory=OrderedDict)

    def add(self, key: runtime_keys.ObjectKey, uid: str) -> None:
        self.uids[key] = uid
        self.uids.move_to_end(key)
        while len(self.uids) > MAX_CREATED:
            self.uids.popitem(last=False)

    def holds(self, claim: Obj) -> bool:
        uid = _meta(claim).get("uid")
        return bool(uid) and self.uids.get(runtime_keys.ObjectKey.of(claim)) == uid

    def forget(self, key: runtime_keys.ObjectKey) -> None:
        self.uids.pop(key, None)


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


async def reconcile_volumes(
    api: state.Api,
    *,
    stores: state.Stores,
    owner: str,
    pairs: Sequence[volumeplan.Pair],
    manage_serving: bool,
    created: CreatedClaims | None = None,
    users: legacy.ClaimUsers | None = None,
) -> volumewriter.Outcome:
    """Drive the cache's PVs/PVCs towards `pairs` (module docstring)."""
    writer = volumewriter.Writer(api)
    created = created if created is not None else CreatedClaims()
    users = users if users is not None else legacy.ClaimUsers()
    pv_store, pvc_store = stores.persistent_volumes, stores.persistent_volume_claims
    pvcs, pvs = kube.PERSISTENT_VOLUME_CLAIMS, kube.PERSISTENT_VOLUMES
    held: set[runtime_keys.ObjectKey] = set()  # old claims that the pair step handles
    for pair in pairs:
        kept = await _sync_pair(
            writer, pair, owner=owner, stores=stores, created=created, users=users
        )
        if kept is not None:
            held.add(kept)
    wanted_pvcs = {p.pvc_key for p in pairs} | held
    wanted_pvs = {p.pv_name for p in pairs}
    roles = {"download", "serving"} if manage_serving else {"download"}
    for obj in _annotated(pvc_store.by_index(state.BY_OWNER, owner), owner):
        if _role(obj) in roles and runtime_keys.ObjectKey.of(obj) not in wanted_pvcs:
            await writer.delete(pvcs, obj)
    for obj in _annotated(pv_store.by_index(state.BY_OWNER, owner), owner):
        if _role(obj) in roles and runtime_keys.ObjectKey.of(obj).name not in wanted_pvs:
            await writer.delete(pvs, obj)
    return writer.outcome


@dataclass(frozen=True, slots=True)
class _Found:
    """An object of the pair as the store holds it (None: absent) and the verdict on it."""

    res: kube.Resource
    obj: Obj | None
    wanted: Obj
    verdict: adoption.Judgement

    @property
    def absent(self) -> bool:
        return self.obj is None


_ABSENT: Final = adoption.Judgement("ours")


def _judge(pair: volumeplan.Pair, *, owner: str, stores: state.Stores) -> tuple[_Found, _Found]:
    """The pair's PV and PVC as found, each with its verdict (module docstring)."""
    cache = pair.owner(owner)
    claims = stores.persistent_volume_claims
    pv = stores.persistent_volumes.get(runtime_keys.ObjectKey("", pair.pv_name))
    pvc = claims.get(pair.pvc_key)
    pv_verdict = pvc_verdict = _ABSENT
    if pv is not None:
        pv_verdict = adoption.judge_volume(
            pv,
            owner=cache,
            role=pair.role,
            template=pair.pv,
            wanted_claim=pair.pvc_key,
            claims=claims,
        )
    if pvc is not None:
        pvc_verdict = adoption.judge_claim(pvc, owner=cache, pv_name=pair.pv_name, pv=pv)
    return (
        _Found(kube.PERSISTENT_VOLUMES, pv, pair.pv, pv_verdict),
        _Found(kube.PERSISTENT_VOLUME_CLAIMS, pvc, pair.pvc, pvc_verdict),
    )


def _name_taken(found: _Found) -> conditions.NameTaken:
    meta = _meta(found.obj or {})
    return conditions.NameTaken(
        kind=found.res.kind,
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        reason=found.verdict.reason,
        remedy=found.verdict.remedy,
    )


async def _sync_pair(
    writer: volumewriter.Writer,
    pair: volumeplan.Pair,
    *,
    owner: str,
    stores: state.Stores,
    created: CreatedClaims,
    users: legacy.ClaimUsers,
) -> runtime_keys.ObjectKey | None:
    """One pair's step of `reconcile_volumes` (module docstring, in order); returns the old
    claim of a stale download PV, which only this step may delete (not before the PV is
    Retain)."""
    pv, pvc = _judge(pair, owner=owner, stores=stores)
    taken = [f for f in (pv, pvc) if f.verdict.verdict == "taken"]
    if taken:
        writer.outcome.taken.extend(_name_taken(f) for f in taken)
        return None  # the other object is left alone too
    if _terminating(pv.obj) or _terminating(pvc.obj):
        return None  # recreated once gone: the delete event brings us back
    if pvc.obj is not None and pvc.verdict.verdict == "unproven":
        if not created.holds(pvc.obj):  # else ours, its PV not in the store yet
            _log.warning("volume_claim_unproven", claim=str(pair.pvc_key), pv=pair.pv_name)
            await writer.delete(pvc.res, pvc.obj)
        return None
    if pv.obj is not None and pv.verdict.verdict in ("ours", "adopt") and _unrecorded(pv.obj):
        _log.info("volume_pair_replaced", pv=pair.pv_name, reason="claimRef records no uid")
        await writer.delete(pv.res, pv.obj)
        return None
    if _phase(pv.obj) in BROKEN_PV_PHASES or _phase(pvc.obj) in BROKEN_PVC_PHASES:
        _log.info(
            "volume_pair_replaced",
            pv=pair.pv_name,
            pv_phase=_phase(pv.obj),
            pvc_phase=_phase(pvc.obj),
        )
        for found in (pvc, pv):
            if found.obj is not None:
                await writer.delete(found.res, found.obj)
        return None
    if pv.obj is not None and pv.verdict.verdict == "stale":
        return await _replace_stale(writer, pair, pv.obj, pv.verdict.old_claim)
    if (
        pv.obj is not None
        and pvc.obj is not None
        and pv.verdict.verdict == pvc.verdict.verdict == "ours"
        and legacy.is_legacy(pv.obj, pair.pv)
    ):
        waits = await legacy.replace_when_unused(
            writer, users, pv=pv.obj, pvc=pvc.obj, claim=pair.pvc_key
        )
        writer.outcome.waiting = writer.outcome.waiting or waits
        return None
    for found in (pv, pvc):
        if not await _adopt(writer, found, owner=owner, role=pair.role):
            return None  # changed meanwhile or refused: the pair waits
    if pvc.obj is not None:
        created.forget(pair.pvc_key)  # its PV records it: proof no longer needs memory
    elif pv.obj is None:
        await _create_pair(writer, pair, created)
    # else: a PV that records a claim now gone turns Released, and the pair is then replaced
    return None


def _unrecorded(pv: Obj) -> bool:
    return not ((pv.get("spec") or {}).get("claimRef") or {}).get("uid")


async def _create_pair(
    writer: volumewriter.Writer, pair: volumeplan.Pair, created: CreatedClaims
) -> None:
    """Claim first, then its PV recording the claim's uid, then the nudge (module docstring)."""
    pvcs, pvs = kube.PERSISTENT_VOLUME_CLAIMS, kube.PERSISTENT_VOLUMES
    claim = await writer.create_new(pvcs, pair.pvc)
    if claim is None:
        return  # refused, or there already: judged when the store shows it
    uid = str(_meta(claim).get("uid") or "")
    created.add(pair.pvc_key, uid)
    pv = copy.deepcopy(pair.pv)
    pv["spec"]["claimRef"]["uid"] = uid
    volume = await writer.create_new(pvs, pv)
    if volume is None:
        created.forget(pair.pvc_key)
        await writer.delete(pvcs, claim)
        return
    nudge = {"metadata": {"annotations": {VOLUME_UID_ANNOTATION: _meta(volume).get("uid")}}}
    await writer.patch(pvcs, claim, nudge)


async def _adopt(writer: volumewriter.Writer, found: _Found, *, owner: str, role: str) -> bool:
    """Adopt `found` if its verdict says so; False when that did not happen."""
    if found.obj is None or found.verdict.verdict != "adopt":
        return True
    if not await writer.patch(
        found.res, found.obj, adoption.adoption_patch(found.obj, found.wanted)
    ):
        return False
    meta = _meta(found.obj)
    adopted = volumewriter.Adopted(
        found.res.kind, str(meta["name"]), str(meta.get("namespace") or "")
    )
    _log.info(
        "volume_adopted",
        kind=adopted.kind,
        name=adopted.name,
        namespace=adopted.namespace or None,
        cache=owner,
        role=role,
    )
    writer.outcome.adopted.append(adopted)
    return True


async def _replace_stale(
    writer: volumewriter.Writer, pair: volumeplan.Pair, pv: Obj, old_claim: Obj | None
) -> runtime_keys.ObjectKey | None:
    """A download PV of the cache bound to another claim: Retain first, then delete the old
    claim and the PV (the pair is recreated once both are gone). Returns the old claim's key."""
    retain = adoption.retain_patch(pv)
    if retain is not None:
        if await writer.patch(kube.PERSISTENT_VOLUMES, pv, retain):
            _log.info("volume_retained_before_release", pv=pair.pv_name)
        # the update event brings us back, with the policy in the store
        return runtime_keys.ObjectKey.of(old_claim) if old_claim is not None else None
    bound = (pv.get("spec") or {}).get("claimRef") or {}
    _log.info(
        "volume_pair_replaced",
        pv=pair.pv_name,
        reason="bound to another claim",
        claim=f"{bound.get('namespace')}/{bound.get('name')}",
        wanted=str(pair.pvc_key),
    )
    if old_claim is not None:
        await writer.delete(kube.PERSISTENT_VOLUME_CLAIMS, old_claim)
    await writer.delete(kube.PERSISTENT_VOLUMES, pv)
    return runtime_keys.ObjectKey.of(old_claim) if old_claim is not None else None


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
