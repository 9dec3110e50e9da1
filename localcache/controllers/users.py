"""Who uses a cache, and which serving claims they need: InferenceServices (`scope.isvcs_of`)
and KServe's LLMInferenceServices (base model or LoRA adapter, `caching.llmuse`).

- `llm_users_of` reads the LLMInferenceService store (none when the kind is not watched) by
  the `BY_USED_CACHE` index and keeps the objects whose use is proven (`llmuse.uses`).
- `serving` gives the (namespace, node group) pairs that need a serving PV/PVC: per user, its
  `serving.kserve.io/nodegroup` annotation when that is one of the cache's groups, else the
  cache's first group (KServe's rule for the base model; a LoRA adapter's claim is the one
  KServe's controller recomputes, `<cache>-<that group>`). It also gives the pairs whose old,
  hash-shortened claim (`names.legacy_serving_pvc`) a user still names in its
  `localmodel-pvc-name` annotation: those are kept beside the plain one until no user names
  them (README "Serving claim names").
- `map_llmisvc` and `llmisvc_changed` feed the cache controllers from LLMInferenceService
  events (`setup`): added/deleted, or a change of what decides a use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from localcache.api import inferenceservice, modelcache
from localcache.caching import indexes, llmuse, names, sharedvolume
from localcache.controllers import scope, state
from localcache.runtime import keys as runtime_keys
from localcache.runtime import store

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
BY_USED_CACHE: Final = llmuse.USED_CACHE_INDEX
"""LLMInferenceServices by the status key of each cache they are labelled/annotated for."""
LLMISVC_INDEXERS: Final = {BY_USED_CACHE: llmuse.used_caches}
MAX_TRACKED: Final = 1000
"""Entries of each users list in a cache's status (`tracked`)."""


@dataclass(frozen=True, slots=True)
class LlmUser:
    obj: Obj
    uses: list[llmuse.Use]


@dataclass(slots=True)
class Serving:
    """What `serving` found: pairs wanted, and the old-named pairs still named by a user."""

    pairs: set[tuple[str, str]] = field(default_factory=set)
    legacy: set[tuple[str, str]] = field(default_factory=set)


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def llm_users_of(sc: scope.Scope, stores: state.Stores, cache: scope.CacheModel) -> list[LlmUser]:
    """The LLMInferenceServices whose use of `cache` is proven (module docstring)."""
    reader: store.Reader | None = stores.llm_inference_services
    if reader is None:
        return []
    found = llmuse.proven(
        reader.by_index(BY_USED_CACHE, sc.status_key(cache)),
        cache_namespace=cache.namespace if sc.namespaced else "",
        cache_name=cache.name,
        cache_uri=cache.spec.source_model_uri,
    )
    return [LlmUser(obj, used) for obj, used in found]


def _group(cache: scope.CacheModel, obj: Obj, *, reads_claim_name: bool = False) -> str | None:
    """The node group whose serving claim `obj` needs: for a user that reads
    `localmodel-pvc-name` (an InferenceService, an LLMInferenceService's base model), the group
    of the claim it names (the webhook picks the group the workload can run on), else the
    `serving.kserve.io/nodegroup` annotation when the cache lists it, else the first group."""
    meta = _meta(obj)
    annotations = meta.get("annotations") or {}
    if reads_claim_name:
        claim = annotations.get(inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION)
        for group in cache.spec.node_groups:
            if claim in (
                names.serving_pvc(cache.name, group),
                names.legacy_serving_pvc(cache.name, group),
            ):
                return group
    wanted = annotations.get(inferenceservice.NODE_GROUP_ANNOTATION)
    if wanted and wanted not in cache.spec.node_groups:
        _log.info(
            "user_node_group_not_in_cache",
            kind=obj.get("kind"),
            name=meta.get("name"),
            node_group=wanted,
        )
        return None
    return str(wanted or cache.spec.node_groups[0])


def serving(
    cache: scope.CacheModel, *, isvcs: Iterable[Obj], llm_users: Iterable[LlmUser]
) -> Serving:
    """The serving pairs the users need (module docstring)."""
    out = Serving()
    named: list[tuple[Obj, bool]] = [(o, True) for o in isvcs]
    for user in llm_users:
        named.append((user.obj, any(u.how == "base model" for u in user.uses)))
        for use in user.uses:
            if use.how == "LoRA adapter" and (group := _group(cache, user.obj)) is not None:
                _check_plain(cache, group, user.obj, use)
    for obj, reads_claim_name in named:
        group = _group(cache, obj, reads_claim_name=reads_claim_name)
        if group is None:
            continue
        namespace = str(_meta(obj).get("namespace") or "")
        out.pairs.add((namespace, group))
        legacy = names.legacy_serving_pvc(cache.name, group)
        claim = (_meta(obj).get("annotations") or {}).get(
            inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION
        )
        if reads_claim_name and claim == legacy != names.serving_pvc(cache.name, group):
            out.legacy.add((namespace, group))
    return out


def _check_plain(cache: scope.CacheModel, group: str, obj: Obj, use: llmuse.Use) -> None:
    plain = names.plain_serving_pvc(cache.name, group)
    if names.serving_pvc(cache.name, group) != plain:
        _log.warning(
            "lora_claim_name_not_plain",
            llmisvc=f"{_meta(obj).get('namespace')}/{_meta(obj).get('name')}",
            adapter=use.adapter,
            claim=plain[:80],
            reason=f"longer than {names.MAX_NAME} characters: KServe's claim cannot exist",
        )


def tracked(objs: Iterable[Obj]) -> list[Obj]:
    """`status.inferenceServices` / `status.llmInferenceServices` entries, sorted, distinct,
    the first `MAX_TRACKED` only: tenants of every namespace may label objects for a cluster
    cache, and its status must stay far below etcd's object size limit (deletion is guarded
    from the stores, not from this list)."""
    refs = {(str(_meta(o).get("namespace")), str(_meta(o).get("name"))) for o in objs}
    return [{"namespace": ns, "name": name} for ns, name in sorted(refs)[:MAX_TRACKED]]


# ------------------------------------------------------------------------ watch wiring


def map_llmisvc(sc: scope.Scope) -> Any:
    """Handler mapping: the caches of `sc`'s kind the object is labelled/annotated for."""

    def keys_of(obj: Obj) -> list[runtime_keys.ObjectKey]:
        return [k for sk in llmuse.used_caches(obj) if (k := sc.key_of_status_key(sk)) is not None]

    return keys_of


def _relevant(obj: Obj) -> tuple[Any, ...]:
    meta = _meta(obj)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return (
        labels.get(inferenceservice.LOCAL_MODEL_LABEL),
        labels.get(inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL),
        annotations.get(llmuse.LORA_ANNOTATION),
        annotations.get(inferenceservice.NODE_GROUP_ANNOTATION),
        annotations.get(inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION),
        annotations.get(inferenceservice.LOCAL_MODEL_SOURCE_URI_ANNOTATION),  # baseRefs proof
        llmuse.model_uri(obj),
        tuple(llmuse.adapter_uris(obj)),
        llmuse.has_base_refs(obj),
    )


def isvc_changed(old: Obj, new: Obj) -> bool:
    """Update predicate of InferenceServices: what decides their use or claims changed."""

    def relevant(obj: Obj) -> tuple[Any, ...]:
        labels = _meta(obj).get("labels") or {}
        annotations = _meta(obj).get("annotations") or {}
        return (
            labels.get(inferenceservice.LOCAL_MODEL_LABEL),
            labels.get(inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL),
            annotations.get(inferenceservice.NODE_GROUP_ANNOTATION),
            annotations.get(inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION),
            indexes.isvc_storage_uri(obj),  # a use is proven by the URI too (scope.isvcs_of)
        )

    return relevant(old) != relevant(new)


def llmisvc_changed(old: Obj, new: Obj) -> bool:
    """Update predicate: what decides a use (or its claims) changed."""
    return _relevant(old) != _relevant(new)


def shared_users(stores: state.Stores, cache: modelcache.LocalModelNamespaceCache) -> Obj:
    """`inferenceServices` / `llmInferenceServices` of a shared-volume cache: the workloads of
    its namespace whose model or adapter URI it serves (`sharedvolume.uses`: proof by URI,
    routed or not; such workloads carry no cache label)."""
    out: Obj = {}
    ref, uri = cache.spec.pvc_ref or "", cache.spec.source_model_uri

    def serves(value: str | None) -> bool:
        return sharedvolume.uses(value, cache_uri=uri, pvc_ref=ref)

    isvcs, llms = stores.inference_services, stores.llm_inference_services
    if isvcs is not None:
        found = [o for o in isvcs.list(cache.namespace) if serves(indexes.isvc_storage_uri(o))]
        out["inferenceServices"] = tracked(found)
    if llms is not None:
        out["llmInferenceServices"] = tracked(
            o
            for o in llms.list(cache.namespace)
            if serves(llmuse.model_uri(o)) or any(serves(a) for a in llmuse.adapter_uris(o))
        )
    return out
