"""The InferenceService admission handler: `IsvcMutator` reads caches, node groups and nodes
from informer stores (the narrow `Lister` protocol; no API call per request), applies
`isvc.decide` and answers with a JSON patch. Until those stores have synced it admits the ISVC
unchanged with a warning, so an empty cache at start-up never strips labels. Not promised: the
download state in the warning and the nodes the group is judged by are as fresh as the
informer caches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic
import structlog

from localcache.api import inferenceservice as isvc_api
from localcache.api import modelcache, nodegroup
from localcache.caching import groupfit
from localcache.runtime import keys as runtime_keys
from localcache.runtime.serving import review
from localcache.webhooks import isvc, stores

log = structlog.get_logger(__name__)

Obj = dict[str, Any]


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
            served = isvc_api.InferenceService.from_dict(obj)
        except pydantic.ValidationError as exc:
            log.info("isvc_mutation.unparsable", error=str(exc))
            return review.allowed()
        if not served.metadata.namespace and request.namespace:
            served.metadata.namespace = request.namespace
        uri, enabled = served.storage_uri, self._enabled()
        namespace_caches: list[modelcache.LocalModelNamespaceCache] = []
        cluster_caches: list[modelcache.LocalModelCache] = []
        if uri and enabled and not served.local_model_disabled:
            namespace_caches = stores.parse_all(
                modelcache.LocalModelNamespaceCache,
                stores.serving_caches(self._namespace_caches.list(served.namespace), uri),
            )
            cluster_caches = stores.parse_all(
                modelcache.LocalModelCache, stores.serving_caches(self._caches.list(), uri)
            )
        decision = isvc.decide(
            served,
            namespace_caches=namespace_caches,
            cluster_caches=cluster_caches,
            node_group_exists=self._node_group_exists,
            enabled=enabled,
            fit=self._fit(obj) if cluster_caches or namespace_caches else None,
        )
        ops = review.metadata_patch(obj, labels=decision.labels, annotations=decision.annotations)
        ops += [{"op": "replace", "path": p, "value": v} for p, v in decision.rewrites]
        if decision.routed_uri is not None:
            log.info("isvc_mutation.routed_to_shared_volume", uri=decision.routed_uri)
        if decision.choice is not None:
            log.debug(
                "isvc_mutation.cache_chosen",
                cache=isvc.describe(decision.choice.cache),
                node_group=decision.choice.node_group,
            )
        return review.patched(ops, warnings=decision.warnings)
