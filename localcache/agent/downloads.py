"""Download units: which LocalModelNode entries share one download, the names of their
Jobs, and which of the agent's Jobs belong to which unit. Pure: no I/O.

Vocabulary:
- A *download unit* is the set of LocalModelNode entries that share one download: the same
  storage key (URI) and the same credential scope (`credentials.credential_scope`). Entries
  of one unit share one Job, one staging folder and one status (spec §5 "sharing").
- Units are grouped by the full scope (`scope_id`: SHA-256 of it), and a Job belongs to a
  unit by what the agent recorded when it created the Job (`agent.jobs.trust`), never by
  its name.
- A unit's *tag* is its Job names without attempt and suffix: `lmd-<storage key>-<digest>`,
  where the 64-bit digest covers the node and the scope (`jobs.job_tag`). A manifest's `job`,
  or a status entry's `modelProgress.jobName` (both written by the agent for Jobs it
  trusted), therefore records which scope proved access to a folder; the manifest of an
  adopted folder (`agent.adoption`) records the bare tag of the unit it was adopted for.
- A download needed no credentials iff its tag is the unit tag of the `None` scope.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from localcache.agent.jobs import jobs
from localcache.api import modelnode
from localcache.caching import credentials, keys

Obj = dict[str, Any]

_JOB_NAME = re.compile(
    r"(?P<tag>lmd-(?P<key>[0-9a-f]{16})-[0-9a-f]{16})-(?P<attempt>0|[1-9][0-9]*)-[a-z0-9]{8}"
)
_LEGACY_JOB_NAME = re.compile(r"(?P<tag>lmd-[0-9a-f]{16}-[0-9a-f]{8})-(?:0|[1-9][0-9]*)")
"""Job names before 64-bit tags (`lmd-<key>-<32-bit tag>-<attempt>`), as folder manifests and
status written by earlier versions record them."""


@dataclass(frozen=True, slots=True)
class JobRef:
    """A download Job this agent created (its uid matches the agent's record), with what
    the record says about it; `obj` is the Job as last seen."""

    namespace: str
    name: str
    uid: str
    status_key: str
    storage_key: str
    scope: str
    attempt: int
    obj: Obj

    @property
    def identity(self) -> tuple[str, str, str]:
        """(status key, storage key, scope id): what a spec entry must still want."""
        return self.status_key, self.storage_key, self.scope


def parse_job_name(name: str) -> tuple[str, str, int] | None:
    """`(storage key, tag, attempt)` of one of our Job names, else None."""
    match = _JOB_NAME.fullmatch(name)
    if match is None:
        return None
    return match["key"], match["tag"], int(match["attempt"])


def tag_of(job_name: str | None) -> str | None:
    """The unit tag encoded in a Job name (None when it is not one of ours)."""
    parsed = parse_job_name(job_name or "")
    return parsed[1] if parsed else None


def unit_tag(*, storage_key: str, node_name: str, scope: Hashable | None) -> str:
    """The Job-name prefix of a unit (its Job names without `-<attempt>-<suffix>`)."""
    return jobs.job_tag(storage_key=storage_key, node_name=node_name, scope=scope)


def scope_id(scope: Hashable | None) -> str:
    """The full credential scope as a SHA-256 hex digest (what Job records store)."""
    return hashlib.sha256(repr(scope).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Unit:
    """Entries sharing one download (same storage key and credential scope), in spec order.
    The first entry (the leader) decides the Job's namespace, labels and download PVC."""

    tag: str
    open_tag: str
    """The tag of a download of the same URI that needed no credentials."""
    storage_key: str
    scope: Hashable | None
    request: credentials.CredentialRequest
    entries: tuple[modelnode.LocalModelInfo, ...]
    scope_id: str
    namespaces: frozenset[str]
    """The namespaces the unit's Jobs may run in (those of its entries' Jobs)."""

    @property
    def leader(self) -> modelnode.LocalModelInfo:
        return self.entries[0]

    @property
    def status_keys(self) -> list[str]:
        return [status_key(e) for e in self.entries]

    def reuses(self, job_name: str | None) -> bool:
        """Whether a download by `job_name` is good for this unit at once: it needed no
        credentials, or it ran in this unit's credential scope. A bare tag is what the
        manifest of an adopted folder records (`agent.adoption`): the scope it was adopted for."""
        if job_name in (self.tag, self.open_tag):
            return True
        tag = tag_of(job_name)
        if tag is not None:
            return tag in (self.tag, self.open_tag)
        # A folder downloaded before the upgrade to 64-bit tags: its 32-bit tag is the prefix
        # of ours, so an upgrade downloads nothing again (the collision risk stays that of
        # the version that downloaded it, for those folders only).
        legacy = _LEGACY_JOB_NAME.fullmatch(job_name or "")
        return legacy is not None and legacy["tag"] in (self.tag[:-8], self.open_tag[:-8])


def status_key(entry: modelnode.LocalModelInfo) -> str:
    return keys.status_key(entry.model_name, entry.namespace)


def units(
    entries: Sequence[modelnode.LocalModelInfo],
    *,
    node_name: str,
    job_namespace: str,
    place: Callable[[modelnode.LocalModelInfo], str] | None = None,
) -> list[Unit]:
    """Group entries into download units, ordered by their first entry's position. With
    `place` (where an entry is served: its models root, or why it cannot be), entries of
    different places are different units: a URI cached on two roots is downloaded onto each,
    and one entry's unusable node group never becomes another entry's error."""
    grouped: dict[tuple[str, str, str], list[modelnode.LocalModelInfo]] = {}
    first: dict[tuple[str, str, str], tuple[Hashable | None, credentials.CredentialRequest]] = {}
    for entry in entries:
        storage_key = keys.storage_key(entry.source_model_uri)
        request = credentials.request_for(entry, job_namespace=job_namespace)
        scope = credentials.credential_scope(request)
        ident = (storage_key, scope_id(scope), place(entry) if place else "")
        grouped.setdefault(ident, []).append(entry)
        first.setdefault(ident, (scope, request))
    out = []
    for (key, sid, where), members in grouped.items():
        scope, request = first[(key, sid, where)]
        out.append(
            Unit(
                tag=unit_tag(storage_key=key, node_name=node_name, scope=scope),
                open_tag=unit_tag(storage_key=key, node_name=node_name, scope=None),
                storage_key=key,
                scope=scope,
                request=request,
                entries=tuple(members),
                scope_id=sid,
                namespaces=frozenset(e.namespace or job_namespace for e in members),
            )
        )
    return out


def wanted_jobs(unit_list: Iterable[Unit]) -> set[tuple[str, str, str]]:
    """`JobRef.identity` of every Job the spec still wants: an entry's Jobs in its unit."""
    return {
        (key, unit.storage_key, unit.scope_id) for unit in unit_list for key in unit.status_keys
    }


def unit_jobs(unit: Unit, refs: Iterable[JobRef]) -> list[JobRef]:
    """The unit's Jobs, oldest attempt first: recorded for one of its entries (the Jobs of
    entries no unit has are deleted: `wanted_jobs`), its storage key and full scope, and in a
    namespace one of its entries runs Jobs in. Two units of one scope on different roots
    (`units`' `place`) never take each other's Jobs."""
    keys_of_unit = set(unit.status_keys)
    mine = [
        r
        for r in refs
        if (r.storage_key, r.scope) == (unit.storage_key, unit.scope_id)
        and r.namespace in unit.namespaces
        and r.status_key in keys_of_unit
    ]
    return sorted(mine, key=lambda r: r.attempt)
