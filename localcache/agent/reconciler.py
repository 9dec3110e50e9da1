"""The node agent's reconciler: keeps this node's model folders in line with its own
LocalModelNode and reports each entry's download state (spec §5, reference §4).

One pass (`reconcile`), for the LocalModelNode named like this node only:
1. finish any promotion a crash interrupted (`ModelDisk.recover`); load the config (the last
   good one stays in force when the ConfigMap turns invalid; nothing runs before a first
   good one; a missing ConfigMap means KServe's defaults);
2. sort the Jobs seen into trusted (created by this agent: uid recorded in status, see
   `agent.jobs.trust`) and untrusted (reported once, by log and Event, then ignored: never
   proof, never a state, never deleted); delete trusted Jobs that no spec entry wants any
   more (`launcher.cleanup`);
3. per download unit (`downloads.units`: same URI, full credential scope and models root,
   the one whose host path is the entries' node group's PV path, `roots.Disks`; its Jobs are
   the trusted ones recorded for its entries): observe (`agent.observe`), decide
   (`plan.decide`, pure: the state machine) and execute (`_execute`: adopt, create the Job
   (peer-mode, or waiting for a seed, per `agent.peering`) or a ModelDownloadError saying why
   not; promote; stop a Job that wrote more than `modelSize` or stalled; count a failure
   once). No status is written before every unit was considered;
4. per root, delete folders no entry maps to by the keep rule (`roots.retention`: nothing
   on a root no node group declares any more, and never a folder whose entry is now served
   on another root; what is kept is logged and posted once as a `ModelFoldersKept` Warning),
   and staging folders of Jobs that no longer run;
5. patch the owned status fields when changed (the records of the Jobs created, so they
   survive a restart; `status.peer`: `publish_peer`, `agent.peerfiles`), post Events for
   entries that became Downloaded or failed, and requeue (sooner while downloading).

Each create is recorded in status at once (`report.record_jobs`), before the pass goes on.
A Job created just before a crash, whose record never reached status, is never trusted: it runs
out unused (its staging folder is removed as stale, never promoted); the unit starts its own.

Not promised: that entries sharing a Job keep it when the entry that created it leaves the spec
(the Job goes with it; the others start their own).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

import pydantic
import structlog

from localcache.agent import adoption, cleanup, downloads, observe, plan, report, stall, status
from localcache.agent import peering as peers
from localcache.agent.disk import folders, layout, roots
from localcache.agent.jobs import jobs, launcher, peerjob, podwait, trust
from localcache.api import modelnode, nodegroup
from localcache.caching import config, liveconfig
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, reconcile, store

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


_Placement = tuple[nodegroup.LocalModelNodeGroup, folders.ModelDisk] | launcher.NotLaunched
_PublishPeer = Callable[..., Awaitable[dict[str, Any]]]  # (units, placements, outcomes)


@dataclass
class _Pass:
    """What one reconcile pass knows, and the staging folders it must keep."""

    node: modelnode.LocalModelNode
    node_obj: dict[str, Any]
    """The LocalModelNode as last read or written in this pass (for the next status write)."""
    cfg: config.InferenceServiceConfig
    now: datetime.datetime
    jobs: list[downloads.JobRef]
    states: dict[str, str]
    progress: dict[str, modelnode.ModelProgress]
    live_jobs: set[str] = field(default_factory=set)
    placements: dict[str, _Placement] = field(default_factory=dict)
    """Per node group name ("" for entries without one): its group and root, or why not."""

    def seen(self) -> observe.Pass:
        return observe.Pass(self.cfg, self.now, self.jobs, self.states, self.progress)


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a unit is served: its root, its node group (None when missing) and how
    `JobLauncher.resolve` answered."""

    disk: folders.ModelDisk
    group: nodegroup.LocalModelNodeGroup | None
    resolved: tuple[nodegroup.LocalModelNodeGroup, folders.ModelDisk] | launcher.NotLaunched


class Reconciler:
    """Reconciles the LocalModelNode named `node_name` (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        api: launcher.Api,
        disk: folders.ModelDisk | roots.Disks,
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
        peer_settings: peers.PeerSettings | None = None,
        publish_peer: _PublishPeer | None = None,
    ) -> None:
        self.node_name = node_name
        self._publish_peer = publish_peer
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
            caches=(stores.caches, stores.namespace_caches),
        )
        self._report = report.Reporter(node_name=node_name, api=api, wall_clock=wall_clock)
        self._adoptions = adoption.Adoptions(node_name=node_name, reporter=self._report)
        self._observer = observe.Observer(
            jobs=self._jobs,
            adoptions=self._adoptions,
            caches=stores.caches,
            namespace_caches=stores.namespace_caches,
            progress_interval=progress_interval,
            growth=stall.GrowthWatch(clock),
            waits=podwait.PodWaits(api, clock, node_name),
        )
        self._peers = peers.Peering(
            node_name=node_name, api=api, settings=peer_settings or peers.PeerSettings(),
            clock=clock, reporter=self._report, p2p=agent_metrics.p2p,
        )  # fmt: skip
        self._cleaner = cleanup.RootCleaner(
            disks=self._disks, node_groups=stores.node_groups, reporter=self._report
        )
        self._counted_failures: set[tuple[str, str]] = set()

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
            await self._cleaner.check_layout(node, disk)
            await asyncio.to_thread(disk.recover)
        if node_obj is None or node is None:
            return reconcile.Result()
        cfg = await self._load_config(node)
        if cfg is None:
            return reconcile.Result(requeue_after=NO_CONFIG_RETRY_S)
        placements: dict[str, _Placement] = {}
        for entry in node.spec.local_models:
            if (entry.node_group or "") not in placements:
                placements[entry.node_group or ""] = await self._jobs.resolve(entry)

        def place(entry: modelnode.LocalModelInfo) -> str:
            where = placements[entry.node_group or ""]
            if isinstance(where, launcher.NotLaunched):
                return f"!{entry.node_group or ''}"  # its own unit: its error is its alone
            return roots.served_path(where[1])

        units = downloads.units(
            node.spec.local_models,
            node_name=self.node_name,
            job_namespace=cfg.local_model.job_namespace,
            place=place,
        )
        current = node_obj.get("status")
        seen = self._jobs.sort_jobs(trust.parse_records(current))
        await self._report.untrusted_jobs(node, seen.untrusted)
        refs = await self._jobs.cleanup(units, seen.trusted)
        self._counted_failures &= {(r.namespace, r.name) for r in refs}
        running = [r for r in refs if plan.job_state(r.obj).phase is plan.JobPhase.ACTIVE]
        active = {r.name for r in running}
        self._observer.growth.retain(r.uid for r in running)
        ctx = _Pass(
            node=node,
            node_obj=node_obj,
            cfg=cfg,
            now=self._wall(),
            jobs=refs,
            states=status.previous_states(current),
            progress=status.previous_progress(current),
            live_jobs=active,
            placements=placements,
        )
        outcomes: dict[str, status.Outcome] = {}
        served: dict[str, set[str]] = {}  # host path -> storage keys served there
        for unit in units:
            outcome = await self._place_and_evaluate(unit, ctx, served)
            outcome = self._peers.carry(outcome, ctx.progress.get(unit.status_keys[0]))
            outcomes.update(dict.fromkeys(unit.status_keys, outcome))
        await self._cleaner.clean(
            node, anywhere={u.storage_key for u in units}, served=served, live_jobs=ctx.live_jobs
        )
        desired = status.desired_status(outcomes, jobs=self._jobs.records())
        if self._publish_peer is not None:  # `status.peer` (peer distribution)
            desired |= await self._publish_peer(units, placements, outcomes)
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
            kept = "the last good configuration stays in force"
            message = f"{loaded.new_error}; {kept if loaded.config is not None else 'waiting'}"
            await self._report.event(node, "Warning", "InvalidConfiguration", message)
        return loaded.config

    # ---- models roots ------------------------------------------------------------------
    async def _place_and_evaluate(
        self, unit: downloads.Unit, ctx: _Pass, served: dict[str, set[str]]
    ) -> status.Outcome:
        """Evaluate `unit` on the models root serving its node group's PV path (recorded in
        `served`); a group whose path is not mounted is a ModelDownloadError. A missing group
        keeps the single root's behaviour: the folder there counts, no Job starts."""
        group_name = unit.leader.node_group or ""
        where = ctx.placements[group_name]  # every entry's group was resolved for `units`
        if isinstance(where, launcher.NotLaunched):
            if where.unmounted or len(self._disks.all) > 1:
                return _not_launched(where, ctx)
            disk, group = self._disks.all[0], None
        else:
            group, disk = where
        served.setdefault(roots.served_path(disk), set()).add(unit.storage_key)
        return await self._evaluate(unit, ctx, _Where(disk, group, where))

    # ---- one download unit: observe, decide (`plan.decide`), execute --------------------
    async def _evaluate(self, unit: downloads.Unit, ctx: _Pass, at: _Where) -> status.Outcome:
        observed = await self._observer.unit(unit, ctx.seen(), at.disk, evidence=True)
        action = plan.decide(unit, observed)
        if isinstance(action, plan.Adopt):
            adopted = await self._adoptions.adopt(
                unit, list(action.claims), at=at.disk, live_jobs=ctx.live_jobs, node=ctx.node,
                now=ctx.now,
            )  # fmt: skip
            self._adoptions.settle(unit)
            if adopted is not None:
                return plan.Downloaded(adopted, job_name=None).outcome()
            observed = await self._observer.unit(unit, ctx.seen(), at.disk, evidence=False)
            action = plan.decide(unit, observed)
        else:
            self._adoptions.settle(unit)
        latest = observed.jobs[-1] if observed.jobs else None
        action = await self._peers.fast_fallback(action, latest, observed.now)
        return await self._execute(unit, action, ctx, at)

    async def _execute(
        self, unit: downloads.Unit, action: plan.Action, ctx: _Pass, at: _Where
    ) -> status.Outcome:
        if isinstance(action, plan.Downloaded):
            return action.outcome()
        if isinstance(action, plan.Report):
            return action.outcome
        if isinstance(action, plan.Promote):
            promoted = await self._promote(unit, action, at)
            return await self._peers.completed(action.job, promoted, group=at.group, node=ctx.node)
        if isinstance(action, plan.Stop):
            await self._jobs.stop(action.job)
            await asyncio.to_thread(at.disk.remove_staging, unit.storage_key, action.job.name)
            return action.outcome
        if isinstance(action, plan.Adopt):  # decided again after a refusal: never Adopt
            raise errors.LocalcacheError(f"adoption of {unit.storage_key} decided twice")
        if action.keep_staging is not None:  # the retry waits for the backoff
            ctx.live_jobs.add(action.keep_staging)
        failed = action.failed
        if failed is not None and (failed.namespace, failed.name) not in self._counted_failures:
            self._counted_failures.add((failed.namespace, failed.name))
            self._metrics.failed.inc()
        if isinstance(action, plan.Wait):
            return action.outcome
        if action.lost is not None:
            log.info("model_folder_lost", storage_key=unit.storage_key, job=action.lost.name)
        if action.retry_of is not None:
            log.info("download_retried", job=action.retry_of.name, attempt=action.attempt)
        return await self._launch(unit, ctx, at, action)

    async def _promote(
        self, unit: downloads.Unit, action: plan.Promote, at: _Where
    ) -> status.Outcome:
        key, job, state = unit.storage_key, action.job, action.state
        variant, seeded = layout.variant_of_scope(unit.scope_id), peerjob.is_seed(job.obj)
        promote = functools.partial(at.disk.promote, variant=variant, seeded=seeded)
        manifest = action.manifest
        if peerjob.unchecked_origin(job.obj, unit.request.uri):  # no sidecar checked it
            manifest = replace(manifest, origin_unchecked=True)
        in_force = await asyncio.to_thread(promote, action.staging, key, manifest)
        self._metrics.succeeded.inc()
        self._metrics.bytes.inc(action.manifest.bytes)
        if state.started_at and state.finished_at:
            seconds = (state.finished_at - state.started_at).total_seconds()
            self._metrics.duration.observe(max(0.0, seconds))
        kept = in_force.job != job.name
        log.info(
            "model_promoted", storage_key=key, job=job.name, kept_existing=kept,
            folder=in_force.folder,
        )  # fmt: skip
        return plan.Downloaded(in_force, job_name=job.name).outcome()

    async def _launch(
        self, unit: downloads.Unit, ctx: _Pass, at: _Where, action: plan.Launch
    ) -> status.Outcome:
        if at.group is None:  # the node group is missing: no Job can run
            assert isinstance(at.resolved, launcher.NotLaunched)
            return _not_launched(at.resolved, ctx)
        max_size = self._observer.model_size(unit) or int(at.group.spec.storage_limit)
        mode = await self._peers.mode(
            unit, node=ctx.node, group=at.group, previous=action.retry_of, max_size=max_size
        )
        if isinstance(mode, status.Outcome):  # waiting for a seed (peer distribution)
            return mode
        launch = functools.partial(
            self._jobs.launch, unit, node=ctx.node, cfg=ctx.cfg, attempt=action.attempt,
            group=at.group, disk=at.disk,
        )  # fmt: skip
        result = await launch(peer=mode.transform)
        if isinstance(result, launcher.NotLaunched) and result.refused and mode.transform:
            why, result = result.message, await launch(peer=None)  # the origin, in this pass
            if not isinstance(result, launcher.NotLaunched):
                mode = await self._peers.refused(ctx.node, unit, why)
        if isinstance(result, launcher.NotLaunched):
            return _not_launched(result, ctx)
        ctx.live_jobs.add(result.name)
        ctx.node_obj = await self._report.record_jobs(ctx.node_obj, self._jobs.records())
        self._metrics.started.inc()
        progress = modelnode.ModelProgress(
            bytes_on_disk=0, attempts=action.attempt + 1, job_name=result.name,
            message=action.message, source=mode.source,
        )  # fmt: skip
        return status.Outcome(ModelStatus.DOWNLOAD_PENDING, progress, self._progress_interval)


def _not_launched(why: launcher.NotLaunched, ctx: _Pass) -> status.Outcome:
    retry = float(ctx.cfg.local_model.reconcilation_frequency_in_secs)
    return status.Outcome(
        ModelStatus.DOWNLOAD_ERROR, modelnode.ModelProgress(message=why.message), retry
    )
