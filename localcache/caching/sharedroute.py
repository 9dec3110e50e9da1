"""Routing serving objects to a shared-volume namespace cache (`spec.pvcRef`, KServe #6107), pure.

A LocalModelNamespaceCache with `spec.pvcRef` keeps one copy of its model on the tenant's
ReadWriteMany claim, at `models/<storage key>`. A serving object's model URI that the cache
serves (`keys.match_storage_uri`) is rewritten to `pvc://<pvcRef>/models/<storage key><subPath>`
(`routed_uri`), which KServe's controllers mount read-only as any `pvc://` URI, but only once
the cache is Ready (`not_ready` is None): its `Ready` condition is True and was set for the
cache's current `metadata.generation` (`observedGeneration` at least it). Until then the cache
counts as absent and the object keeps its URI.

`subPath` is what the object's URI adds below the cache's (one trailing `/` of each ignored,
as matching ignores it): `gs://b/m` → `` and `gs://b/m/x` → `/x` for a cache of `gs://b/m`
or `gs://b/m/`. (KServe's `BuildCachedPVCURI` appends a `/` for an equal URI; both name the
same folder.)
"""

from __future__ import annotations

from typing import Final

from localcache.api import meta, modelcache
from localcache.caching import keys

SHARED_VOLUME_CACHE_ANNOTATION: Final = "localcache.kserve.io/shared-volume-cache"
"""On a serving object routed to shared volumes: the names of the caches, `,`-separated."""
PVC_SCHEME: Final = "pvc://"

AnyCache = modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache


def is_shared(cache: AnyCache) -> bool:
    """A namespace cache in shared-volume mode (its `spec.nodeGroups` is empty)."""
    spec = cache.spec
    return isinstance(spec, modelcache.LocalModelNamespaceCacheSpec) and spec.shared_volume


def not_ready(cache: modelcache.LocalModelNamespaceCache) -> str | None:
    """Why the cache may not be routed to yet (its Ready condition's reason and message, or
    that it has none, or that it is older than the spec); None when it may."""
    conditions = (cache.status.conditions if cache.status else None) or []
    ready = next((c for c in conditions if c.type == modelcache.CONDITION_READY), None)
    if ready is None:
        return "no status yet"
    generation = cache.metadata.generation or 0
    if ready.status != meta.ConditionStatus.TRUE:
        detail = f"{ready.reason}: {ready.message}" if ready.message else ready.reason
        return f"Ready is {ready.status.value} ({detail})"
    if ready.observed_generation is None or ready.observed_generation < generation:
        return (
            f"Ready was observed for generation {ready.observed_generation or 0}, the spec is "
            f"at generation {generation}"
        )
    return None


def routed_uri(cache: modelcache.LocalModelNamespaceCache, uri: str) -> str:
    """`pvc://<pvcRef>/models/<storage key><subPath>` for `uri`, which the cache serves."""
    source = cache.spec.source_model_uri
    base = source.removesuffix("/")
    sub = uri[len(base) :] if uri.startswith(base) else ""
    if sub == "/":
        sub = ""
    return f"{PVC_SCHEME}{cache.spec.pvc_ref}/models/{keys.storage_key(source)}{sub}"


def copy_prefix(cache: modelcache.LocalModelNamespaceCache) -> str:
    """`pvc://<pvcRef>/models/<storage key>`: the URIs at or under it read the cache's copy."""
    return routed_uri(cache, cache.spec.source_model_uri)


def names(value: str | None) -> list[str]:
    """The cache names of a `SHARED_VOLUME_CACHE_ANNOTATION` value."""
    return [n for n in (value or "").split(",") if n]


def annotation(cache_names: set[str]) -> str | None:
    """The annotation value for `cache_names`; None (remove it) when there are none."""
    return ",".join(sorted(cache_names)) or None


def describe(cache: modelcache.LocalModelNamespaceCache) -> str:
    return f"LocalModelNamespaceCache {cache.namespace}/{cache.name} (claim {cache.spec.pvc_ref})"


def not_ready_warning(cache: modelcache.LocalModelNamespaceCache, why: str) -> str:
    return (
        f"{describe(cache)} is not Ready ({why}): the model URI is left as it is, as if the "
        "cache were absent; it is routed to the shared volume when the object is created or "
        "updated after the cache is Ready"
    )


def specificity(cache: AnyCache) -> tuple[int, str]:
    """Sort key among caches serving one URI: longest source URI first (one trailing `/`
    ignored), then name."""
    return (-len(cache.spec.source_model_uri.removesuffix("/")), cache.name)


def pick(
    uri: str,
    caches: list[modelcache.LocalModelNamespaceCache],
    *,
    blocked: str | None = None,
) -> tuple[modelcache.LocalModelNamespaceCache | None, list[str]]:
    """The most specific Ready shared cache of `caches` (those of the object's namespace)
    serving `uri`, and a warning for each one that serves it but is not used: not Ready, or
    `blocked` (why this URI cannot be rewritten) when given. Caches being deleted are absent."""
    ready: list[modelcache.LocalModelNamespaceCache] = []
    warnings: list[str] = []
    for cache in caches:
        if not is_shared(cache) or cache.metadata.deletion_timestamp:
            continue
        if not keys.match_storage_uri(cache.spec.source_model_uri, uri):
            continue
        why = not_ready(cache)
        if why is not None:
            warnings.append(not_ready_warning(cache, why))
        elif blocked is not None:
            warnings.append(f"{describe(cache)} is Ready but not used: {blocked}")
        else:
            ready.append(cache)
    return (min(ready, key=specificity) if ready else None), warnings
