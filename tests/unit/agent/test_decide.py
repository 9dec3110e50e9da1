"""`plan.decide`, the per-unit state machine, as a table: what one download unit needs next
from what the reconciler observed of it (no I/O anywhere here)."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import downloads, plan, status
from localcache.agent.disk import layout
from localcache.api import modelnode

URI = "s3://mybucket/mymodel"
NODE = "node-1"
T0 = datetime.datetime(2026, 3, 1, 10, tzinfo=datetime.UTC)
STAGING = Path("/mnt/models/.staging/x")
POLICY = plan.Policy(backoff_s=10.0, max_backoff_s=300.0, progress_interval=5.0)
Downloaded = modelnode.ModelStatus.DOWNLOADED

(UNIT,) = downloads.units(
    [modelnode.LocalModelInfo.model_validate({"sourceModelUri": URI, "modelName": "iris"})],
    node_name=NODE,
    job_namespace="jobs",
)
(SCOPED,) = downloads.units(
    [
        modelnode.LocalModelInfo.model_validate(
            {
                "sourceModelUri": URI,
                "modelName": "llm",
                "namespace": "team-a",
                "serviceAccountName": "reader",
            }
        )
    ],
    node_name=NODE,
    job_namespace="jobs",
)
KEY = UNIT.storage_key


def _name(unit: downloads.Unit, attempt: int) -> str:
    return f"{unit.tag}-{attempt}-abcd1234"


def _job(
    attempt: int = 0,
    *,
    phase: str = "",
    ready: int = 0,
    failed: int = 0,
    finished: datetime.datetime = T0,
    unit: downloads.Unit = UNIT,
    message: str = "",
) -> downloads.JobRef:
    job_status: dict[str, Any] = {"startTime": "2026-03-01T09:00:00Z", "ready": ready}
    if failed:
        job_status["failed"] = failed
    if phase:
        job_status["conditions"] = [
            {
                "type": phase,
                "status": "True",
                "lastTransitionTime": plan.format_time(finished),
                "reason": "BackoffLimitExceeded" if phase == "Failed" else "",
                "message": message,
            }
        ]
    name = _name(unit, attempt)
    return downloads.JobRef(
        namespace="jobs",
        name=name,
        uid=f"uid-{attempt}",
        status_key=unit.status_keys[0],
        storage_key=unit.storage_key,
        scope=unit.scope_id,
        attempt=attempt,
        obj={"metadata": {"name": name, "namespace": "jobs"}, "status": job_status},
    )


def _manifest(job: str, *, adopted: bool = False) -> layout.Manifest:
    return layout.Manifest(
        storage_key=KEY,
        uri=URI,
        bytes=42,
        completed_at="2026-03-01T09:30:00Z",
        job=job,
        adopted=adopted,
    )


def _observed(
    *,
    manifest: layout.Manifest | None = None,
    claims: tuple[str, ...] = (),
    jobs: tuple[downloads.JobRef, ...] = (),
    latest: plan.JobFacts | None = None,
    states: dict[str, str] | None = None,
    progress: dict[str, modelnode.ModelProgress] | None = None,
    now: datetime.datetime = T0,
) -> plan.Observed:
    return plan.Observed(
        now=now,
        policy=POLICY,
        models_root="/mnt/models",
        manifest=manifest,
        claims=claims,
        jobs=jobs,
        latest=latest,
        states=states or {},
        progress=progress or {},
    )


LATER = T0 + datetime.timedelta(seconds=11)  # the first backoff (10 s) has passed
OTHER_SCOPE = f"lmd-{KEY}-{'f' * 16}-0-abcd1234"  # a Job name of another credential scope
PROVED = {"team-a/llm": modelnode.ModelProgress(job_name=_name(SCOPED, 2))}

CASES: list[tuple[str, downloads.Unit, plan.Observed, plan.Action]] = [
    (
        "a folder downloaded without credentials is reused",
        UNIT,
        _observed(manifest=_manifest(_name(UNIT, 0)), jobs=(_job(0, phase="Failed"),)),
        plan.Downloaded(_manifest(_name(UNIT, 0)), job_name=_name(UNIT, 0)),
    ),
    (
        "an adopted folder is reused with no Job to name",
        UNIT,
        _observed(manifest=_manifest(UNIT.tag, adopted=True)),
        plan.Downloaded(_manifest(UNIT.tag, adopted=True), job_name=None),
    ),
    (
        "another scope's folder needs this scope's own download",
        SCOPED,
        _observed(manifest=_manifest(OTHER_SCOPE)),
        plan.Launch(attempt=0),
    ),
    (
        "the unit's own Job proved access earlier (status says so)",
        SCOPED,
        _observed(
            manifest=_manifest("lmd-somebody-else-0-abcd1234"),
            states={"team-a/llm": Downloaded.value},
            progress=PROVED,
        ),
        plan.Downloaded(_manifest("lmd-somebody-else-0-abcd1234"), job_name=_name(SCOPED, 2)),
    ),
    (
        "a proof counts only when the status said Downloaded",
        SCOPED,
        _observed(manifest=_manifest("lmd-somebody-else-0-abcd1234"), progress=PROVED),
        plan.Launch(attempt=0),
    ),
    (
        "evidence and no complete folder: adopt",
        UNIT,
        _observed(claims=("iris",), jobs=(_job(0, phase="Failed"),)),
        plan.Adopt(("iris",)),
    ),
    (
        "evidence but a complete folder: reuse, no adoption",
        UNIT,
        _observed(manifest=_manifest(_name(UNIT, 0)), claims=("iris",)),
        plan.Downloaded(_manifest(_name(UNIT, 0)), job_name=_name(UNIT, 0)),
    ),
    ("no folder and no Job: launch the first attempt", UNIT, _observed(), plan.Launch(attempt=0)),
    (
        "a running Job with nothing written yet is pending",
        UNIT,
        _observed(jobs=(_job(0),), latest=plan.JobFacts(STAGING)),
        plan.Report(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOAD_PENDING,
                modelnode.ModelProgress(bytes_on_disk=0, attempts=1, job_name=_name(UNIT, 0)),
                5.0,
            )
        ),
    ),
    (
        "a running Job that wrote bytes is downloading, with its percent of modelSize",
        UNIT,
        _observed(jobs=(_job(0),), latest=plan.JobFacts(STAGING, staging_bytes=50, model_size=200)),
        plan.Report(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOADING,
                modelnode.ModelProgress(
                    bytes_on_disk=50, percent=25, attempts=1, job_name=_name(UNIT, 0)
                ),
                5.0,
            )
        ),
    ),
    (
        "a retry keeps the failure message an earlier attempt left",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Failed"), _job(1, ready=1)),
            latest=plan.JobFacts(STAGING),
            progress={"iris": modelnode.ModelProgress(message="download Job x failed: 403")},
        ),
        plan.Report(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOADING,
                modelnode.ModelProgress(
                    bytes_on_disk=0,
                    attempts=2,
                    job_name=_name(UNIT, 1),
                    message="download Job x failed: 403",
                ),
                5.0,
            )
        ),
    ),
    (
        "a retry whose pod started again does not keep why an earlier pod had not started",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Failed"), _job(1, ready=1)),
            latest=plan.JobFacts(STAGING),
            progress={
                "iris": modelnode.ModelProgress(
                    message=f"{plan.NOT_STARTED}x cannot start: ImagePullBackOff"
                )
            },
        ),
        plan.Report(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOADING,
                modelnode.ModelProgress(bytes_on_disk=0, attempts=2, job_name=_name(UNIT, 1)),
                5.0,
            )
        ),
    ),
    (
        "a pod failure while the Job still retries is only a message",
        UNIT,
        _observed(jobs=(_job(0, failed=1),), latest=plan.JobFacts(STAGING, pod_message="oom")),
        plan.Report(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOAD_PENDING,
                modelnode.ModelProgress(
                    bytes_on_disk=0,
                    attempts=1,
                    job_name=_name(UNIT, 0),
                    message=f"a download pod failed, Job jobs/{_name(UNIT, 0)} retries: oom",
                ),
                5.0,
            )
        ),
    ),
    (
        "a running Job whose pod cannot start says why",
        UNIT,
        _observed(
            jobs=(_job(0),),
            latest=plan.JobFacts(STAGING, pod_message="ImagePullBackOff: Back-off pulling"),
        ),
        plan.Report(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOAD_PENDING,
                modelnode.ModelProgress(
                    bytes_on_disk=0,
                    attempts=1,
                    job_name=_name(UNIT, 0),
                    message=f"the download pod of Job {_name(UNIT, 0)} cannot start: "
                    "ImagePullBackOff: Back-off pulling",
                ),
                5.0,
            )
        ),
    ),
    (
        "a completed Job's staging folder is promoted",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Complete"),),
            latest=plan.JobFacts(
                STAGING, staging_bytes=42, staging_is_dir=True, staging_empty=False
            ),
        ),
        plan.Promote(
            job=_job(0, phase="Complete"),
            state=plan.job_state(_job(0, phase="Complete").obj),
            staging=STAGING,
            manifest=layout.Manifest(
                storage_key=KEY,
                uri=URI,
                bytes=42,
                completed_at=plan.format_time(T0),
                job=_name(UNIT, 0),
            ),
        ),
    ),
    (
        "a completed Job whose folder is in place already (promoted earlier)",
        SCOPED,
        _observed(
            manifest=_manifest("lmd-somebody-else-0-abcd1234"),
            jobs=(_job(0, phase="Complete", unit=SCOPED),),
            latest=plan.JobFacts(STAGING),
        ),
        plan.Downloaded(_manifest("lmd-somebody-else-0-abcd1234"), job_name=_name(SCOPED, 0)),
    ),
    (
        "a completed Job whose folder was lost: download again",
        UNIT,
        _observed(jobs=(_job(0, phase="Complete"),), latest=plan.JobFacts(STAGING)),
        plan.Launch(attempt=1, lost=_job(0, phase="Complete")),
    ),
    (
        "a completed Job that wrote nothing: an error until the backoff, its staging kept",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Complete"),),
            latest=plan.JobFacts(STAGING, staging_is_dir=True),
        ),
        plan.Wait(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOAD_ERROR,
                modelnode.ModelProgress(
                    attempts=1,
                    job_name=_name(UNIT, 0),
                    message=(
                        f"download Job jobs/{_name(UNIT, 0)} succeeded but wrote nothing into "
                        f"{STAGING}: the node group's PV must be the agent's models root "
                        "(/mnt/models)"
                    ),
                    next_retry_time="2026-03-01T10:00:10Z",
                ),
                10.0,
            ),
            keep_staging=_name(UNIT, 0),
        ),
    ),
    (
        "a failed Job: an error with the pod's message until the backoff has passed",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Failed"),),
            latest=plan.JobFacts(STAGING, pod_message="403 Forbidden"),
        ),
        plan.Wait(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOAD_ERROR,
                modelnode.ModelProgress(
                    attempts=1,
                    job_name=_name(UNIT, 0),
                    message=f"download Job jobs/{_name(UNIT, 0)} failed: 403 Forbidden",
                    next_retry_time="2026-03-01T10:00:10Z",
                ),
                10.0,
            ),
            failed=_job(0, phase="Failed"),
        ),
    ),
    (
        "a failed Job without a pod message says the Job's own reason",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Failed", message="Job has reached the backoff limit"),),
            latest=plan.JobFacts(STAGING),
            now=LATER,
        ),
        plan.Launch(
            attempt=1,
            message=f"download Job jobs/{_name(UNIT, 0)} failed: Job has reached the backoff limit",
            retry_of=_job(0, phase="Failed", message="Job has reached the backoff limit"),
            failed=_job(0, phase="Failed", message="Job has reached the backoff limit"),
        ),
    ),
    (
        "the backoff doubles per attempt",
        UNIT,
        _observed(
            jobs=(_job(0, phase="Failed"), _job(1, phase="Failed")),
            latest=plan.JobFacts(STAGING, pod_message="boom"),
            now=LATER,
        ),
        plan.Wait(
            status.Outcome(
                modelnode.ModelStatus.DOWNLOAD_ERROR,
                modelnode.ModelProgress(
                    attempts=2,
                    job_name=_name(UNIT, 1),
                    message=f"download Job jobs/{_name(UNIT, 1)} failed: boom",
                    next_retry_time="2026-03-01T10:00:20Z",
                ),
                9.0,
            ),
            failed=_job(1, phase="Failed"),
        ),
    ),
]


@pytest.mark.parametrize(
    ("unit", "observed", "expected"),
    [pytest.param(u, o, e, id=case) for case, u, o, e in CASES],
)
def test_decide(unit: downloads.Unit, observed: plan.Observed, expected: plan.Action) -> None:
    assert plan.decide(unit, observed) == expected


def test_a_refused_adoption_is_decided_again_without_the_evidence() -> None:
    observed = _observed(claims=("iris",))
    assert plan.decide(UNIT, observed) == plan.Adopt(("iris",))
    assert plan.decide(UNIT, observed.without_claims()) == plan.Launch(attempt=0)


def test_the_folder_alone_decides_before_any_job_fact_is_read() -> None:
    """`by_folder` tells the reconciler when it need not read the latest Job's facts."""
    reused = _observed(manifest=_manifest(_name(UNIT, 0)), jobs=(_job(0, phase="Failed"),))
    assert plan.by_folder(UNIT, reused) is not None
    assert plan.by_folder(UNIT, _observed(jobs=(_job(0),))) is None


def test_a_job_whose_facts_were_not_observed_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="not observed"):
        plan.decide(UNIT, _observed(jobs=(_job(0),)))


def test_a_decision_never_changes_its_input() -> None:
    observed = _observed(jobs=(_job(0, phase="Failed"),), latest=plan.JobFacts(STAGING))
    before = dataclasses.replace(observed)
    plan.decide(UNIT, observed)
    assert observed == before


def test_a_download_over_the_caches_model_size_is_stopped_and_retried_after_the_backoff() -> None:
    """Security review finding 9: `modelSize: 1` with terabytes behind it filled the disk."""
    running = plan.JobFacts(STAGING, staging_bytes=2048, model_size=1024)
    action = plan.decide(UNIT, _observed(jobs=(_job(0),), latest=running))
    assert isinstance(action, plan.Stop)
    assert action.job == _job(0)
    assert action.outcome.status == modelnode.ModelStatus.DOWNLOAD_ERROR
    progress = action.outcome.progress
    assert "more than the cache's modelSize (1024 bytes)" in (progress.message or "")
    assert progress.next_retry_time == plan.format_time(T0 + datetime.timedelta(seconds=10))
    completed = plan.JobFacts(
        STAGING, staging_bytes=2048, staging_is_dir=True, staging_empty=False, model_size=1024
    )
    action = plan.decide(UNIT, _observed(jobs=(_job(0, phase="Complete"),), latest=completed))
    assert isinstance(action, plan.Stop), "an oversized download is never promoted"

    # the Job is gone now: the error stays until the retry time, then attempt 1 starts
    recorded = {"iris": progress}
    waiting = plan.decide(UNIT, _observed(progress=recorded))
    assert isinstance(waiting, plan.Wait)
    assert waiting.outcome.status == modelnode.ModelStatus.DOWNLOAD_ERROR
    retried = plan.decide(UNIT, _observed(progress=recorded, now=LATER))
    assert retried == plan.Launch(attempt=1, message=progress.message)


def test_a_download_within_its_model_size_runs_on() -> None:
    running = plan.JobFacts(STAGING, staging_bytes=1024, model_size=1024)
    assert isinstance(plan.decide(UNIT, _observed(jobs=(_job(0),), latest=running)), plan.Report)
