"""What the admission handlers read from informer stores: the narrow `Lister` protocol, a
cheap pre-filter of raw caches by URI, and lenient parsing (an unreadable object is logged and
skipped, never fails a request)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

import pydantic
import structlog

from localcache.caching import keys as cache_keys
from localcache.runtime import keys as runtime_keys

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
Objs = list[Obj]
M = TypeVar("M", bound=pydantic.BaseModel)


class Lister(Protocol):
    """The part of an informer store (`runtime.store.Reader`) the mutator reads."""

    def get(self, key: runtime_keys.ObjectKey) -> Obj | None: ...

    def list(self, namespace: str | None = None) -> Objs: ...


def serving_caches(objs: Iterable[Obj], uri: str) -> list[Obj]:
    """Raw cache objects whose source URI serves `uri` (cheap filter before parsing)."""
    found = []
    for obj in objs:
        source = (obj.get("spec") or {}).get("sourceModelUri")
        if isinstance(source, str) and cache_keys.match_storage_uri(source, uri):
            found.append(obj)
    return found


def parse_all(model: type[M], objs: Iterable[Obj]) -> list[M]:
    """`objs` parsed as `model`; an object that does not parse is logged and skipped."""
    parsed: list[M] = []
    for obj in objs:
        try:
            parsed.append(model.model_validate(obj))
        except pydantic.ValidationError as exc:
            meta = obj.get("metadata") or {}
            log.warning(
                "webhook.object_unreadable",
                kind=model.__name__,
                name=meta.get("name"),
                object_namespace=meta.get("namespace"),
                error=str(exc.errors()[0]["msg"]) if exc.errors() else "invalid",
            )
    return parsed
