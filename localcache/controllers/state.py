"""What the cache reconcilers read and write through: store views, index names, the API
subset they call, and a placement snapshot built from the stores.

Reconcilers never read the API for state; they read informer stores (`Stores`), which are
eventually consistent, and write through `Api`, a narrow Protocol that `runtime.kube.Kube`
satisfies. Objects handed out by stores are shared: never mutate them (copy first).

`StateReader` parses cache and node-group objects into models once per resourceVersion
(memoised by uid and resourceVersion) and builds `placement.Snapshot`s; both reconcilers and
the node-group usage reconciler share one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar

import pydantic
import structlog

from localcache.api import groupversion, inferenceservice, modelcache, nodegroup
from localcache.caching import config as config_mod
from localcache.caching import indexes, keys, placement, prunedmode
from localcache.runtime import kube, store

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
ConfigSource = Callable[[], config_mod.InferenceServiceConfig]
"""Returns the configuration in force (the last good one)."""

# Annotations and labels on the PVs/PVCs we create.
OWNER_ANNOTATION: Final = "localmodel.kserve.io/cache"
"""`LocalModelCache/<name>` or `LocalModelNamespaceCache/<namespace>/<name>`."""
ROLE_ANNOTATION: Final = "localmodel.kserve.io/volume-role"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "localcache"

# Index names of the stores.
BY_NODE_GROUP: Final = indexes.CACHES_BY_NODE_GROUP
"""Caches by each of their `spec.nodeGroups`."""
BY_ENTRY: Final = "entry"
"""LocalModelNodes by the status key of each `spec.localModels` entry."""
BY_CACHE_LABEL: Final = "localmodel"
"""InferenceServices by the value of `internal.serving.kserve.io/localmodel`."""
BY_OWNER: Final = "cache-owner"
"""PVs and PVCs by owning cache id (our annotation, or an ownerReference to a cache kind)."""


LOCAL_MODEL_CACHES: Final = groupversion.LOCAL_MODEL_CACHE.api
LOCAL_MODEL_NAMESPACE_CACHES: Final = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api
LOCAL_MODEL_NODES: Final = groupversion.LOCAL_MODEL_NODE.api
LOCAL_MODEL_NODE_GROUPS: Final = groupversion.LOCAL_MODEL_NODE_GROUP.api
INFERENCE_SERVICES: Final = groupversion.INFERENCE_SERVICE.api
LLM_INFERENCE_SERVICES: Final = groupversion.LLM_INFERENCE_SERVICE.api
CLUSTER_STORAGE_CONTAINERS: Final = groupversion.CLUSTER_STORAGE_CONTAINER.api


def owner_id(kind: str, namespace: str, name: str) -> str:
    """The id of a cache in `OWNER_ANNOTATION` and the `BY_OWNER` index."""
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


# ------------------------------------------------------------------------ index functions


def meta_of(obj: Obj) -> dict[str, Any]:
    """`obj["metadata"]`, or {} when it is missing or not a mapping."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


_meta = meta_of


def index_entries(obj: Obj) -> list[str]:
    found: list[str] = []
    for entry in (obj.get("spec") or {}).get("localModels") or []:
        if isinstance(entry, dict) and entry.get("modelName"):
            try:
                found.append(keys.status_key(entry["modelName"], entry.get("namespace") or None))
            except ValueError:
                continue
    return found


_CACHE_KINDS: Final = (
    groupversion.LOCAL_MODEL_CACHE.kind,
    groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind,
)


def index_owner(obj: Obj) -> list[str]:
    meta = _meta(obj)
    found = set()
    annotated = (meta.get("annotations") or {}).get(OWNER_ANNOTATION)
    if annotated:
        found.add(annotated)
    for ref in meta.get("ownerReferences") or []:
        if not isinstance(ref, dict) or ref.get("kind") not in _CACHE_KINDS:
            continue
        if not str(ref.get("apiVersion") or "").startswith(f"{groupversion.GROUP}/"):
            continue
        namespaced = ref["kind"] == groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind
        found.add(
            owner_id(ref["kind"], meta.get("namespace") or "" if namespaced else "", ref["name"])
        )
    return sorted(found)


CACHE_INDEXERS: Final[Mapping[str, store.IndexFunc]] = {BY_NODE_GROUP: indexes.cache_node_groups}
LOCAL_MODEL_NODE_INDEXERS: Final[Mapping[str, store.IndexFunc]] = {BY_ENTRY: index_entries}
ISVC_INDEXERS: Final[Mapping[str, store.IndexFunc]] = {
    BY_CACHE_LABEL: store.label_index(inferenceservice.LOCAL_MODEL_LABEL)
}
VOLUME_INDEXERS: Final[Mapping[str, store.IndexFunc]] = {BY_OWNER: index_owner}


# ------------------------------------------------------------------------ ports


class Api(Protocol):
    """The API calls the reconcilers make (`runtime.kube.Kube` provides them)."""

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj: ...

    async def list(
        self,
        res: kube.Resource,
        *,
        namespace: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> kube.ObjList: ...

    async def create(
        self, res: kube.Resource, obj: Obj, *, namespace: str | None = None
    ) -> Obj: ...

    async def patch(
        self,
        res: kube.Resource,
        name: str,
        patch: kube.Patch,
        *,
        namespace: str | None = None,
        patch_type: kube.PatchType = "merge",
    ) -> Obj: ...

    async def patch_status(
        self,
        res: kube.Resource,
        name: str,
        patch: kube.Patch,
        *,
        namespace: str | None = None,
        patch_type: kube.PatchType = "merge",
    ) -> Obj: ...

    async def delete(
        self,
        res: kube.Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = None,
    ) -> Obj: ...


@dataclass(frozen=True, slots=True)
class Stores:
    """Read-only views of the informer stores, with the indexes above registered."""

    caches: store.Reader
    namespace_caches: store.Reader
    nodes: store.Reader
    local_model_nodes: store.Reader
    node_groups: store.Reader
    persistent_volumes: store.Reader
    persistent_volume_claims: store.Reader
    inference_services: store.Reader | None
    """None when InferenceServices are not watched (`disableVolumeManagement` at start-up)."""
    llm_inference_services: store.Reader | None = None
    """KServe's LLMInferenceServices (`users.LLMISVC_INDEXERS`); None when not watched."""
    jobs: store.Reader | None = None
    """Import Jobs of shared-volume caches (`importjobs.JOB_SELECTOR`), in every namespace."""


# ------------------------------------------------------------------------ parsing


M = TypeVar("M", bound=pydantic.BaseModel)


class _Memo:
    """Parsed models by (uid, resourceVersion); entries of vanished objects are dropped."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, str], pydantic.BaseModel | None] = {}

    def parse(
        self,
        objs: Iterable[Obj],
        model: type[M],
        refuse: Callable[[M], str | None] = lambda _: None,
    ) -> list[tuple[Obj, M]]:
        """The objects that parse as `model` and that `refuse` has nothing against; each
        other one is logged once per resourceVersion, with its key, and left out."""
        kept: dict[tuple[str, str], pydantic.BaseModel | None] = {}
        out: list[tuple[Obj, M]] = []
        for obj in objs:
            meta = _meta(obj)
            memo_key = (str(meta.get("uid") or meta.get("name")), str(meta.get("resourceVersion")))
            if memo_key in self._parsed:
                parsed = self._parsed[memo_key]
            else:
                try:
                    parsed = model.model_validate(obj)
                    error = refuse(parsed)
                except pydantic.ValidationError as exc:
                    error = str(exc)
                if error is not None:
                    _log.warning(
                        "invalid_object_ignored",
                        kind=obj.get("kind"),
                        name=meta.get("name"),
                        namespace=meta.get("namespace"),
                        error=error,
                    )
                    parsed = None
            kept[memo_key] = parsed
            if isinstance(parsed, model):
                out.append((obj, parsed))
        self._parsed = kept
        return out


class StateReader:
    """Parses the stores' caches and node groups (memoised) and builds snapshots."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self._caches = _Memo()
        self._namespace_caches = _Memo()
        self._groups = _Memo()

    def groups(self) -> dict[str, nodegroup.LocalModelNodeGroup]:
        parsed = self._groups.parse(self.stores.node_groups.list(), nodegroup.LocalModelNodeGroup)
        return {model.name: model for _, model in parsed}

    def caches(self) -> list[placement.PlacedCache]:
        """Every cache of both kinds, cluster caches first."""
        cluster = self._caches.parse(
            self.stores.caches.list(), modelcache.LocalModelCache, _too_long_uri
        )
        namespaced = self._namespace_caches.parse(
            self.stores.namespace_caches.list(), modelcache.LocalModelNamespaceCache, _too_long_uri
        )
        models: list[modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache] = [
            m for _, m in cluster
        ]
        # a pvcRef the apiserver pruned makes no node-group cache (`caching.prunedmode`)
        models.extend(m for raw, m in namespaced if prunedmode.dropped_pvc_ref(raw) is None)
        return [
            placement.PlacedCache(
                name=cache.name,
                namespace=cache.namespace,
                spec=cache.spec,
                deleting=cache.metadata.deletion_timestamp is not None,
                created=cache.metadata.creation_timestamp or "",
            )
            for cache in models
        ]

    def snapshot(self) -> placement.Snapshot:
        nodes = {name_of(obj): obj for obj in self.stores.nodes.list()}
        return placement.Snapshot(nodes=nodes, groups=self.groups(), caches=self.caches())


def _too_long_uri(
    cache: modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache,
) -> str | None:
    """A URI that every LocalModelNode of its groups would carry past etcd's object size limit
    (security review finding 5); the CRDs and the URI policy refuse it, KServe's CRDs do not."""
    length = len(cache.spec.source_model_uri)
    if length <= modelcache.MAX_SOURCE_URI_LENGTH:
        return None
    return (
        f"spec.sourceModelUri is {length} characters long, more than "
        f"{modelcache.MAX_SOURCE_URI_LENGTH}: left out of every LocalModelNode"
    )


def name_of(obj: Obj) -> str:
    return str(_meta(obj).get("name") or "")
