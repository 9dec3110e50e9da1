"""Whose is a PV or PVC that already exists under a name a cache wants: the pure decision that
lets the controller take over the volumes KServe's localmodel add-on created (a migration)
without ever touching an object that is not provably the cache's.

A name alone proves nothing (KServe's names are plain `-` joins, and tenants may create PVCs
under any name in their namespaces), so the proof is an identity the apiserver vouches for:

- a PVC is the cache's when the cache's PV records its uid: the PV's `claimRef` names it by
  namespace, name and uid (PVs are cluster-scoped: tenants cannot write them). Its marks only
  say which cache it claims to be: our `OWNER_ANNOTATION` with the cache's id (ours), or an
  ownerReference to the cache's kind (`serving.kserve.io`) whose uid is the cache's uid (KServe's,
  ref §2.2), and its `spec.volumeName` names the wanted PV. A tenant can write both marks on a
  claim of its namespace (an `ephemeral` volume's claim, or one made before the cache's), so
  marks without the record are never proof: such a claim with our annotation is `unproven`
  (the leftover of a create whose PV never followed, or a forgery: neither serves anything);
  localcache creates a claim first and then its PV with the claim's uid in `claimRef`;
- a PV is the cache's when it carries our annotation (ours), or such an ownerReference
  (KServe's cluster-cache PVs), or, with no ownerReference at all (KServe's namespace-cache
  PVs: a cluster-scoped object cannot be owned by a namespaced one), when its `claimRef`
  names the wanted PVC by namespace, name AND uid, that PVC is the cache's by the rule above,
  and the PV's path (`local`/`hostPath`) and `nodeAffinity` are what the node group's template
  gives. The template check is the cheap extra evidence for the weakest proof; for owned PVs
  the uid is proof enough (our own PVs are not updated when a node group changes either).

Verdicts (`Judgement.verdict`):
    ours    annotated with this cache's id: ours already;
    adopt   provably the cache's, not annotated yet: annotate it (`adoption_patch`);
    stale   a download PV that is the cache's but bound to another claim (after a migration,
            KServe's download PVC in its own job namespace): replace the pair. `old_claim`
            is that claim when it still exists (and is then provably the cache's);
    unproven  a claim with our annotation that no PV of the cache records (and no foreign
            ownerReference): deleted, then the pair is made anew;
    taken   anything else: never touched; `reason` and `remedy` say why and what to do.

A serving PV of the cache bound to another claim is `taken` when unannotated (it may serve a
pod; nothing proves the claim is disposable) and `ours` when annotated (as before adoption).
Not checked: the rest of the spec (capacity, access modes, storage class): the PVC binding
already shows the two fit, and the spec is never changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from localcache.api import groupversion
from localcache.controllers import state
from localcache.csi import entitlement
from localcache.runtime import keys as runtime_keys
from localcache.runtime import store

Obj = dict[str, Any]
Verdict = Literal["ours", "adopt", "stale", "unproven", "taken"]

LEFTOVER_REMEDY: Final = (
    "localcache leaves it alone; if it is a leftover (of KServe's localmodel add-on or of an "
    "earlier cache of that name), delete it and localcache creates its own"
)


@dataclass(frozen=True, slots=True)
class Owner:
    """The cache a decision is for: its id (`state.owner_id`), kind and uid."""

    id: str
    kind: str
    uid: str

    @classmethod
    def of_reference(cls, owner_id: str, ref: Obj) -> Owner:
        """From the ownerReference the cache puts on its objects (`Scope.owner_reference`)."""
        return cls(id=owner_id, kind=str(ref.get("kind") or ""), uid=str(ref.get("uid") or ""))


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    reason: str = ""
    remedy: str = LEFTOVER_REMEDY
    old_claim: Obj | None = None


OURS: Final = Judgement("ours")
ADOPT: Final = Judgement("adopt")
UNPROVEN: Final = Judgement("unproven")


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: Obj) -> dict[str, Any]:
    return obj.get("spec") or {}


def _annotation(obj: Obj) -> str:
    return str((_meta(obj).get("annotations") or {}).get(state.OWNER_ANNOTATION) or "")


def _refers_to(ref: Any, owner: Owner) -> bool:
    if not isinstance(ref, dict) or not owner.uid:
        return False
    group = str(ref.get("apiVersion") or "").partition("/")[0]
    return (
        ref.get("uid") == owner.uid
        and ref.get("kind") == owner.kind
        and group == groupversion.GROUP
    )


def _owned_by(obj: Obj, owner: Owner) -> bool:
    return any(_refers_to(ref, owner) for ref in _meta(obj).get("ownerReferences") or [])


def _owners(obj: Obj) -> str:
    refs = [r for r in _meta(obj).get("ownerReferences") or [] if isinstance(r, dict)]
    return ", ".join(f"{r.get('kind')} {r.get('name')} (uid {r.get('uid')})" for r in refs)


def _where(key: runtime_keys.ObjectKey) -> str:
    return f"{key.namespace}/{key.name}" if key.namespace else key.name


def _taken(reason: str, remedy: str = LEFTOVER_REMEDY) -> Judgement:
    return Judgement("taken", reason=reason, remedy=remedy)


def provably_of(obj: Obj, owner: Owner) -> bool:
    """Whether `obj` carries the cache's own proof: our annotation or its ownerReference."""
    return _annotation(obj) == owner.id or _owned_by(obj, owner)


def records(pv: Obj | None, pvc: Obj) -> bool:
    """Whether `pv`'s claimRef names `pvc` by namespace, name and uid."""
    ref = _spec(pv or {}).get("claimRef") or {}
    meta = _meta(pvc)
    return (
        bool(ref.get("uid"))
        and ref.get("uid") == meta.get("uid")
        and ref.get("name") == meta.get("name")
        and (ref.get("namespace") or "") == (meta.get("namespace") or "")
    )


def judge_claim(pvc: Obj, *, owner: Owner, pv_name: str, pv: Obj | None) -> Judgement:
    """The verdict on the PVC found under the wanted name; `pv` is the wanted PV as found
    (None: absent), judged on its own by `judge_volume` (module docstring)."""
    annotated = _annotation(pvc)
    if annotated and annotated != owner.id:
        return _taken(f"it belongs to {annotated}")
    foreign = [r for r in _meta(pvc).get("ownerReferences") or [] if not _refers_to(r, owner)]
    if foreign:
        return _taken(f"it is owned by {_owners(pvc)}")
    if not annotated and not _owned_by(pvc, owner):
        return _taken("it has no ownerReference to this cache")
    volume = str(_spec(pvc).get("volumeName") or "")
    if volume != pv_name:
        return _taken(f"it names PersistentVolume {volume or '(none)'}, not {pv_name}")
    if records(pv, pvc):
        return OURS if annotated else ADOPT
    if annotated:
        return UNPROVEN
    return _taken(
        f"no PersistentVolume of this cache records its uid ({pv_name} "
        + ("does not exist)" if pv is None else "names another claim or none)")
    )


def _place(spec: Obj) -> tuple[Any, Any]:
    source = spec.get("local") or spec.get("hostPath") or {}
    path = source.get("path")
    if path is None:  # our CSI template: the models root is an attribute
        path = ((spec.get("csi") or {}).get("volumeAttributes") or {}).get(entitlement.ROOT)
    return path, spec.get("nodeAffinity")


def _claim_key(pv: Obj) -> runtime_keys.ObjectKey | None:
    ref = _spec(pv).get("claimRef") or {}
    if not ref.get("name"):
        return None
    return runtime_keys.ObjectKey(str(ref.get("namespace") or ""), str(ref["name"]))


def _bound_claim(pv: Obj, claims: store.Reader) -> Obj | None:
    """The PVC the PV's claimRef names, if it exists and is the one it records (uid)."""
    key = _claim_key(pv)
    claim = claims.get(key) if key is not None else None
    if claim is None:
        return None
    return claim if records(pv, claim) else None


def judge_volume(
    pv: Obj,
    *,
    owner: Owner,
    role: str,
    template: Obj,
    wanted_claim: runtime_keys.ObjectKey,
    claims: store.Reader,
) -> Judgement:
    """The verdict on the PV found under the wanted name; `template` is the wanted PV (from
    the node group), `wanted_claim` the PVC it is meant for, `claims` the PVC store."""
    annotated = _annotation(pv)
    if annotated and annotated != owner.id:
        return _taken(f"it belongs to {annotated}")
    owned = _owned_by(pv, owner)
    if not annotated and not owned and _meta(pv).get("ownerReferences"):
        return _taken(f"it is owned by {_owners(pv)}")
    if not annotated and not owned:
        return _judge_ownerless(
            pv, owner=owner, template=template, wanted_claim=wanted_claim, claims=claims
        )
    bound_to = _claim_key(pv)
    name = str(_meta(pv).get("name") or "")
    if bound_to is None or bound_to == wanted_claim:
        return OURS if annotated else ADOPT
    if role != "download":
        if annotated:
            return OURS
        return _taken(
            f"it is this cache's but bound to claim {_where(bound_to)}, not {_where(wanted_claim)}",
            "localcache leaves it alone (a pod may use that claim); delete that claim and "
            "this PersistentVolume once nothing uses them, and localcache creates its own",
        )
    claim = _bound_claim(pv, claims)
    if claim is None or provably_of(claim, owner):
        return Judgement("stale", old_claim=claim)
    return _taken(
        f"it is this cache's but bound to claim {_where(bound_to)}, which is not provably "
        f"this cache's ({_owners(claim) or 'no ownerReference'})",
        f"localcache leaves both alone; if that claim is a leftover, set PersistentVolume "
        f"{name}'s persistentVolumeReclaimPolicy to Retain, delete the claim and the "
        "PersistentVolume, and localcache creates its own",
    )


def _judge_ownerless(
    pv: Obj,
    *,
    owner: Owner,
    template: Obj,
    wanted_claim: runtime_keys.ObjectKey,
    claims: store.Reader,
) -> Judgement:
    """An unannotated PV without ownerReferences: its claim must vouch for it."""
    bound_to = _claim_key(pv)
    name = str(_meta(pv).get("name") or "")
    if bound_to is None:
        return _taken("it has no ownerReference and is bound to no claim")
    if bound_to != wanted_claim:
        return _taken(
            f"it has no ownerReference and is bound to claim {_where(bound_to)}, not "
            f"{_where(wanted_claim)}",
            f"localcache leaves it alone; if it is KServe's volume for this cache, set its "
            "persistentVolumeReclaimPolicy to Retain (the models on the nodes then stay), "
            f"delete claim {_where(bound_to)} and PersistentVolume {name}, and localcache "
            "creates its own",
        )
    claim = claims.get(wanted_claim)
    if claim is None or not records(pv, claim):
        return _taken(
            f"it has no ownerReference and its claimRef is not the claim {_where(wanted_claim)} "
            "that exists now"
        )
    if judge_claim(claim, owner=owner, pv_name=name, pv=pv).verdict not in ("ours", "adopt"):
        return _taken(
            f"it has no ownerReference and its claim {_where(wanted_claim)} is not this cache's"
        )
    if _place(_spec(pv)) != _place(_spec(template)):
        return _taken(
            "it has no ownerReference and its path or nodeAffinity differ from the node "
            "group's PersistentVolume template"
        )
    return ADOPT


def adoption_patch(obj: Obj, wanted: Obj) -> Obj:
    """The merge patch that adopts `obj`: the wanted object's annotations (owner, role,
    storage key) and labels (`app.kubernetes.io/managed-by`, which the admission policies of
    `manifests/policies` select our PVs by), guarded by `obj`'s resourceVersion so that a
    concurrent change is not overwritten (409 instead). Nothing else changes."""
    wanted_meta = _meta(wanted)
    return {
        "metadata": {
            "resourceVersion": _meta(obj).get("resourceVersion"),
            "annotations": dict(wanted_meta.get("annotations") or {}),
            "labels": dict(wanted_meta.get("labels") or {}),
        }
    }


RETAIN: Final = "Retain"


def retain_patch(pv: Obj) -> Obj | None:
    """The merge patch that sets a PV's reclaim policy to Retain before its claim is deleted,
    or None when it already is: releasing a `Recycle` hostPath PV scrubs its directory (the
    whole models root), and a `Delete` hostPath PV under `/tmp/` is removed by
    kube-controller-manager; `Retain` leaves the data where it is."""
    if _spec(pv).get("persistentVolumeReclaimPolicy") == RETAIN:
        return None
    return {
        "metadata": {"resourceVersion": _meta(pv).get("resourceVersion")},
        "spec": {"persistentVolumeReclaimPolicy": RETAIN},
    }


_CLAIM_METADATA: Final = (
    "name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
)  # fmt: skip
MAX_OWNERS, MAX_KEPT, MAX_VALUE = 8, 16, 1024


def observed_claim(obj: Obj) -> Obj:
    """What the controller keeps of a PersistentVolumeClaim (its informer's transform): the
    identity, a few ownerReferences, our own annotations and labels (clipped), the volume it
    names and its phase, and what a shared-volume cache's preflight reads (volume mode,
    access modes, requested and bound storage). Anyone may create claims in their namespace,
    with megabytes of annotations each (security review finding 6: 400 such claims took the
    controller to 409 MB on restart); the rest is never read."""
    meta = _meta(obj)
    kept: Obj = {k: meta[k] for k in _CLAIM_METADATA if k in meta}
    owners = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]
    kept["ownerReferences"] = [
        {k: str(r[k])[:MAX_VALUE] for k in ("apiVersion", "kind", "name", "uid") if k in r}
        for r in owners[:MAX_OWNERS]
    ]
    for field in ("annotations", "labels"):
        found = meta.get(field)
        values: Obj = found if isinstance(found, dict) else {}
        ours = [(k, v) for k, v in values.items() if _ours(str(k))][:MAX_KEPT]
        kept[field] = {str(k): str(v)[:MAX_VALUE] for k, v in ours}
    spec = _spec(obj)
    found_status = obj.get("status")
    status: Obj = found_status if isinstance(found_status, dict) else {}
    kept_spec: Obj = {"volumeName": str(spec.get("volumeName") or "")[:MAX_VALUE]}
    # what a shared-volume cache's preflight reads (`caching.sharedvolume.preflight`)
    if isinstance(mode := spec.get("volumeMode"), str):
        kept_spec["volumeMode"] = mode[:64]
    if isinstance(modes := spec.get("accessModes"), list) and modes:
        kept_spec["accessModes"] = [str(m)[:64] for m in modes[:8]]
    if (requested := _storage_of((spec.get("resources") or {}).get("requests"))) is not None:
        kept_spec["resources"] = {"requests": {"storage": requested}}
    kept_status: Obj = {"phase": str(status.get("phase") or "")[:64]}
    if (capacity := _storage_of(status.get("capacity"))) is not None:
        kept_status["capacity"] = {"storage": capacity}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": kept,
        "spec": kept_spec,
        "status": kept_status,
    }


def _storage_of(values: object) -> str | None:
    found = values.get("storage") if isinstance(values, dict) else None
    return str(found)[:64] if found is not None else None


def _ours(key: str) -> bool:
    return key.startswith(("localmodel.kserve.io/", "app.kubernetes.io/"))
