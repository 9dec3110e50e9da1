"""Pure decisions of the node agent: download units, Job phases, retry timing, failure
messages, progress and the node-group fallback. No I/O; `reconciler.py` feeds it objects.

Vocabulary:
- A *download unit* is the set of LocalModelNode entries that share one download: the same
  storage key (URI) and the same credential scope (`credentials.credential_scope`). Entries
  of one unit share one Job, one staging folder and one status (spec §5 "sharing").
- Units are grouped by the full scope (`scope_id`: SHA-256 of it), and a Job belongs to a
  unit by what the agent recorded when it created the Job (`agent.trust`), never by its name.
- A unit's *tag* is its Job names without attempt and suffix: `lmd-<storage key>-<digest>`,
  where the 64-bit digest covers the node and the scope (`jobs.job_tag`). A manifest's `job`,
  or a status entry's `modelProgress.jobName` (both written by the agent for Jobs it
  trusted), therefore records which scope proved access to a folder; the manifest of an
  adopted folder (`agent.adoption`) records the bare tag of the unit it was adopted for.
- A download needed no credentials iff its tag is the unit tag of the `None` scope.

Job phases follow the Job's conditions only: `Failed` (for good, [P17]) and `Complete`; a Job
whose pods failed but that still retries is `ACTIVE`.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from localcache.agent import jobs
from localcache.api import modelnode
from localcache.caching import credentials, keys

Obj = dict[str, Any]

_JOB_NAME = re.compile(
    r"(?P<tag>lmd-(?P<key>[0-9a-f]{16})-[0-9a-f]{16})-(?P<attempt>0|[1-9][0-9]*)-[a-z0-9]{8}"
)
_LEGACY_JOB_NAME = re.compile(r"(?P<tag>lmd-[0-9a-f]{16}-[0-9a-f]{8})-(?:0|[1-9][0-9]*)")
"""Job names before 64-bit tags (`lmd-<key>-<32-bit tag>-<attempt>`), as folder manifests and
status written by earlier versions record them."""
_MESSAGE_LIMIT: Final = 1024
POD_MESSAGE_LIMIT: Final = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


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
    entries: Sequence[modelnode.LocalModelInfo], *, node_name: str, job_namespace: str
) -> list[Unit]:
    """Group entries into download units, ordered by their first entry's position."""
    grouped: dict[tuple[str, str], list[modelnode.LocalModelInfo]] = {}
    first: dict[tuple[str, str], tuple[Hashable | None, credentials.CredentialRequest]] = {}
    for entry in entries:
        storage_key = keys.storage_key(entry.source_model_uri)
        request = credentials.request_for(entry, job_namespace=job_namespace)
        scope = credentials.credential_scope(request)
        ident = (storage_key, scope_id(scope))
        grouped.setdefault(ident, []).append(entry)
        first.setdefault(ident, (scope, request))
    out = []
    for (key, sid), members in grouped.items():
        scope, request = first[(key, sid)]
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
    """The unit's Jobs, oldest attempt first: recorded for its storage key and full scope,
    and in a namespace one of its entries runs Jobs in."""
    mine = [
        r
        for r in refs
        if (r.storage_key, r.scope) == (unit.storage_key, unit.scope_id)
        and r.namespace in unit.namespaces
    ]
    return sorted(mine, key=lambda r: r.attempt)


# ---- Job state ------------------------------------------------------------------------------
class JobPhase(StrEnum):
    ACTIVE = "Active"
    COMPLETE = "Complete"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class JobState:
    phase: JobPhase
    ready: int = 0
    failed_pods: int = 0
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    reason: str = ""
    message: str = ""


def job_state(job: Obj) -> JobState:
    """The phase of a Job from its `Complete`/`Failed` conditions, with counters and times."""
    status = job.get("status") or {}
    phase, finished, reason, message = JobPhase.ACTIVE, None, "", ""
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True" or cond.get("type") not in ("Complete", "Failed"):
            continue
        phase = JobPhase.COMPLETE if cond["type"] == "Complete" else JobPhase.FAILED
        finished = parse_time(cond.get("lastTransitionTime"))
        reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
        if phase is JobPhase.FAILED:
            break
    if phase is JobPhase.COMPLETE:
        finished = parse_time(status.get("completionTime")) or finished
    return JobState(
        phase=phase,
        ready=int(status.get("ready") or 0),
        failed_pods=int(status.get("failed") or 0),
        started_at=parse_time(status.get("startTime")),
        finished_at=finished,
        reason=reason,
        message=message,
    )


def retry_delay(attempt: int, *, base: float, cap: float) -> float:
    """Seconds between the failure of attempt `attempt` (0-based) and the next attempt:
    `base` doubling per attempt, at most `cap`."""
    if attempt >= 64:
        return cap
    return float(min(cap, base * (2**attempt)))


def pod_failure_message(pods: Iterable[Obj], *, job_uid: str | None = None) -> str:
    """What the newest failed pod (of the Job `job_uid`, when given: its controller
    ownerReference) says: its container's termination message (or reason and exit code),
    else the pod's own message or reason; "" when no pod failed. Always `one_line`."""
    failed = [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Failed"
        and (job_uid is None or _controller_uid(p) == job_uid)
    ]
    failed.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    for pod in reversed(failed):
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            term = (container.get("state") or {}).get("terminated") or {}
            if text := one_line(term.get("message")):
                return text
            if term.get("reason") or term.get("exitCode"):
                reason = one_line(term.get("reason"), limit=64) or "Error"
                return f"{reason} (exit code {one_line(term.get('exitCode'), limit=8) or '?'})"
        if text := one_line(status.get("message") or status.get("reason")):
            return text
    return ""


def _controller_uid(obj: Obj) -> str | None:
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid") or "")
    return None


def one_line(text: Any, *, limit: int = POD_MESSAGE_LIMIT) -> str:
    """A pod-supplied text as it may be published: its last non-blank line, without control
    characters, at most `limit` characters ("" for nothing)."""
    if text is None:
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = " ".join(_CONTROL.sub(" ", lines[-1]).split()) if lines else ""
    return clip(line, limit)


def clip(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def percent(size: int, model_size: int | None) -> int | None:
    """Progress in percent of `model_size` (None when unknown), capped at 99 while
    downloading: only a promoted folder is 100 %."""
    if not model_size or model_size <= 0:
        return None
    return min(99, size * 100 // model_size)


# ---- node-group fallback ---------------------------------------------------------------------
def _requirement_holds(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = str(req.get("key") or ""), req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_matches(terms: Sequence[Mapping[str, Any]] | None, node: Obj) -> bool:
    """NodeSelectorTerms semantics: terms are ORed, a term's expressions ANDed; an empty
    term matches nothing; `matchFields` supports `metadata.name`."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    fields = {"metadata.name": str(meta.get("name") or "")}
    for term in terms or []:
        exprs = list(term.get("matchExpressions") or [])
        field_exprs = list(term.get("matchFields") or [])
        if not exprs and not field_exprs:
            continue
        if all(_requirement_holds(r, labels) for r in exprs) and all(
            _requirement_holds(r, fields) for r in field_exprs
        ):
            return True
    return False


# ---- time -----------------------------------------------------------------------------------
def parse_time(value: Any) -> datetime.datetime | None:
    """An RFC 3339 timestamp as an aware datetime, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def format_time(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
