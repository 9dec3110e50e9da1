"""`spec.baseRefs` of an LLMInferenceService: the fields localcache reads, merged the way
KServe's LLMInferenceService controller merges specs (v0.20 `config_merge.go`).

`resolve()` is pure. KServe's controller merges, lowest priority first: its well-known preset
configurations, then each `spec.baseRefs` entry in order, then the LLMInferenceService's own
spec; a later layer overrides a field it sets (a strategic merge from a zero spec: an empty
URI or an empty adapter list sets nothing). Each reference is looked up by name in the
LLMInferenceService's namespace first, then in KServe's namespace (`getConfig`); a
configuration's own `baseRefs` are not followed (KServe does not follow them either), so the
chain is one level deep, and at most `MAX_BASE_REFS` references are resolved.

Read here: `model.uri`, `model.lora.adapters` and `storageInitializer.enabled`. Not done:
KServe's preset configurations (`kserve-config-llm-*`, chosen by the shape of the merged spec)
are not consulted (the presets KServe ships set no model), and template variables
(`{{ ... }}`) in a URI are not expanded: such a URI is reported unresolved.

Where resolution fails (a reference without a name, a configuration missing from both
namespaces or unreadable, the configuration kind not served, its informer still listing, too
many references), `Resolved.unresolved` names the reason and the other fields are the
LLMInferenceService's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import pydantic

from localcache.api import llminferenceservice as llm_api

MAX_BASE_REFS: Final = 16

Obj = dict[str, Any]


class Unavailable(Exception):
    """The configurations cannot be read now; the message is the reason, for a warning."""


# `lookup(namespace, name)`: the LLMInferenceServiceConfig object, None when it does not exist;
# raises `Unavailable` when that cannot be known.
Lookup = Callable[[str, str], Obj | None]


@dataclass(frozen=True, slots=True)
class Resolved:
    """The merged fields (None: no layer sets them) and why resolution failed, if it did."""

    uri: str | None
    adapters: Any = None
    storage_initializer_enabled: bool | None = None
    unresolved: str | None = None


def _own(spec: llm_api.LLMInferenceServiceSpec, unresolved: str | None = None) -> Resolved:
    return Resolved(
        uri=spec.model_uri,
        adapters=spec.raw_adapters or None,
        storage_initializer_enabled=spec.storage_initializer_enabled,
        unresolved=unresolved,
    )


def _config(name: str, *, namespace: str, kserve_namespace: str, lookup: Lookup) -> Obj:
    """The configuration `name`, KServe's way: the LLMInferenceService's namespace, then
    KServe's. Raises `Unavailable` naming what went wrong."""
    found = lookup(namespace, name)
    if found is None and kserve_namespace != namespace:
        found = lookup(kserve_namespace, name)
    if found is None:
        where = sorted({namespace, kserve_namespace})
        raise Unavailable(
            f"LLMInferenceServiceConfig {name} exists in none of the namespaces {', '.join(where)}"
        )
    return found


def resolve(
    spec: llm_api.LLMInferenceServiceSpec,
    *,
    namespace: str,
    kserve_namespace: str,
    lookup: Lookup,
) -> Resolved:
    """The model fields of `spec` merged with its base configurations (module docstring)."""
    names = spec.base_ref_names
    if not names:
        return _own(spec)
    if len(names) > MAX_BASE_REFS:
        return _own(
            spec,
            f"spec.baseRefs lists {len(names)} configurations, more than the {MAX_BASE_REFS} "
            "localcache resolves",
        )
    layers: list[llm_api.LLMInferenceServiceSpec] = []
    for index, name in enumerate(names):
        if name is None:
            return _own(spec, f"spec.baseRefs[{index}] has no name")
        try:
            raw = _config(
                name, namespace=namespace, kserve_namespace=kserve_namespace, lookup=lookup
            )
            config = llm_api.LLMInferenceServiceConfig.from_dict(raw)
        except Unavailable as exc:
            return _own(spec, str(exc))
        except pydantic.ValidationError:
            where = (raw.get("metadata") or {}).get("namespace")
            return _own(spec, f"LLMInferenceServiceConfig {where}/{name} is not readable")
        layers.append(config.spec or llm_api.LLMInferenceServiceSpec())
    layers.append(spec)
    merged = Resolved(uri=None)
    for layer in layers:
        merged = Resolved(
            uri=layer.model_uri or merged.uri,
            adapters=layer.raw_adapters or merged.adapters,
            storage_initializer_enabled=(
                layer.storage_initializer_enabled
                if layer.storage_initializer_enabled is not None
                else merged.storage_initializer_enabled
            ),
        )
    if merged.uri is not None and "{{" in merged.uri:
        return Resolved(
            uri=None,
            adapters=merged.adapters,
            storage_initializer_enabled=merged.storage_initializer_enabled,
            unresolved=f"the model URI {merged.uri} holds a template KServe expands later",
        )
    return merged
