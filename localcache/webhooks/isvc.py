"""InferenceService mutation: tie an InferenceService to the local model cache that serves it.

`decide()` is the whole rule, pure (spec §6, reference §6.1):
- Nothing to do (every local-model key removed when present) when the ISVC has no predictor
  storage URI, carries `serving.kserve.io/disable-localmodel` (presence alone counts), or
  `localModel.enabled` is false. An ISVC created that way is left untouched.
- Candidates are the caches whose `sourceModelUri` serves the storage URI (equal or a
  sub-path, `caching.keys.match_storage_uri`), that are not being deleted and whose name can
  be a label value (`caching.cachename`; a longer one is skipped with a warning naming it).
  A candidate needs a node group: the one named by `serving.kserve.io/nodegroup` when the
  cache lists it, else the first of its `nodeGroups`; with a node-group lookup, groups that
  do not exist are skipped (an unknown node group gives no labels). With a `groupfit.GroupFit`
  and a predictor `nodeSelector` or required node affinity, the group follows the workload
  (`caching.groupfit`: the group it uses now while it fits, else the first group with a node
  the predictor can run on; the annotation still wins; none fits: the first group, warned).
- LocalModelNamespaceCaches of the ISVC's own namespace are tried first, then
  LocalModelCaches. Among candidates the most specific wins: the longest `sourceModelUri`
  (one trailing `/` ignored, as matching ignores it), ties by name [P23].
- The result sets label `internal.serving.kserve.io/localmodel` (cache name), label
  `internal.serving.kserve.io/localmodel-namespace` (cache namespace, removed for a cluster
  cache), annotation `internal.serving.kserve.io/localmodel-sourceuri` (cache URI) and
  annotation `internal.serving.kserve.io/localmodel-pvc-name` (`{cache}-{nodeGroup}`); with no
  candidate all four are removed (stale labels never survive).
- Shared-volume namespace caches (`spec.pvcRef`, `caching.sharedroute`) of the ISVC's own
  namespace compete with its node-group namespace caches by the same specificity, but only
  once Ready (Ready=True for the current generation); until then they count as absent (a
  cluster cache may then match) and a warning names the cache and why. A chosen shared cache
  rewrites the predictor's `storageUri` to `pvc://<pvcRef>/models/<storage key><subPath>`,
  removes the four keys above except `…/localmodel-sourceuri`, which records the original
  URI, and sets `localcache.kserve.io/shared-volume-cache` (cache name); no node-group key is
  set, or KServe's injector would mount a node-local claim. An ISVC whose `storageUri` is
  `pvc://` and that carries that annotation (routed before) is left alone.
- Warnings: the chosen cache has no downloaded copy yet (`copies.available` is 0 or no node
  reports `NodeDownloaded`), the node-group annotation excluded every cache of the URI, the
  chosen group has no node the predictor can be scheduled on, or a cache of the URI has a
  name too long for a label.

The admission handler is `webhooks.isvchandler.IsvcMutator`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import pydantic
import structlog

from localcache.api import inferenceservice as isvc_api
from localcache.api import modelcache
from localcache.caching import cachename, groupfit, names, sharedroute
from localcache.caching import keys as cache_keys

log = structlog.get_logger(__name__)

MUTATE_PATH: Final = "/mutate-serving-kserve-io-v1beta1-inferenceservice"

LABEL_KEYS: Final = (isvc_api.LOCAL_MODEL_LABEL, isvc_api.LOCAL_MODEL_NAMESPACE_LABEL)
ANNOTATION_KEYS: Final = (
    isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION,
    isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION,
    sharedroute.SHARED_VOLUME_CACHE_ANNOTATION,
)

AnyCache = modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache
Obj = dict[str, Any]
Objs = list[Obj]
NodeGroupExists = Callable[[str], bool]
M = TypeVar("M", bound=pydantic.BaseModel)


def _kind(cache: AnyCache) -> str:
    if isinstance(cache, modelcache.LocalModelNamespaceCache):
        return "LocalModelNamespaceCache"
    return "LocalModelCache"


def describe(cache: AnyCache) -> str:
    """`LocalModelCache name` or `LocalModelNamespaceCache ns/name`, for messages."""
    ref = f"{cache.namespace}/{cache.name}" if cache.namespace else cache.name
    return f"{_kind(cache)} {ref}"


def has_downloaded_copy(cache: AnyCache) -> bool:
    """True when the status shows a copy on some node: `copies.available` > 0 and at least one
    node `NodeDownloaded` (absent counts are 0)."""
    status = cache.status
    if status is None:
        return False
    available = (status.copies.available if status.copies else None) or 0
    nodes = (status.node_status or {}).values()
    return available > 0 and any(s == modelcache.NodeStatus.DOWNLOADED for s in nodes)


@dataclass(frozen=True, slots=True)
class Choice:
    """The cache an ISVC uses and the node group whose PVC it mounts."""

    cache: AnyCache
    node_group: str
    unfit: str | None = None
    """Why the workload cannot be scheduled on the group's nodes (None: it can, or unknown)."""

    @property
    def pvc_name(self) -> str:
        return names.serving_pvc(self.cache.name, self.node_group)

    @property
    def namespace(self) -> str | None:
        """The namespace cache's namespace; None for a cluster cache."""
        return self.cache.namespace or None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the ISVC's local-model labels and annotations should be (None: absent)."""

    labels: dict[str, str | None]
    annotations: dict[str, str | None]
    choice: Choice | None = None
    warnings: tuple[str, ...] = field(default=())
    routed_uri: str | None = None
    """The URI the model field is rewritten to (a shared-volume cache chose it)."""
    rewrites: tuple[tuple[str, str], ...] = ()
    """(JSON pointer, value) of each model URI field to replace."""


def _cleared(warnings: Sequence[str] = ()) -> Decision:
    return Decision(
        labels=dict.fromkeys(LABEL_KEYS),
        annotations=dict.fromkeys(ANNOTATION_KEYS),
        warnings=tuple(warnings),
    )


def _node_group(
    cache: AnyCache,
    requested: str | None,
    exists: NodeGroupExists | None,
    fit: groupfit.GroupFit | None = None,
) -> groupfit.GroupPick:
    groups = cache.spec.node_groups
    if fit is not None and fit.constrained:
        return fit.pick(cache.name, groups, requested=requested)
    if requested is not None:
        ok = requested in groups and (exists is None or exists(requested))
        return groupfit.GroupPick(requested if ok else None)
    return groupfit.GroupPick(next((g for g in groups if exists is None or exists(g)), None))


def _specificity(choice: Choice) -> tuple[int, str]:
    """Sort key: longest source URI first (one trailing `/` ignored), then name."""
    return sharedroute.specificity(choice.cache)


def choose(
    storage_uri: str,
    caches: Iterable[AnyCache],
    *,
    node_group: str | None = None,
    node_group_exists: NodeGroupExists | None = None,
    fit: groupfit.GroupFit | None = None,
) -> tuple[Choice | None, bool]:
    """The most specific cache serving `storage_uri`, and whether some cache matched the URI
    but had no usable node group (see the module docstring). Caches whose name cannot be a
    label value are not candidates (`caching.cachename`)."""
    candidates: list[Choice] = []
    excluded = False
    for cache in caches:
        if cache.metadata.deletion_timestamp or sharedroute.is_shared(cache):
            continue  # shared-volume caches have no node group (`sharedroute.pick`)
        if not cache_keys.match_storage_uri(cache.spec.source_model_uri, storage_uri):
            continue
        if not cachename.fits_label(cache.name):
            continue
        pick = _node_group(cache, node_group, node_group_exists, fit)
        if pick.group is None:
            excluded = True
            continue
        candidates.append(Choice(cache, pick.group, pick.why if pick.fits is False else None))
    return (min(candidates, key=_specificity) if candidates else None), excluded


def _not_downloaded_warning(choice: Choice) -> str:
    status = choice.cache.status
    total = (status.copies.total if status and status.copies else None) or 0
    return (
        f"{describe(choice.cache)} has no downloaded copy of the model yet (0 of {total} "
        "nodes): pods may start before the model is on their node"
    )


def _unfit_warning(choice: Choice, requested: str | None) -> str:
    if requested is not None:
        how = f"using node group {choice.node_group} as annotation {_NODE_GROUP} asks"
    else:
        how = f"keeping its first node group {choice.node_group}, as KServe would"
    return (
        f"{describe(choice.cache)}: {choice.unfit}; {how} (claim {choice.pvc_name}): the pods "
        "cannot be scheduled where the model is cached"
    )


def _long_names(uri: str, caches: Iterable[AnyCache]) -> list[str]:
    """Warnings for the live caches serving `uri` whose names cannot be label values."""
    return [
        f"{describe(c)} serves {uri} but is not used: metadata.name {cachename.too_long(c.name)}; "
        "create a cache with a shorter name"
        for c in caches
        if not c.metadata.deletion_timestamp
        and not sharedroute.is_shared(c)
        and not cachename.fits_label(c.name)
        and cache_keys.match_storage_uri(c.spec.source_model_uri, uri)
    ]


_NODE_GROUP: Final = isvc_api.NODE_GROUP_ANNOTATION


def decide(
    isvc: isvc_api.InferenceService,
    *,
    namespace_caches: Iterable[modelcache.LocalModelNamespaceCache],
    cluster_caches: Iterable[modelcache.LocalModelCache],
    node_group_exists: NodeGroupExists | None = None,
    enabled: bool = True,
    fit: groupfit.GroupFit | None = None,
) -> Decision:
    """The local-model labels and annotations `isvc` should carry (module docstring).

    `namespace_caches` should be those of the ISVC's namespace; others are ignored.
    `node_group_exists` (optional) tells whether a LocalModelNodeGroup exists; `fit`
    (optional) judges the node group by the predictor's constraints (used when it has any).
    """
    uri = isvc.storage_uri
    if routed_before(uri, isvc.annotations):
        return Decision(labels={}, annotations={})
    if not enabled or isvc.local_model_disabled or not uri:
        return _cleared()
    decision = match(
        uri,
        namespace=isvc.namespace,
        requested=isvc.node_group,
        namespace_caches=namespace_caches,
        cluster_caches=cluster_caches,
        node_group_exists=node_group_exists,
        fit=fit,
    )
    if decision.routed_uri is None:
        return decision
    return dataclasses.replace(decision, rewrites=((_uri_path(isvc), decision.routed_uri),))


def routed_before(uri: str | None, annotations: dict[str, str]) -> bool:
    """The model URI was rewritten to a shared volume before: leave the object alone."""
    return bool(uri and uri.startswith(sharedroute.PVC_SCHEME)) and (
        sharedroute.SHARED_VOLUME_CACHE_ANNOTATION in annotations
    )


def _uri_path(isvc: isvc_api.InferenceService) -> str:
    """The JSON pointer of the predictor implementation's `storageUri` (KServe's order)."""
    predictor = isvc.spec.predictor if isvc.spec else None
    key = next(k for k in isvc_api.PREDICTOR_KEYS if getattr(predictor, k, None) is not None)
    return f"/spec/predictor/{key}/storageUri"


def _routed(uri: str, cache: modelcache.LocalModelNamespaceCache, warnings: list[str]) -> Decision:
    return Decision(
        labels=dict.fromkeys(LABEL_KEYS),
        annotations={
            isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: uri,
            isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: None,
            sharedroute.SHARED_VOLUME_CACHE_ANNOTATION: cache.name,
        },
        warnings=tuple(warnings),
        routed_uri=sharedroute.routed_uri(cache, uri),
    )


def match(
    uri: str,
    *,
    namespace: str,
    requested: str | None,
    namespace_caches: Iterable[modelcache.LocalModelNamespaceCache],
    cluster_caches: Iterable[modelcache.LocalModelCache],
    node_group_exists: NodeGroupExists | None = None,
    fit: groupfit.GroupFit | None = None,
    shared_blocked: str | None = None,
) -> Decision:
    """The cache of `uri` for a serving object in `namespace` that asked for node group
    `requested` (None: none asked) and whose workloads `fit` judges: the rule of the module
    docstring past its first point, shared by InferenceService and LLMInferenceService.
    `shared_blocked` says why `uri` cannot be rewritten (shared caches then count as absent);
    a chosen shared cache gives `routed_uri`, the caller writes it."""
    own = [c for c in namespace_caches if c.namespace == namespace]
    cluster = list(cluster_caches)
    pick = functools.partial(
        choose, uri, node_group=requested, node_group_exists=node_group_exists, fit=fit
    )
    choice, excluded = pick(own)
    shared, shared_warnings = sharedroute.pick(uri, own, blocked=shared_blocked)
    long_names = [*shared_warnings, *_long_names(uri, own)]
    if shared is not None and (
        choice is None or sharedroute.specificity(shared) < _specificity(choice)
    ):
        return _routed(uri, shared, long_names)
    if choice is None:
        choice, excluded_cluster = pick(cluster)
        excluded = excluded or excluded_cluster
        long_names += _long_names(uri, cluster)
    if choice is None:
        if not excluded:
            return _cleared(long_names)
        if requested is not None:
            why = f"no local model cache of {uri} is on node group {requested}"
        else:
            why = f"the node groups of the local model caches of {uri} do not exist"
        return _cleared([f"{why}: not using a local model cache", *long_names])
    warnings = [*long_names]
    if choice.unfit is not None:
        warnings.append(_unfit_warning(choice, requested))
    if not has_downloaded_copy(choice.cache):
        warnings.append(_not_downloaded_warning(choice))
    return Decision(
        labels={
            isvc_api.LOCAL_MODEL_LABEL: choice.cache.name,
            isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: choice.namespace,
        },
        annotations={
            isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: choice.cache.spec.source_model_uri,
            isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: choice.pvc_name,
            sharedroute.SHARED_VOLUME_CACHE_ANNOTATION: None,
        },
        choice=choice,
        warnings=tuple(warnings),
    )
