"""The agent's download Jobs: which exist, which go, and creating a new one.

`JobLauncher` is the only part of the agent that creates or deletes Jobs, and it keeps the
records of the Jobs it created (`agent.jobs.trust`: the only Jobs the agent trusts, by uid):
- `sort_jobs(status_records)` matches the informer's Jobs against the records (those of
  this process, plus those the LocalModelNode status kept across restarts), and Jobs this
  process created in the last minute that the cache has not shown yet (so a stale cache
  never leads to a second create); `records()` is what the status must keep;
- `cleanup(units, refs)` deletes trusted Jobs no spec entry wants (same entry, URI and
  scope), with the uid as precondition: a Job we did not create is never deleted;
- `resolve(entry)` finds the entry's node group and the models root serving its PV path
  (`roots.Disks.for_path`), or says why not;
- `launch(...)` reads the credentials (in the entry's namespace only), picks the
  container, prepares the staging folder on that root and creates the Job (turned into the
  peer-mode Job by `peer` when given) under a fresh random name (AlreadyExists means someone
  else holds that name: never ours; another name is tried); the uid of the created Job is
  recorded at once; a problem that a retry cannot fix comes back as `NotLaunched(message)`
  and no Job is created;
- `pod_message(job)`: why the Job's newest failed pod failed (cached per failure count).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import pydantic
import structlog

from localcache.agent import downloads
from localcache.agent.disk import folders, layout, roots
from localcache.agent.jobs import jobs, peerjob, trust
from localcache.api import download, modelnode, nodegroup, storage
from localcache.caching import (
    config,
    credentials,
    downloadcontainer,
    downloadenv,
    jobfailures,
    placement,
)
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, kube, onchange, store

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
CREATED_MEMORY_S: Final = 60.0
_POD_MESSAGES_KEPT: Final = 256
NAME_TRIES: Final = 3


class Api(Protocol):
    """The API calls the agent makes (`kube.Kube` provides them)."""

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj: ...

    async def list(
        self, res: kube.Resource, *, namespace: str | None = None, label_selector: str | None = None
    ) -> kube.ObjList: ...

    async def create(
        self, res: kube.Resource, obj: Obj, *, namespace: str | None = None
    ) -> Obj: ...

    async def delete(
        self,
        res: kube.Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Any = None,
        uid: str | None = None,
    ) -> Obj: ...

    async def get_status(
        self, res: kube.Resource, name: str, *, namespace: str | None = None
    ) -> Obj: ...

    async def patch(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj: ...

    async def patch_status(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj: ...


@dataclass(frozen=True, slots=True)
class NotLaunched:
    """Why a unit's Job was not created (the entry's ModelDownloadError message);
    `unmounted` when the node group's PV path is no models root of this agent; `refused` when
    the API refused the Job itself (403/422: admission, quota)."""

    message: str
    unmounted: bool = False
    refused: bool = False


@dataclass(frozen=True, slots=True)
class Launched:
    namespace: str
    name: str


async def job_pods(api: Api, ref: downloads.JobRef) -> list[Obj] | None:
    """The pods of Job `ref` (by controller uid); None when the LIST failed (logged)."""
    selector = f"batch.kubernetes.io/controller-uid={ref.uid}"
    try:
        return (await api.list(kube.PODS, namespace=ref.namespace, label_selector=selector)).items
    except errors.ApiError as exc:
        log.warning("pods_not_read", job=f"{ref.namespace}/{ref.name}", error=str(exc))
        return None


class JobLauncher:
    """Creates, lists and deletes this node's download Jobs (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        api: Api,
        disks: roots.Disks,
        jobs_store: store.Reader,
        node_groups: store.Reader,
        storage_containers: store.Reader,
        clock: clock_mod.Clock,
        backoff_limit: int | None = None,
        name_suffix: Callable[[], str] = jobs.name_suffix,
        caches: tuple[store.Reader, store.Reader] | None = None,
    ) -> None:
        self._node_name = node_name
        self._caches = caches  # (cluster, namespace): their spec.download
        self._name_suffix = name_suffix
        self._records: list[modelnode.DownloadJob] = []
        self._deleted: set[str] = set()
        self._api = api
        self._disks = disks
        self._jobs = jobs_store
        self._groups = node_groups
        self._containers = storage_containers
        self._clock = clock
        self._backoff_limit = backoff_limit
        self._created: dict[tuple[str, str], tuple[float, Obj]] = {}
        self._pod_messages: dict[tuple[str, str, int], str] = {}
        self._warned = onchange.OnChange()  # per storage key: warn on a change, not per pass
        self._root_warned = onchange.OnChange()  # per node group

    def sort_jobs(self, status_records: Iterable[modelnode.DownloadJob]) -> trust.Sorted:
        """Trusted and untrusted Jobs now; the records whose Job is gone are forgotten."""
        now = self._clock.now()
        for ident, (at, _obj) in list(self._created.items()):
            if now - at > CREATED_MEMORY_S:
                del self._created[ident]
        records = trust.merge(self._records, status_records)
        unseen_ok = {ident: obj for ident, (_at, obj) in self._created.items()}
        result = trust.sort_jobs(self._jobs.list(), records, unseen_ok=unseen_ok)
        self._records = result.records
        # Jobs we deleted ourselves may linger in the cache a moment: not someone else's.
        self._deleted &= {trust.uid_of(o) for o in result.untrusted}
        untrusted = [o for o in result.untrusted if trust.uid_of(o) not in self._deleted]
        return trust.Sorted(result.trusted, result.records, untrusted)

    def records(self) -> list[modelnode.DownloadJob]:
        """The records of the Jobs this agent created that are still there."""
        return list(self._records)

    async def cleanup(
        self, units: list[downloads.Unit], refs: list[downloads.JobRef]
    ) -> list[downloads.JobRef]:
        """Delete trusted Jobs whose entry (status key, URI and scope) left the spec; return
        the Jobs that stay."""
        wanted = downloads.wanted_jobs(units)
        self._warned.retain(unit.storage_key for unit in units)
        keep = []
        for ref in refs:
            if ref.identity in wanted:
                keep.append(ref)
                continue
            await self.stop(ref)
        return keep

    async def stop(self, ref: downloads.JobRef) -> None:
        """Delete one of our Jobs (and, in the background, its pods) and forget it."""
        log.info("download_job_deleted", job=f"{ref.namespace}/{ref.name}")
        self._created.pop((ref.namespace, ref.name), None)
        self._records = [r for r in self._records if r.uid != ref.uid]
        self._deleted.add(ref.uid)
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self._api.delete(
                kube.JOBS,
                ref.name,
                namespace=ref.namespace,
                propagation_policy="Background",
                uid=ref.uid,
            )

    async def pod_message(self, ref: downloads.JobRef, failed_pods: int) -> str:
        """What the Job's newest failed pod says ("" when none says anything)."""
        ident = (ref.namespace, ref.uid, failed_pods)
        if ident not in self._pod_messages:
            pods = await job_pods(self._api, ref)
            if pods is None:
                return ""
            self._pod_messages[ident] = pod_failure_message(pods, job_uid=ref.uid)
            while len(self._pod_messages) > _POD_MESSAGES_KEPT:
                self._pod_messages.pop(next(iter(self._pod_messages)))
        return self._pod_messages[ident]

    async def launch(
        self,
        unit: downloads.Unit,
        *,
        node: modelnode.LocalModelNode,
        cfg: config.InferenceServiceConfig,
        attempt: int,
        group: nodegroup.LocalModelNodeGroup,
        disk: folders.ModelDisk,
        peer: Callable[[Obj, credentials.Injection], Obj] | None = None,
    ) -> Launched | NotLaunched:
        """Create attempt `attempt` of the unit's download Job, or say why not; `group` and
        `disk` as `resolve` found them, `peer` makes the peer-mode Job of the origin Job."""
        try:
            injection = await self._credentials(unit.request, cfg.credentials)
            containers = [
                storage.ClusterStorageContainer.model_validate(o) for o in self._containers.list()
            ]
            container = downloadcontainer.select_container(
                unit.request.uri, containers, cfg.storage_initializer
            )
        except (credentials.CredentialError, downloadcontainer.ContainerError) as exc:
            if self._warned.changed(unit.storage_key, str(exc)):
                log.warning("download_not_started", storage_key=unit.storage_key, error=str(exc))
            return NotLaunched(str(exc))
        for _ in range(NAME_TRIES):
            job = jobs.build_job(
                entry=unit.leader, node=node, node_group=group, storage_key=unit.storage_key,
                attempt=attempt, container=container, injection=injection,
                local_model=cfg.local_model, scope=unit.scope, backoff_limit=self._backoff_limit,
                run_as_user=disk.download_uid, suffix=self._name_suffix(), download=(
                    self._group_download(unit.leader, group), self._cache_download(unit.leader)
                ),
            )  # fmt: skip
            job = peer(job, injection) if peer else peerjob.seed_job(job, group, unit.request.uri)
            name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
            await asyncio.to_thread(
                disk.prepare_staging,
                unit.storage_key,
                name,
                group=cfg.local_model.fs_group,
            )
            await asyncio.to_thread(
                functools.partial(
                    disk.record_job,
                    name,
                    namespace=namespace,
                    status_key=unit.status_keys[0],
                    storage_key=unit.storage_key,
                )
            )
            try:
                created = await self._api.create(kube.JOBS, job, namespace=namespace)
            except errors.Conflict as exc:
                if not exc.already_exists:
                    raise
                # Someone else holds this name: not our Job, whatever it looks like.
                log.warning("download_job_name_taken", job=f"{namespace}/{name}")
                await asyncio.to_thread(disk.remove_staging, unit.storage_key, name)
                await asyncio.to_thread(disk.forget_job, name)
                continue
            except (errors.Forbidden, errors.NotFound, errors.Invalid) as exc:
                # e.g. an exhausted ResourceQuota, or the namespace is gone: this entry's problem.
                if self._warned.changed(unit.storage_key, (exc.status, exc.reason)):
                    log.warning("download_job_rejected", job=f"{namespace}/{name}", error=str(exc))
                await asyncio.to_thread(disk.remove_staging, unit.storage_key, name)
                await asyncio.to_thread(disk.forget_job, name)
                why = f"cannot create download Job {namespace}/{name}: {exc.message}"
                return NotLaunched(why, refused=not isinstance(exc, errors.NotFound))
            return self._record(unit, created, namespace=namespace, name=name, attempt=attempt)
        return NotLaunched(f"no free download Job name in namespace {namespace}; retrying")

    def _group_download(
        self, entry: modelnode.LocalModelInfo, group: nodegroup.LocalModelNodeGroup
    ) -> download.DownloadSpec | None:
        """The group's `spec.download`; for a namespace cache's Job its literal values only."""
        spec = group.spec.download
        return downloadenv.literal_layer(spec) if entry.namespace else spec

    def _cache_download(self, entry: modelnode.LocalModelInfo) -> download.DownloadSpec | None:
        """The `spec.download` of the entry's cache (a namespace cache's: tenant names only)."""
        if self._caches is None:
            return None
        reader = self._caches[1] if entry.namespace else self._caches[0]
        obj = reader.get(keys.ObjectKey(entry.namespace or "", entry.model_name))
        raw = ((obj or {}).get("spec") or {}).get("download")
        try:
            spec = download.DownloadSpec.model_validate(raw) if raw else None
        except pydantic.ValidationError:
            log.warning("cache_download_unreadable", cache=entry.model_name)
            return None
        return downloadenv.tenant_layer(spec) if entry.namespace else spec

    def _record(
        self, unit: downloads.Unit, created: Obj, *, namespace: str, name: str, attempt: int
    ) -> Launched:
        self._warned.forget(unit.storage_key)
        uid = trust.uid_of(created)
        if not uid:
            raise errors.LocalcacheError(f"created Job {namespace}/{name} came back without uid")
        self._records.append(
            modelnode.DownloadJob(
                namespace=namespace,
                name=name,
                uid=uid,
                status_key=unit.status_keys[0],
                storage_key=unit.storage_key,
                scope=unit.scope_id,
                attempt=attempt,
            )
        )
        self._created[(namespace, name)] = (self._clock.now(), created)
        log.info(
            "download_job_created",
            job=f"{namespace}/{name}",
            uid=uid,
            attempt=attempt,
            status_keys=unit.status_keys,
        )
        return Launched(namespace, name)

    async def resolve(
        self, entry: modelnode.LocalModelInfo
    ) -> tuple[nodegroup.LocalModelNodeGroup, folders.ModelDisk] | NotLaunched:
        """The entry's node group and the models root serving its PV path, or why not
        (group missing, or its path not mounted: `layout.RootMismatch`'s message)."""
        group = await self._node_group(entry)
        if isinstance(group, NotLaunched):
            return group
        try:
            return group, self._disks.for_path(group.spec.local_path())
        except layout.RootMismatch as exc:
            if self._root_warned.changed(entry.node_group, str(exc)):
                log.warning(
                    "node_group_path_not_mounted", node_group=entry.node_group, error=str(exc)
                )
            return NotLaunched(str(exc), unmounted=True)

    async def _node_group(
        self, entry: modelnode.LocalModelInfo
    ) -> nodegroup.LocalModelNodeGroup | NotLaunched:
        """The entry's node group, else the first (by name) whose PV affinity matches this
        node (KServe's fallback for entries without `nodeGroup`)."""
        if entry.node_group:
            obj = self._groups.get(keys.ObjectKey("", entry.node_group))
            if obj is None:
                return NotLaunched(f"LocalModelNodeGroup {entry.node_group} not found")
            return nodegroup.LocalModelNodeGroup.model_validate(obj)
        try:
            node = await self._api.get(kube.NODES, self._node_name)
        except (errors.NotFound, errors.Forbidden) as exc:
            return NotLaunched(f"entry has no nodeGroup and node {self._node_name}: {exc}")
        for obj in sorted(self._groups.list(), key=lambda o: str(o["metadata"]["name"])):
            group = nodegroup.LocalModelNodeGroup.model_validate(obj)
            if placement.node_matches(node, group.spec.node_selector_terms()):
                return group
        return NotLaunched(f"did not find matching nodegroup for node: {self._node_name}")

    async def _credentials(
        self, request: credentials.CredentialRequest, settings: config.CredentialsConfig
    ) -> credentials.Injection:
        """Read what `credentials.plan` asks for, in the request's namespace only."""
        fetch = credentials.plan(request, settings)
        account = None
        if fetch.service_account:
            account = await self._read(
                kube.SERVICE_ACCOUNTS, fetch.service_account, fetch.namespace
            )
        secrets: dict[str, Mapping[str, Any] | None] = {}
        for name in credentials.secret_names(fetch, account):
            secrets[name] = await self._read(kube.SECRETS, name, fetch.namespace)
        return credentials.resolve(request, settings, service_account=account, secrets=secrets)

    async def _read(self, res: kube.Resource, name: str, namespace: str) -> Obj | None:
        try:
            return await self._api.get(res, name, namespace=namespace)
        except errors.NotFound:
            return None
        except errors.Forbidden as exc:
            raise credentials.CredentialError(
                f"cannot read {res.kind} {namespace}/{name}: {exc}"
            ) from exc


pod_failure_message = jobfailures.pod_failure_message
