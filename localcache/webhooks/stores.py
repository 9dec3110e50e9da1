"""What the serving-object mutators share: the narrow `Lister` protocol over informer stores, a
cheap pre-filter of raw caches by URI, lenient parsing (an unreadable object is logged and
skipped, never fails a request), and the answers given before any rule runs (`early_answer`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

import pydantic
import structlog

from localcache.caching import keys as cache_keys
from localcache.runtime import keys as runtime_keys
from localcache.runtime.serving import review

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
Objs = list[Obj]
M = TypeVar("M", bound=pydantic.BaseModel)


class Lister(Protocol):
    """The part of an informer store (`runtime.store.Reader`) the mutator reads."""

    def get(self, key: runtime_keys.ObjectKey) -> Obj | None: ...

    def list(self, namespace: str | None = None) -> Objs: ...


class Indexed(Protocol):
    """The index read of an informer store (`runtime.store.Reader`)."""

    def by_index(self, index: str, value: str) -> Objs: ...


def serving_caches(objs: Iterable[Obj], *uris: str) -> list[Obj]:
    """Raw cache objects whose source URI serves one of `uris` (cheap filter before parsing)."""
    found = []
    for obj in objs:
        source = (obj.get("spec") or {}).get("sourceModelUri")
        if isinstance(source, str) and any(cache_keys.match_storage_uri(source, u) for u in uris):
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


def early_answer(request: review.Request, *, synced: bool) -> review.Response | None:
    """The answer to a serving-object CREATE/UPDATE before any rule runs, or None to go on:
    nothing to do (no object, another operation, being deleted), a malformed `metadata` (not
    from an apiserver: say so), or the stores not synced yet (admitted unchanged, warned, so an
    empty cache at start-up never strips labels)."""
    obj = request.object
    if obj is None or request.operation not in ("CREATE", "UPDATE"):
        return review.allowed()
    if not isinstance(obj.get("metadata", {}), dict):
        return review.denied(
            "metadata must be an object", field="metadata", code=400, reason="BadRequest"
        )
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return review.allowed()
    if not synced:
        return review.allowed(
            warnings=["localcache is starting: local model labels were not updated"]
        )
    return None
