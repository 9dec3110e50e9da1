"""Validation of LocalModelCache and LocalModelNamespaceCache writes (spec §3, §4, §6).

Pure rules over a `Snapshot` of the cluster (`validate_write`, `validate_delete`), and the thin
admission handler `CacheValidator` that builds it from informer stores (and `livegroups`). Every
`Violation` names the field and the conflicting object; one denial carries all of them.

Create and update (an update of an object being deleted is always allowed, as in KServe):
- on create, `metadata.name` can be a label value (`caching.cachename`: at most 63
  characters), as it becomes label `internal.serving.kserve.io/localmodel` of every
  InferenceService served; existing longer-named caches stay updatable and deletable;
- `spec.sourceModelUri` has a download path (`caching.uris`: a scheme the storage initializer
  recognises, or a ClusterStorageContainer for download Jobs that claims it); the message
  lists the supported schemes. Checked on create and when the URI changes, so a container
  deleted later never blocks updates of a live cache;
- `spec.modelSize` is greater than zero (on create and when it changes);
- `spec.download.env` sets no name localcache sets for credentials, none twice, each by value
  or by one reference; a namespace cache only download tuning names (`caching.downloadenv`);
- every node group in `spec.nodeGroups` exists (on update: every group added by it, so a group
  deleted later never blocks finalizer or label updates of a live cache) [P1, P5], read from
  the apiserver when the store lacks it (`webhooks.livegroups`);
- a LocalModelCache's `sourceModelUri` is unique among LocalModelCaches (one trailing `/`
  ignored, as URI matching ignores it) — checked on create and when the URI changes;
- on create, a LocalModelCache may not share its name with any LocalModelNamespaceCache and
  the reverse: their serving PVCs `{cache}-{group}` would collide [P2];
- capacity [P13]: on each node group, the sum of `modelSize` over the distinct
  `sourceModelUri`s of every cache (both kinds) placed on it stays within its `storageLimit`;
  a URI already on the group adds only what its size grows. Checked on create, for groups an
  update adds, and for all groups when an update grows `modelSize`. A write that adds nothing
  is never denied, even on a group already over its limit;
- a LocalModelNamespaceCache's storage mode (`webhooks.sharedvalidation`): exactly one of
  `spec.nodeGroups` / `spec.pvcRef`, `pvcRef` a claim name and immutable (checked on the raw
  object, before parsing), and on create no other shared-volume cache of the namespace
  importing the same model onto the same claim. A shared-volume cache has no node groups, so
  the node-group, capacity and share rules find nothing to check, and the name rule does not
  apply to it (it makes no serving PVC);
- a namespace's share (`webhooks.capacity`, security review finding 9): the namespace caches of
  one namespace may declare at most `localModel.namespaceStorageSharePercent` (default 50) of
  a group's `storageLimit`, so no tenant can take a whole shared group for itself.

Delete: denied while a live InferenceService is labelled for the cache (label
`internal.serving.kserve.io/localmodel` = name, plus `…/localmodel-namespace` = namespace for a
namespace cache, none for a cluster cache) and the cache serves its storage URI
(`caching.indexes.isvc_uses_uri`), or while a live LLMInferenceService uses it, by its base
model (the same labels, `spec.model.uri`) or a LoRA adapter (the `…/localmodel-lora`
annotation, an adapter's URI; `caching.llmuse`). The denial names each kind's first user
(kind, namespace/name, and how an LLMInferenceService uses it) and how many more there are.
The labels and annotation are the truth the cache's `status.inferenceServices` and
`status.llmInferenceServices` are derived from, so a user listed in status that no longer
exists (or no longer carries the keys) does not block [P4], and one labelled but not yet in
status does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

import pydantic
import structlog

from localcache.api import modelcache, nodegroup, storage
from localcache.caching import cachename, downloadenv, indexes, sharedroute, uris
from localcache.caching import config as config_mod
from localcache.runtime import keys as runtime_keys
from localcache.runtime.serving import review
from localcache.webhooks import capacity, inuse, isvc, livegroups, sharedvalidation, stores

log = structlog.get_logger(__name__)

CACHE_PATH: Final = "/validate-serving-kserve-io-v1alpha1-localmodelcache"
NAMESPACE_CACHE_PATH: Final = "/validate-serving-kserve-io-v1alpha1-localmodelnamespacecache"

NODE_GROUP_INDEX: Final = indexes.CACHES_BY_NODE_GROUP
"""On both cache stores: each entry of `spec.nodeGroups`."""
NAME_INDEX: Final = "localcache.webhooks/name"
"""On the namespace-cache store: `metadata.name` (same-named caches across namespaces)."""
USED_CACHE_INDEX: Final = "localcache.webhooks/used-cache"
"""On the InferenceService store: the status key of the cache the ISVC is labelled for."""

AnyCache = isvc.AnyCache
Obj = dict[str, Any]
Objs = list[Obj]


Violation = capacity.Violation


@dataclass(frozen=True)
class Snapshot:
    """What the rules see of the cluster. Objects may include the cache under review."""

    node_groups: Mapping[str, nodegroup.LocalModelNodeGroup] = field(default_factory=dict)
    cluster_caches: Sequence[modelcache.LocalModelCache] = ()
    namespace_caches: Sequence[modelcache.LocalModelNamespaceCache] = ()
    users: Sequence[runtime_keys.ObjectKey] = ()
    """Live InferenceServices labelled for the cache under review (delete only)."""
    llm_users: Sequence[tuple[runtime_keys.ObjectKey, str]] = ()
    """Live LLMInferenceServices using the cache under review, with how (delete only)."""
    storage_containers: Sequence[storage.ClusterStorageContainer] = ()
    allow_file_uris: bool = False
    namespace_share_percent: int = config_mod.DEFAULT_NAMESPACE_SHARE_PERCENT


def _ref(cache: AnyCache) -> tuple[str, str]:
    return (cache.namespace, cache.name)


def _same(a: AnyCache, b: AnyCache) -> bool:
    return type(a) is type(b) and a.namespace == b.namespace and a.name == b.name


def check_node_groups(
    cache: AnyCache, *, old: AnyCache | None, node_groups: Mapping[str, Any]
) -> list[Violation]:
    before = set(old.spec.node_groups) if old is not None else set()
    return [
        Violation(f"spec.nodeGroups[{i}]", f"LocalModelNodeGroup {group} not found")
        for i, group in enumerate(cache.spec.node_groups)
        if group not in before and group not in node_groups
    ]


def check_uri(
    cache: AnyCache,
    *,
    old: AnyCache | None,
    storage_containers: Iterable[storage.ClusterStorageContainer],
    allow_file: bool = False,
) -> list[Violation]:
    uri = cache.spec.source_model_uri
    if old is not None and old.spec.source_model_uri == uri:
        return []
    reason = uris.malformed(uri)
    if reason is not None:
        return [Violation("spec.sourceModelUri", f"{uri[:200]!r} {reason}")]
    if uris.supported(uri, storage_containers, allow_file=allow_file):
        return []
    return [
        Violation(
            "spec.sourceModelUri",
            f"no download path supports {uri!r}: supported schemes are "
            f"{uris.describe_supported(allow_file=allow_file)}, or a ClusterStorageContainer "
            "with workloadType "
            f"{storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB} whose supportedUriFormats match it",
        )
    ]


def check_model_size(cache: AnyCache, *, old: AnyCache | None) -> list[Violation]:
    size = cache.spec.model_size
    if size.value > 0 or (old is not None and old.spec.model_size.value == size.value):
        return []
    return [Violation("spec.modelSize", f"must be greater than 0, got {size}")]


def check_unique_uri(
    cache: AnyCache, *, old: AnyCache | None, cluster_caches: Iterable[modelcache.LocalModelCache]
) -> list[Violation]:
    uri = cache.spec.source_model_uri
    if not isinstance(cache, modelcache.LocalModelCache):
        return []
    if old is not None and old.spec.source_model_uri == uri:
        return []
    for other in sorted(cluster_caches, key=_ref):
        other_uri = other.spec.source_model_uri
        if not _same(other, cache) and other_uri.removesuffix("/") == uri.removesuffix("/"):
            return [
                Violation(
                    "spec.sourceModelUri",
                    f"LocalModelCache {other.name} has the same StorageURI {other_uri}",
                )
            ]
    return []


def check_name_length(cache: AnyCache, *, old: AnyCache | None) -> list[Violation]:
    if old is not None or cachename.fits_label(cache.name):
        return []  # names are immutable: checked once, on create
    return [Violation("metadata.name", cachename.too_long(cache.name))]


def check_name(cache: AnyCache, *, old: AnyCache | None, snapshot: Snapshot) -> list[Violation]:
    if old is not None:
        return []  # names are immutable: checked once, on create
    others: Sequence[AnyCache]
    if isinstance(cache, modelcache.LocalModelCache):
        others = snapshot.namespace_caches
    else:
        others = snapshot.cluster_caches
    for other in sorted(others, key=_ref):
        if other.name == cache.name and not (
            sharedroute.is_shared(cache) or sharedroute.is_shared(other)
        ):
            return [
                Violation(
                    "metadata.name",
                    f"{isvc.describe(other)} has the same name: a LocalModelCache and a "
                    "LocalModelNamespaceCache may not share a name, their serving PVCs "
                    "would collide",
                )
            ]
    return []


def validate_write(
    cache: AnyCache, *, old: AnyCache | None = None, snapshot: Snapshot
) -> list[Violation]:
    """Violations of a create (`old` None) or update (module docstring)."""
    if old is not None and cache.metadata.deletion_timestamp:
        return []
    return [
        *check_name_length(cache, old=old),
        *check_uri(
            cache,
            old=old,
            storage_containers=snapshot.storage_containers,
            allow_file=snapshot.allow_file_uris,
        ),
        *check_model_size(cache, old=old),
        *(
            Violation(f, m)
            for f, m in downloadenv.violations(
                cache.spec.download,
                field="spec.download",
                tenant=isinstance(cache, modelcache.LocalModelNamespaceCache),
            )
        ),
        *check_node_groups(cache, old=old, node_groups=snapshot.node_groups),
        *check_unique_uri(cache, old=old, cluster_caches=snapshot.cluster_caches),
        *check_name(cache, old=old, snapshot=snapshot),
        *(
            sharedvalidation.check_destination(
                cache, old=old, namespace_caches=snapshot.namespace_caches
            )
            if isinstance(cache, modelcache.LocalModelNamespaceCache)
            else ()
        ),
        *capacity.check_capacity(
            cache,
            old=old,
            node_groups=snapshot.node_groups,
            caches=[*snapshot.cluster_caches, *snapshot.namespace_caches],
        ),
        *capacity.check_namespace_share(
            cache,
            old=old,
            node_groups=snapshot.node_groups,
            caches=[*snapshot.cluster_caches, *snapshot.namespace_caches],
            percent=snapshot.namespace_share_percent,
        ),
    ]


def validate_delete(cache: AnyCache, *, snapshot: Snapshot) -> list[Violation]:
    """Violations of deleting `cache`: live (LLM)InferenceServices using it."""
    if cache.metadata.deletion_timestamp:
        return []  # already accepted once; a repeated delete changes nothing
    return inuse.check_in_use(cache, users=snapshot.users, llm_users=snapshot.llm_users)


# ------------------------------------------------------------------------ admission handler


class IndexedLister(stores.Lister, stores.Indexed, Protocol):
    """The part of an informer store the validator reads (`runtime.store.Reader`)."""


class CacheValidator:
    """The admission handler for one cache kind: CREATE, UPDATE and DELETE."""

    def __init__(
        self,
        *,
        namespaced: bool,
        caches: IndexedLister,
        namespace_caches: IndexedLister,
        node_groups: stores.Lister,
        inference_services: IndexedLister,
        synced: Callable[[], bool],
        llm_inference_services: IndexedLister | None = None,
        storage_containers: stores.Lister | None = None,
        allow_file_uris: bool = False,
        namespace_share_percent: Callable[[], int] = lambda: (
            config_mod.DEFAULT_NAMESPACE_SHARE_PERCENT
        ),
        read_node_group: livegroups.Reader | None = None,
    ) -> None:
        """`storage_containers` reads KServe's ClusterStorageContainers; None where the
        apiserver does not serve that kind (only the built-in schemes are supported then).
        `llm_inference_services` reads LLMInferenceServices (`caching.llmuse.slim`, with
        its `USED_CACHE_INDEX`); None: not consulted. `read_node_group`: `livegroups`."""
        self._model: type[AnyCache] = (
            modelcache.LocalModelNamespaceCache if namespaced else modelcache.LocalModelCache
        )
        self._caches = caches
        self._namespace_caches = namespace_caches
        self._node_groups = node_groups
        self._isvcs = inference_services
        self._llmisvcs = llm_inference_services
        self._synced = synced
        self._storage_containers = storage_containers
        self._allow_file_uris = allow_file_uris
        self._namespace_share_percent = namespace_share_percent
        self._live = read_node_group

    def _cache(self, obj: Obj | None, request: review.Request) -> AnyCache | None:
        if obj is None:
            return None
        cache = self._model.model_validate(obj)
        if not cache.metadata.namespace and self._model is modelcache.LocalModelNamespaceCache:
            cache.metadata.namespace = request.namespace
        return cache

    async def __call__(self, request: review.Request) -> review.Response:
        if not self._synced():
            return review.denied(
                "localcache's caches have not synced yet; retry in a few seconds",
                code=503,
                reason="ServiceUnavailable",
            )
        if (
            self._model is modelcache.LocalModelNamespaceCache
            and request.operation in ("CREATE", "UPDATE")
            and request.object is not None
            and (mode := sharedvalidation.check_mode(request.object, old=request.old_object))
        ):
            return review.denied("; ".join(str(v) for v in mode), field=mode[0].field)
        try:
            new = self._cache(request.object, request)
            old = self._cache(request.old_object, request)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            return review.denied(
                f"expected a {self._model.__name__}: {where}: {first['msg']}",
                code=400,
                reason="BadRequest",
            )
        if request.operation == "DELETE":
            if old is None:
                return review.allowed()
            snapshot = Snapshot(
                users=inuse.isvc_users(self._isvcs, old, index=USED_CACHE_INDEX),
                llm_users=inuse.llm_users(self._llmisvcs, old),
            )
            violations = validate_delete(old, snapshot=snapshot)
        elif request.operation in ("CREATE", "UPDATE") and new is not None:
            snapshot = self._snapshot(new, old)
            live = await livegroups.complete(snapshot.node_groups, new, old, self._live)
            violations = validate_write(new, old=old, snapshot=replace(snapshot, node_groups=live))
        else:
            return review.allowed()
        if not violations:
            return review.allowed()
        return review.denied("; ".join(str(v) for v in violations), field=violations[0].field)

    def _snapshot(self, cache: AnyCache, old: AnyCache | None) -> Snapshot:
        groups = dict.fromkeys([*cache.spec.node_groups, *(old.spec.node_groups if old else [])])
        node_groups: dict[str, nodegroup.LocalModelNodeGroup] = {}
        for group in groups:
            raw = self._node_groups.get(runtime_keys.ObjectKey("", group))
            parsed = stores.parse_all(nodegroup.LocalModelNodeGroup, [raw] if raw else [])
            if parsed:
                node_groups[group] = parsed[0]
        cluster: dict[runtime_keys.ObjectKey, Obj] = {}
        namespaced: dict[runtime_keys.ObjectKey, Obj] = {}
        if isinstance(cache, modelcache.LocalModelCache):
            _collect(cluster, self._caches.list())
        else:
            same_name = self._caches.get(runtime_keys.ObjectKey("", cache.name))
            _collect(cluster, [same_name] if same_name is not None else [])
        _collect(namespaced, self._namespace_caches.by_index(NAME_INDEX, cache.name))
        if old is None and sharedroute.is_shared(
            cache
        ):  # destination conflicts: the namespace's caches
            _collect(namespaced, self._namespace_caches.list(cache.namespace))
        for group in groups:
            _collect(cluster, self._caches.by_index(NODE_GROUP_INDEX, group))
            _collect(namespaced, self._namespace_caches.by_index(NODE_GROUP_INDEX, group))
        containers = self._storage_containers
        return Snapshot(
            allow_file_uris=self._allow_file_uris,
            namespace_share_percent=self._namespace_share_percent(),
            storage_containers=stores.parse_all(
                storage.ClusterStorageContainer, containers.list() if containers else []
            ),
            node_groups=node_groups,
            cluster_caches=stores.parse_all(modelcache.LocalModelCache, cluster.values()),
            namespace_caches=stores.parse_all(
                modelcache.LocalModelNamespaceCache, namespaced.values()
            ),
        )


def _collect(into: dict[runtime_keys.ObjectKey, Obj], objs: Iterable[Obj]) -> None:
    for obj in objs:
        into[runtime_keys.ObjectKey.of(obj)] = obj
