"""The node agent's reconciler: keeps this node's model folders in line with its own
LocalModelNode and reports each entry's download state (spec §5, reference §4).

One pass (`reconcile`), for the LocalModelNode named like this node only:
1. finish any promotion a crash interrupted (`disk.recover`); load the config (the last
   good one stays in force when the ConfigMap turns invalid; nothing runs before a first
   good one; a missing ConfigMap means KServe's defaults);
2. sort the Jobs seen into trusted (created by this agent: uid recorded in status, see
   `agent.trust`) and untrusted (reported once, by log and Event, then ignored: never proof,
   never a state, never deleted); delete trusted Jobs that no spec entry wants any more
   (`launcher.cleanup`);
3. per download unit (`plan.units`: same URI and full credential scope; its entries share
   one Job, folder and status; its Jobs are the trusted ones recorded for that storage key
   and scope, in a namespace of its entries): Downloaded when the complete folder (with
   manifest) may be reused: it was downloaded without credentials, or in the unit's scope,
   or the unit's own Job proved access earlier (recorded in `modelProgress.jobName`); or
   when a folder without manifest that KServe's add-on downloaded is adopted, on the
   evidence of the status as this process first read it (`agent.adoption`; no status is
   written before every unit was considered).
   Otherwise follow the unit's latest Job: none → create one (or ModelDownloadError saying
   why not: credentials, node group, PV path); running → Pending/Downloading with progress
   (a pod failure while the Job still retries is only a message [P17]); Complete → promote
   the staging folder (keeping an existing complete folder) or re-download when the folder
   was lost; Failed → ModelDownloadError with the pod's message, and a new attempt after
   the backoff;
   Each unit is served on the models root whose host path is its node group's PV path
   (`roots.Disks`); a path no root has is a ModelDownloadError naming the roots;
4. per root, delete folders no entry maps to by the keep rule (`roots.retention`: nothing
   on a root no node group declares any more, and never a folder whose entry is now served
   on another root; what is kept is logged and posted once as a `ModelFoldersKept` Warning),
   and staging folders of Jobs that no longer run;
5. patch the owned status fields when changed (with the records of the Jobs created, so
   they survive a restart), post Events for entries that became Downloaded or failed, and
   requeue (sooner while downloading or waiting for a retry).

Each create is recorded in status at once (`report.record_jobs`), before the pass goes on.
A Job created just before a crash, whose record never reached status, is never trusted: it
runs out unused (its staging folder is removed as stale, so it is never promoted) and the
unit starts a Job of its own.

Not promised: that entries sharing a Job keep it when the entry that created it leaves the
spec (the Job goes with it; the others start their own).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pydantic
import structlog

from localcache.agent import (
    adoption,
    cleanup,
    jobs,
    launcher,
    layout,
    plan,
    report,
    roots,
    status,
    trust,
)
from localcache.agent import disk as disk_mod
from localcache.api import modelnode, nodegroup
from localcache.api import quantity as quantity_mod
from localcache.caching import config, liveconfig
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, onchange, reconcile, store

log = structlog.get_logger(__name__)

ModelStatus = modelnode.ModelStatus
NO_CONFIG_RETRY_S: Final = 30.0
MIN_REQUEUE_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class Stores:
    """Informer caches the agent reads (`setup.py` says what each one watches)."""

    nodes: store.Reader
    jobs: store.Reader
    node_groups: store.Reader
    storage_containers: store.Reader
    config_maps: store.Reader
    caches: store.Reader
    namespace_caches: store.Reader


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class _Pass:
    """What one reconcile pass knows, and the staging folders it must keep."""

    node: modelnode.LocalModelNode
    node_obj: dict[str, Any]
    """The LocalModelNode as last read or written in this pass (for the next status write)."""
    cfg: config.InferenceServiceConfig
    now: datetime.datetime
    jobs: list[plan.JobRef]
    states: dict[str, str]
    progress: dict[str, modelnode.ModelProgress]
    live_jobs: set[str] = field(default_factory=set)
    placements: dict[
        str, tuple[nodegroup.LocalModelNodeGroup, disk_mod.ModelDisk] | launcher.NotLaunched
    ] = field(default_factory=dict)
    """Per node group name ("" for entries without one): its group and root, or why not."""


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a unit is served: its root, its node group (None when missing) and how
    `JobLauncher.resolve` answered."""

    disk: disk_mod.ModelDisk
    group: nodegroup.LocalModelNodeGroup | None
    resolved: tuple[nodegroup.LocalModelNodeGroup, disk_mod.ModelDisk] | launcher.NotLaunched


class Reconciler:
    """Reconciles the LocalModelNode named `node_name` (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        api: launcher.Api,
        disk: disk_mod.ModelDisk | roots.Disks,
        stores: Stores,
        agent_metrics: report.AgentMetrics,
        config_namespace: str,
        clock: clock_mod.Clock,
        config_map: str = config.CONFIGMAP_NAME,
        kserve_config: liveconfig.Under | None = None,
        wall_clock: Callable[[], datetime.datetime] = utcnow,
        job_backoff_limit: int | None = None,
        progress_interval: float = 10.0,
        job_name_suffix: Callable[[], str] | None = None,
    ) -> None:
        self.node_name = node_name
        self._disks = disk if isinstance(disk, roots.Disks) else roots.Disks([disk])
        self._stores = stores
        self._metrics = agent_metrics
        self._live_config = liveconfig.LiveConfig(
            stores.config_maps,
            keys.ObjectKey(config_namespace, config_map),
            initial=None,
            under=kserve_config,
        )
        self._wall = wall_clock
        self._progress_interval = progress_interval
        self._jobs = launcher.JobLauncher(
            node_name=node_name,
            api=api,
            disks=self._disks,
            jobs_store=stores.jobs,
            node_groups=stores.node_groups,
            storage_containers=stores.storage_containers,
            clock=clock,
            backoff_limit=job_backoff_limit,
            name_suffix=job_name_suffix or jobs.name_suffix,
        )
        self._report = report.Reporter(node_name=node_name, api=api, wall_clock=wall_clock)
        self._adoptions = adoption.Adoptions(node_name=node_name, reporter=self._report)
        self._cleaner = cleanup.RootCleaner(
            disks=self._disks, node_groups=stores.node_groups, reporter=self._report
        )
        self._counted_failures: set[tuple[str, str]] = set()
        self._layout_warned = onchange.OnChange()  # per models root

    async def _check_layout(
        self, node: modelnode.LocalModelNode | None, disk: disk_mod.ModelDisk
    ) -> None:
        """`disk.ensure_layout`, reported: a repair as a Warning Event each time, a refusal
        as one Warning Event per distinct problem, then raised (retried with backoff)."""
        where = str(disk.root)
        try:
            repaired = await asyncio.to_thread(disk.ensure_layout)
        except layout.DiskError as exc:
            log.error("models_root_unsafe", root=where, error=str(exc))
            if node is not None and self._layout_warned.changed(where, str(exc)):
                await self._report.event(node, "Warning", "ModelsRootUnsafe", str(exc))
            raise errors.LocalcacheError(f"models root {where}: {exc}") from exc
        self._layout_warned.forget(where)
        for message in repaired:
            log.warning("models_root_repaired", root=where, repair=message)
            if node is not None:
                await self._report.event(node, "Warning", "ModelsRootRepaired", message)

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        if key.name != self.node_name or key.namespace:
            log.debug("reconcile_skipped_other_node", node=str(key))
            return reconcile.Result()
        node_obj = self._stores.nodes.get(keys.ObjectKey("", self.node_name))
        node = None
        if node_obj is not None:
            try:
                node = modelnode.LocalModelNode.model_validate(node_obj)
            except pydantic.ValidationError as exc:
                raise errors.TerminalError(f"LocalModelNode {self.node_name}: {exc}") from exc
            self._adoptions.observe(node, node_obj.get("status"))
        # Every pass: a layout directory replaced by a symlink is repaired or refused before
        # any move, and reported.
        for disk in self._disks.all:
            await self._check_layout(node, disk)
            await asyncio.to_thread(disk.recover)
        if node_obj is None or node is None:
            return reconcile.Result()
        cfg = await self._load_config(node)
        if cfg is None:
            return reconcile.Result(requeue_after=NO_CONFIG_RETRY_S)
        units = plan.units(
            node.spec.local_models,
            node_name=self.node_name,
            job_namespace=cfg.local_model.job_namespace,
        )
        current = node_obj.get("status")
        seen = self._jobs.sort_jobs(trust.parse_records(current))
        await self._report.untrusted_jobs(node, seen.untrusted)
        refs = await self._jobs.cleanup(units, seen.trusted)
        self._counted_failures &= {(r.namespace, r.name) for r in refs}
        active = {r.name for r in refs if plan.job_state(r.obj).phase is plan.JobPhase.ACTIVE}
        ctx = _Pass(
            node=node,
            node_obj=node_obj,
            cfg=cfg,
            now=self._wall(),
            jobs=refs,
            states=status.previous_states(current),
            progress=status.previous_progress(current),
            live_jobs=active,
        )
        outcomes: dict[str, status.Outcome] = {}
        served: dict[str, set[str]] = {}  # host path -> storage keys served there
        for unit in units:
            outcome = await self._place_and_evaluate(unit, ctx, served)
            outcomes.update(dict.fromkeys(unit.status_keys, outcome))
        await self._cleaner.clean(
            node, anywhere={u.storage_key for u in units}, served=served, live_jobs=ctx.live_jobs
        )
        desired = status.desired_status(outcomes, jobs=self._jobs.records())
        before = await self._report.write_status(ctx.node_obj, desired)
        for change in status.transitions(before, outcomes):
            await self._report.transition(node, change)
        delays = [o.requeue_after for o in outcomes.values() if o.requeue_after]
        freq = float(cfg.local_model.reconcilation_frequency_in_secs)
        return reconcile.Result(requeue_after=max(MIN_REQUEUE_S, min([freq, *delays])))

    async def _load_config(
        self, node: modelnode.LocalModelNode
    ) -> config.InferenceServiceConfig | None:
        """The configuration in force (None before a first good one); an Event is posted once
        per bad ConfigMap version."""
        loaded = self._live_config.load()
        if loaded.new_error is not None:
            note = (
                "the last good configuration stays in force"
                if loaded.config is not None
                else "waiting"
            )
            message = f"{loaded.new_error}; {note}"
            await self._report.event(node, "Warning", "InvalidConfiguration", message)
        return loaded.config

    # ---- models roots ------------------------------------------------------------------
    async def _place_and_evaluate(
        self, unit: plan.Unit, ctx: _Pass, served: dict[str, set[str]]
    ) -> status.Outcome:
        """Evaluate `unit` on the models root serving its node group's PV path (recorded in
        `served`); a group whose path is not mounted is a ModelDownloadError. A missing group
        keeps the single root's behaviour: the folder there counts, no Job starts."""
        group_name = unit.leader.node_group or ""
        where = ctx.placements.get(group_name)
        if where is None:
            where = ctx.placements[group_name] = await self._jobs.resolve(unit.leader)
        if isinstance(where, launcher.NotLaunched):
            if where.unmounted or len(self._disks.all) > 1:
                return _not_launched(where, ctx)
            disk, group = self._disks.all[0], None
        else:
            group, disk = where
        served.setdefault(roots.served_path(disk), set()).add(unit.storage_key)
        return await self._evaluate(unit, ctx, _Where(disk, group, where))

    # ---- one download unit -------------------------------------------------------------
    async def _evaluate(self, unit: plan.Unit, ctx: _Pass, at: _Where) -> status.Outcome:
        key = unit.storage_key
        complete = await asyncio.to_thread(at.disk.is_complete, key)
        manifest = await asyncio.to_thread(at.disk.manifest, key) if complete else None
        adopted = await self._adoptions.consider(
            unit,
            complete=manifest is not None,
            at=at.disk,
            live_jobs=ctx.live_jobs,
            node=ctx.node,
            now=ctx.now,
        )
        if adopted is not None:
            return _downloaded(adopted, job_name=None)
        if manifest is not None:
            if unit.reuses(manifest.job):
                return _downloaded(manifest, job_name=None if manifest.adopted else manifest.job)
            proof = _proof(unit, ctx)
            if proof is not None:
                return _downloaded(manifest, job_name=proof)
        unit_jobs = plan.unit_jobs(unit, ctx.jobs)
        if not unit_jobs:
            return await self._launch(unit, ctx, at, attempt=0, message=None)
        latest = unit_jobs[-1]
        state = plan.job_state(latest.obj)
        if state.phase is plan.JobPhase.ACTIVE:
            return await self._active(unit, latest, state, ctx, at)
        if state.phase is plan.JobPhase.COMPLETE:
            return await self._complete(unit, latest, state, manifest, ctx, at)
        return await self._failed(unit, latest, state, ctx, at)

    async def _active(
        self, unit: plan.Unit, latest: plan.JobRef, state: plan.JobState, ctx: _Pass, at: _Where
    ) -> status.Outcome:
        staging = at.disk.staging_path(unit.storage_key, latest.name)
        size = await asyncio.to_thread(disk_mod.folder_bytes, staging)
        message = _carried_message(unit, ctx) if latest.attempt > 0 else None
        if state.failed_pods:
            pod = await self._jobs.pod_message(latest, state.failed_pods)
            where = f"{latest.namespace}/{latest.name}"
            message = plan.clip(f"a download pod failed, Job {where} retries: {pod or '?'}")
        progress = modelnode.ModelProgress(
            bytes_on_disk=size,
            percent=plan.percent(size, self._model_size(unit)),
            attempts=latest.attempt + 1,
            job_name=latest.name,
            message=message,
        )
        downloading = state.ready > 0 or size > 0
        phase = ModelStatus.DOWNLOADING if downloading else ModelStatus.DOWNLOAD_PENDING
        return status.Outcome(phase, progress, self._progress_interval)

    async def _complete(
        self,
        unit: plan.Unit,
        latest: plan.JobRef,
        state: plan.JobState,
        manifest: layout.Manifest | None,
        ctx: _Pass,
        at: _Where,
    ) -> status.Outcome:
        key = unit.storage_key
        staging = at.disk.staging_path(key, latest.name)
        if not await asyncio.to_thread(staging.is_dir):
            if manifest is not None:  # promoted earlier, or another scope's folder is there
                return _downloaded(manifest, job_name=latest.name)
            log.info("model_folder_lost", storage_key=key, job=latest.name)
            return await self._launch(unit, ctx, at, attempt=latest.attempt + 1, message=None)
        if not await asyncio.to_thread(lambda: any(staging.iterdir())):
            ctx.live_jobs.add(latest.name)  # keep it: the retry waits for the backoff
            root = at.disk.host_path or at.disk.root
            message = (
                f"download Job {latest.namespace}/{latest.name} succeeded but wrote nothing "
                f"into {staging}: the node group's PV must be the agent's models root ({root})"
            )
            return await self._retry_or_wait(unit, latest, state, ctx, at, message)
        size = await asyncio.to_thread(disk_mod.folder_bytes, staging)
        record = layout.Manifest(
            storage_key=key,
            uri=unit.request.uri,
            bytes=size,
            completed_at=plan.format_time(state.finished_at or ctx.now),
            job=latest.name,
        )
        in_force = await asyncio.to_thread(at.disk.promote, staging, key, record)
        self._metrics.succeeded.inc()
        self._metrics.bytes.inc(size)
        if state.started_at and state.finished_at:
            seconds = (state.finished_at - state.started_at).total_seconds()
            self._metrics.duration.observe(max(0.0, seconds))
        kept = in_force.job != latest.name
        log.info("model_promoted", storage_key=key, job=latest.name, kept_existing=kept)
        return _downloaded(in_force, job_name=latest.name)

    async def _failed(
        self, unit: plan.Unit, latest: plan.JobRef, state: plan.JobState, ctx: _Pass, at: _Where
    ) -> status.Outcome:
        ident = (latest.namespace, latest.name)
        if ident not in self._counted_failures:
            self._counted_failures.add(ident)
            self._metrics.failed.inc()
        pod = await self._jobs.pod_message(latest, state.failed_pods)
        why = pod or plan.one_line(state.message or state.reason) or "no message"
        message = plan.clip(f"download Job {latest.namespace}/{latest.name} failed: {why}")
        return await self._retry_or_wait(unit, latest, state, ctx, at, message)

    async def _retry_or_wait(
        self,
        unit: plan.Unit,
        latest: plan.JobRef,
        state: plan.JobState,
        ctx: _Pass,
        at: _Where,
        message: str,
    ) -> status.Outcome:
        """A new attempt once the backoff after `latest` has passed; until then an error."""
        local = ctx.cfg.local_model
        delay = plan.retry_delay(
            latest.attempt,
            base=local.download_retry_backoff_in_secs,
            cap=local.download_retry_max_backoff_in_secs,
        )
        retry_at = (state.finished_at or ctx.now) + datetime.timedelta(seconds=delay)
        wait = (retry_at - ctx.now).total_seconds()
        if wait <= 0:
            log.info("download_retried", job=latest.name, attempt=latest.attempt + 1)
            return await self._launch(unit, ctx, at, attempt=latest.attempt + 1, message=message)
        progress = modelnode.ModelProgress(
            attempts=latest.attempt + 1,
            job_name=latest.name,
            message=message,
            next_retry_time=plan.format_time(retry_at),
        )
        return status.Outcome(ModelStatus.DOWNLOAD_ERROR, progress, wait)

    async def _launch(
        self, unit: plan.Unit, ctx: _Pass, at: _Where, *, attempt: int, message: str | None
    ) -> status.Outcome:
        if at.group is None:  # the node group is missing: no Job can run
            assert isinstance(at.resolved, launcher.NotLaunched)
            return _not_launched(at.resolved, ctx)
        result = await self._jobs.launch(
            unit, node=ctx.node, cfg=ctx.cfg, attempt=attempt, group=at.group, disk=at.disk
        )
        if isinstance(result, launcher.NotLaunched):
            return _not_launched(result, ctx)
        ctx.live_jobs.add(result.name)
        ctx.node_obj = await self._report.record_jobs(ctx.node_obj, self._jobs.records())
        self._metrics.started.inc()
        progress = modelnode.ModelProgress(
            bytes_on_disk=0, attempts=attempt + 1, job_name=result.name, message=message
        )
        return status.Outcome(ModelStatus.DOWNLOAD_PENDING, progress, self._progress_interval)

    def _model_size(self, unit: plan.Unit) -> int | None:
        """The cache's `modelSize` in bytes (first entry of the unit that has one)."""
        for entry in unit.entries:
            reader = self._stores.namespace_caches if entry.namespace else self._stores.caches
            cache = reader.get(keys.ObjectKey(entry.namespace or "", entry.model_name))
            size = ((cache or {}).get("spec") or {}).get("modelSize")
            if size is not None:
                try:
                    return int(quantity_mod.Quantity(size))
                except ValueError:
                    continue
        return None


def _not_launched(why: launcher.NotLaunched, ctx: _Pass) -> status.Outcome:
    progress = modelnode.ModelProgress(message=why.message)
    retry = float(ctx.cfg.local_model.reconcilation_frequency_in_secs)
    return status.Outcome(ModelStatus.DOWNLOAD_ERROR, progress, retry)


def _downloaded(manifest: layout.Manifest, *, job_name: str | None) -> status.Outcome:
    progress = modelnode.ModelProgress(
        bytes_on_disk=manifest.bytes,
        percent=100,
        job_name=job_name,
        completion_time=manifest.completed_at,
    )
    return status.Outcome(ModelStatus.DOWNLOADED, progress)


def _proof(unit: plan.Unit, ctx: _Pass) -> str | None:
    """A Job of the unit's scope that downloaded the URI before, as the status recorded it
    for one of the unit's entries (TTL may have removed the Job since)."""
    for key in unit.status_keys:
        progress = ctx.progress.get(key)
        downloaded = ctx.states.get(key) == ModelStatus.DOWNLOADED.value
        if downloaded and progress is not None and unit.reuses(progress.job_name):
            return progress.job_name
    return None


def _carried_message(unit: plan.Unit, ctx: _Pass) -> str | None:
    """The failure message an earlier attempt left in status (kept while retrying)."""
    for key in unit.status_keys:
        progress = ctx.progress.get(key)
        if progress is not None and progress.message:
            return progress.message
    return None
