"""LLMInferenceService mutation (v1alpha1 and v1alpha2, one handler): tie an
LLMInferenceService and its LoRA adapters to the local model caches that serve them.

`decide()` is the whole rule, pure; it applies InferenceService mutation's rule
(`isvc.match`: namespace caches of the object's namespace first, then cluster caches, the most
specific source URI, `serving.kserve.io/nodegroup`, node groups that must exist) to the model
fields `llmbase.resolve()` merged from `spec.baseRefs`:
- Every key below is removed when `localModel.enabled` is false or the LLMInferenceService
  carries `serving.kserve.io/disable-localmodel` (presence alone counts), as KServe's defaulter
  does; also when the merged `storageInitializer.enabled` is false: KServe's controller then
  skips model attachment and the local-cache rewrite, so a claim would serve nobody (a warning
  says so when a model URI is set).
- The model URI (`spec.model.uri`, else the merged base configurations') sets or removes the
  same four keys as for an InferenceService: labels `internal.serving.kserve.io/localmodel`,
  `…/localmodel-namespace`, annotations `…/localmodel-sourceuri`, `…/localmodel-pvc-name`.
- Each well-formed LoRA adapter (`spec.model.lora.adapters[]` with a name and a URI; at most
  `MAX_ADAPTERS`) is matched the same way; the annotation `…/localmodel-lora` holds
  `{"<adapter>": {"cache", "namespace" (namespace caches only)}}` for
  those that matched, written as KServe's `MarshalLoRACacheAnnotation` writes it (Go's
  `encoding/json`: adapters sorted, no spaces, `<`, `>`, `&` escaped), and is removed when none
  matched. A later adapter of the same name wins, as in KServe's map.
- Shared-volume namespace caches (`isvc.match`, `caching.sharedroute`): a Ready one chosen
  for the model URI rewrites `spec.model.uri`, and for an adapter that adapter's `uri`, to
  `pvc://<pvcRef>/models/<storage key><subPath>`; such an adapter has no `…/localmodel-lora`
  entry, the base model no node-group key (`…/localmodel-sourceuri` records its original
  URI), and `localcache.kserve.io/shared-volume-cache` lists the caches. Only a URI the object
  sets itself is rewritten: one from `spec.baseRefs` is not (copying it into the object would
  detach the object from its configuration), a warning says so and the cache counts as
  absent. A model URI that is `pvc://` with that annotation (routed before) is left alone,
  as are adapters whose URI is `pvc://`.
- When `spec.baseRefs` cannot be resolved (`llmbase` lists the reasons), a warning names the
  reason; the base-model keys are left as they are unless the LLMInferenceService sets its own
  URI, and the LoRA annotation unless it lists its own adapters. The rule never denies.

`LlmIsvcMutator` is the admission handler: it reads caches, node groups and
LLMInferenceServiceConfigs from informer stores (no API call per request) and answers with a
JSON patch on metadata only, the same in both API versions. Until the cache stores have synced
it admits unchanged with a warning. It is registered with `reinvocationPolicy: IfNeeded`
(manifests/webhook/mutating.yaml) so that it has the last word over KServe's defaulter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import pydantic
import structlog

from localcache.api import inferenceservice as isvc_api
from localcache.api import llminferenceservice as llm_api
from localcache.api import modelcache, nodegroup
from localcache.caching import groupfit, sharedroute
from localcache.runtime import informer
from localcache.runtime import keys as runtime_keys
from localcache.runtime.crds import optional
from localcache.runtime.serving import review
from localcache.webhooks import isvc, llmbase, stores

log = structlog.get_logger(__name__)

MUTATE_PATH: Final = "/mutate-serving-kserve-io-llminferenceservice"
MAX_ADAPTERS: Final = 64
LABEL_KEYS: Final = isvc.LABEL_KEYS
ANNOTATION_KEYS: Final = (*isvc.ANNOTATION_KEYS, llm_api.LOCAL_MODEL_LORA_ANNOTATION)

Obj = dict[str, Any]


def _cleared(warnings: Iterable[str] = ()) -> isvc.Decision:
    return isvc.Decision(
        labels=dict.fromkeys(LABEL_KEYS),
        annotations=dict.fromkeys(ANNOTATION_KEYS),
        warnings=tuple(warnings),
    )


def lora_annotation(choices: Mapping[str, isvc.Choice]) -> str | None:
    """The `localmodel-lora` value for adapters matched to caches; None when there are none."""
    if not choices:
        return None
    entries: dict[str, dict[str, str]] = {}
    for name in sorted(choices):
        choice = choices[name]
        entry = {"cache": choice.cache.name}
        if choice.namespace:
            entry["namespace"] = choice.namespace
        entries[name] = entry
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def decide(
    llmisvc: llm_api.LLMInferenceService,
    *,
    resolved: llmbase.Resolved,
    namespace_caches: Iterable[modelcache.LocalModelNamespaceCache],
    cluster_caches: Iterable[modelcache.LocalModelCache],
    node_group_exists: isvc.NodeGroupExists | None = None,
    enabled: bool = True,
    fit: groupfit.GroupFit | None = None,
) -> isvc.Decision:
    """The local-model labels and annotations `llmisvc` should carry (module docstring);
    `resolved` is its spec merged with its base configurations (`llmbase.resolve`); `fit`
    (optional) judges the base model's node group by the workloads' node constraints."""
    own = llmisvc.spec or llm_api.LLMInferenceServiceSpec()
    if isvc.routed_before(own.model_uri, llmisvc.annotations) and (
        not enabled or llmisvc.local_model_disabled or resolved.storage_initializer_enabled is False
    ):
        return isvc.Decision(labels={}, annotations={})
    if not enabled or llmisvc.local_model_disabled:
        return _cleared()
    if resolved.storage_initializer_enabled is False:
        return _cleared(
            [
                "spec.storageInitializer.enabled is false: KServe mounts no model cache, so "
                "localcache does not set one"
            ]
            if resolved.uri
            else []
        )
    own_caches = [c for c in namespace_caches if c.namespace == llmisvc.namespace]
    clusters = list(cluster_caches)

    def match(
        uri: str, fit: groupfit.GroupFit | None = None, blocked: str | None = None
    ) -> isvc.Decision:
        return isvc.match(
            uri,
            namespace=llmisvc.namespace,
            requested=llmisvc.node_group,
            namespace_caches=own_caches,
            cluster_caches=clusters,
            node_group_exists=node_group_exists,
            fit=fit,
            shared_blocked=blocked,
        )

    warnings: list[str] = []
    if resolved.unresolved:
        warnings.append(f"spec.baseRefs not resolved ({resolved.unresolved})")
    labels: dict[str, str | None] = {}
    annotations: dict[str, str | None] = {}
    choice: isvc.Choice | None = None
    rewrites: list[tuple[str, str]] = []
    routed: set[str] = set()
    keep_routed = False  # a URI routed before: keep the caches the annotation lists
    if resolved.uri and isvc.routed_before(resolved.uri, llmisvc.annotations):
        keep_routed = True
    elif resolved.uri:
        base = match(resolved.uri, fit, None if own.model_uri else FROM_BASE_REFS)
        labels, annotations, choice = dict(base.labels), dict(base.annotations), base.choice
        warnings.extend(base.warnings)
        if base.routed_uri is not None:
            rewrites.append(("/spec/model/uri", base.routed_uri))
            routed.update(sharedroute.names(annotations[SHARED]))
    elif not resolved.unresolved:
        labels, annotations = dict.fromkeys(LABEL_KEYS), dict.fromkeys(isvc.ANNOTATION_KEYS)
    elif (llmisvc.labels.keys() | llmisvc.annotations.keys()) & {*LABEL_KEYS, *ANNOTATION_KEYS}:
        warnings.append("local model labels left as they were")
    if resolved.adapters is not None or not resolved.unresolved:
        adapters, problems = llm_api.adapters(resolved.adapters, limit=MAX_ADAPTERS)
        warnings.extend(problems)
        chosen: dict[str, isvc.Choice] = {}
        own_adapters = bool(own.raw_adapters)
        indices = _adapter_indices(resolved.adapters) if own_adapters else []
        for n, adapter in enumerate(adapters):
            keep_routed = keep_routed or adapter.uri.startswith(sharedroute.PVC_SCHEME)
            found = match(adapter.uri, None, None if own_adapters else FROM_BASE_REFS)
            if found.routed_uri is not None:
                rewrites.append((f"/spec/model/lora/adapters/{indices[n]}/uri", found.routed_uri))
                routed.update(sharedroute.names(found.annotations[SHARED]))
                chosen.pop(adapter.name, None)
            elif found.choice is not None:
                chosen[adapter.name] = found.choice
            warnings.extend(f"LoRA adapter {adapter.name}: {w}" for w in found.warnings)
        annotations[llm_api.LOCAL_MODEL_LORA_ANNOTATION] = lora_annotation(chosen)
    if keep_routed:
        routed.update(sharedroute.names(llmisvc.annotations.get(SHARED)))
    if SHARED in annotations or routed or keep_routed:
        annotations[SHARED] = sharedroute.annotation(routed)
    return isvc.Decision(
        labels=labels,
        annotations=annotations,
        choice=choice,
        warnings=tuple(warnings),
        rewrites=tuple(rewrites),
    )


SHARED: Final = sharedroute.SHARED_VOLUME_CACHE_ANNOTATION
FROM_BASE_REFS: Final = (
    "the URI comes from spec.baseRefs (an LLMInferenceServiceConfig) and localcache rewrites "
    "only URIs the LLMInferenceService sets itself: set it in the LLMInferenceService's spec"
)


def _adapter_indices(raw: Any) -> list[int]:
    """The indices in `raw` of the adapters `llm_api.adapters` returns, in its order."""
    if not isinstance(raw, list):
        return []
    return [
        i
        for i, entry in enumerate(raw[:MAX_ADAPTERS])
        if isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and entry["name"]
        and isinstance(entry.get("uri"), str)
        and entry["uri"]
    ]


# ------------------------------------------------------------------------ admission handler


def config_use(obj: Obj) -> Obj:
    """The informer transform of LLMInferenceServiceConfigs: metadata and, of the spec, only
    `model` and `storageInitializer` (configurations carry whole pod templates)."""
    slim = informer.metadata_only(obj)
    spec = obj.get("spec")
    if isinstance(spec, dict):
        kept = {k: spec[k] for k in ("model", "storageInitializer") if k in spec}
        if kept:
            slim["spec"] = kept
    return slim


WORKLOADS: Final = (
    (("template",), "spec.template"),
    (("worker",), "spec.worker"),
    (("prefill", "template"), "spec.prefill.template"),
    (("prefill", "worker"), "spec.prefill.worker"),
)
"""The pod templates of an LLMInferenceService that mount the model (KServe renders decode,
prefill and LeaderWorkerSet workers from them): the node group must fit them all."""


def _workloads(obj: Obj) -> list[tuple[Any, str]]:
    found = []
    for path, what in WORKLOADS:
        node: Any = obj.get("spec")
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            found.append((node, what))
    return found


class LlmIsvcMutator:
    """The admission handler for LLMInferenceService CREATE/UPDATE (module docstring)."""

    def __init__(
        self,
        *,
        caches: stores.Lister,
        namespace_caches: stores.Lister,
        node_groups: stores.Lister,
        nodes: stores.Lister | None = None,
        configs: stores.Lister,
        configs_served: Callable[[], bool],
        kserve_namespace: str,
        enabled: Callable[[], bool],
        synced: Callable[[], bool],
    ) -> None:
        self._caches = caches
        self._namespace_caches = namespace_caches
        self._node_groups = node_groups
        self._nodes = nodes
        self._configs = configs
        self._configs_served = configs_served
        self._kserve_namespace = kserve_namespace
        self._enabled = enabled
        self._synced = synced

    def _node_group_exists(self, name: str) -> bool:
        return self._node_groups.get(runtime_keys.ObjectKey("", name)) is not None

    def _fit(self, obj: Obj) -> groupfit.GroupFit | None:
        """The group fit of the object's own workloads (`WORKLOADS`); None when none of them
        has a node constraint."""
        workloads = [groupfit.Workload.of(pod, what) for pod, what in _workloads(obj)]
        if not any(w.constrained for w in workloads):
            return None
        groups = stores.parse_all(nodegroup.LocalModelNodeGroup, self._node_groups.list())
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return groupfit.GroupFit(
            node_groups={g.name: g for g in groups},
            nodes=self._nodes.list() if self._nodes is not None else None,
            workloads=workloads,
            current_claim=annotations.get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION),
        )

    def _lookup(self, namespace: str, name: str) -> Obj | None:
        if not self._configs_served():
            raise llmbase.Unavailable("the LLMInferenceServiceConfig kind is not served")
        try:
            return self._configs.get(runtime_keys.ObjectKey(namespace, name))
        except optional.NotSynced as exc:
            raise llmbase.Unavailable(
                "localcache is still listing LLMInferenceServiceConfigs"
            ) from exc

    async def __call__(self, request: review.Request) -> review.Response:
        if (early := stores.early_answer(request, synced=self._synced())) is not None:
            return early
        obj = request.object
        assert obj is not None  # early_answer answered otherwise
        try:
            llmisvc = llm_api.LLMInferenceService.from_dict(obj)
        except pydantic.ValidationError as exc:
            log.info("llmisvc_mutation.unparsable", error=str(exc))
            return review.allowed()
        if not llmisvc.metadata.namespace and request.namespace:
            llmisvc.metadata.namespace = request.namespace
        enabled = self._enabled()
        spec = llmisvc.spec or llm_api.LLMInferenceServiceSpec()
        resolved = llmbase.Resolved(uri=None)
        namespace_caches: list[modelcache.LocalModelNamespaceCache] = []
        cluster_caches: list[modelcache.LocalModelCache] = []
        if enabled and not llmisvc.local_model_disabled:
            resolved = llmbase.resolve(
                spec,
                namespace=llmisvc.namespace,
                kserve_namespace=self._kserve_namespace,
                lookup=self._lookup,
            )
            adapters, _ = llm_api.adapters(resolved.adapters, limit=MAX_ADAPTERS)
            uris = [u for u in (resolved.uri, *(a.uri for a in adapters)) if u]
            if uris:
                namespace_caches = stores.parse_all(
                    modelcache.LocalModelNamespaceCache,
                    stores.serving_caches(self._namespace_caches.list(llmisvc.namespace), *uris),
                )
                cluster_caches = stores.parse_all(
                    modelcache.LocalModelCache, stores.serving_caches(self._caches.list(), *uris)
                )
        decision = decide(
            llmisvc,
            resolved=resolved,
            namespace_caches=namespace_caches,
            cluster_caches=cluster_caches,
            node_group_exists=self._node_group_exists,
            enabled=enabled,
            fit=self._fit(obj) if namespace_caches or cluster_caches else None,
        )
        ops = review.metadata_patch(obj, labels=decision.labels, annotations=decision.annotations)
        ops += [{"op": "replace", "path": p, "value": v} for p, v in decision.rewrites]
        if decision.choice is not None:
            log.debug(
                "llmisvc_mutation.cache_chosen",
                cache=isvc.describe(decision.choice.cache),
                node_group=decision.choice.node_group,
            )
        return review.patched(ops, warnings=decision.warnings)
