"""The cache reconciler: one implementation for both cache kinds, parameterised by a Scope.

A reconcile of cache C (level-based, reading informer stores, writing only what differs):

1. C gone → nothing. C being deleted → finalize (below) and stop.
2. Add the finalizer if missing (merge patch guarded by resourceVersion).
3. LocalModelNodes: every member node of C's groups, and every node whose LocalModelNode
   still lists C, gets its desired entry list (`nodes.LocalModelNodes`: the list covers all
   caches and is computed at write time).
4. Volumes: the download pair per existing group and, when InferenceServices are watched and
   `disableVolumeManagement` is off, a serving pair per (namespace, node group) of its users,
   InferenceServices and LLMInferenceServices (base model or LoRA adapter; plus the old-named
   pair a user still names, `users.serving`) (`volumes.reconcile_volumes`): existing objects
   that are provably the cache's but not annotated (KServe's, after a migration) are adopted,
   with a Normal Event `VolumeAdopted` each; a wanted name held by an object that is not the
   cache's (another cache's claim of the same plain name, `caching.names`) is reported
   (`Degraded`, reason `VolumeNameTaken`, and one Warning Event and log line when first
   reported) and the cache is looked at again after `volumes.TAKEN_RECHECK` seconds.
5. Status: `nodeStatus`, `copies`, `conditions`, `inferenceServices` and (while that kind is
   watched) `llmInferenceServices`, patched only when they differ (from what this process last
   wrote, when the store lags behind it); Events for downloads completed or failed, derived
   objects refused, and condition changes.
Failures of steps 3 and 4 do not stop the others; the first is raised at the end (retry with
backoff), after the status was written, except when step 4 got no answer from the apiserver
(a transport error): then the status is left as it is. A PV/PVC write the apiserver refuses
reaches `Degraded` (reason `VolumeRefused`, with the apiserver's code, reason and message)
and a Warning Event in the same reconcile, and is still raised, so retries keep their
backoff.

Finalize (C has a deletionTimestamp and our finalizer): wait for LocalModelNode writes in
flight, then remove C's entry from every LocalModelNode found by a fresh LIST (so entries
written moments ago are not missed; entries on nodes no longer known are dropped alone);
delete C's ownerless PVs (namespace caches); then remove the finalizer, only if all of that
succeeded. Nothing here needs C's node groups to exist [P5]. Owned PVCs (and a cluster
cache's PVs) go through garbage collection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic
import structlog

from localcache.api import modelcache
from localcache.caching import conditions, placement, prunedmode, sharedroute
from localcache.controllers import (
    importjobs,
    legacy,
    nodes,
    scope,
    sharedvolume,
    state,
    status,
    users,
    volumeplan,
    volumes,
    volumewriter,
)
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, reconcile
from localcache.runtime import keys as runtime_keys
from localcache.runtime import reconcile as reconcile_mod

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_status(raw: Obj) -> modelcache.LocalModelCacheStatus:
    """The cache's status as last written; unreadable (a newer version's) → empty."""
    try:
        return modelcache.LocalModelCacheStatus.model_validate(raw)
    except pydantic.ValidationError:
        return modelcache.LocalModelCacheStatus()


class CacheReconciler:
    """Reconciles one cache kind (see the module docstring)."""

    def __init__(
        self,
        sc: scope.Scope,
        *,
        api: state.Api,
        reader: state.StateReader,
        config: state.ConfigSource,
        recorder: status.EventRecorder,
        writer: nodes.LocalModelNodes,
        now: Callable[[], str] = clock_mod.now_rfc3339,
        import_image: importjobs.ImageSource | None = None,
    ) -> None:
        self.scope = sc
        self._api = api
        self._reader = reader
        self._stores = reader.stores
        self._config = config
        self._recorder = recorder
        self._now = now
        self._nodes = writer
        self._written = status.WrittenStatus()
        self._created = volumes.CreatedClaims()
        self._claim_users = legacy.ClaimUsers()
        self._shared = (
            sharedvolume.SharedVolumeReconciler(
                sc,
                api=api,  # type: ignore[arg-type]  # runtime.kube.Kube is importjobs.Api too
                stores=self._stores,
                config=config,
                recorder=recorder,
                written=self._written,
                image=import_image,
                now=now,
            )
            if import_image is not None
            else None
        )

    async def reconcile(self, key: runtime_keys.ObjectKey) -> reconcile.Result:
        raw = self.scope.store(self._stores).get(key)
        if raw is None:
            return reconcile.Result()
        try:
            cache = self.scope.parse(raw)
        except pydantic.ValidationError as exc:
            raise errors.TerminalError(f"{self.scope.kind.kind} {key} is invalid: {exc}") from exc
        if isinstance(cache, modelcache.LocalModelNamespaceCache):
            if sharedroute.is_shared(cache):
                return await self._reconcile_shared(raw, cache)
            if not cache.metadata.deletion_timestamp and prunedmode.dropped_pvc_ref(raw):
                return await self._reconcile_unavailable(raw, cache)
        if cache.metadata.deletion_timestamp:
            await self._finalize(cache)
            return reconcile.Result()
        if not await self._ensure_finalizer(cache):
            return reconcile.Result()
        cfg = self._config().local_model
        snap = self._reader.snapshot()
        members = snap.members(cache.spec.node_groups)
        failures: list[errors.LocalcacheError] = []
        try:
            await self._sync_nodes(cache, snap, members)
        except errors.LocalcacheError as exc:
            failures.append(exc)
        manage_serving = (
            self._stores.inference_services is not None and not cfg.disable_volume_management
        )
        isvcs = self.scope.isvcs_of(self._stores, cache)
        llms = users.llm_users_of(self.scope, self._stores, cache)
        wanted = users.serving(cache, isvcs=isvcs, llm_users=llms) if manage_serving else None
        pairs = volumeplan.plan(
            self.scope,
            cache,
            groups=snap.groups,
            serving=wanted.pairs if wanted else (),
            legacy_serving=wanted.legacy if wanted else (),
            job_namespace=cfg.job_namespace,
            volume_source=cfg.volume_source,
        )
        try:
            outcome = await volumes.reconcile_volumes(
                self._api,
                stores=self._stores,
                owner=self.scope.owner_id(cache),
                pairs=pairs,
                manage_serving=manage_serving,
                created=self._created,
                users=self._claim_users,
            )
        except errors.LocalcacheError as exc:
            # no answer (refusals are returned, not raised): what the volumes are is unknown,
            # so the status is not rewritten, lest a refusal reported earlier look recovered
            if failures:
                raise failures[0] from exc
            raise
        if outcome.error is not None:
            failures.append(outcome.error)
        for adopted in outcome.adopted:
            await self._recorder.record(
                self.scope,
                cache,
                conditions.EventSpec(
                    "Normal", conditions.REASON_VOLUME_ADOPTED, adopted.describe()
                ),
            )
        await self._write_status(raw, cache, snap, members, (isvcs, llms), outcome)
        if failures:
            raise failures[0]
        if outcome.taken:
            return reconcile.Result(requeue_after=volumes.TAKEN_RECHECK)
        if outcome.waiting:
            return reconcile.Result(requeue_after=legacy.RECHECK)
        return reconcile.Result()

    async def _reconcile_shared(
        self, raw: Obj, cache: modelcache.LocalModelNamespaceCache
    ) -> reconcile_mod.Result:
        """A shared-volume cache (`sharedvolume`): no node-group work at all."""
        if self._shared is None:
            raise errors.TerminalError("shared-volume caches are not reconciled by this process")
        if cache.metadata.deletion_timestamp:
            if self.scope.finalizer not in (cache.metadata.finalizers or []):
                return reconcile_mod.Result()
            if not await self._shared.finalize(cache, raw):
                return reconcile_mod.Result(requeue_after=sharedvolume.DELETION_RECHECK)
            remaining = [f for f in cache.metadata.finalizers or [] if f != self.scope.finalizer]
            if await self._patch_finalizers(cache, remaining):
                _log.info("finalizer_removed")
            return reconcile_mod.Result()
        if self.scope.finalizer not in (cache.metadata.finalizers or []):
            # the finalizer's own event brings the next reconcile, on the store's new copy:
            # the import's trust record is written against that copy, never an older one
            await self._ensure_finalizer(cache)
            return reconcile_mod.Result()
        return await self._shared.reconcile(raw, cache)

    async def _reconcile_unavailable(
        self, raw: Obj, cache: modelcache.LocalModelNamespaceCache
    ) -> reconcile_mod.Result:
        """A cache applied with a pvcRef the apiserver pruned (`caching.prunedmode`): placed
        on no node (`state.StateReader.caches` leaves it out), which takes its entries off the
        nodes holding them; its status and a Warning Event say why."""
        if self._shared is None:
            raise errors.TerminalError("shared-volume caches are not reconciled by this process")
        if not await self._ensure_finalizer(cache):
            return reconcile_mod.Result()
        _log.warning("shared_volume_unavailable", pvc_ref=prunedmode.dropped_pvc_ref(raw))
        await self._sync_nodes(cache, self._reader.snapshot(), {})
        await self._shared.unavailable(raw, cache)
        return reconcile_mod.Result()

    # ------------------------------------------------------------------- steps

    async def _patch_finalizers(self, cache: scope.CacheModel, finalizers: list[str]) -> bool:
        """Set the cache's finalizers (guarded by resourceVersion); False when the cache is
        already gone, which a store lagging behind a deletion makes a normal outcome."""
        try:
            await self._api.patch(
                self.scope.resource,
                cache.name,
                {
                    "metadata": {
                        "finalizers": finalizers,
                        "resourceVersion": cache.metadata.resource_version,
                    }
                },
                namespace=cache.namespace or None,
            )
        except errors.NotFound:
            _log.debug("cache_already_gone")
            return False
        return True

    async def _ensure_finalizer(self, cache: scope.CacheModel) -> bool:
        """Add our finalizer if missing; False when the cache no longer exists."""
        finalizers = list(cache.metadata.finalizers or [])
        if self.scope.finalizer in finalizers:
            return True
        if not await self._patch_finalizers(cache, [*finalizers, self.scope.finalizer]):
            return False
        _log.info("finalizer_added")
        return True

    def _lmn(self, name: str) -> Obj | None:
        return self._stores.local_model_nodes.get(runtime_keys.ObjectKey("", name))

    async def _sync_nodes(
        self, cache: scope.CacheModel, snap: placement.Snapshot, members: dict[str, str]
    ) -> None:
        key = self.scope.status_key(cache)
        holders = {
            state.name_of(o) for o in self._stores.local_model_nodes.by_index(state.BY_ENTRY, key)
        }
        await self._nodes.sync(set(members) | holders, snap)

    async def _write_status(
        self,
        raw: Obj,
        cache: scope.CacheModel,
        snap: placement.Snapshot,
        members: dict[str, str],
        used_by: tuple[list[Obj], list[users.LlmUser]],
        outcome: volumewriter.Outcome,
    ) -> None:
        key = self.scope.status_key(cache)
        node_status: dict[str, conditions.NodeStatus] = {}
        failure_messages: dict[str, str] = {}
        retrying: set[str] = set()
        entry_key = (cache.namespace or "", cache.name)
        over_budget = {
            node: why for node in members if (why := snap.left_out(node, entry_key)) is not None
        }
        if over_budget:
            _log.warning(
                "localmodelnode_entry_over_budget",
                nodes=sorted(over_budget),
                reason=next(iter(over_budget.values())),
            )
        for node in sorted(members):
            node_obj = self._lmn(node)
            lmn_status = (node_obj or {}).get("status") or {}
            model_status = (lmn_status.get("modelStatus") or {}).get(key)
            progress = (lmn_status.get("modelProgress") or {}).get(key) or {}
            message = str(progress.get("message") or "")
            attempts = _int_or_none(progress.get("attempts"))
            node_status[node] = conditions.node_status(
                ready=snap.is_ready(node),
                model_status=model_status,
                attempts=attempts,
                message=message,
            )
            if message:
                failure_messages[node] = message
            if conditions.is_retry_after_failure(
                model_status=model_status, attempts=attempts, message=message
            ):
                retrying.add(node)
        old = _parse_status(self._written.current(raw))
        conds = conditions.conditions(
            node_status,
            missing_groups=snap.missing_groups(cache.spec.node_groups),
            previous=old.conditions,
            generation=cache.metadata.generation,
            now=self._now(),
            refused=outcome.refused,
            taken=outcome.taken,
            retrying=retrying,
            failure_messages=failure_messages,
            over_budget=over_budget,
        )
        desired: Obj = {
            "nodeStatus": {node: str(state_) for node, state_ in node_status.items()},
            "copies": conditions.copies(node_status).to_dict(),
            "conditions": [c.to_dict() for c in conds],
        }
        if self._stores.inference_services is not None:
            desired["inferenceServices"] = users.tracked(used_by[0])
        if self._stores.llm_inference_services is not None:
            desired["llmInferenceServices"] = users.tracked(u.obj for u in used_by[1])
        if not await status.write_status(
            self._api, self.scope, current=raw, desired=desired, written=self._written
        ):
            return
        for event in conditions.events(
            old_nodes=old.node_status or {},
            new_nodes=node_status,
            old_conditions=old.conditions or [],
            new_conditions=conds,
            failure_messages=failure_messages,
            refused=outcome.refused,
            taken=outcome.taken,
            over_budget=over_budget,
        ):
            if event.reason == conditions.REASON_VOLUME_NAME_TAKEN:
                _log.warning("volume_name_taken", message=event.message)
            await self._recorder.record(self.scope, cache, event)

    async def _finalize(self, cache: scope.CacheModel) -> None:
        finalizers = list(cache.metadata.finalizers or [])
        if self.scope.finalizer not in finalizers:
            return
        key = self.scope.status_key(cache)
        await self._nodes.settled()
        listed = await self._api.list(state.LOCAL_MODEL_NODES)
        holders = [o for o in listed.items if key in state.index_entries(o)]
        snap = self._reader.snapshot()
        present = {state.name_of(o): o for o in holders if state.name_of(o) in snap.nodes}
        await self._nodes.sync(present, snap, listed=present)
        for orphan in holders:
            if state.name_of(orphan) not in snap.nodes:
                await self._nodes.drop_entry(orphan, (cache.namespace, cache.name))
        if not self.scope.pvs_owned:
            await volumes.delete_pvs(
                self._api, volumes.ownerless_pvs(self.scope, cache, stores=self._stores)
            )
        remaining = [f for f in finalizers if f != self.scope.finalizer]
        if await self._patch_finalizers(cache, remaining):
            _log.info("finalizer_removed")
