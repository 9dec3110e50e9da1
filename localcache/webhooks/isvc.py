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
- Warnings: the chosen cache has no downloaded copy yet (`copies.available` is 0 or no node
  reports `NodeDownloaded`), the node-group annotation excluded every cache of the URI, the
  chosen group has no node the predictor can be scheduled on, or a cache of the URI has a
  name too long for a label.

`IsvcMutator` is the thin admission handler: it reads caches, node groups and nodes from
informer stores (the narrow `Lister` protocol; no API call per request) and answers with a
JSON patch. Until those stores have synced it admits the ISVC unchanged with a warning, so an
empty cache at start-up never strips labels. Not promised: the download state in the warning
and the nodes the group is judged by are as fresh as the informer caches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import pydantic
import structlog

from localcache.api import inferenceservice as isvc_api
from localcache.api import modelcache, nodegroup
from localcache.caching import cachename, groupfit, names
from localcache.caching import keys as cache_keys
from localcache.runtime import keys as runtime_keys
from localcache.runtime.serving import review
from localcache.webhooks import stores

log = structlog.get_logger(__name__)

MUTATE_PATH: Final = "/mutate-serving-kserve-io-v1beta1-inferenceservice"

LABEL_KEYS: Final = (isvc_api.LOCAL_MODEL_LABEL, isvc_api.LOCAL_MODEL_NAMESPACE_LABEL)
ANNOTATION_KEYS: Final = (
    isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION,
    isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION,
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
    return (-len(choice.cache.spec.source_model_uri.removesuffix("/")), choice.cache.name)


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
        if cache.metadata.deletion_timestamp:
            continue
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
    if not enabled or isvc.local_model_disabled or not uri:
        return _cleared()
    return match(
        uri,
        namespace=isvc.namespace,
        requested=isvc.node_group,
        namespace_caches=namespace_caches,
        cluster_caches=cluster_caches,
        node_group_exists=node_group_exists,
        fit=fit,
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
) -> Decision:
    """The cache of `uri` for a serving object in `namespace` that asked for node group
    `requested` (None: none asked) and whose workloads `fit` judges: the rule of the module
    docstring past its first point, shared by InferenceService and LLMInferenceService."""
    own = [c for c in namespace_caches if c.namespace == namespace]
    cluster = list(cluster_caches)
    pick = functools.partial(
        choose, uri, node_group=requested, node_group_exists=node_group_exists, fit=fit
    )
    choice, excluded = pick(own)
    long_names = _long_names(uri, own)
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
        },
        choice=choice,
        warnings=tuple(warnings),
    )


# ------------------------------------------------------------------------ admission handler


class IsvcMutator:
    """The admission handler for InferenceService CREATE/UPDATE (module docstring)."""

    def __init__(
        self,
        *,
        caches: stores.Lister,
        namespace_caches: stores.Lister,
        node_groups: stores.Lister,
        enabled: Callable[[], bool],
        synced: Callable[[], bool],
        nodes: stores.Lister | None = None,
    ) -> None:
        """`nodes` reads the cluster's Node objects (labels suffice); without it a constrained
        predictor still gets the first group (KServe's choice), unjudged."""
        self._caches = caches
        self._namespace_caches = namespace_caches
        self._node_groups = node_groups
        self._nodes = nodes
        self._enabled = enabled
        self._synced = synced

    def _node_group_exists(self, name: str) -> bool:
        return self._node_groups.get(runtime_keys.ObjectKey("", name)) is not None

    def _fit(self, obj: Obj) -> groupfit.GroupFit | None:
        """The group fit of the ISVC's predictor; None when it has no node constraint."""
        predictor = (obj.get("spec") or {}).get("predictor")
        workload = groupfit.Workload.of(predictor, "the predictor")
        if not workload.constrained:
            return None
        groups = stores.parse_all(nodegroup.LocalModelNodeGroup, self._node_groups.list())
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return groupfit.GroupFit(
            node_groups={g.name: g for g in groups},
            nodes=self._nodes.list() if self._nodes is not None else None,
            workloads=(workload,),
            current_claim=annotations.get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION),
        )

    async def __call__(self, request: review.Request) -> review.Response:
        if (early := stores.early_answer(request, synced=self._synced())) is not None:
            return early
        obj = request.object
        assert obj is not None  # early_answer answered otherwise
        try:
            isvc = isvc_api.InferenceService.from_dict(obj)
        except pydantic.ValidationError as exc:
            log.info("isvc_mutation.unparsable", error=str(exc))
            return review.allowed()
        if not isvc.metadata.namespace and request.namespace:
            isvc.metadata.namespace = request.namespace
        uri, enabled = isvc.storage_uri, self._enabled()
        namespace_caches: list[modelcache.LocalModelNamespaceCache] = []
        cluster_caches: list[modelcache.LocalModelCache] = []
        if uri and enabled and not isvc.local_model_disabled:
            namespace_caches = stores.parse_all(
                modelcache.LocalModelNamespaceCache,
                stores.serving_caches(self._namespace_caches.list(isvc.namespace), uri),
            )
            cluster_caches = stores.parse_all(
                modelcache.LocalModelCache, stores.serving_caches(self._caches.list(), uri)
            )
        decision = decide(
            isvc,
            namespace_caches=namespace_caches,
            cluster_caches=cluster_caches,
            node_group_exists=self._node_group_exists,
            enabled=enabled,
            fit=self._fit(obj) if cluster_caches or namespace_caches else None,
        )
        ops = review.metadata_patch(obj, labels=decision.labels, annotations=decision.annotations)
        if decision.choice is not None:
            log.debug(
                "isvc_mutation.cache_chosen",
                cache=describe(decision.choice.cache),
                node_group=decision.choice.node_group,
            )
        return review.patched(ops, warnings=decision.warnings)
