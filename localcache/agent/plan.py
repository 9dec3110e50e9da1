"""Pure decisions of the node agent: download units, Job phases, retry timing, failure
messages, progress and the node-group fallback. No I/O; `reconciler.py` feeds it objects.

Vocabulary:
- A *download unit* is the set of LocalModelNode entries that share one download: the same
  storage key (URI) and the same credential scope (`credentials.credential_scope`). Entries
  of one unit share one Job, one staging folder and one status (spec §5 "sharing").
- A unit's *tag* is its Job names without the attempt: `lmd-<storage key>-<digest>`, where
  the digest covers the node and the scope (`jobs.job_name`). A manifest's `job`, or a status
  entry's `modelProgress.jobName`, therefore records which scope proved access to a folder.
- A download needed no credentials iff its tag is the unit tag of the `None` scope.

Job phases follow the Job's conditions only: `Failed` (for good, [P17]) and `Complete`; a Job
whose pods failed but that still retries is `ACTIVE`.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from localcache.agent import jobs
from localcache.api import modelnode
from localcache.caching import credentials, keys

Obj = dict[str, Any]

_JOB_NAME = re.compile(r"(?P<tag>lmd-(?P<key>[0-9a-f]{16})-[0-9a-f]{8})-(?P<attempt>0|[1-9][0-9]*)")
_MESSAGE_LIMIT: Final = 1024


@dataclass(frozen=True, slots=True)
class JobRef:
    """A download Job of this agent, with what its name encodes."""

    namespace: str
    name: str
    storage_key: str
    tag: str
    attempt: int
    obj: Obj


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


def job_ref(obj: Obj) -> JobRef | None:
    """The JobRef of a Job object named like ours and not being deleted, else None."""
    meta = obj.get("metadata") or {}
    parsed = parse_job_name(str(meta.get("name") or ""))
    if parsed is None or meta.get("deletionTimestamp"):
        return None
    key, tag, attempt = parsed
    return JobRef(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta["name"]),
        storage_key=key,
        tag=tag,
        attempt=attempt,
        obj=obj,
    )


def unit_tag(*, storage_key: str, node_name: str, scope: Hashable | None) -> str:
    """The Job-name prefix of a unit (its Job names without `-<attempt>`)."""
    name = jobs.job_name(storage_key=storage_key, node_name=node_name, attempt=0, scope=scope)
    return name.rpartition("-")[0]


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

    @property
    def leader(self) -> modelnode.LocalModelInfo:
        return self.entries[0]

    @property
    def status_keys(self) -> list[str]:
        return [status_key(e) for e in self.entries]

    def reuses(self, job_name: str | None) -> bool:
        """Whether a download by `job_name` is good for this unit at once: it needed no
        credentials, or it ran in this unit's credential scope."""
        return tag_of(job_name) in (self.tag, self.open_tag)


def status_key(entry: modelnode.LocalModelInfo) -> str:
    return keys.status_key(entry.model_name, entry.namespace)


def units(
    entries: Sequence[modelnode.LocalModelInfo], *, node_name: str, job_namespace: str
) -> list[Unit]:
    """Group entries into download units, ordered by their first entry's position."""
    grouped: dict[str, list[modelnode.LocalModelInfo]] = {}
    first: dict[str, tuple[str, Hashable | None, credentials.CredentialRequest]] = {}
    for entry in entries:
        storage_key = keys.storage_key(entry.source_model_uri)
        request = credentials.request_for(entry, job_namespace=job_namespace)
        scope = credentials.credential_scope(request)
        tag = unit_tag(storage_key=storage_key, node_name=node_name, scope=scope)
        grouped.setdefault(tag, []).append(entry)
        first.setdefault(tag, (storage_key, scope, request))
    out = []
    for tag, members in grouped.items():
        key, scope, request = first[tag]
        open_tag = unit_tag(storage_key=key, node_name=node_name, scope=None)
        out.append(Unit(tag, open_tag, key, scope, request, tuple(members)))
    return out


def wanted_job_labels(unit_list: Iterable[Unit]) -> set[tuple[str, str | None, str]]:
    """(model label, modelNamespace label, tag) of every Job the spec still wants."""
    wanted = set()
    for unit in unit_list:
        for entry in unit.entries:
            ns = jobs.label_value(entry.namespace) if entry.namespace else None
            wanted.add((jobs.label_value(entry.model_name), ns, unit.tag))
    return wanted


def job_identity(ref: JobRef) -> tuple[str, str | None, str]:
    labels = (ref.obj.get("metadata") or {}).get("labels") or {}
    return labels.get(jobs.LABEL_MODEL, ""), labels.get(jobs.LABEL_MODEL_NAMESPACE), ref.tag


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


def pod_failure_message(pods: Iterable[Obj]) -> str:
    """What the newest failed pod says: its container's termination message (or reason and
    exit code), else the pod's own message or reason; "" when no pod failed."""
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    failed.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    for pod in reversed(failed):
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            term = (container.get("state") or {}).get("terminated") or {}
            if term.get("message"):
                return clip(str(term["message"]).strip())
            if term.get("reason") or term.get("exitCode"):
                return f"{term.get('reason') or 'Error'} (exit code {term.get('exitCode', '?')})"
        if status.get("message") or status.get("reason"):
            return clip(str(status.get("message") or status.get("reason")).strip())
    return ""


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
