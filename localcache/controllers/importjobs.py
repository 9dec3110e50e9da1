"""The I/O around a shared-volume cache's import Job: the API subset it needs, the Job
informer's shape and mapping, the credentials read in the cache's namespace, the download
container, the localcache image, the pods of a Job and the progress sidecar's last line.

- Jobs are watched in every namespace, label-selected (`JOB_SELECTOR`: KServe's import Job
  labels, not a download Job's `node` label) and slimmed (`observed_job`): the selector
  only bounds what is kept; a Job is trusted by the uid recorded in the cache's status,
  never by its labels or name (`sharedvolume`).
- `job_keys(job)` are the caches a Job event concerns: its controller ownerReference's, its
  `model` label's and its name's (`<cache>-import`), in its namespace; the reconciler looks
  at each again and decides by uid.
- Credentials are read exactly as the node agent reads them for a namespace cache's download
  Job (`caching.credentials.plan`, `secret_names`, `resolve`), in the cache's namespace only;
  a Secret or ServiceAccount that cannot be read raises `credentials.CredentialError`.
- `Progress` reads the last line of the `progress` sidecar's log of a running pod whose
  controller is the recorded Job (tail 1 line, at most `LOG_LIMIT` bytes, `LOG_TIMEOUT`
  seconds), at most every `PROGRESS_INTERVAL` seconds per cache; display only.
- `ImageSource` is the image of the import Job's localcache containers: the `--import-image`
  setting, else the image of this controller's own container, read once from its own Pod.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final, Literal, Protocol

import pydantic
import structlog

from localcache.api import modelcache, storage
from localcache.caching import config, credentials, downloadcontainer, importjob, importstate, keys
from localcache.controllers import state
from localcache.runtime import errors, kube
from localcache.runtime import keys as runtime_keys

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
JOB_SELECTOR: Final = "modelNamespace,model,!node"
PROGRESS_INTERVAL: Final = 10.0
MAX_PODS_READ: Final = 16
LOG_LIMIT: Final = 256
LOG_TIMEOUT: Final = 5.0
MAX_VALUE: Final = 256
_KEPT_ANNOTATIONS: Final = (
    importjob.ANNOTATION_PVC_UID,
    importjob.ANNOTATION_STORAGE_KEY,
    importjob.ANNOTATION_SPEC_HASH,
)


class Api(state.Api, Protocol):
    """`state.Api` plus the calls the import needs (`runtime.kube.Kube` provides them)."""

    async def delete(
        self,
        res: kube.Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = None,
        uid: str | None = None,
    ) -> Obj: ...

    async def list(
        self,
        res: kube.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> kube.ObjList: ...

    async def pod_log(
        self,
        name: str,
        *,
        namespace: str,
        container: str,
        tail_lines: int,
        limit_bytes: int,
        request_timeout: float | None = None,
    ) -> str: ...


_meta = state.meta_of


def observed_job(obj: Obj) -> Obj:
    """What the controller keeps of a Job (the Job informer's transform)."""
    meta = _meta(obj)
    kept: Obj = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
        if k in meta
    }
    kept["ownerReferences"] = [
        {k: str(r[k])[:MAX_VALUE] for k in ("apiVersion", "kind", "name", "uid") if k in r}
        | ({"controller": True} if r.get("controller") else {})
        for r in (meta.get("ownerReferences") or [])[:8]
        if isinstance(r, dict)
    ]
    labels = meta.get("labels") or {}
    kept["labels"] = {k: str(labels[k])[:MAX_VALUE] for k in ("model",) if k in labels}
    annotations = meta.get("annotations") or {}
    kept["annotations"] = {
        k: str(annotations[k])[:MAX_VALUE] for k in _KEPT_ANNOTATIONS if k in annotations
    }
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    assert isinstance(status, dict)
    conds = [
        {k: str(c[k])[:MAX_VALUE] for k in ("type", "status", "reason") if k in c}
        for c in (status.get("conditions") or [])[:8]
        if isinstance(c, dict)
    ]
    counts = {k: status[k] for k in ("active", "ready", "failed", "succeeded") if k in status}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": kept,
        "status": {"conditions": conds, **counts},
    }


def job_keys(job: Obj) -> list[runtime_keys.ObjectKey]:
    meta = _meta(job)
    namespace = str(meta.get("namespace") or "")
    names = set()
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == "LocalModelNamespaceCache":
            names.add(str(ref.get("name") or ""))
    names.add(str((meta.get("labels") or {}).get("model") or ""))
    names.add(str(meta.get("name") or "").removesuffix("-import"))
    return [runtime_keys.ObjectKey(namespace, n) for n in sorted(names) if n]


def job_changed(old: Obj, new: Obj) -> bool:
    return old.get("status") != new.get("status") or _meta(old).get("deletionTimestamp") != _meta(
        new
    ).get("deletionTimestamp")


# ------------------------------------------------------------------------ reads and deletes


async def get_job(api: Api, namespace: str, name: str) -> Obj | None:
    """The Job by a fresh GET (None when there is none)."""
    try:
        return await api.get(kube.JOBS, name, namespace=namespace)
    except errors.NotFound:
        return None


async def delete_job(api: Api, job: Obj, *, why: str) -> None:
    """Delete `job` with its uid as precondition (foreground: it is gone once its pods are);
    a Job already gone, or replaced by another of that name, is left alone."""
    meta = _meta(job)
    try:
        await api.delete(
            kube.JOBS,
            str(meta.get("name")),
            namespace=str(meta.get("namespace")),
            propagation_policy="Foreground",
            uid=str(meta.get("uid")),
        )
    except (errors.NotFound, errors.Conflict):
        return
    _log.info("import_job_deleted", job=meta.get("name"), uid=meta.get("uid"), why=why)


async def read_credentials(
    api: Api, request: credentials.CredentialRequest, settings: config.CredentialsConfig
) -> credentials.Injection:
    """What `credentials.plan` asks for, read in the request's namespace only."""
    fetch = credentials.plan(request, settings)
    account = None
    if fetch.service_account:
        account = await _read(api, kube.SERVICE_ACCOUNTS, fetch.service_account, fetch.namespace)
    secrets: dict[str, Mapping[str, Any] | None] = {}
    for name in credentials.secret_names(fetch, account):
        secrets[name] = await _read(api, kube.SECRETS, name, fetch.namespace)
    return credentials.resolve(request, settings, service_account=account, secrets=secrets)


async def _read(api: Api, res: kube.Resource, name: str, namespace: str) -> Obj | None:
    try:
        return await api.get(res, name, namespace=namespace)
    except errors.NotFound:
        return None
    except errors.Forbidden as exc:
        raise credentials.CredentialError(
            f"cannot read {res.kind} {namespace}/{name}: {exc.message}"
        ) from exc


async def storage_containers(api: Api) -> list[storage.ClusterStorageContainer]:
    """KServe's ClusterStorageContainers (none when the kind is not served)."""
    try:
        listed = await api.list(state.CLUSTER_STORAGE_CONTAINERS)
    except errors.NotFound:
        return []
    found = []
    for obj in listed.items:
        try:
            found.append(storage.ClusterStorageContainer.model_validate(obj))
        except pydantic.ValidationError:
            _log.warning("storage_container_unreadable", name=_meta(obj).get("name"))
    return found


def record_kept(written: Obj, claim_uid: str) -> bool:
    """Whether the cache's status as written (the apiserver's answer) kept
    `status.sharedVolume.claimUID`: a served CRD without `sharedVolume` (KServe's, even one
    with pvcRef) would drop the record of our Job's uid, and every Job would look unproven."""
    kept = written.get("sharedVolume")
    return isinstance(kept, dict) and kept.get("claimUID") == claim_uid


RECORD_PRUNED: Final = (
    "status.sharedVolume is dropped by the served LocalModelNamespaceCache CRD (KServe's "
    "schema): localcache could not record its import Job, which it trusts only by that record, "
    "so it imports nothing. Install localcache's CRDs (README \"KServe's CRD schema\")"
)


async def stop_unfinished(api: Api, job: Obj | None, recorded_uid: str | None, *, why: str) -> None:
    """Delete our recorded Job (uid precondition) unless it finished: used when the cache no
    longer owns its destination, so two imports never write one staging folder."""
    if job is None or recorded_uid is None or str(_meta(job).get("uid")) != recorded_uid:
        return
    if importstate.phase_of(job) in ("succeeded", "failed") or _meta(job).get("deletionTimestamp"):
        return
    await delete_job(api, job, why=why)


async def pods_of(api: Api, namespace: str, job_uid: str) -> list[Obj]:
    """The pods whose controller is the Job `job_uid` (by its controller-uid label, then
    checked against the ownerReference)."""
    listed = await api.list(  # a Job of ours has 1 pod at a time: a tenant may add many
        kube.PODS,
        namespace=namespace,
        label_selector=f"batch.kubernetes.io/controller-uid={job_uid}",
        limit=MAX_PODS_READ,
    )
    return importstate.owned_pods(listed.items, job_uid)


class Progress:
    """The import's bytes so far from the progress sidecar (module docstring)."""

    def __init__(self, api: Api, *, interval: float = PROGRESS_INTERVAL, limit: int = 4096) -> None:
        self._api = api
        self._interval = interval
        self._limit = limit
        self._last: dict[str, tuple[float, int | None]] = {}

    def forget(self, cache_uid: str) -> None:
        self._last.pop(cache_uid, None)

    async def bytes(self, cache_uid: str, *, namespace: str, job_uid: str) -> int | None:
        now = time.monotonic()
        last = self._last.get(cache_uid)
        if last is not None and now - last[0] < self._interval:
            return last[1]
        found: int | None = last[1] if last is not None else None
        try:
            pods = await pods_of(self._api, namespace, job_uid)
            running = [p for p in pods if _progress_running(p)]
            if running:
                text = await self._api.pod_log(
                    str(_meta(running[-1]).get("name")),
                    namespace=namespace,
                    container=importjob.PROGRESS_CONTAINER,
                    tail_lines=1,
                    limit_bytes=LOG_LIMIT,
                    request_timeout=LOG_TIMEOUT,
                )
                progress = importjob.progress_from_log(text)
                if progress is not None:
                    found = progress.bytes
        except errors.LocalcacheError as exc:
            _log.debug("import_progress_not_read", error=str(exc))
        self._last[cache_uid] = (now, found)
        if len(self._last) > self._limit:
            self._last.pop(next(iter(self._last)))
        return found


def _progress_running(pod: Obj) -> bool:
    """Whether the pod's progress sidecar runs. It is an init container (native sidecar), so
    the pod's phase stays Pending for the whole download: only `place` makes it Running."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return any(
        isinstance(c, dict)
        and c.get("name") == importjob.PROGRESS_CONTAINER
        and "running" in (c.get("state") or {})
        for c in statuses
    )


class ImageSource:
    """The localcache image for import Jobs (module docstring)."""

    def __init__(self, api: Api, *, image: str = "", pod: runtime_keys.ObjectKey | None = None):
        self._api = api
        self._image = image
        self._pod = pod

    async def image(self) -> str:
        if self._image or self._pod is None:
            return self._image
        try:
            pod = await self._api.get(kube.PODS, self._pod.name, namespace=self._pod.namespace)
        except errors.ApiError as exc:
            _log.warning("own_pod_not_read", pod=str(self._pod), error=str(exc))
            return ""
        containers = (pod.get("spec") or {}).get("containers") or []
        named = [c for c in containers if c.get("name") == "manager"] or containers
        self._image = str((named[0] if named else {}).get("image") or "")
        return self._image


async def prepare_job(
    api: Api,
    cache: modelcache.LocalModelNamespaceCache,
    cfg: config.InferenceServiceConfig,
    *,
    claim_uid: str,
    image: ImageSource,
) -> Obj:
    """The import Job to create for `cache` (its controller ownerReference is the cache);
    raises `credentials.CredentialError` or `downloadcontainer.ContainerError` when its
    credentials or its download container cannot be had, `errors.LocalcacheError` when no
    localcache image is known."""
    spec = cache.spec
    request = credentials.CredentialRequest(
        namespace=cache.namespace,
        uri=spec.source_model_uri,
        service_account_name=spec.service_account_name or None,
        has_storage=spec.storage is not None,
        storage_key=(spec.storage.key or None) if spec.storage else None,
        parameters=dict(spec.storage.parameters or {}) if spec.storage else None,
        tenant=True,
    )
    injection = await read_credentials(api, request, cfg.credentials)
    containers = await storage_containers(api)
    container = downloadcontainer.select_container(
        spec.source_model_uri, containers, cfg.storage_initializer
    )
    found = await image.image()
    if not found:
        raise errors.LocalcacheError("no localcache image for the import Job (--import-image)")
    return importjob.build_import_job(
        cache=cache,
        claim_uid=claim_uid,
        storage_key=keys.storage_key(spec.source_model_uri),
        container=container,
        injection=injection,
        image=found,
        local_model=cfg.local_model,
    )
