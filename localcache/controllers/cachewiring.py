"""The event sources of a cache controller (`setup`'s table says what passes and what is
enqueued), and those of shared-volume namespace caches (`sharedvolume`):

    event source          passes when                              enqueues
    PersistentVolumeClaim added, deleted, uid/phase/spec/capacity  the shared caches of its
                          changed                                  namespace naming it (pvcRef)
    Job (import)          added, deleted, status or deletion       `importjobs.job_keys` that
                          changed                                  name a namespace cache
    LocalModelNamespace-  added, deleted                           the other shared caches of
    Cache (shared)                                                 its namespace and pvcRef
    (LLM)Inference-       as for the node-group caches             the shared caches of its
    Service                                                        namespace (users by URI)

The Job informer watches every namespace, label-selected (`importjobs.JOB_SELECTOR`) and
slimmed (`importjobs.observed_job`). The claim informer is the controllers' shared one
(`adoption.observed_claim` keeps uid, volumeMode, accessModes, requests, phase, capacity).
"""

from __future__ import annotations

from typing import Any, Final

from localcache.caching import placement
from localcache.controllers import importjobs, scope, state, users, volumes
from localcache.runtime import (
    factory,
    handlers,
    informer,
    keys,
    kube,
    predicates,
    workqueue,
)
from localcache.runtime.crds import optional

Obj = dict[str, Any]
BY_PVC_REF: Final = "pvc-ref"
"""Namespace caches by `<namespace>/<pvcRef>` (shared-volume caches only)."""


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def spec_changed(old: Obj, new: Obj) -> bool:
    a, b = _meta(old), _meta(new)
    return old.get("spec") != new.get("spec") or any(
        a.get(f) != b.get(f) for f in ("generation", "deletionTimestamp", "finalizers")
    )


def _node_changed(old: Obj, new: Obj) -> bool:
    return _meta(old).get("labels") != _meta(new).get("labels") or (
        placement.node_is_ready(old) != placement.node_is_ready(new)
    )


def _volume_changed(old: Obj, new: Obj) -> bool:
    """A PV/PVC turned broken (Released, Failed, Lost), started terminating, or (a PV) had
    its reclaim policy changed."""
    phase = (new.get("status") or {}).get("phase")
    broke = phase != (old.get("status") or {}).get("phase") and phase in _BROKEN_PHASES
    deleting = bool(_meta(new).get("deletionTimestamp"))
    policy = (new.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    retained = policy != (old.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    return broke or retained or deleting != bool(_meta(old).get("deletionTimestamp"))


_BROKEN_PHASES = volumes.BROKEN_PV_PHASES | volumes.BROKEN_PVC_PHASES


def _lmn_changed(old: Obj, new: Obj) -> bool:
    return old.get("status") != new.get("status")


# ------------------------------------------------------------------------ mappings


def _map_node(sc: scope.Scope, reader: state.StateReader) -> handlers.MapFunc:
    def keys_of(node: Obj) -> list[keys.ObjectKey]:
        caches = sc.store(reader.stores)
        found: list[keys.ObjectKey] = []
        for group in placement.groups_of(node, reader.groups()):
            found.extend(keys.ObjectKey.of(c) for c in caches.by_index(state.BY_NODE_GROUP, group))
        return found

    return keys_of


def _map_lmn(sc: scope.Scope) -> handlers.MapFunc:
    def keys_of(lmn: Obj) -> list[keys.ObjectKey]:
        status_keys = set(((lmn.get("status") or {}).get("modelStatus") or {}).keys())
        status_keys.update(state.index_entries(lmn))
        return [k for sk in status_keys if (k := sc.key_of_status_key(sk)) is not None]

    return keys_of


def _map_isvc(sc: scope.Scope) -> handlers.MapFunc:
    def keys_of(isvc: Obj) -> list[keys.ObjectKey]:
        key = sc.cache_key_of_isvc(isvc)
        return [key] if key is not None else []

    return keys_of


def _map_volume(sc: scope.Scope) -> handlers.MapFunc:
    def keys_of(obj: Obj) -> list[keys.ObjectKey]:
        return [k for o in state.index_owner(obj) if (k := sc.key_of_owner_id(o)) is not None]

    return keys_of


def _map_group(sc: scope.Scope, reader: state.StateReader) -> handlers.MapFunc:
    def keys_of(group: Obj) -> list[keys.ObjectKey]:
        name = str(_meta(group).get("name") or "")
        caches = sc.store(reader.stores).by_index(state.BY_NODE_GROUP, name)
        return [keys.ObjectKey.of(c) for c in caches]

    return keys_of


def wire_cache_controller(
    sc: scope.Scope,
    queue: workqueue.WorkQueue,
    informers: dict[str, informer.Informer],
    reader: state.StateReader,
    serving_kinds: tuple[optional.OptionalInformer | None, optional.OptionalInformer | None],
) -> None:
    fn = predicates.funcs
    informers["nodes"].add_handler(
        handlers.enqueue_mapped(queue, _map_node(sc, reader), fn(updated=_node_changed))
    )
    informers["local_model_nodes"].add_handler(
        handlers.enqueue_mapped(
            queue, _map_lmn(sc), fn(added=lambda _: False, updated=_lmn_changed)
        )
    )
    informers["node_groups"].add_handler(
        handlers.enqueue_mapped(queue, _map_group(sc, reader), fn(updated=spec_changed))
    )
    for name in ("persistent_volumes", "persistent_volume_claims"):
        informers[name].add_handler(
            handlers.enqueue_mapped(
                queue, _map_volume(sc), fn(added=lambda _: False, updated=_volume_changed)
            )
        )
    isvcs, llms = serving_kinds
    if isvcs is not None:
        isvcs.add_handler(
            handlers.enqueue_mapped(queue, _map_isvc(sc), fn(updated=users.isvc_changed))
        )
    if llms is not None:
        llms.add_handler(
            handlers.enqueue_mapped(queue, users.map_llmisvc(sc), fn(updated=users.llmisvc_changed))
        )


# ------------------------------------------------------------------------ shared volumes


def pvc_ref_index(obj: Obj) -> list[str]:
    ref = (obj.get("spec") or {}).get("pvcRef")
    namespace = (obj.get("metadata") or {}).get("namespace") or ""
    return [f"{namespace}/{ref}"] if isinstance(ref, str) and ref else []


def job_informer(shared: factory.InformerFactory) -> informer.Informer:
    return shared.informer(
        kube.JOBS, label_selector=importjobs.JOB_SELECTOR, transform=importjobs.observed_job
    )


def _claim_changed(old: Obj, new: Obj) -> bool:
    return any(old.get(f) != new.get(f) for f in ("spec", "status")) or (
        (old.get("metadata") or {}).get("uid") != (new.get("metadata") or {}).get("uid")
    )


def wire(
    queue: workqueue.WorkQueue,
    *,
    caches: informer.Informer,
    claims: informer.Informer,
    jobs: informer.Informer,
    serving: tuple[optional.OptionalInformer | None, optional.OptionalInformer | None],
) -> None:
    """Feed the namespace-cache queue from claims, import Jobs and the other shared caches of
    a claim (module docstring)."""
    reader = caches.reader()

    def by_claim(claim: Obj) -> list[keys.ObjectKey]:
        meta = claim.get("metadata") or {}
        ref = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        return [keys.ObjectKey.of(c) for c in reader.by_index(BY_PVC_REF, ref)]

    def by_job(job: Obj) -> list[keys.ObjectKey]:
        return [k for k in importjobs.job_keys(job) if reader.get(k) is not None]

    def siblings(cache: Obj) -> list[keys.ObjectKey]:
        own = keys.ObjectKey.of(cache)
        found = (
            keys.ObjectKey.of(c)
            for r in pvc_ref_index(cache)
            for c in reader.by_index(BY_PVC_REF, r)
        )
        return [k for k in found if k != own]

    def shared_of_namespace(obj: Obj) -> list[keys.ObjectKey]:
        namespace = str(_meta(obj).get("namespace") or "")
        return [keys.ObjectKey.of(c) for c in reader.list(namespace) if pvc_ref_index(c)]

    claims.add_handler(
        handlers.enqueue_mapped(queue, by_claim, predicates.funcs(updated=_claim_changed))
    )
    jobs.add_handler(
        handlers.enqueue_mapped(queue, by_job, predicates.funcs(updated=importjobs.job_changed))
    )
    # users of a shared cache carry no cache label: their namespace's shared caches recount
    isvcs, llms = serving
    for kind, changed in ((isvcs, users.isvc_changed), (llms, users.llmisvc_changed)):
        if kind is not None:
            kind.add_handler(
                handlers.enqueue_mapped(
                    queue, shared_of_namespace, predicates.funcs(updated=changed)
                )
            )
    # a destination's owner came or went: the other caches of its claim decide again
    caches.add_handler(
        handlers.enqueue_mapped(queue, siblings, predicates.funcs(updated=lambda _o, _n: False))
    )
