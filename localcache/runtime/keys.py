"""ObjectKey: (namespace, name) <-> "ns/name" | "name"; the queue item and the store key."""

from __future__ import annotations

from typing import Any, NamedTuple


class ObjectKey(NamedTuple):
    """Identifies one object. `namespace` is "" for cluster-scoped objects.

    A NamedTuple because keys are hashed several times per watch event (store, indexes,
    queue sets): tuple hashing runs in C."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def parse(cls, text: str) -> ObjectKey:
        """Inverse of `str()`: "ns/name" or "name"."""
        namespace, sep, name = text.partition("/")
        if not sep:
            return cls("", namespace)
        if not namespace or not name or "/" in name:
            raise ValueError(f"not an object key: {text!r}")
        return cls(namespace, name)

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectKey:
        """The key of a Kubernetes object given as a dict."""
        meta = obj.get("metadata") or {}
        return cls(meta.get("namespace") or "", meta["name"])
