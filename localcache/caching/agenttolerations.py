"""The agent DaemonSet's tolerations: the installer's, plus every node group's (pure rules).

The agent must run on every node of every node group, tainted or not, so the controller keeps
the pod template's tolerations of localcache's own agent DaemonSet equal to

    (live - recorded) + groups

- `live`: the template's tolerations as read from the API;
- `recorded`: the tolerations the controller itself added last time, kept as JSON in the
  DaemonSet annotation `RECORD_ANNOTATION` (an annotation the installer never sets: kubectl
  client-side apply and Helm 3 merge annotations key by key and keep it, while they replace
  the tolerations list as a whole);
- `groups`: the valid tolerations of every LocalModelNodeGroup, groups in name order, each
  group's in its own order, without duplicates and without those the installer already has.

So what the installer set (Helm `agent.tolerations`, a kustomize patch, a manual edit) is
kept in its own order, first; the groups' follow; and a toleration no group has any more
goes away again. The new record is exactly the groups' part that was added.

Identity: two tolerations are the same when key, operator (empty counts as `Equal`), value,
effect and tolerationSeconds are. The installer's entries are written back exactly as read
(even duplicates); the groups' in canonical form (no empty fields, operator spelled out).

Bounds, so that no group can wedge the sync (the apiserver refuses the whole DaemonSet patch
if one toleration is invalid): a toleration is skipped, with a `Rejected` naming the group
and key, when it would fail Kubernetes' validation (`problem`); a group contributes at most
`MAX_PER_GROUP`; at most `MAX_ADDED` are added in all (groups in name order fill it).

Edge cases (README "Agent tolerations"):
- A toleration the installer adds while a group already contributes it counts as the
  controller's: it is removed once no group has it, and the installer's next apply brings it
  back for good (it is then not in the record).
- An unreadable record (the annotation edited by hand) is taken as empty: everything live
  counts as the installer's, so nothing is removed until the installer re-applies.
- Not promised: which of two equal tolerations in different groups "owns" it (either keeps it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from localcache.caching import placement

Obj = dict[str, Any]

RECORD_ANNOTATION: Final = "localmodel.kserve.io/node-group-tolerations"
MAX_PER_GROUP: Final = 16
MAX_ADDED: Final = 64
OPERATORS: Final = ("Equal", "Exists")
EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_FIELDS: Final = ("key", "operator", "value", "effect", "tolerationSeconds")

Identity = tuple[str, str, str, str, int | None]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A group's toleration left out of the agent's, and why."""

    group: str
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What the DaemonSet should hold: the template's `tolerations` and the annotation's
    `record` (JSON of `added`); `rejected` what the groups asked for and did not get."""

    tolerations: list[Obj]
    added: list[Obj]
    record: str
    rejected: tuple[Rejected, ...]


def problem(tol: Mapping[str, Any]) -> str | None:
    """Why Kubernetes would refuse `tol` in a pod spec (core/v1 ValidateTolerations), or None."""
    key, operator, value = tol.get("key") or "", tol.get("operator") or "", tol.get("value") or ""
    effect, seconds = tol.get("effect") or "", tol.get("tolerationSeconds")
    if not all(isinstance(v, str) for v in (key, operator, value, effect)):
        return "key, operator, value and effect must be strings"
    if key and not placement.label_key_valid(key):
        return "key is not a qualified name ([prefix/]name, name at most 63 characters)"
    if operator and operator not in OPERATORS:
        return f"operator must be one of {', '.join(OPERATORS)}, got {operator[:32]!r}"
    if not key and operator != "Exists":
        return "an empty key needs operator Exists"
    if operator == "Exists" and value:
        return "operator Exists takes no value"
    if not placement.label_value_valid(value):
        return "value is not a label value (at most 63 characters, alphanumerics, '-', '_', '.')"
    if effect and effect not in EFFECTS:
        return f"effect must be one of {', '.join(EFFECTS)}, got {effect[:32]!r}"
    if seconds is not None and (type(seconds) is not int or effect != "NoExecute"):
        return "tolerationSeconds must be an integer, with effect NoExecute"
    return None


def identity(tol: Mapping[str, Any]) -> Identity:
    seconds = tol.get("tolerationSeconds")
    return (
        str(tol.get("key") or ""),
        str(tol.get("operator") or "Equal"),
        str(tol.get("value") or ""),
        str(tol.get("effect") or ""),
        seconds if type(seconds) is int else None,
    )


def canonical(tol: Mapping[str, Any]) -> Obj:
    """`tol` with its fields in a fixed order, empty ones dropped, the operator spelled out."""
    out: Obj = {f: tol[f] for f in _FIELDS if tol.get(f) not in (None, "")}
    out["operator"] = tol.get("operator") or "Equal"
    return {f: out[f] for f in _FIELDS if f in out}


def parse_record(text: str | None) -> list[Obj] | None:
    """The record annotation's tolerations; [] when absent, None when unreadable."""
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        return None
    return value


def record_text(added: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(list(added), separators=(",", ":"))


def group_tolerations(
    groups: Iterable[tuple[str, Sequence[Any] | None]],
) -> tuple[list[Obj], list[Rejected]]:
    """The valid tolerations of the groups (name order), deduplicated and bounded."""
    chosen: list[Obj] = []
    seen: set[Identity] = set()
    rejected: list[Rejected] = []
    for name, tolerations in sorted(groups, key=lambda g: g[0]):
        taken = 0
        for tol in tolerations or ():
            if not isinstance(tol, Mapping):
                rejected.append(Rejected(name, "", "a toleration must be an object"))
                continue
            key = str(tol.get("key") or "")[:80]
            reason = problem(tol)
            if reason is None and taken >= MAX_PER_GROUP:
                reason = f"a node group contributes at most {MAX_PER_GROUP} tolerations"
            ident = identity(tol) if reason is None else None
            if ident is not None and ident not in seen and len(chosen) >= MAX_ADDED:
                reason = f"the agent takes at most {MAX_ADDED} tolerations from node groups"
            if reason is not None or ident is None:  # ident is None exactly when reason is set
                rejected.append(Rejected(name, key, reason or ""))
                continue
            taken += 1
            if ident not in seen:
                seen.add(ident)
                chosen.append(canonical(tol))
    return chosen, rejected


def plan(
    *,
    live: Sequence[Mapping[str, Any]] | None,
    record: str | None,
    groups: Iterable[tuple[str, Sequence[Any] | None]],
) -> Plan:
    """The tolerations and record the DaemonSet should hold (module docstring)."""
    recorded = parse_record(record) or []
    ours = {identity(t) for t in recorded}
    installer = [dict(t) for t in live or () if identity(t) not in ours]
    theirs = {identity(t) for t in installer}
    wanted, rejected = group_tolerations(groups)
    added = [t for t in wanted if identity(t) not in theirs]
    return Plan(
        tolerations=installer + added,
        added=added,
        record=record_text(added),
        rejected=tuple(rejected),
    )
