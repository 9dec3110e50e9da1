"""Kubernetes API access: the only module that imports kubernetes_asyncio.

`Kube` speaks to the apiserver with plain dicts (Kubernetes JSON) for any resource described
by a `Resource` record (core, apps, batch, coordination, CRDs alike). kubernetes_asyncio is
used for configuration (kubeconfig, in-cluster, token refresh) and its TLS-configured aiohttp
session; its model classes are never used, so nothing is deserialised into generated models.

Contract:
- Every call has a client-side timeout (`request_timeout=` per call, else the client's).
- Failures raise the `errors` tree: a non-2xx answer maps its HTTP status onto an `ApiError`
  subclass carrying the Status reason and message (429 also carries `retry_after`); a refused,
  reset or broken connection is a `TransportError`; a passed deadline is an `ApiTimeout`.
- `watch()` yields raw events `{"type", "object"}` and turns an `ERROR` event into the mapped
  `ApiError` (so 410 arrives as `errors.Gone` whether it comes as a status or in the stream).
  A connection that delivers no bytes for `read_deadline` seconds raises `ApiTimeout`.
- List items get `apiVersion`/`kind` filled in when the server omits them.
- `requests` counts calls per verb, as data for tests and benchmarks; `instrument()` also
  reports every request to client-go's `rest_client_*` metrics.
- A configuration that cannot be used (a kubeconfig that is missing or does not parse, no
  current context, not in a pod) raises `errors.ConfigError` from the constructors.
Not promised: retries. Callers (reflector, lease, reconcilers) decide how to retry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from localcache.runtime import apitypes, errors, transport

# The API's vocabulary lives in `apitypes`; callers find it here.
Obj = apitypes.Obj
Patch = apitypes.Patch
PatchType = apitypes.PatchType
Resource = apitypes.Resource
ObjList = apitypes.ObjList
WatchStream = transport.WatchStream
error_from_status = transport.error_from_status
NAMESPACES = apitypes.NAMESPACES
NODES = apitypes.NODES
PODS = apitypes.PODS
SECRETS = apitypes.SECRETS
SERVICE_ACCOUNTS = apitypes.SERVICE_ACCOUNTS
CONFIG_MAPS = apitypes.CONFIG_MAPS
EVENTS = apitypes.EVENTS
PERSISTENT_VOLUMES = apitypes.PERSISTENT_VOLUMES
PERSISTENT_VOLUME_CLAIMS = apitypes.PERSISTENT_VOLUME_CLAIMS
JOBS = apitypes.JOBS
LEASES = apitypes.LEASES
MUTATING_WEBHOOK_CONFIGURATIONS = apitypes.MUTATING_WEBHOOK_CONFIGURATIONS
VALIDATING_WEBHOOK_CONFIGURATIONS = apitypes.VALIDATING_WEBHOOK_CONFIGURATIONS
CUSTOM_RESOURCE_DEFINITIONS = apitypes.CUSTOM_RESOURCE_DEFINITIONS

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_READ_DEADLINE_S = 120.0


# What kubernetes_asyncio raises for a configuration it cannot use: its own exception, and
# whatever a kubeconfig of the wrong shape makes its parser raise (it reads YAML by key).
_CONFIG_ERRORS = (
    k8s_config.ConfigException,
    yaml.YAMLError,
    OSError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _current_kubeconfig() -> str:
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return first or str(Path.home() / ".kube" / "config")


class Kube:
    """An API client for any resource; plain dicts in and out. Use as an async context
    manager or call `close()`. Construct with `from_kubeconfig`, `in_cluster` or `auto`."""

    def __init__(self, configuration: Any, *, request_timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Wrap a kubernetes_asyncio `Configuration`; must be called inside a running loop."""
        self._api = k8s_client.ApiClient(configuration)
        self._config = configuration
        self._http = transport.Transport(
            self._api.rest_client,
            configuration,
            default_headers=self._api.default_headers,
            request_timeout=request_timeout,
        )
        self.requests = self._http.requests
        """Requests sent, per verb (get, list, watch, create, update, patch, delete, raw)."""

    @property
    def request_timeout(self) -> float:
        return self._http.request_timeout

    def instrument(self, metrics: transport.RequestMetrics) -> None:
        """Report every request from now on to `metrics` (`metrics.Metrics.rest_client()`)."""
        self._http.metrics = metrics

    # ---------------------------------------------------------------- constructors

    @classmethod
    async def from_kubeconfig(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        request_timeout: float = DEFAULT_TIMEOUT_S,
    ) -> Kube:
        """From a kubeconfig file; `None` means the current one ($KUBECONFIG, ~/.kube/config)."""
        file = str(path) if path is not None else _current_kubeconfig()
        # Checked first, as the loader would log a warning of its own. (One stat: the loader
        # reads the file without a thread too.)
        if not Path(file).is_file():  # noqa: ASYNC240
            what = "not a file" if Path(file).exists() else "no such file"  # noqa: ASYNC240
            raise errors.ConfigError(f"kubeconfig {file}: {what}")
        configuration = k8s_client.Configuration()
        try:
            await k8s_config.load_kube_config(
                config_file=file,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except _CONFIG_ERRORS as exc:
            raise errors.ConfigError(f"kubeconfig {file} is unusable: {_first_line(exc)}") from exc
        return cls(configuration, request_timeout=request_timeout)

    @classmethod
    async def in_cluster(cls, *, request_timeout: float = DEFAULT_TIMEOUT_S) -> Kube:
        """From the pod's service account (the token is re-read as it rotates)."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration, try_refresh_token=True
            )
        except _CONFIG_ERRORS as exc:
            raise errors.ConfigError(f"in-cluster configuration: {_first_line(exc)}") from exc
        return cls(configuration, request_timeout=request_timeout)

    @classmethod
    async def auto(cls, *, request_timeout: float = DEFAULT_TIMEOUT_S) -> Kube:
        """In-cluster when running in a pod, else the current kubeconfig."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            return await cls.in_cluster(request_timeout=request_timeout)
        return await cls.from_kubeconfig(request_timeout=request_timeout)

    @property
    def server(self) -> str:
        return str(self._config.host)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---------------------------------------------------------------- reads

    async def get(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        request_timeout: float | None = None,
    ) -> Obj:
        return await self._http.json(
            "get", "GET", res.path(namespace=namespace, name=name), request_timeout=request_timeout
        )

    async def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        request_timeout: float | None = None,
    ) -> ObjList:
        """One LIST request (one page when `limit` is set; follow `continue_token`)."""
        query = transport.query(
            {
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
                "resourceVersion": resource_version,
                "resourceVersionMatch": resource_version_match,
                "limit": limit,
                "continue": continue_token or None,
            }
        )
        body = await self._http.json(
            "list",
            "GET",
            res.path(namespace=namespace),
            query=query,
            request_timeout=request_timeout,
        )
        items: list[Obj] = body.get("items") or []
        for item in items:
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        meta = body.get("metadata") or {}
        return ObjList(
            items=items,
            resource_version=str(meta.get("resourceVersion") or ""),
            continue_token=str(meta.get("continue") or ""),
            remaining_item_count=meta.get("remainingItemCount"),
        )

    async def list_all(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        request_timeout: float | None = None,
    ) -> ObjList:
        """A consistent full list in pages of `page_size`; if a continue token expires
        midway, falls back to one unpaged list (client-go's pager, FullListIfExpired)."""
        selectors: dict[str, Any] = {
            "namespace": namespace,
            "label_selector": label_selector,
            "field_selector": field_selector,
            "request_timeout": request_timeout,
        }
        items: list[Obj] = []
        token = ""
        while True:
            try:
                page = await self.list(res, limit=page_size, continue_token=token, **selectors)
            except errors.Gone:
                if not token:
                    raise
                return await self.list(res, **selectors)
            items.extend(page.items)
            if not page.continue_token:
                return ObjList(items=items, resource_version=page.resource_version)
            token = page.continue_token

    def watch(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: int | None = None,
        read_deadline: float = DEFAULT_READ_DEADLINE_S,
        connect_timeout: float | None = None,
    ) -> WatchStream:
        """A WATCH stream; use as `async with kube.watch(...) as events: async for ev in events`.
        Opening raises for HTTP errors; iterating raises for ERROR events and broken or silent
        connections; a clean end of the stream (server timeout) ends the iteration."""
        query = transport.query(
            {
                "watch": True,
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": allow_bookmarks,
                "timeoutSeconds": timeout_seconds,
            }
        )
        return WatchStream(
            self._http,
            res.path(namespace=namespace),
            query=query,
            read_deadline=read_deadline,
            connect_timeout=self.request_timeout if connect_timeout is None else connect_timeout,
        )

    async def raw(
        self,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        request_timeout: float | None = None,
    ) -> str:
        """GET any path (e.g. /version, /metrics) and return the body as text."""
        body = await self._http.call(
            "raw", "GET", path, query=transport.query(query or {}), request_timeout=request_timeout
        )
        return body.decode(errors="replace")

    # ---------------------------------------------------------------- writes

    async def create(
        self,
        res: Resource,
        obj: Obj,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
        request_timeout: float | None = None,
    ) -> Obj:
        return await self._write(
            "POST", "", res, obj, namespace, field_manager, dry_run, request_timeout
        )

    async def replace(
        self,
        res: Resource,
        obj: Obj,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
        request_timeout: float | None = None,
    ) -> Obj:
        """PUT the whole object; its metadata.resourceVersion makes this a compare-and-swap."""
        return await self._write(
            "PUT", "", res, obj, namespace, field_manager, dry_run, request_timeout
        )

    async def replace_status(
        self,
        res: Resource,
        obj: Obj,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        request_timeout: float | None = None,
    ) -> Obj:
        return await self._write(
            "PUT", "status", res, obj, namespace, field_manager, False, request_timeout
        )

    async def _write(
        self,
        method: Literal["POST", "PUT"],
        subresource: str,
        res: Resource,
        obj: Obj,
        namespace: str | None,
        field_manager: str | None,
        dry_run: bool,
        request_timeout: float | None,
    ) -> Obj:
        """POST `obj` to its collection (create), or PUT it or its `subresource` (update)."""
        ns = namespace if namespace is not None else _namespace_of(res, obj)
        name = None if method == "POST" else str((obj.get("metadata") or {}).get("name") or "")
        return await self._http.json(
            "create" if method == "POST" else "update",
            method,
            res.path(namespace=ns, name=name, subresource=subresource),
            query=_write_query(field_manager, dry_run),
            body=obj,
            request_timeout=request_timeout,
        )

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
        subresource: str = "",
        request_timeout: float | None = None,
    ) -> Obj:
        """PATCH with a merge, JSON, strategic-merge or server-side-apply body. Apply needs a
        `field_manager`; `force` takes over conflicting fields."""
        if patch_type == "apply" and not field_manager:
            raise ValueError("server-side apply needs a field_manager")
        if patch_type == "json" and not isinstance(patch, list):
            raise ValueError("a JSON patch is a list of operations")
        query = _write_query(field_manager, dry_run)
        if patch_type == "apply" and force:
            query.append(("force", "true"))
        return await self._http.json(
            "patch",
            "PATCH",
            res.path(namespace=namespace, name=name, subresource=subresource),
            query=query,
            body=patch,
            content_type=apitypes.PATCH_CONTENT_TYPES[patch_type],
            request_timeout=request_timeout,
        )

    async def get_status(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        request_timeout: float | None = None,
    ) -> Obj:
        path = res.path(namespace=namespace, name=name, subresource="status")
        return await self._http.json("get", "GET", path, request_timeout=request_timeout)

    async def patch_status(
        self,
        res: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        request_timeout: float | None = None,
    ) -> Obj:
        return await self.patch(
            res,
            name,
            patch,
            namespace=namespace,
            patch_type=patch_type,
            field_manager=field_manager,
            force=force,
            subresource="status",
            request_timeout=request_timeout,
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
        request_timeout: float | None = None,
    ) -> Obj:
        """DELETE; `uid`/`resource_version` are preconditions (409 Conflict when they do not
        hold). Returns the object (still present while finalizers run) or a Status."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            options["preconditions"] = preconditions
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if dry_run:
            options["dryRun"] = ["All"]
        return await self._http.json(
            "delete",
            "DELETE",
            res.path(namespace=namespace, name=name),
            body=options,
            request_timeout=request_timeout,
        )


def _namespace_of(res: Resource, obj: Obj) -> str | None:
    if not res.namespaced:
        return None
    namespace = (obj.get("metadata") or {}).get("namespace")
    if not namespace:
        raise ValueError(f"{res.kind} object without metadata.namespace and no namespace= given")
    return str(namespace)


def _write_query(field_manager: str | None, dry_run: bool) -> list[tuple[str, str]]:
    return transport.query({"fieldManager": field_manager, "dryRun": "All" if dry_run else None})
