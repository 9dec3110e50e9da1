"""The shared-volume namespace cache reconciler (`spec.pvcRef`, KServe #6107, issue 22).

`CacheReconciler` hands every namespace cache whose spec has `pvcRef` here, before any
node-group work. A reconcile of cache C, level-based:

1. C being deleted: its import Job (fresh GET), when ours (recorded uid, or a controller
   ownerReference to C's uid), is deleted (uid precondition, foreground); the finalizer stays
   until it is gone. The claim and its data are never touched.
2. The finalizer is added if missing (and the reconcile ends: its event brings the next).
3. Preflight against the claim of the informer store (`caching.sharedvolume.preflight`).
4. Destination owner: a fresh LIST of C's namespace's caches decides who owns (pvcRef, key);
   a later cache reports `DestinationConflict`, creates nothing, stops an unfinished Job.
5. The import Job `<C>-import`, judged by uid (`importstate.judge`): the recorded uid is
   ours; one whose controller ownerReference is C's uid but unrecorded is `unproven` (a crash
   between create and record, or a forgery): deleted (uid precondition) and made anew, after
   a fresh read of C; anything else is `ImportJobConflict`, never touched. Ours is replaced
   when it targets another claim uid or storage key, or the credential spec hash changed
   while it is not complete.
6. No Job: C is read afresh; after a completed import onto this claim, C stays Ready (the
   Job was removed, e.g. by a TTL policy: a re-import would replace a copy readers use). Else
   the record is written first (dropped by the CRD: `SharedVolumeUnavailable`); credentials are
   read in C's namespace as the agent reads them (`CredentialError` → `ImportCredentialError`,
   no Job); the Job is built, created and its uid recorded at once.
7. Our Job's phase: pending → ImportPending; running → ImportRunning with the progress
   sidecar's bytes (every `importjobs.PROGRESS_INTERVAL`); succeeded → ImportSucceeded with the
   placed size; failed → ImportFailed with the failure's gist and a Warning Event at once,
   then after the backoff (`status.sharedVolume.nextAttemptTime`) the failed Job is deleted
   (uid precondition) and a new one created. A user deleting the failed Job retries at once.

Status (`conditions` Ready, `copies`, `nodeStatus` emptied, `sharedVolume`, users by URI) is
written when it differs, guarded: one computed from a copy older than the API's is refused
and retried, except the record of a Job just created (its uid must be kept).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import structlog

from localcache.api import modelcache
from localcache.caching import (
    conditions,
    config,
    credentials,
    downloadcontainer,
    importjob,
    importstate,
    prunedmode,
    sharedvolume,
)
from localcache.controllers import importjobs, scope, state, status, users
from localcache.runtime import errors, kube
from localcache.runtime import keys as runtime_keys
from localcache.runtime import reconcile as reconciling

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
CONFLICT_RECHECK: Final = 60.0
DELETION_RECHECK: Final = 5.0
SV = modelcache.SharedVolumeStatus
_meta = state.meta_of
_PENDING: Final = importstate.Outcome(
    False, sharedvolume.REASON_IMPORT_PENDING, "Model import job is pending"
)
_IMPORTED: Final = importstate.Outcome(
    True, sharedvolume.REASON_IMPORT_SUCCEEDED, "Model import completed", available=1
)


class SharedVolumeReconciler:
    """Reconciles shared-volume namespace caches (module docstring)."""

    def __init__(
        self,
        sc: scope.Scope,
        *,
        api: importjobs.Api,
        stores: state.Stores,
        config: state.ConfigSource,
        recorder: status.EventRecorder,
        written: status.WrittenStatus,
        image: importjobs.ImageSource,
        now: Callable[[], str],
    ) -> None:
        self.scope = sc
        self._api = api
        self._stores = stores
        self._config = config
        self._recorder = recorder
        self._written = written
        self._image = image
        self._now = now
        self._progress = importjobs.Progress(api)

    async def reconcile(
        self, raw: Obj, cache: modelcache.LocalModelNamespaceCache
    ) -> reconciling.Result:
        ref = cache.spec.pvc_ref or ""
        namespace = cache.namespace
        old = _status(self._written.current(raw))
        sv = old.shared_volume or SV()
        claim = self._stores.persistent_volume_claims.get(runtime_keys.ObjectKey(namespace, ref))
        if claim is None:
            verdict = sharedvolume.claim_not_found(ref, namespace)
            await self._write(raw, cache, old, importstate.Outcome.not_ready(verdict), sv)
            return reconciling.Result()
        if (found := sharedvolume.preflight(claim, cache.spec.model_size)) is not None:
            await self._write(raw, cache, old, importstate.Outcome.not_ready(found), sv)
            return reconciling.Result()
        me = sharedvolume.Claimant.of(raw)
        assert me is not None
        listed = await self._api.list(state.LOCAL_MODEL_NAMESPACE_CACHES, namespace=namespace)
        rivals = [c for o in listed.items if (c := sharedvolume.Claimant.of(o)) is not None]
        if (owner := sharedvolume.destination_owner(me, rivals)) is not None:
            verdict = sharedvolume.conflict(me, owner, namespace)
            _log.info("destination_conflict", owner=owner.name)
            name = importjob.import_job_name(cache.name)
            job = await importjobs.get_job(self._api, namespace, name) if sv.job else None
            await importjobs.stop_unfinished(
                self._api, job, sv.job.uid if sv.job else None, why="destination_lost"
            )
            await self._write(raw, cache, old, importstate.Outcome.not_ready(verdict), sv)
            return reconciling.Result()
        claim_uid = str(_meta(claim).get("uid") or "")
        return await self._import(
            raw, cache, old, sv, claim_uid=claim_uid, storage_key=me.storage_key
        )

    async def finalize(self, cache: modelcache.LocalModelNamespaceCache, raw: Obj) -> bool:
        """Delete our import Job and wait for it to be gone; True when the finalizer may go."""
        old = _status(self._written.current(raw))
        recorded = (old.shared_volume or SV()).job
        job = await importjobs.get_job(
            self._api, cache.namespace, importjob.import_job_name(cache.name)
        )
        self._progress.forget(cache.metadata.uid or "")
        if job is None:
            return True
        verdict = importstate.judge(
            job, recorded_uid=recorded.uid if recorded else None, cache_uid=cache.metadata.uid or ""
        )
        if verdict == "foreign":
            return True
        if not _meta(job).get("deletionTimestamp"):
            await importjobs.delete_job(self._api, job, why="cache_deleted")
        _log.info("import_job_terminating", job=_meta(job).get("name"))
        return False

    async def unavailable(self, raw: Obj, cache: modelcache.LocalModelNamespaceCache) -> None:
        """Report a cache whose pvcRef the apiserver pruned (`caching.prunedmode`)."""
        old, ref = _status(self._written.current(raw)), prunedmode.dropped_pvc_ref(raw) or ""
        outcome = importstate.Outcome(False, prunedmode.REASON, prunedmode.message(ref))
        await self._write(raw, cache, old, outcome, old.shared_volume or SV())

    # ------------------------------------------------------------------ the import

    async def _import(
        self,
        raw: Obj,
        cache: modelcache.LocalModelNamespaceCache,
        old: modelcache.LocalModelCacheStatus,
        sv: SV,
        *,
        claim_uid: str,
        storage_key: str,
    ) -> reconciling.Result:
        cfg = self._config()
        name = importjob.import_job_name(cache.name)
        jobs = self._stores.jobs
        stored = jobs.get(runtime_keys.ObjectKey(cache.namespace, name)) if jobs else None
        job = stored or await importjobs.get_job(self._api, cache.namespace, name)
        recorded = sv.job.uid if sv.job else None
        if job is None:  # before importing, the status as written last (the store may lag)
            raw, old, sv = await self._fresh(cache)
            if self._reason(old) == sharedvolume.REASON_IMPORT_SUCCEEDED and (
                sv.claim_uid == claim_uid
            ):  # its Job removed: keep the copy in use
                await self._write(raw, cache, old, _IMPORTED, sv)
                return reconciling.Result()
            return await self._create(raw, cache, old, sv, cfg, claim_uid=claim_uid)
        verdict = importstate.judge(job, recorded_uid=recorded, cache_uid=cache.metadata.uid or "")
        if verdict == "unproven":  # the record may be newer than the store: read it afresh
            raw, old, sv = await self._fresh(cache)
            recorded = sv.job.uid if sv.job else None
            verdict = importstate.judge(
                job, recorded_uid=recorded, cache_uid=cache.metadata.uid or ""
            )
        pending = sharedvolume.REASON_IMPORT_PENDING
        if verdict == "foreign":
            message = (
                f"Job {cache.namespace}/{name} already exists and is not controlled by "
                f"LocalModelNamespaceCache {cache.namespace}/{cache.name}; localcache leaves "
                "it alone: delete it, and the import starts"
            )
            outcome = importstate.Outcome(False, sharedvolume.REASON_IMPORT_JOB_CONFLICT, message)
            if self._reason(old) != sharedvolume.REASON_IMPORT_JOB_CONFLICT:
                _log.warning("import_job_conflict", job=f"{cache.namespace}/{name}")
            await self._write(raw, cache, old, outcome, sv)
            return reconciling.Result(requeue_after=CONFLICT_RECHECK)
        annotations = _meta(job).get("annotations") or {}
        phase = importstate.phase_seen(job, reported=self._reason(old), recorded_uid=recorded)
        stale = (
            annotations.get(importjob.ANNOTATION_PVC_UID) != claim_uid
            or annotations.get(importjob.ANNOTATION_STORAGE_KEY) != storage_key
        )
        # our finished import stays Ready while its Job is deleted (a TTL policy, the tenant)
        done = verdict == "ours" and phase == "succeeded" and not stale
        if _meta(job).get("deletionTimestamp") and not done:
            outcome = importstate.Outcome(False, pending, "previous import Job is terminating")
            await self._write(raw, cache, old, outcome, sv)
            return reconciling.Result(requeue_after=DELETION_RECHECK)
        if verdict == "unproven":
            _log.warning("import_job_unproven", job=f"{cache.namespace}/{name}")
            await importjobs.delete_job(self._api, job, why="unproven")
            outcome = importstate.Outcome(False, pending, "replacing an unproven import Job")
            await self._write(raw, cache, old, outcome, sv)
            return reconciling.Result(requeue_after=DELETION_RECHECK)
        respec = phase != "succeeded" and annotations.get(
            importjob.ANNOTATION_SPEC_HASH
        ) != importjob.import_spec_hash(cache.spec)
        if stale or respec:
            why = "claim_changed" if stale else "spec_changed"
            await importjobs.delete_job(self._api, job, why=why)
            text = "the claim was recreated" if stale else "the credential spec changed"
            text += "; replacing the import Job"
            sv = sv.model_copy(update={"failed_attempts": 0, "next_attempt_time": None})
            await self._write(raw, cache, old, importstate.Outcome(False, pending, text), sv)
            return reconciling.Result(requeue_after=DELETION_RECHECK)
        return await self._follow(raw, cache, old, sv, job, phase, cfg)

    async def _fresh(
        self, cache: modelcache.LocalModelNamespaceCache
    ) -> tuple[Obj, modelcache.LocalModelCacheStatus, SV]:
        raw = await self._api.get(self.scope.resource, cache.name, namespace=cache.namespace)
        old = _status(raw.get("status") or {})
        return raw, old, old.shared_volume or SV()

    async def _follow(
        self,
        raw: Obj,
        cache: modelcache.LocalModelNamespaceCache,
        old: modelcache.LocalModelCacheStatus,
        sv: SV,
        job: Obj,
        phase: importstate.Phase,
        cfg: config.InferenceServiceConfig,
    ) -> reconciling.Result:
        namespace, uid = cache.namespace, str(_meta(job).get("uid"))
        if phase == "succeeded":
            placed = sv.bytes
            if self._reason(old) != sharedvolume.REASON_IMPORT_SUCCEEDED or placed is None:
                pods = await importjobs.pods_of(self._api, namespace, uid)
                placed = importstate.placed_bytes(uid, pods) or placed
            sv = sv.model_copy(
                update={
                    "failed_attempts": 0,
                    "next_attempt_time": None,
                    "bytes": placed,
                    "message": None,
                }
            )
            await self._write(raw, cache, old, _IMPORTED, sv)
            return reconciling.Result()
        if phase == "failed":
            return await self._failed(raw, cache, old, sv, job, cfg)
        if phase == "running":
            found = await self._progress.bytes(
                cache.metadata.uid or "", namespace=namespace, job_uid=uid
            )
            sv = sv.model_copy(update={"bytes": found if found is not None else sv.bytes})
            text = "Model import job is running"
            if sv.bytes is not None:
                text += f" ({sv.bytes} bytes so far)"
            outcome = importstate.Outcome(False, sharedvolume.REASON_IMPORT_RUNNING, text)
            await self._write(raw, cache, old, outcome, sv)
            return reconciling.Result(requeue_after=importjobs.PROGRESS_INTERVAL)
        await self._write(raw, cache, old, _PENDING, sv)
        return reconciling.Result()

    async def _failed(
        self,
        raw: Obj,
        cache: modelcache.LocalModelNamespaceCache,
        old: modelcache.LocalModelCacheStatus,
        sv: SV,
        job: Obj,
        cfg: config.InferenceServiceConfig,
    ) -> reconciling.Result:
        now = self._now()
        if sv.next_attempt_time is None:  # first seen failed: count it, say why, back off
            pods = await importjobs.pods_of(self._api, cache.namespace, str(_meta(job)["uid"]))
            sv, delay, message = importstate.on_failure(sv, job, pods, now, cfg.local_model)
            _log.warning(
                "import_failed", job=_meta(job).get("name"), attempt=sv.attempt, error=message
            )
            text = f"{message}; retrying in {delay}s"
            outcome = importstate.Outcome(False, sharedvolume.REASON_IMPORT_FAILED, text, failed=1)
            if await self._write(raw, cache, old, outcome, sv):
                event = conditions.EventSpec(
                    "Warning", sharedvolume.REASON_IMPORT_FAILED, f"attempt {sv.attempt}: {message}"
                )
                await self._recorder.record(self.scope, cache, event)
            return reconciling.Result(requeue_after=delay)
        wait = importstate.seconds_until(sv.next_attempt_time, now)
        if wait > 0:
            return reconciling.Result(requeue_after=wait)
        await importjobs.delete_job(self._api, job, why="retry")
        return reconciling.Result(requeue_after=DELETION_RECHECK)

    async def _create(
        self,
        raw: Obj,
        cache: modelcache.LocalModelNamespaceCache,
        old: modelcache.LocalModelCacheStatus,
        sv: SV,
        cfg: config.InferenceServiceConfig,
        *,
        claim_uid: str,
    ) -> reconciling.Result:
        intent = sv.model_copy(update={"claim_uid": claim_uid})
        creating = importstate.Outcome(False, sharedvolume.REASON_IMPORT_PENDING, "creating Job")
        await self._write(raw, cache, old, creating, intent)
        if not importjobs.record_kept(self._written.current(raw), claim_uid):
            lost = importstate.Outcome(False, prunedmode.REASON, importjobs.RECORD_PRUNED)
            await self._write(raw, cache, old, lost, sv)
            return reconciling.Result(requeue_after=CONFLICT_RECHECK)
        try:
            job = await importjobs.prepare_job(
                self._api, cache, cfg, claim_uid=claim_uid, image=self._image
            )
        except (credentials.CredentialError, downloadcontainer.ContainerError) as exc:
            outcome = importstate.Outcome(
                False, sharedvolume.REASON_IMPORT_CREDENTIAL_ERROR, str(exc)
            )
            await self._write(raw, cache, old, outcome, sv)
            return reconciling.Result(requeue_after=cfg.local_model.download_retry_backoff_in_secs)
        name = str(job["metadata"]["name"])
        try:
            created = await self._api.create(kube.JOBS, job, namespace=cache.namespace)
        except errors.Conflict as exc:
            if not exc.already_exists:
                raise
            raise errors.LocalcacheError(f"import Job {cache.namespace}/{name} appeared") from exc
        uid = str(_meta(created).get("uid") or "")
        attempt = (sv.attempt or 0) + 1
        _log.info("import_job_created", job=f"{cache.namespace}/{name}", uid=uid, attempt=attempt)
        sv = SV(
            claim_uid=claim_uid,
            job=modelcache.ImportJobRef(name=name, uid=uid),
            attempt=attempt,
            failed_attempts=sv.failed_attempts,
        )
        await self._write(raw, cache, old, _PENDING, sv, guarded=False)  # the Job exists now
        return reconciling.Result()

    def _reason(self, old: modelcache.LocalModelCacheStatus) -> str | None:
        return next((c.reason for c in old.conditions or [] if c.type == "Ready"), None)

    async def _write(
        self,
        raw: Obj,
        cache: modelcache.LocalModelNamespaceCache,
        old: modelcache.LocalModelCacheStatus,
        outcome: importstate.Outcome,
        sv: SV,
        guarded: bool = True,
    ) -> bool:
        conds = importstate.ready_condition(
            outcome, previous=old.conditions, generation=cache.metadata.generation, now=self._now()
        )
        desired: Obj = {
            "nodeStatus": None,
            "copies": importstate.copies(outcome).to_dict(),
            "conditions": [c.to_dict() for c in conds],
            "sharedVolume": sv.to_dict() or None,
        }
        desired.update(users.shared_users(self._stores, cache))
        wrote = await status.write_status(
            self._api,
            self.scope,
            current=raw,
            desired=desired,
            written=self._written,
            guarded=guarded,
        )
        if wrote:
            for event in importstate.events(old.conditions, conds):
                await self._recorder.record(self.scope, cache, event)
        return wrote


def _status(raw: Obj) -> modelcache.LocalModelCacheStatus:
    try:
        return modelcache.LocalModelCacheStatus.model_validate(raw)
    except ValueError:
        return modelcache.LocalModelCacheStatus()
