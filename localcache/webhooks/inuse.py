"""Who uses a cache, for delete validation: live InferenceServices and LLMInferenceServices
whose use is proven (a label or annotation alone proves nothing: a tenant could label an
object with any cluster cache's name and so block its deletion), and the denial naming them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localcache.api import modelcache
from localcache.caching import indexes, llmuse
from localcache.caching import keys as cache_keys
from localcache.runtime import keys as runtime_keys
from localcache.webhooks import capacity, isvc, stores

Violation = capacity.Violation

AnyCache = modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache
Obj = dict[str, Any]


def isvc_users(
    isvcs: stores.Indexed, cache: AnyCache, *, index: str
) -> list[runtime_keys.ObjectKey]:
    """The live InferenceServices labelled for `cache` (`index` of the store) whose storage URI
    it serves."""
    key = cache_keys.status_key(cache.name, cache.namespace or None)
    return [
        runtime_keys.ObjectKey.of(o)
        for o in isvcs.by_index(index, key)
        if indexes.isvc_uses_uri(o, cache.spec.source_model_uri)
    ]


def llm_users(
    llmisvcs: stores.Indexed | None, cache: AnyCache
) -> list[tuple[runtime_keys.ObjectKey, str]]:
    """The live LLMInferenceServices whose use of `cache` is proven (`llmuse.uses`), with how;
    none when LLMInferenceServices are not watched."""
    if llmisvcs is None:
        return []
    key = cache_keys.status_key(cache.name, cache.namespace or None)
    found = llmuse.proven(
        llmisvcs.by_index(llmuse.USED_CACHE_INDEX, key),
        cache_namespace=cache.namespace or "",
        cache_name=cache.name,
        cache_uri=cache.spec.source_model_uri,
    )
    return [
        (runtime_keys.ObjectKey.of(o), ", ".join(u.describe() for u in sorted(used)))
        for o, used in found
    ]


def check_in_use(
    cache: AnyCache,
    *,
    users: Sequence[runtime_keys.ObjectKey],
    llm_users: Sequence[tuple[runtime_keys.ObjectKey, str]] = (),
) -> list[Violation]:
    kinds = (
        ("status.inferenceServices", "InferenceService", [(k, "") for k in users]),
        ("status.llmInferenceServices", "LLMInferenceService", list(llm_users)),
    )
    found = []
    for where, kind, named in kinds:
        if named:
            (key, how), *rest = sorted(named)
            more = f" (and {len(rest)} more)" if rest else ""
            used = f"{kind} {key.namespace}/{key.name}" + (f" ({how})" if how else "")
            found.append(Violation(where, f"{isvc.describe(cache)} is being used by {used}{more}"))
    return found
