"""The agent's download Jobs: which exist, which go, and creating a new one.

`JobLauncher` is the only part of the agent that creates or deletes Jobs:
- `our_jobs()` lists this node's download Jobs from the informer cache, plus the Jobs it
  created in the last minute that the cache has not shown yet (so a stale cache never
  leads to a second create; names are deterministic anyway, and AlreadyExists is success);
- `cleanup(units)` deletes Jobs no spec entry wants (same name, namespace, URI and scope);
- `launch(...)` resolves the node group, checks that its PV path is the models root, reads
  the credentials (in the entry's namespace only), picks the container, prepares the
  staging folder and creates the Job; a problem that a retry cannot fix comes back as
  `NotLaunched(message)` and no Job is created;
- `pod_message(job)` reads why the Job's newest failed pod failed (cached per failure count).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from localcache.agent import disk as disk_mod
from localcache.agent import jobs, layout, plan
from localcache.api import modelnode, nodegroup, storage
from localcache.caching import config, credentials
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, kube, store

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
CREATED_MEMORY_S: Final = 60.0
_POD_MESSAGES_KEPT: Final = 256


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
    ) -> Obj: ...

    async def get_status(
        self, res: kube.Resource, name: str, *, namespace: str | None = None
    ) -> Obj: ...

    async def patch_status(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj: ...


@dataclass(frozen=True, slots=True)
class NotLaunched:
    """Why a unit's Job was not created (the entry's ModelDownloadError message)."""

    message: str


@dataclass(frozen=True, slots=True)
class Launched:
    namespace: str
    name: str


class JobLauncher:
    """Creates, lists and deletes this node's download Jobs (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        api: Api,
        disk: disk_mod.ModelDisk,
        jobs_store: store.Reader,
        node_groups: store.Reader,
        storage_containers: store.Reader,
        clock: clock_mod.Clock,
        backoff_limit: int | None = None,
    ) -> None:
        self._node_name = node_name
        self._api = api
        self._disk = disk
        self._jobs = jobs_store
        self._groups = node_groups
        self._containers = storage_containers
        self._clock = clock
        self._backoff_limit = backoff_limit
        self._created: dict[tuple[str, str], tuple[float, Obj]] = {}
        self._pod_messages: dict[tuple[str, str, int], str] = {}

    def our_jobs(self) -> list[plan.JobRef]:
        """Our Jobs from the cache, plus those created lately that it has not shown yet."""
        found: dict[tuple[str, str], plan.JobRef] = {}
        for obj in self._jobs.list():
            ref = plan.job_ref(obj)
            if ref is not None:
                found[(ref.namespace, ref.name)] = ref
        now = self._clock.now()
        for ident, (at, obj) in list(self._created.items()):
            if ident in found or now - at > CREATED_MEMORY_S:
                del self._created[ident]
            elif (ref := plan.job_ref(obj)) is not None:
                found[ident] = ref
        return list(found.values())

    async def cleanup(self, units: list[plan.Unit]) -> list[plan.JobRef]:
        """Delete Jobs whose entry (name, namespace, URI and scope) left the spec; return
        the Jobs that stay."""
        wanted = plan.wanted_job_labels(units)
        keep = []
        for ref in self.our_jobs():
            if plan.job_identity(ref) in wanted:
                keep.append(ref)
                continue
            log.info("download_job_deleted", job=f"{ref.namespace}/{ref.name}")
            self._created.pop((ref.namespace, ref.name), None)
            with contextlib.suppress(errors.NotFound):
                await self._api.delete(
                    kube.JOBS, ref.name, namespace=ref.namespace, propagation_policy="Background"
                )
        return keep

    async def pod_message(self, ref: plan.JobRef, failed_pods: int) -> str:
        """What the Job's newest failed pod says ("" when none says anything)."""
        ident = (ref.namespace, ref.name, failed_pods)
        if ident not in self._pod_messages:
            try:
                pods = await self._api.list(
                    kube.PODS,
                    namespace=ref.namespace,
                    label_selector=f"batch.kubernetes.io/job-name={ref.name}",
                )
            except errors.ApiError as exc:
                log.warning("pods_not_read", job=f"{ref.namespace}/{ref.name}", error=str(exc))
                return ""
            self._pod_messages[ident] = plan.pod_failure_message(pods.items)
            if len(self._pod_messages) > _POD_MESSAGES_KEPT:
                self._pod_messages.pop(next(iter(self._pod_messages)))
        return self._pod_messages[ident]

    async def launch(
        self,
        unit: plan.Unit,
        *,
        node: modelnode.LocalModelNode,
        cfg: config.InferenceServiceConfig,
        attempt: int,
    ) -> Launched | NotLaunched:
        """Create attempt `attempt` of the unit's download Job, or say why it cannot run."""
        group = await self._node_group(unit.leader)
        if isinstance(group, NotLaunched):
            return group
        pv_path = group.spec.local_path()
        try:
            if pv_path is not None:
                self._disk.check_root(pv_path)
            injection = await self._credentials(unit.request, cfg.credentials)
            containers = [
                storage.ClusterStorageContainer.model_validate(o) for o in self._containers.list()
            ]
            container = jobs.select_container(unit.request.uri, containers, cfg.storage_initializer)
        except (layout.RootMismatch, credentials.CredentialError, jobs.JobError) as exc:
            log.warning("download_not_started", storage_key=unit.storage_key, error=str(exc))
            return NotLaunched(str(exc))
        job = jobs.build_job(
            entry=unit.leader,
            node=node,
            node_group=group,
            storage_key=unit.storage_key,
            attempt=attempt,
            container=container,
            injection=injection,
            local_model=cfg.local_model,
            scope=unit.scope,
            backoff_limit=self._backoff_limit,
        )
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        await asyncio.to_thread(self._disk.prepare_staging, unit.storage_key, name)
        try:
            created = await self._api.create(kube.JOBS, job, namespace=namespace)
        except errors.Conflict as exc:
            if not exc.already_exists:
                raise
            created = job
        except (errors.Forbidden, errors.NotFound, errors.Invalid) as exc:
            # e.g. an exhausted ResourceQuota, or the namespace is gone: this entry's problem.
            log.warning("download_job_rejected", job=f"{namespace}/{name}", error=str(exc))
            return NotLaunched(f"cannot create download Job {namespace}/{name}: {exc.message}")
        self._created[(namespace, name)] = (self._clock.now(), created)
        log.info(
            "download_job_created",
            job=f"{namespace}/{name}",
            attempt=attempt,
            status_keys=unit.status_keys,
        )
        return Launched(namespace, name)

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
            if plan.node_matches(group.spec.node_selector_terms(), node):
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
