"""Which caches a KServe LLMInferenceService uses, read from the object alone (pure).

An LLMInferenceService (`serving.kserve.io`, v1alpha1 and v1alpha2 share these fields) uses a
cache in two ways, both with the keys KServe v0.20+ sets and reads:

    base model     label `internal.serving.kserve.io/localmodel` = cache name, plus label
                   `…/localmodel-namespace` = its own namespace for a namespace cache (none
                   for a cluster cache), as on InferenceServices; proven by `spec.model.uri`
                   lying at or under the cache's `sourceModelUri`
    LoRA adapter   annotation `internal.serving.kserve.io/localmodel-lora` = JSON
                   `{"<adapter>": {"cache": "<name>", "namespace": "<ns>"}}` (`namespace` only
                   for a namespace cache, which must be the object's own); proven by an entry of
                   `spec.model.lora.adapters[]` whose `uri` the cache serves

A label or annotation alone proves nothing (anyone who can edit the object can set it; with
the webhook down nothing checks it): a use also needs the URI, as for InferenceServices
(`indexes.isvc_uses_uri`). A model whose URI comes only from `spec.baseRefs` (an
LLMInferenceServiceConfig, resolved by the mutating webhook) has no URI in the object's spec:
for such an object (non-empty `spec.baseRefs`, no `spec.model.uri`, or no adapter URIs) the
URI the webhook recorded stands in, the annotation `…/localmodel-sourceuri` for the base model
and an entry's `sourceUri` for an adapter. That is the same proof (a tenant who knows the URI
could as well write it into the spec) and no weaker: the name alone still proves nothing.

The annotation is tenant input: it is read only when at most `MAX_LORA_ANNOTATION` characters
long, with at most `MAX_LORA_ENTRIES` entries, and as a JSON object of objects; anything else
is no LoRA use. `slim` (the informer transform the controllers and webhooks share) drops an
unreadable annotation and logs `llmisvc_lora_annotation_ignored` once per object version; it
keeps the metadata and, of the spec, only `model.uri` and the adapters' `name`/`uri` (at most
`MAX_ADAPTERS`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import structlog

from localcache.api import inferenceservice, llminferenceservice
from localcache.caching import keys
from localcache.runtime import informer

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
LORA_ANNOTATION: Final = llminferenceservice.LOCAL_MODEL_LORA_ANNOTATION
MAX_LORA_ANNOTATION: Final = 16 * 1024
MAX_LORA_ENTRIES: Final = 64
MAX_ADAPTERS: Final = 256
MAX_URI: Final = 4096

USED_CACHE_INDEX: Final = "localcache/llmisvc-used-cache"
"""The index of `used_caches`, shared by the controllers and the webhooks."""

How = Literal["base model", "LoRA adapter"]


@dataclass(frozen=True, slots=True, order=True)
class LoraEntry:
    """One entry of the LoRA annotation: adapter name, cache name, cache namespace ('' for a
    cluster cache)."""

    adapter: str
    cache: str
    namespace: str
    source_uri: str = ""
    """`sourceUri` as the webhook writes it ('' when absent or too long)."""


@dataclass(frozen=True, slots=True, order=True)
class Use:
    """One proven use of a cache: how, and the adapter's name for a LoRA adapter."""

    how: How
    adapter: str = ""

    def describe(self) -> str:
        return f"LoRA adapter {self.adapter}" if self.how == "LoRA adapter" else self.how


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def parse_lora(raw: object) -> list[LoraEntry] | str:
    """The entries of a LoRA annotation value, or why it is not read (module docstring)."""
    if not isinstance(raw, str):
        return "not a string"
    if len(raw) > MAX_LORA_ANNOTATION:
        return f"longer than {MAX_LORA_ANNOTATION} characters"
    try:
        data = json.loads(raw)
    except ValueError:
        return "not JSON"
    if not isinstance(data, dict):
        return "not a JSON object"
    if len(data) > MAX_LORA_ENTRIES:
        return f"more than {MAX_LORA_ENTRIES} entries"
    entries = []
    for adapter, ref in data.items():
        if not isinstance(ref, dict):
            return f"entry {adapter[:63]!r} is not an object"
        cache, namespace = ref.get("cache"), ref.get("namespace") or ""
        if not isinstance(cache, str) or not cache or not isinstance(namespace, str):
            return f"entry {adapter[:63]!r} names no cache"
        source = ref.get("sourceUri")
        source = source if isinstance(source, str) and len(source) <= MAX_URI else ""
        entries.append(LoraEntry(adapter, cache, namespace, source))
    return sorted(entries)


def lora_entries(obj: Obj) -> list[LoraEntry]:
    """The LoRA annotation's entries; none when absent or unreadable."""
    raw = (_meta(obj).get("annotations") or {}).get(LORA_ANNOTATION)
    if raw is None:
        return []
    parsed = parse_lora(raw)
    return parsed if isinstance(parsed, list) else []


def model_uri(obj: Obj) -> str | None:
    model = (obj.get("spec") or {}).get("model")
    uri = model.get("uri") if isinstance(model, dict) else None
    return uri if isinstance(uri, str) and len(uri) <= MAX_URI else None


def has_base_refs(obj: Obj) -> bool:
    """True when `spec.baseRefs` is a non-empty list (the model may come from a config)."""
    refs = (obj.get("spec") or {}).get("baseRefs")
    return isinstance(refs, list) and bool(refs)


def recorded_source_uri(obj: Obj) -> str | None:
    """The `…/localmodel-sourceuri` annotation, when a string of at most `MAX_URI`."""
    uri = (_meta(obj).get("annotations") or {}).get(
        inferenceservice.LOCAL_MODEL_SOURCE_URI_ANNOTATION
    )
    return uri if isinstance(uri, str) and len(uri) <= MAX_URI else None


def adapter_uris(obj: Obj) -> list[str]:
    """`spec.model.lora.adapters[].uri` (the first `MAX_ADAPTERS`)."""
    model = (obj.get("spec") or {}).get("model")
    lora = model.get("lora") if isinstance(model, dict) else None
    adapters = lora.get("adapters") if isinstance(lora, dict) else None
    if not isinstance(adapters, list):
        return []
    return [
        a["uri"]
        for a in adapters[:MAX_ADAPTERS]
        if isinstance(a, dict) and isinstance(a.get("uri"), str) and len(a["uri"]) <= MAX_URI
    ]


def slim(obj: Obj) -> Obj:
    """The informer transform of LLMInferenceServices (module docstring)."""
    out = informer.metadata_only(obj)
    meta = out.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if LORA_ANNOTATION in annotations:
        parsed = parse_lora(annotations[LORA_ANNOTATION])
        if isinstance(parsed, str):
            _log.warning(
                "llmisvc_lora_annotation_ignored",
                namespace=meta.get("namespace"),
                name=meta.get("name"),
                reason=parsed,
            )
            meta["annotations"] = {k: v for k, v in annotations.items() if k != LORA_ANNOTATION}
    model: Obj = {}
    if (uri := model_uri(obj)) is not None:
        model["uri"] = uri
    if uris := adapter_uris(obj):
        model["lora"] = {"adapters": [{"uri": u} for u in uris]}
    spec: Obj = {"model": model} if model else {}
    if has_base_refs(obj):
        spec["baseRefs"] = [{}]  # only whether there are any is read
    if spec:
        out["spec"] = spec
    return out


def _base_cache(obj: Obj) -> tuple[str, str] | None:
    """(cache namespace or '', cache name) of the base-model labels, when well-formed."""
    meta = _meta(obj)
    labels = meta.get("labels") or {}
    name = labels.get(inferenceservice.LOCAL_MODEL_LABEL)
    label_ns = labels.get(inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL)
    if not isinstance(name, str) or not name:
        return None
    if label_ns is not None and label_ns != meta.get("namespace"):
        return None
    return (label_ns or "", name)


def _lora_caches(obj: Obj) -> list[LoraEntry]:
    """The LoRA entries of usable scope: a cluster cache, or a namespace cache of the object's
    own namespace."""
    own = _meta(obj).get("namespace")
    return [e for e in lora_entries(obj) if e.namespace in ("", own)]


def used_caches(obj: Obj) -> list[str]:
    """Index function: the status keys (`name`, `ns/name`) of every cache the object is
    labelled or annotated for, proven or not (readers check with `uses`)."""
    found = set()
    refs = [(e.namespace, e.cache) for e in _lora_caches(obj)]
    if (base := _base_cache(obj)) is not None:
        refs.append(base)
    for namespace, name in refs:
        try:
            found.add(keys.status_key(name, namespace or None))
        except ValueError:
            continue
    return sorted(found)


def proven(
    objs: Iterable[Obj], *, cache_namespace: str, cache_name: str, cache_uri: str
) -> list[tuple[Obj, list[Use]]]:
    """The objects of `objs` (e.g. from `USED_CACHE_INDEX`) whose use of the cache is proven,
    with their uses; a namespace cache's users are only those of its namespace."""
    found = []
    for obj in objs:  # `uses` keeps a namespace cache's uses to its own namespace
        used = uses(
            obj, cache_namespace=cache_namespace, cache_name=cache_name, cache_uri=cache_uri
        )
        if used:
            found.append((obj, used))
    return found


def uses(obj: Obj, *, cache_namespace: str, cache_name: str, cache_uri: str) -> list[Use]:
    """The proven uses of the cache (`cache_namespace` '' for a cluster cache) by `obj`."""
    found: list[Use] = []
    from_configs = has_base_refs(obj)
    if _base_cache(obj) == (cache_namespace, cache_name):
        uri = model_uri(obj)
        if uri is None and from_configs:
            uri = recorded_source_uri(obj)
        if uri is not None and keys.match_storage_uri(cache_uri, uri):
            found.append(Use("base model"))
    spec_uris = adapter_uris(obj)
    served = any(keys.match_storage_uri(cache_uri, u) for u in spec_uris)
    for entry in _lora_caches(obj):
        if (entry.namespace, entry.cache) != (cache_namespace, cache_name):
            continue
        recorded = from_configs and not spec_uris and bool(entry.source_uri)
        if served or (recorded and keys.match_storage_uri(cache_uri, entry.source_uri)):
            found.append(Use("LoRA adapter", entry.adapter))
    return found
