"""Gathering one download unit's inputs to `plan.decide`: the observing half of a pass.

`Observer.unit` reads, for one unit on the models root serving it: whether its folder is
complete and its manifest, the adoption evidence naming it (`agent.adoption`), its trusted
Jobs and, unless the folder alone decides (`plan.by_folder`), what its latest Job's phase
makes relevant: running, the staging folder's size (a bounded walk, `tree.folder_usage`), how
long it has not grown (`stall.GrowthWatch`), the cache's `modelSize` and the failed pod's
message when a pod failed; completed, whether the staging folder is a non-empty
directory and its size; failed, the failed pod's message. It changes nothing (the pod
messages it reads are cached by the launcher); the reconciler executes what `decide` answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Final

from localcache.agent import adoption, downloads, plan, stall
from localcache.agent.disk import folders, layout, originsums, tree
from localcache.agent.jobs import launcher, peerjob, podwait
from localcache.api import modelnode
from localcache.api import quantity as quantity_mod
from localcache.caching import config
from localcache.runtime import keys, store

STALL_WALK_ENTRIES: Final = 100_000
"""At most this many entries of a running download's staging folder are listed per look."""


@dataclasses.dataclass(frozen=True, slots=True)
class Pass:
    """What the reconcile pass already read, shared by the units it observes."""

    cfg: config.InferenceServiceConfig
    now: datetime.datetime
    jobs: Sequence[downloads.JobRef]
    states: Mapping[str, str]
    progress: Mapping[str, modelnode.ModelProgress]


class Observer:
    """Reads units' inputs from the disk, the launcher (pod messages), the adoption evidence
    and the cache stores (`modelSize`)."""

    def __init__(
        self,
        *,
        jobs: launcher.JobLauncher,
        adoptions: adoption.Adoptions,
        caches: store.Reader,
        namespace_caches: store.Reader,
        progress_interval: float,
        growth: stall.GrowthWatch,
        waits: podwait.PodWaits | None = None,
    ) -> None:
        self._jobs, self._waits = jobs, waits
        self.growth = growth
        self._adoptions = adoptions
        self._caches = caches
        self._namespace_caches = namespace_caches
        self._progress_interval = progress_interval

    async def unit(
        self, unit: downloads.Unit, seen: Pass, disk: folders.ModelDisk, *, evidence: bool
    ) -> plan.Observed:
        """The unit's inputs to `plan.decide` on `disk`; the adoption evidence only when
        `evidence` (not after a refused adoption)."""
        manifest = await asyncio.to_thread(_unit_manifest, disk, unit)
        local, jobs = seen.cfg.local_model, tuple(downloads.unit_jobs(unit, seen.jobs))
        stall_s = float(local.download_stall_timeout_in_secs)
        if stall_s and jobs and peerjob.is_seed(jobs[-1].obj):  # its sidecar may end last
            stall_s = max(stall_s, float(peerjob.SEED_GRACE_S))
        observed = plan.Observed(
            now=seen.now,
            policy=plan.Policy(
                backoff_s=local.download_retry_backoff_in_secs,
                max_backoff_s=local.download_retry_max_backoff_in_secs,
                progress_interval=self._progress_interval,
                stall_timeout_s=stall_s,
            ),
            models_root=str(disk.host_path or disk.root),
            manifest=manifest,
            claims=tuple(self._adoptions.claims(unit)) if evidence else (),
            jobs=jobs,
            states=seen.states,
            progress=seen.progress,
        )
        if not observed.jobs or plan.by_folder(unit, observed) is not None:
            return observed
        facts = await self._job_facts(unit, observed.jobs[-1], disk, observed.now)
        return dataclasses.replace(observed, latest=facts)

    async def _job_facts(
        self,
        unit: downloads.Unit,
        latest: downloads.JobRef,
        disk: folders.ModelDisk,
        now: datetime.datetime,
    ) -> plan.JobFacts:
        """What `plan.decide` reads about the latest Job, as its phase needs it."""
        state = plan.job_state(latest.obj)
        staging = disk.staging_path(unit.storage_key, latest.name)
        if state.phase is plan.JobPhase.ACTIVE:
            usage = await asyncio.to_thread(
                tree.folder_usage, staging, max_entries=STALL_WALK_ENTRIES
            )
            idle = self.growth.idle(latest.uid, usage, running=state.ready > 0)
            failed = state.failed_pods
            pod = await self._jobs.pod_message(latest, failed) if failed else ""
            if not (failed or state.ready or usage.bytes) and self._waits is not None:
                tenant = unit.leader.namespace is not None  # its Job runs in their namespace
                pod = await self._waits.message(latest, now, detail=not tenant)
            return plan.JobFacts(
                staging,
                staging_bytes=usage.bytes,
                model_size=self.model_size(unit),
                pod_message=pod,
                idle_s=idle,
            )
        if state.phase is plan.JobPhase.COMPLETE:
            if not await asyncio.to_thread(staging.is_dir):
                return plan.JobFacts(staging)
            if not await asyncio.to_thread(lambda: any(staging.iterdir())):
                return plan.JobFacts(staging, staging_is_dir=True)
            size = await asyncio.to_thread(tree.folder_bytes, staging)
            if peerjob.is_seed(latest.obj):  # the sidecar's record is no byte of the model
                size -= await asyncio.to_thread(originsums.staged_bytes, staging)
            return plan.JobFacts(
                staging,
                staging_bytes=size,
                staging_is_dir=True,
                staging_empty=False,
                model_size=self.model_size(unit),
            )
        pod = await self._jobs.pod_message(latest, state.failed_pods)
        return plan.JobFacts(staging, pod_message=pod)

    def model_size(self, unit: downloads.Unit) -> int | None:
        """The cache's `modelSize` in bytes (first entry of the unit that has one)."""
        for entry in unit.entries:
            reader = self._namespace_caches if entry.namespace else self._caches
            cache = reader.get(keys.ObjectKey(entry.namespace or "", entry.model_name))
            size = ((cache or {}).get("spec") or {}).get("modelSize")
            if size is not None:
                try:
                    return int(quantity_mod.Quantity(size))
                except ValueError:
                    continue
        return None


def _unit_manifest(disk: folders.ModelDisk, unit: downloads.Unit) -> layout.Manifest | None:
    """The manifest of the folder that serves `unit`: its scope's own variant when there is
    one (its download differed from the folder in place), else the storage key's folder."""
    variant = layout.variant_of_scope(unit.scope_id)
    for candidate in (variant, None):
        if disk.is_complete(unit.storage_key, candidate):
            return disk.manifest(unit.storage_key, candidate)
    return None
