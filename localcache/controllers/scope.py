"""The one place where the two cache kinds differ: a `Scope` names the kind, its finalizer,
its status-key style, its PV/PVC names and which InferenceServices belong to it.

                        LocalModelCache (cluster)         LocalModelNamespaceCache (in ns)
    finalizer           localmodel.kserve.io/finalizer    localmodelnamespacecache.kserve.io/…
    status key          name                              ns/name
    download PV         {c}-{g}-download (owned)          {c}-{g}-{ns}-download (no owner)
    download PVC        {c}-{g} in jobNamespace (owned)   {c}-{g}-download in ns (owned)
    serving PV          {c}-{g}-{isvcNs} (owned)          {c}-{g}-{ns} (no owner)
    serving PVC         {c}-{g} in isvcNs (owned)         {c}-{g} in ns (owned)
    (users: InferenceServices, and LLMInferenceServices by base model or LoRA adapter,
    `controllers.users`)
    InferenceServices   localmodel label = c, and no      localmodel label = c, namespace
                        localmodel-namespace label [P2]   label = ns, and the ISVC is in ns

The PV/PVC names are KServe's forms when those are unambiguous and fit, else hash-shortened;
the serving PVC is KServe's plain join wherever that is a valid name (`caching.names`, the
one place that derives them for controller, agent and webhooks).

Everything else (the reconcile steps) is shared and parameterised by a Scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localcache.api import groupversion, inferenceservice, modelcache
from localcache.caching import indexes, keys, names
from localcache.controllers import state
from localcache.runtime import keys as runtime_keys
from localcache.runtime import kube, store

CacheModel = modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache
Obj = dict[str, Any]

EVENT_NAMESPACE_FOR_CLUSTER_OBJECTS = "default"
"""Where client-go records Events about cluster-scoped objects; `kubectl describe` finds them."""


@dataclass(frozen=True, slots=True)
class Scope:
    kind: groupversion.KindInfo
    finalizer: str
    model: type[CacheModel]

    @property
    def namespaced(self) -> bool:
        return self.kind.namespaced

    @property
    def resource(self) -> kube.Resource:
        return self.kind.api

    @property
    def name(self) -> str:
        """The controller's name (metrics, logs)."""
        return self.kind.singular

    def store(self, stores: state.Stores) -> store.Reader:
        return stores.namespace_caches if self.namespaced else stores.caches

    def parse(self, obj: Obj) -> CacheModel:
        return self.model.model_validate(obj)

    # ------------------------------------------------------------------- identities

    def status_key(self, cache: CacheModel) -> keys.StatusKey:
        return keys.status_key(cache.name, cache.namespace or None)

    def owner_id(self, cache: CacheModel) -> str:
        return state.owner_id(self.kind.kind, cache.namespace, cache.name)

    def owner_reference(self, cache: CacheModel) -> Obj:
        return {
            "apiVersion": self.kind.api_version,
            "kind": self.kind.kind,
            "name": cache.name,
            "uid": cache.metadata.uid or "",
            "controller": True,
        }

    def key_of_status_key(self, status_key: str) -> runtime_keys.ObjectKey | None:
        """The cache key of this kind that a LocalModelNode status key names, if any."""
        try:
            namespace, name = keys.parse_status_key(status_key)
        except ValueError:
            return None
        if (namespace is not None) != self.namespaced:
            return None
        return runtime_keys.ObjectKey(namespace or "", name)

    def key_of_owner_id(self, owner: str) -> runtime_keys.ObjectKey | None:
        """The cache key of this kind named by an owner id (`state.owner_id`), if any."""
        kind, _, rest = owner.partition("/")
        if kind != self.kind.kind or not rest:
            return None
        if not self.namespaced:
            return None if "/" in rest else runtime_keys.ObjectKey("", rest)
        namespace, sep, name = rest.partition("/")
        if not sep or not namespace or not name or "/" in name:
            return None
        return runtime_keys.ObjectKey(namespace, name)

    def event_namespace(self, cache: CacheModel) -> str:
        return cache.namespace or EVENT_NAMESPACE_FOR_CLUSTER_OBJECTS

    # ------------------------------------------------------------------- volume names

    def download_pv_name(self, cache: CacheModel, group: str) -> str:
        return names.download_pv(cache.name, group, cache.namespace if self.namespaced else None)

    def download_pvc(self, cache: CacheModel, group: str, *, job_namespace: str) -> tuple[str, str]:
        """(namespace, name) of the download PVC."""
        name = names.download_pvc(cache.name, group, namespaced=self.namespaced)
        return (cache.namespace if self.namespaced else job_namespace), name

    def serving_pv_name(self, cache: CacheModel, group: str, isvc_namespace: str) -> str:
        return names.serving_pv(cache.name, group, isvc_namespace)

    def serving_pvc_name(self, cache: CacheModel, group: str) -> str:
        return names.serving_pvc(cache.name, group)

    def legacy_serving_names(
        self, cache: CacheModel, group: str, namespace: str
    ) -> tuple[str, str]:
        """(PV, PVC) names of a serving pair as named before issue 21 (`names` docstring)."""
        return (
            names.legacy_serving_pv(cache.name, group, namespace),
            names.legacy_serving_pvc(cache.name, group),
        )

    @property
    def pvs_owned(self) -> bool:
        """Whether our PVs carry an ownerReference to the cache (only a cluster-scoped owner
        can own a cluster-scoped object); ownerless PVs are deleted by the finalizer."""
        return not self.namespaced

    # ------------------------------------------------------------------- InferenceServices

    def cache_key_of_isvc(self, isvc: Obj) -> runtime_keys.ObjectKey | None:
        """The cache of this kind an InferenceService object uses, judged by its labels."""
        meta = isvc.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = labels.get(inferenceservice.LOCAL_MODEL_LABEL)
        if not name:
            return None
        label_ns = labels.get(inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL)
        if not self.namespaced:
            return None if label_ns else runtime_keys.ObjectKey("", name)
        namespace = meta.get("namespace") or ""
        if not label_ns or label_ns != namespace:
            return None
        return runtime_keys.ObjectKey(namespace, name)

    def isvcs_of(self, stores: state.Stores, cache: CacheModel) -> list[Obj]:
        """The InferenceServices that use `cache` (none when ISVCs are not watched): labelled
        with it, and whose storage URI it serves. The label alone proves nothing: with the
        webhook down (failurePolicy Ignore) a tenant may label an ISVC with any cluster
        cache's name, and would get a serving claim of that model (security review finding
        12)."""
        if stores.inference_services is None:
            return []
        own = runtime_keys.ObjectKey(cache.namespace, cache.name)
        return [
            isvc
            for isvc in stores.inference_services.by_index(state.BY_CACHE_LABEL, cache.name)
            if self.cache_key_of_isvc(isvc) == own
            and indexes.isvc_uses_uri(isvc, cache.spec.source_model_uri)
        ]
