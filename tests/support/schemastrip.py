"""Strip nodes from an OpenAPI schema: build the schema a CRD lacking those fields serves.

`strip(schema, paths)` takes the path notation of `runtime.crds.schemadiff.missing_fields`
(`status.conditions`, `status.modelProgress.*.percent`, `spec.items[*].name`) and returns a
copy without those nodes (and without them in their parent's `required`). The integration
tests use it to install KServe-shaped CRDs (ours minus localcache's extras) on a control
plane of their own; unit tests use it as the inverse of `missing_fields`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def strip(schema: Mapping[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """A copy of `schema` without the nodes at `paths`; KeyError for a path that names no
    node."""
    out: dict[str, Any] = _copy(schema)
    for path in paths:
        parts = _split(path)
        node: dict[str, Any] | None = out
        for part in parts[:-1]:
            node = _child(node, part) if node is not None else None
        if node is None:
            raise KeyError(f"no schema node at {path!r}")
        last = parts[-1]
        if last == "[*]":
            node.pop("items", None)
        elif last == "*":
            node.pop("additionalProperties", None)
        elif last in (node.get("properties") or {}):
            del node["properties"][last]
            if last in (node.get("required") or []):
                node["required"] = [r for r in node["required"] if r != last]
                if not node["required"]:
                    del node["required"]
        else:
            raise KeyError(f"no schema node at {path!r}")
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _split(path: str) -> list[str]:
    parts: list[str] = []
    for dotted in path.split("."):
        name = dotted
        items = 0
        while name.endswith("[*]"):
            name, items = name[:-3], items + 1
        if name:
            parts.append(name)
        parts.extend(["[*]"] * items)
    return parts


def _child(node: dict[str, Any], part: str) -> dict[str, Any] | None:
    if part == "[*]":
        found = node.get("items")
    elif part == "*":
        found = node.get("additionalProperties")
    else:
        found = (node.get("properties") or {}).get(part)
    return found if isinstance(found, dict) else None


def drop_rules(schema: Mapping[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """A copy of `schema` without the CEL rules (`x-kubernetes-validations`) at `paths`."""
    out: dict[str, Any] = _copy(schema)
    for path in paths:
        node: dict[str, Any] | None = out
        for part in _split(path):
            node = _child(node, part) if node is not None else None
        if node is None:
            raise KeyError(f"no schema node at {path!r}")
        node.pop("x-kubernetes-validations", None)
    return out
