"""Which parts of a CRD's wanted schema the served CRD lacks (pure, no I/O).

The apiserver prunes, without a word, every field of a custom object that the served
structural schema does not declare, and enforces only the CEL rules the served schema holds.
`compare(wanted, served)` walks the wanted CRD's schema of each wanted version against the
served CRD's schema of the same version and returns a `SchemaFinding`:

- `missing_fields`: the top-most paths the served schema does not declare (so they are
  pruned on write). Below a missing path nothing more is listed. Paths are dotted from the
  object root; `[*]` stands for the items of an array and `.*` for the values of a map, e.g.
  `status.conditions`, `status.modelProgress.*.percent` (sorted). Below a served node marked
  `x-kubernetes-preserve-unknown-fields: true` nothing is pruned, so nothing is listed. A
  wanted version the CRD does not serve is reported as the single path `versions[<name>]`.
- `missing_rules`: `x-kubernetes-validations` rules of the wanted schema, on nodes the
  served schema declares, that the served node does not hold (matched by the rule text):
  `"<path>: <message or rule>"`. Nothing is lost, but invalid values are no longer refused.

Only the structural part is compared (`properties`, `items`, `additionalProperties`,
preserve-unknown-fields, CEL rules): not types, formats, enums, defaults, printer columns or
names. Not promised: a served schema that declares *more* than wanted is not reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Schema = Mapping[str, Any]

PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"
VALIDATIONS = "x-kubernetes-validations"


@dataclass(frozen=True, slots=True)
class SchemaFinding:
    """What the served CRD `crd` lacks of the wanted one (module docstring)."""

    crd: str
    missing_fields: tuple[str, ...] = ()
    missing_rules: tuple[str, ...] = ()

    @property
    def degraded(self) -> bool:
        return bool(self.missing_fields or self.missing_rules)


def version_schema(crd: Schema, version: str) -> Schema | None:
    """The `openAPIV3Schema` of `version` when the CRD serves it, else None."""
    for entry in (crd.get("spec") or {}).get("versions") or ():
        if entry.get("name") == version and entry.get("served", True):
            schema = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, Mapping) else {}
    return None


def compare(wanted: Schema, served: Schema) -> SchemaFinding:
    """Compare every version of the `wanted` CRD with the `served` CRD (module docstring)."""
    name = str((wanted.get("metadata") or {}).get("name", ""))
    fields: list[str] = []
    rules: list[str] = []
    for entry in (wanted.get("spec") or {}).get("versions") or ():
        version = str(entry.get("name", ""))
        ours = (entry.get("schema") or {}).get("openAPIV3Schema") or {}
        theirs = version_schema(served, version)
        if theirs is None:
            fields.append(f"versions[{version}]")
            continue
        fields.extend(missing_fields(ours, theirs))
        rules.extend(missing_rules(ours, theirs))
    return SchemaFinding(name, tuple(sorted(fields)), tuple(sorted(rules)))


def missing_fields(ours: Schema, served: Schema) -> list[str]:
    """The top-most paths of `ours` that `served` does not declare (module docstring)."""
    return [path for path, theirs, _ in _pairs(ours, served) if theirs is None]


def missing_rules(ours: Schema, served: Schema) -> list[str]:
    """The CEL rules of `ours` missing from the node `served` declares at the same path."""
    out: list[str] = []
    for path, theirs, node in _pairs(ours, served):
        if theirs is None:
            continue
        held = {r.get("rule") for r in _rules(theirs)}
        for rule in _rules(node):
            if rule.get("rule") not in held:
                out.append(f"{path or '<root>'}: {rule.get('message') or rule.get('rule')}")
    return out


def _rules(node: Schema) -> Iterable[Mapping[str, Any]]:
    rules = node.get(VALIDATIONS) or ()
    return [r for r in rules if isinstance(r, Mapping)]


def _pairs(ours: Schema, served: Schema) -> list[tuple[str, Schema | None, Schema]]:
    """(path, served node or None, our node) for every node of `ours` down to where the
    served schema stops (a missing node, or preserve-unknown-fields), in walk order."""
    out: list[tuple[str, Schema | None, Schema]] = []
    stack: list[tuple[str, Schema, Schema | None]] = [("", ours, served)]
    while stack:
        path, node, theirs = stack.pop()
        out.append((path, theirs, node))
        if theirs is None or theirs.get(PRESERVE_UNKNOWN) is True:
            continue
        children: list[tuple[str, Schema, Schema | None]] = []
        props = theirs.get("properties") or {}
        theirs_values = _sub(theirs, "additionalProperties")
        for name, child in (node.get("properties") or {}).items():
            if isinstance(child, Mapping):
                # a served map keeps any key, with its values' schema
                match = props.get(name) if name in props else theirs_values
                children.append((_join(path, name), child, match))
        if (items := _sub(node, "items")) is not None:
            children.append((f"{path}[*]", items, _sub(theirs, "items")))
        if (values := _sub(node, "additionalProperties")) is not None:
            children.append((_join(path, "*"), values, theirs_values))
        stack.extend(reversed(children))
    return out


def _sub(node: Schema, key: str) -> Schema | None:
    value = node.get(key)
    return value if isinstance(value, Mapping) else None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
