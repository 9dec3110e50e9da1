"""Where a shared-volume cache's import stands, from its (trusted) import Job and that Job's
pods, and the status that says it. Pure rules, no I/O.

- `phase_of(job)`: `succeeded` (condition Complete True), `failed` (condition Failed True),
  `running` (active or ready pods), else `pending`.
- `failure_message(job, pods)`: what the failed import may publish. The download container
  writes no termination message of its own (`FallbackToLogsOnError`: the kubelet copies the
  tail of its log, a tenant's pod output), so only its gist of a FIXED vocabulary is kept
  (`jobfailures.gist`), never raw log text; the other containers (ours: prepare, place) and
  the pod and Job reasons are named, with exit codes. Only pods whose controller
  ownerReference is the Job's uid are read.
- `placed_bytes(job_uid, pods)`: the size of the placed model, from the `place` container's
  termination message (`importjob.placed_from_message`), None when not readable.
- `retry_delay(failed_attempts, ...)`: the usual download backoff, doubling per failed
  attempt from `downloadRetryBackoffInSecs`, capped by `downloadRetryMaxBackoffInSecs`.
- `ready_condition(...)` / `copies(...)`: the `Ready` condition (positive polarity,
  `observedGeneration`, `lastTransitionTime` kept unless the status changes) and KServe's
  copies `{total: 1, available, failed}`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from localcache.api import meta, modelcache
from localcache.caching import conditions, config, importjob, jobfailures, prunedmode, sharedvolume

Obj = dict[str, Any]
Phase = Literal["pending", "running", "succeeded", "failed"]

MESSAGE_LIMIT: Final = 512


def _mapping(value: object) -> Obj:
    return value if isinstance(value, dict) else {}


def _condition(job: Obj, type_: str) -> Obj | None:
    for cond in _mapping(job.get("status")).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def phase_of(job: Obj) -> Phase:
    status = _mapping(job.get("status"))
    if _condition(job, "Complete") is not None:
        return "succeeded"
    if _condition(job, "Failed") is not None:
        return "failed"
    if (status.get("active") or 0) > 0 or (status.get("ready") or 0) > 0:
        return "running"
    return "pending"


def phase_seen(job: Obj, *, reported: str | None, recorded_uid: str | None) -> Phase:
    """`phase_of(job)`, except that a Job the status already reported succeeded (our recorded
    uid, `ImportSucceeded`) stays succeeded: a Job never leaves Complete, so an older phase
    is an informer's copy that lags (under load, behind the GET that saw it complete)."""
    phase = phase_of(job)
    uid = _mapping(job.get("metadata")).get("uid")
    if reported == sharedvolume.REASON_IMPORT_SUCCEEDED and recorded_uid and uid == recorded_uid:
        return "succeeded"
    return phase


def controller_uid(obj: Obj) -> str | None:
    for ref in _mapping(obj.get("metadata")).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return None


Verdict = Literal["ours", "unproven", "foreign"]


def judge(job: Obj, *, recorded_uid: str | None, cache_uid: str) -> Verdict:
    """Whose the Job under a cache's import name is: `ours` when its uid is the one recorded
    in the cache's status; `unproven` when not recorded but its controller ownerReference is
    the cache's uid (a crash between create and record, or a forgery claiming to be ours);
    else `foreign` (never touched)."""
    uid = str(_mapping(job.get("metadata")).get("uid") or "")
    if recorded_uid and uid == recorded_uid:
        return "ours"
    if cache_uid and controller_uid(job) == cache_uid:
        return "unproven"
    return "foreign"


def _created(pod: Obj) -> str:
    return str(_mapping(pod.get("metadata")).get("creationTimestamp") or "")


def owned_pods(pods: Iterable[Obj], job_uid: str) -> list[Obj]:
    """The pods whose controller is the Job `job_uid`, oldest first."""
    return sorted((p for p in pods if controller_uid(p) == job_uid), key=_created)


def _terminated(status: Obj) -> Iterable[tuple[str, Obj]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            if not isinstance(container, dict):
                continue
            term = _mapping(_mapping(container.get("state")).get("terminated"))
            if term:
                yield str(container.get("name") or ""), term


def _container_failure(name: str, term: Obj) -> str:
    code = jobfailures.one_line(term.get("exitCode"), limit=8) or "?"
    if name == importjob.DOWNLOAD_CONTAINER:
        found = jobfailures.gist(str(term.get("message") or ""))
        what = found or jobfailures.one_line(term.get("reason"), limit=64) or "Error"
        return f"download failed: {what} (exit code {code})"
    reason = jobfailures.one_line(term.get("reason"), limit=64) or "Error"
    return f"{jobfailures.one_line(name, limit=64)} failed: {reason} (exit code {code})"


def failure_message(job: Obj, pods: Iterable[Obj]) -> str:
    """Why the import Job failed, as it may be published (module docstring)."""
    uid = str(_mapping(job.get("metadata")).get("uid") or "")
    detail = ""
    for pod in reversed(owned_pods(pods, uid)):
        status = _mapping(pod.get("status"))
        failed = [(n, t) for n, t in _terminated(status) if t.get("exitCode") not in (None, 0)]
        if failed:
            detail = _container_failure(*failed[0])
            break
        if status.get("phase") == "Failed" and status.get("reason"):
            detail = f"pod {jobfailures.one_line(status.get('reason'), limit=64)}"
            break
    cond = _condition(job, "Failed") or {}
    reason = jobfailures.one_line(cond.get("reason"), limit=64)
    head = f"import Job failed ({reason})" if reason else "import Job failed"
    return jobfailures.clip(f"{head}: {detail}" if detail else head, MESSAGE_LIMIT)


def placed_bytes(job_uid: str, pods: Iterable[Obj]) -> int | None:
    """The placed model's size from the newest owned pod's `place` termination message."""
    for pod in reversed(owned_pods(pods, job_uid)):
        for name, term in _terminated(_mapping(pod.get("status"))):
            if name == importjob.PLACE_CONTAINER and term.get("exitCode") == 0:
                placed = importjob.placed_from_message(str(term.get("message") or ""))
                if placed is not None:
                    return placed.bytes
    return None


def retry_delay(failed_attempts: int, *, base: int, cap: int) -> int:
    """Seconds before the next attempt after `failed_attempts` failures in a row (>= 1)."""
    exponent = max(0, min(failed_attempts - 1, 30))
    return int(min(cap, base * 2**exponent))


def later(now: str, seconds: float) -> str:
    """RFC 3339 `now` + `seconds`, second precision (what status fields carry)."""
    start = parse_time(now) or datetime.datetime.now(datetime.UTC)
    moment = start + datetime.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def seconds_until(moment: str | None, now: str) -> float:
    """Seconds from `now` until `moment` (0 when past, unparseable or absent)."""
    end, start = parse_time(moment), parse_time(now)
    if end is None or start is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


# ------------------------------------------------------------------------ status


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the `Ready` condition and `copies` say for one reconcile."""

    ready: bool
    reason: str
    message: str
    available: int = 0
    failed: int = 0

    @classmethod
    def not_ready(cls, verdict: sharedvolume.Verdict, *, failed: int = 0) -> Outcome:
        return cls(False, verdict.reason, verdict.message, failed=failed)


def ready_condition(
    outcome: Outcome,
    *,
    previous: Sequence[meta.Condition] | None,
    generation: int | None,
    now: str,
) -> list[meta.Condition]:
    """The conditions of a shared-volume cache: `Ready` alone."""
    return [
        conditions.set_condition(
            list(previous or []),
            type_=conditions.READY,
            status=outcome.ready,
            reason=outcome.reason,
            message=jobfailures.clip(outcome.message, MESSAGE_LIMIT * 2),
            generation=generation,
            now=now,
        )
    ]


def copies(outcome: Outcome) -> modelcache.ModelCopies:
    return modelcache.ModelCopies(total=1, available=outcome.available, failed=outcome.failed)


WARNING_REASONS: Final = frozenset(
    {
        sharedvolume.REASON_PVC_NOT_FOUND,
        sharedvolume.REASON_UNSUPPORTED_VOLUME_MODE,
        sharedvolume.REASON_UNSUPPORTED_ACCESS_MODE,
        sharedvolume.REASON_INSUFFICIENT_CAPACITY,
        sharedvolume.REASON_DESTINATION_CONFLICT,
        sharedvolume.REASON_IMPORT_JOB_CONFLICT,
        sharedvolume.REASON_IMPORT_CREDENTIAL_ERROR,
        prunedmode.REASON,
    }
)


def events(
    old: Sequence[meta.Condition] | None, new: Sequence[meta.Condition]
) -> list[conditions.EventSpec]:
    """Events for a change of the `Ready` condition: Normal `Ready` when it turns True, a
    Warning named by the reason when it newly reports a problem (ImportFailed is recorded by
    the reconciler when it first sees the failure, with its attempt)."""
    before = next((c for c in old or [] if c.type == conditions.READY), None)
    after = next((c for c in new if c.type == conditions.READY), None)
    if after is None:
        return []
    same = before is not None and (before.status, before.reason) == (after.status, after.reason)
    if same:
        return []
    if after.status == meta.ConditionStatus.TRUE:
        return [conditions.EventSpec("Normal", "Ready", f"{after.reason}: {after.message}")]
    if after.reason in WARNING_REASONS:
        return [conditions.EventSpec("Warning", after.reason, after.message)]
    return []


def on_failure(
    sv: modelcache.SharedVolumeStatus,
    job: Obj,
    pods: Sequence[Obj],
    now: str,
    local_model: config.LocalModelConfig,
) -> tuple[modelcache.SharedVolumeStatus, int, str]:
    """Our Job first seen failed: the status with the attempt counted, why (`failure_message`)
    and when to retry; the delay in seconds; the message."""
    message = failure_message(job, pods)
    failed = (sv.failed_attempts or 0) + 1
    delay = retry_delay(
        failed,
        base=local_model.download_retry_backoff_in_secs,
        cap=local_model.download_retry_max_backoff_in_secs,
    )
    update = {"failed_attempts": failed, "next_attempt_time": later(now, delay), "message": message}
    return sv.model_copy(update=update), delay, message
