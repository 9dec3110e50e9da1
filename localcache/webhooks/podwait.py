"""Pod mutation: a serving pod starts only on a node whose copy of its cache is complete.

The rule (`decide`, pure):
- Only CREATE of a pod that mounts a serving claim of a cache (`caching.names.serving_pvc`
  of the cache and one of its node groups; a LocalModelNamespaceCache's only in its own
  namespace, and preferred over a cluster cache with the same claim name, as KServe's
  matching prefers namespace caches) is changed, and only while
  `localModel.servingPodsWaitForCopy` is on. Caches being deleted are skipped.
- For each such cache the pod's required node affinity gets the cache's readiness requirement
  (`caching.readiness.with_requirements`: ANDed into every nodeSelectorTerm, or one new
  term), and the annotation `caching.readiness.WAITS_FOR_ANNOTATION` lists the caches' status keys
  (what the waiting-pod Events read). Everything else of the pod is left as it is.

`PodWaitMutator` is the admission handler: it reads the caches from informer stores (an
index by serving claim name; no API call per request). Until they have synced, or on any
handler failure, the pod is admitted unchanged (the configuration's `failurePolicy: Ignore`
does the same when localcache does not answer): an outage of localcache never blocks pod
creation, it only lets pods start where the copy may not be complete, as KServe does.
The objects users write (Deployments, InferenceServices) are never changed, only the pods
their controllers create, so GitOps tools see no drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import structlog

from localcache.caching import indexes, keys, names, readiness
from localcache.runtime.serving import review
from localcache.webhooks import stores

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
MUTATE_PATH: Final = "/mutate-v1-pod-localmodel"
SERVING_CLAIM_INDEX: Final = "serving-claim"
"""Caches (both kinds) by the name of each serving claim they make."""
WAITS_FOR_ANNOTATION: Final = readiness.WAITS_FOR_ANNOTATION


def index_serving_claims(cache: Obj) -> list[str]:
    """The serving claim names of a cache: one per node group."""
    name = str((cache.get("metadata") or {}).get("name") or "")
    if not name:
        return []
    return sorted({names.serving_pvc(name, group) for group in indexes.cache_node_groups(cache)})


def claims_of(pod: Obj) -> list[str]:
    """The PVC claim names a pod's volumes mount, in order, without repeats."""
    found: list[str] = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
        if isinstance(claim, str) and claim and claim not in found:
            found.append(claim)
    return found


@dataclass(frozen=True)
class Decision:
    status_keys: tuple[str, ...]
    ops: tuple[Obj, ...]


def _live(objs: Iterable[Obj]) -> list[Obj]:
    return [o for o in objs if not (o.get("metadata") or {}).get("deletionTimestamp")]


def caches_for(
    pod: Obj, namespace: str, *, caches: stores.Indexed, namespace_caches: stores.Indexed
) -> list[str]:
    """The status keys of the caches whose serving claims `pod` (in `namespace`) mounts."""
    found: list[str] = []
    for claim in claims_of(pod):
        own = [
            o
            for o in _live(namespace_caches.by_index(SERVING_CLAIM_INDEX, claim))
            if (o.get("metadata") or {}).get("namespace") == namespace
        ]
        if own:
            chosen = sorted(str(o["metadata"]["name"]) for o in own)[0]
            key = keys.status_key(chosen, namespace)
        else:
            cluster = _live(caches.by_index(SERVING_CLAIM_INDEX, claim))
            if not cluster:
                continue
            key = keys.status_key(sorted(str(o["metadata"]["name"]) for o in cluster)[0], None)
        if key not in found:
            found.append(key)
    return found


def decide(pod: Obj, status_keys: list[str]) -> Decision:
    """The JSON-patch ops adding the readiness requirements of `status_keys` to `pod`."""
    if not status_keys:
        return Decision((), ())
    spec = pod.get("spec") or {}
    affinity = readiness.with_requirements(
        spec.get("affinity"), [readiness.requirement(k) for k in status_keys]
    )
    ops: list[Obj] = []
    if affinity is not None:
        ops.append({"op": "add", "path": "/spec/affinity", "value": affinity})
    ops.extend(
        review.metadata_patch(pod, annotations={WAITS_FOR_ANNOTATION: ",".join(status_keys)})
    )
    return Decision(tuple(status_keys), tuple(ops))


class PodWaitMutator:
    """The admission handler for Pod CREATE (module docstring)."""

    def __init__(
        self,
        *,
        caches: stores.Indexed,
        namespace_caches: stores.Indexed,
        enabled: Callable[[], bool],
        synced: Callable[[], bool],
    ) -> None:
        self._caches = caches
        self._namespace_caches = namespace_caches
        self._enabled = enabled
        self._synced = synced

    async def __call__(self, request: review.Request) -> review.Response:
        pod = request.object
        if pod is None or request.operation != "CREATE" or not isinstance(pod, dict):
            return review.allowed()
        if not self._enabled() or not self._synced():
            return review.allowed()
        if not isinstance(pod.get("spec"), dict) or not isinstance(pod.get("metadata", {}), dict):
            return review.allowed()
        namespace = request.namespace or str((pod.get("metadata") or {}).get("namespace") or "")
        status_keys = caches_for(
            pod, namespace, caches=self._caches, namespace_caches=self._namespace_caches
        )
        decision = decide(pod, status_keys)
        if decision.ops:
            log.debug("pod_mutation.waits_for_copy", caches=list(decision.status_keys))
        return review.patched(list(decision.ops))
