"""The per-unit state machine of the node agent, as a pure function, and the facts it reads.

`decide(unit, observed)` says what one download unit needs next, from what the reconciler
observed of it in this pass (`Observed`: its folder's manifest, the adoption evidence, its
latest trusted Job and that Job's staging folder, the status as last written, the clock and
the config). It does no I/O; the reconciler gathers the inputs and executes the `Action`:

- `Downloaded`: a complete folder may be reused (downloaded without credentials or in the
  unit's scope, or the unit's own Job proved access earlier, as its status recorded it);
- `Adopt`: the folder has no manifest but the status as this process first read it says
  KServe's add-on downloaded it (`agent.adoption`); when the adoption is refused the
  reconciler decides again with no evidence (`Observed.without_claims`);
- `Launch`: create attempt `attempt` of the unit's Job (none yet, the folder of a completed
  Job was lost, or the backoff after a failure has passed);
- `Report`: the latest Job runs: Pending or Downloading with progress (a pod failure while
  the Job still retries is only a message [P17]);
- `Promote`: the latest Job completed and wrote its staging folder: promote it;
- `Wait`: the latest Job failed (or completed without writing anything): a ModelDownloadError
  until the backoff has passed;
- `Stop`: the latest Job wrote more than `modelSize`, or its staging folder has not grown for
  `downloadStallTimeoutInSecs` (`DownloadStalled`, `agent.stall`): delete it, then retry.

Job phases follow the Job's conditions only (`job_state`): `Failed` (for good, [P17]) and
`Complete`; a Job whose pods failed but that still retries is `ACTIVE`. Download units and
their Jobs are `agent.downloads`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from localcache.agent import downloads, jobstate, stall, status
from localcache.agent.disk import layout
from localcache.agent.jobstate import JobPhase as JobPhase
from localcache.agent.jobstate import JobState as JobState
from localcache.agent.jobstate import job_state as job_state
from localcache.api import modelnode
from localcache.caching import jobfailures
from localcache.runtime import clock as clock_mod

Obj = dict[str, Any]
ModelStatus = modelnode.ModelStatus

POD_MESSAGE_LIMIT: Final = jobfailures.POD_MESSAGE_LIMIT
STALL_LOOK_MIN_S: Final = 1.0
NOT_STARTED: Final = "the download pod of Job "  # a message's start: why it has not started
one_line = jobfailures.one_line
clip = jobfailures.clip


def retry_delay(attempt: int, *, base: float, cap: float) -> float:
    """Seconds between the failure of attempt `attempt` (0-based) and the next attempt:
    `base` doubling per attempt, at most `cap`."""
    if attempt >= 64:
        return cap
    return float(min(cap, base * (2**attempt)))


def percent(size: int, model_size: int | None) -> int | None:
    """Progress in percent of `model_size` (None when unknown), capped at 99 while
    downloading: only a promoted folder is 100 %."""
    if not model_size or model_size <= 0:
        return None
    return min(99, size * 100 // model_size)


# ---- time -----------------------------------------------------------------------------------
parse_time = jobstate.parse_time


def format_time(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return clock_mod.rfc3339(value)


# ---- what the reconciler observed of one unit ---------------------------------------------
@dataclass(frozen=True, slots=True)
class Policy:
    """The settings a decision reads: retry backoff (`downloadRetryBackoffInSecs`, doubling up
    to `downloadRetryMaxBackoffInSecs`) and how often a running download is looked at."""

    backoff_s: float
    max_backoff_s: float
    progress_interval: float
    stall_timeout_s: float = 0.0
    """`downloadStallTimeoutInSecs` (0: never stop a download for writing nothing)."""


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What was read about the unit's latest Job beyond the Job object, as its phase needs it:
    running, the staging folder's size, the model's size (the cache's `modelSize`) and, when
    a pod failed, that pod's message (none failed: why its pod cannot start, if it says);
    completed, whether the staging folder is a directory, whether it is empty and its size;
    failed, the failed pod's message."""

    staging: Path
    staging_bytes: int = 0
    staging_is_dir: bool = False
    staging_empty: bool = True
    model_size: int | None = None
    pod_message: str = ""
    idle_s: float = 0.0
    """Running: seconds since the staging folder last grew (`stall.GrowthWatch`)."""


@dataclass(frozen=True, slots=True)
class Observed:
    """One unit's inputs to `decide`, gathered by the reconciler in one pass."""

    now: datetime.datetime
    policy: Policy
    models_root: str
    """The models root serving the unit, as the node sees it (host path, else the root)."""
    manifest: layout.Manifest | None
    """The manifest of the unit's complete folder on that root (None: no complete folder)."""
    claims: tuple[str, ...] = ()
    """Status keys of the unit that the adoption evidence reports downloaded into its folder."""
    jobs: tuple[downloads.JobRef, ...] = ()
    """The unit's trusted Jobs, oldest attempt first (`downloads.unit_jobs`)."""
    latest: JobFacts | None = None
    """Facts of `jobs[-1]`; not read while the folder alone decides (`by_folder`)."""
    states: Mapping[str, str] = field(default_factory=dict)
    """`status.modelStatus` as it was before this pass."""
    progress: Mapping[str, modelnode.ModelProgress] = field(default_factory=dict)
    """`status.modelProgress` as it was before this pass."""

    def without_claims(self) -> Observed:
        """The same observation after a refused adoption (the evidence is spent)."""
        return dataclasses.replace(self, claims=())


# ---- actions ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Downloaded:
    """The folder is the unit's: report it downloaded (`job_name` proved access, if any)."""

    manifest: layout.Manifest
    job_name: str | None

    def outcome(self) -> status.Outcome:
        progress = modelnode.ModelProgress(
            bytes_on_disk=self.manifest.bytes,
            percent=100,
            job_name=self.job_name,
            completion_time=self.manifest.completed_at,
            folder=self.manifest.folder if self.manifest.variant else None,
        )
        return status.Outcome(ModelStatus.DOWNLOADED, progress)


@dataclass(frozen=True, slots=True)
class Adopt:
    """Adopt the folder KServe's add-on downloaded for `claims` (`agent.adoption`)."""

    claims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Launch:
    """Create attempt `attempt` of the unit's Job; `message` is kept in status meanwhile.

    `lost`: the completed Job whose folder is gone; `retry_of`: the Job whose failure (or
    empty result) this attempt retries; `failed`: a failed Job to count once; `keep_staging`:
    a Job whose staging folder stays although it is not running."""

    attempt: int
    message: str | None = None
    lost: downloads.JobRef | None = None
    retry_of: downloads.JobRef | None = None
    failed: downloads.JobRef | None = None
    keep_staging: str | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """The latest Job runs: report `outcome` (Pending or Downloading, with progress)."""

    outcome: status.Outcome


@dataclass(frozen=True, slots=True)
class Promote:
    """The latest Job completed and wrote `staging`: promote it with `manifest`."""

    job: downloads.JobRef
    state: JobState
    staging: Path
    manifest: layout.Manifest


@dataclass(frozen=True, slots=True)
class Wait:
    """A ModelDownloadError until the retry (`outcome`); `failed` and `keep_staging` as for
    `Launch`."""

    outcome: status.Outcome
    failed: downloads.JobRef | None = None
    keep_staging: str | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """The latest Job wrote more than the cache's `modelSize` (security review finding 9), or
    stalled: delete it and its staging folder; `outcome` is the ModelDownloadError until the
    retry."""

    job: downloads.JobRef
    outcome: status.Outcome


Action = Downloaded | Adopt | Launch | Report | Promote | Wait | Stop


# ---- the decision -------------------------------------------------------------------------
def decide(unit: downloads.Unit, observed: Observed) -> Action:
    """What the unit needs next (the module docstring lists the actions)."""
    settled = by_folder(unit, observed)
    if settled is not None:
        return settled
    if not observed.jobs:
        return _after_stop(unit, observed) or Launch(attempt=0)
    latest, facts = observed.jobs[-1], observed.latest
    if facts is None:
        raise ValueError(f"the facts of Job {latest.namespace}/{latest.name} were not observed")
    state = job_state(latest.obj)
    if facts.model_size and facts.staging_bytes > facts.model_size:
        why = stall.oversize_message(latest, facts.staging_bytes, facts.model_size)
        return _stop(latest, facts, observed, why)
    timeout = observed.policy.stall_timeout_s
    if state.phase is JobPhase.ACTIVE and 0 < timeout <= facts.idle_s:
        why = stall.stalled_message(latest, facts.staging_bytes, facts.idle_s, timeout)
        return _stop(latest, facts, observed, why)
    if state.phase is JobPhase.ACTIVE:
        return Report(_running(unit, latest, state, facts, observed))
    if state.phase is JobPhase.COMPLETE:
        return _completed(unit, latest, state, facts, observed)
    why = facts.pod_message or one_line(state.message or state.reason) or "no message"
    message = clip(f"download Job {latest.namespace}/{latest.name} failed: {why}")
    return _retry_or_wait(latest, state, observed, message, failed=latest)


def by_folder(unit: downloads.Unit, observed: Observed) -> Downloaded | Adopt | None:
    """What the folder alone decides: adopt it (evidence, no complete folder), or reuse the
    complete one; None when the unit's Jobs decide (their facts are needed then)."""
    manifest = observed.manifest
    if observed.claims and manifest is None:
        return Adopt(observed.claims)
    if manifest is None:
        return None
    if unit.reuses(manifest.job):
        return Downloaded(manifest, None if manifest.adopted else manifest.job)
    proof = _proof(unit, observed)
    return Downloaded(manifest, proof) if proof is not None else None


def _running(
    unit: downloads.Unit,
    latest: downloads.JobRef,
    state: JobState,
    facts: JobFacts,
    observed: Observed,
) -> status.Outcome:
    message = _carried_message(unit, observed) if latest.attempt > 0 else None
    if state.failed_pods:
        where = f"{latest.namespace}/{latest.name}"
        message = clip(f"a download pod failed, Job {where} retries: {facts.pod_message or '?'}")
    elif facts.pod_message:  # running, but its pod cannot start (`agent.jobs.podwait`)
        message = clip(f"{NOT_STARTED}{latest.name} cannot start: {facts.pod_message}")
    size = facts.staging_bytes
    progress = modelnode.ModelProgress(
        bytes_on_disk=size,
        percent=percent(size, facts.model_size),
        attempts=latest.attempt + 1,
        job_name=latest.name,
        message=message,
    )
    downloading = state.ready > 0 or size > 0
    phase = ModelStatus.DOWNLOADING if downloading else ModelStatus.DOWNLOAD_PENDING
    again, timeout = observed.policy.progress_interval, observed.policy.stall_timeout_s
    if timeout > 0:  # look again by the time it would have stalled
        again = min(again, max(STALL_LOOK_MIN_S, timeout - facts.idle_s))
    return status.Outcome(phase, progress, again)


def _completed(
    unit: downloads.Unit,
    latest: downloads.JobRef,
    state: JobState,
    facts: JobFacts,
    observed: Observed,
) -> Action:
    if not facts.staging_is_dir:
        if observed.manifest is not None:  # promoted earlier, or another scope's folder is there
            return Downloaded(observed.manifest, latest.name)
        return Launch(attempt=latest.attempt + 1, lost=latest)
    if facts.staging_empty:
        message = (
            f"download Job {latest.namespace}/{latest.name} succeeded but wrote nothing "
            f"into {facts.staging}: the node group's PV must be the agent's models root "
            f"({observed.models_root})"
        )
        return _retry_or_wait(latest, state, observed, message, keep_staging=latest.name)
    record = layout.Manifest(
        storage_key=unit.storage_key,
        uri=unit.request.uri,
        bytes=facts.staging_bytes,
        completed_at=format_time(state.finished_at or observed.now),
        job=latest.name,
    )
    return Promote(job=latest, state=state, staging=facts.staging, manifest=record)


def _retry_or_wait(
    latest: downloads.JobRef,
    state: JobState,
    observed: Observed,
    message: str,
    *,
    failed: downloads.JobRef | None = None,
    keep_staging: str | None = None,
) -> Launch | Wait:
    """A new attempt once the backoff after `latest` has passed; until then an error."""
    delay = retry_delay(
        latest.attempt, base=observed.policy.backoff_s, cap=observed.policy.max_backoff_s
    )
    retry_at = (state.finished_at or observed.now) + datetime.timedelta(seconds=delay)
    wait = (retry_at - observed.now).total_seconds()
    if wait <= 0:
        return Launch(
            attempt=latest.attempt + 1,
            message=message,
            retry_of=latest,
            failed=failed,
            keep_staging=keep_staging,
        )
    progress = modelnode.ModelProgress(
        attempts=latest.attempt + 1,
        job_name=latest.name,
        message=message,
        next_retry_time=format_time(retry_at),
    )
    outcome = status.Outcome(ModelStatus.DOWNLOAD_ERROR, progress, wait)
    return Wait(outcome, failed=failed, keep_staging=keep_staging)


def _stop(latest: downloads.JobRef, facts: JobFacts, observed: Observed, message: str) -> Stop:
    delay = retry_delay(
        latest.attempt, base=observed.policy.backoff_s, cap=observed.policy.max_backoff_s
    )
    progress = modelnode.ModelProgress(
        bytes_on_disk=facts.staging_bytes,
        attempts=latest.attempt + 1,
        job_name=latest.name,
        message=clip(message),
        next_retry_time=format_time(observed.now + datetime.timedelta(seconds=delay)),
    )
    return Stop(latest, status.Outcome(ModelStatus.DOWNLOAD_ERROR, progress, delay))


def _after_stop(unit: downloads.Unit, observed: Observed) -> Wait | Launch | None:
    """A unit without Jobs whose last one was stopped (`Stop`): the error until its retry
    time, as its status recorded it, then the next attempt."""
    for key in unit.status_keys:
        progress = observed.progress.get(key)
        retry_at = parse_time(progress.next_retry_time) if progress else None
        if progress is None or retry_at is None or not stall.was_stopped(progress.message):
            continue
        attempts = progress.attempts or 1
        if retry_at <= observed.now:
            return Launch(attempt=attempts, message=progress.message)
        wait = (retry_at - observed.now).total_seconds()
        return Wait(status.Outcome(ModelStatus.DOWNLOAD_ERROR, progress, wait))
    return None


def _proof(unit: downloads.Unit, observed: Observed) -> str | None:
    """A Job of the unit's scope that downloaded the URI before, as the status recorded it
    for one of the unit's entries (TTL may have removed the Job since)."""
    for key in unit.status_keys:
        progress = observed.progress.get(key)
        downloaded = observed.states.get(key) == ModelStatus.DOWNLOADED.value
        if downloaded and progress is not None and unit.reuses(progress.job_name):
            return progress.job_name
    return None


def _carried_message(unit: downloads.Unit, observed: Observed) -> str | None:
    """The failure message an earlier attempt left in status (kept while retrying)."""
    for key in unit.status_keys:
        progress = observed.progress.get(key)
        if progress is not None and progress.message:  # (not why a pod had not started)
            return None if progress.message.startswith(NOT_STARTED) else progress.message
    return None
