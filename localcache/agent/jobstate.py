"""A download Job's phase, from its conditions only: `Failed` (for good, [P17]) and
`Complete`; a Job whose pods failed but that still retries is `ACTIVE`. Pure."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from localcache.runtime import clock as clock_mod

Obj = dict[str, Any]


def parse_time(value: Any) -> datetime.datetime | None:
    """An RFC 3339 timestamp as an aware datetime, or None."""
    return clock_mod.parse_rfc3339(value)


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
