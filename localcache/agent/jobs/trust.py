"""Which download Jobs the agent trusts: only those it created itself, known by uid.

Anyone who may create Jobs in a namespace can give one the name, labels, annotations and
ownerReferences of a download Job, and, with the status subresource, any status. None of
that is evidence. What a tenant cannot write is the agent's own LocalModelNode status
(cluster-scoped, agent-owned): there the agent records each Job it creates (`DownloadJob`:
namespace, name and the uid from the create response, with the entry, storage key and full
credential scope it was created for), and `sort_jobs` trusts a seen Job only when namespace,
name and uid all match a record. Everything else is returned as untrusted: never read as
proof of access, never as Active, Complete or Failed, never deleted.

Records are dropped when their Job is gone (`sort_jobs` returns those still alive), so a
Job deleted and replaced under the same name is never trusted again. Pure: no I/O.

`observed` is the transform of the agent's Job informer: of every Job labelled for its node
(which anyone may create, with a megabyte of env each) it keeps only what the agent reads,
bounded: identity, labels, a few ownerReferences and the status counts and conditions, with
condition texts clipped. The pod template is never held (security review finding 6: 310 such
Jobs held whole took the agent to 420 MB against its 384 MiB limit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from localcache.agent import downloads
from localcache.api import modelnode
from localcache.runtime import informer

_KEPT_METADATA = (
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp",
)  # fmt: skip
_KEPT_STATUS = ("active", "ready", "failed", "succeeded", "startTime", "completionTime")
_KEPT_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime")
MAX_OWNERS, MAX_CONDITIONS, MAX_LABELS, MAX_TEXT = 4, 8, 16, 2048
LIST_PAGE_SIZE = 50
"""Jobs per list page of the agent's Job informer: a page is parsed whole before the
transform slims it, and anyone may give a Job a megabyte of env."""

Obj = downloads.Obj
Ident = tuple[str, str]
"""(namespace, name) of a Job."""


def ident_of(obj: Obj) -> Ident:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def uid_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def observed(obj: Obj) -> Obj:
    """What the agent keeps of a Job (module doc)."""
    meta = _mapping(obj.get("metadata"))
    status = _mapping(obj.get("status"))
    kept: Obj = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    labels = _mapping(meta.get("labels"))
    kept["labels"] = {str(k): str(v)[:MAX_TEXT] for k, v in list(labels.items())[:MAX_LABELS]}
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    kept["ownerReferences"] = [
        {k: o[k] for k in ("apiVersion", "kind", "name", "uid", "controller") if k in o}
        for o in owners[:MAX_OWNERS]
    ]
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    job_status: Obj = {k: status[k] for k in _KEPT_STATUS if k in status}
    job_status["conditions"] = [
        {k: str(c[k])[:MAX_TEXT] for k in _KEPT_CONDITION if k in c}
        for c in conditions[:MAX_CONDITIONS]
    ]
    return informer.compact(
        {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept,
         "status": job_status}
    )  # fmt: skip


def _mapping(value: object) -> Obj:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class Sorted:
    """The outcome of `sort_jobs`."""

    trusted: list[downloads.JobRef]
    """Jobs matching a record and not being deleted."""
    records: list[modelnode.DownloadJob]
    """The records whose Job is still there (or was created too lately to be seen)."""
    untrusted: list[Obj]
    """Seen Jobs that match no record."""


def sort_jobs(
    seen: Iterable[Obj],
    records: Iterable[modelnode.DownloadJob],
    *,
    unseen_ok: Mapping[Ident, Obj],
) -> Sorted:
    """Match `seen` Jobs (the informer's) against `records`. `unseen_ok` holds Jobs this
    process created so lately that the informer may not show them yet, as the create
    response returned them: a record whose Job is unseen stays only if it is there, with the
    same uid. A record whose name now carries another uid is dropped (its Job is gone)."""
    by_ident = {ident_of(o): o for o in seen}
    trusted: list[downloads.JobRef] = []
    alive: list[modelnode.DownloadJob] = []
    matched: set[Ident] = set()
    for record in records:
        ident = (record.namespace, record.name)
        obj = by_ident.get(ident)
        if obj is None:
            fresh = unseen_ok.get(ident)
            obj = fresh if fresh is not None and uid_of(fresh) == record.uid else None
        elif uid_of(obj) != record.uid or not record.uid:
            obj = None
        else:
            matched.add(ident)
        if obj is None:
            continue
        alive.append(record)
        if not (obj.get("metadata") or {}).get("deletionTimestamp"):
            trusted.append(_ref(record, obj))
    untrusted = [o for ident, o in by_ident.items() if ident not in matched]
    return Sorted(trusted=trusted, records=alive, untrusted=untrusted)


def merge(
    *groups: Iterable[modelnode.DownloadJob],
) -> list[modelnode.DownloadJob]:
    """Records of all groups, one per (namespace, name, uid), sorted by namespace and name."""
    out: dict[tuple[str, str, str], modelnode.DownloadJob] = {}
    for group in groups:
        for record in group:
            out.setdefault((record.namespace, record.name, record.uid), record)
    return [out[k] for k in sorted(out)]


def parse_records(status: Mapping[str, object] | None) -> list[modelnode.DownloadJob]:
    """`status.downloadJobs` of a LocalModelNode status; unreadable records are skipped."""
    raw = (status or {}).get("downloadJobs")
    out = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(modelnode.DownloadJob.model_validate(item))
        except ValueError:
            continue
    return out


def _ref(record: modelnode.DownloadJob, obj: Obj) -> downloads.JobRef:
    return downloads.JobRef(
        namespace=record.namespace,
        name=record.name,
        uid=record.uid,
        status_key=record.status_key,
        storage_key=record.storage_key,
        scope=record.scope,
        attempt=record.attempt,
        obj=obj,
    )
