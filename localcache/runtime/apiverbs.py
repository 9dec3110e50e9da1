"""The API verbs over `transport.Transport`: get, list, watch, create, replace, patch, delete
(and their status-subresource forms, and `raw`), plain dicts in and out.

`Verbs` is the half of `kube.Kube` that needs no kubernetes_asyncio: `Kube` (the only module
importing it) builds the transport from a configuration and inherits these methods. The
contract (timeouts, the `errors` tree, watch events, list items' apiVersion/kind) is
`kube`'s module docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from localcache.runtime import apitypes, errors, transport

Obj = apitypes.Obj
Patch = apitypes.Patch
PatchType = apitypes.PatchType
Resource = apitypes.Resource
ObjList = apitypes.ObjList
WatchStream = transport.WatchStream

DEFAULT_READ_DEADLINE_S = 120.0


class Verbs:
    """Every API call, through `self._http` (set by the subclass's constructor)."""

    _http: transport.Transport

    @property
    def request_timeout(self) -> float:
        return self._http.request_timeout

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

    async def pod_log(
        self,
        name: str,
        *,
        namespace: str,
        container: str,
        tail_lines: int,
        limit_bytes: int,
        request_timeout: float | None = None,
    ) -> str:
        """The last `tail_lines` lines of a container's log, at most `limit_bytes` bytes (the
        apiserver cuts the body: a pod's output is never read whole)."""
        path = apitypes.PODS.path(namespace=namespace, name=name) + "/log"
        query = {"container": container, "tailLines": tail_lines, "limitBytes": limit_bytes}
        return await self.raw(path, query=query, request_timeout=request_timeout)

    async def token_review(
        self, token: str, *, audiences: Sequence[str], request_timeout: float | None = None
    ) -> Obj:
        """The apiserver's TokenReview of `token` for `audiences` (authentication.k8s.io/v1):
        the returned object's `status` (authenticated, user, audiences, error). The token is
        sent in the body only; it is never logged here."""
        review: Obj = {
            "apiVersion": apitypes.TOKEN_REVIEWS.api_version,
            "kind": apitypes.TOKEN_REVIEWS.kind,
            "spec": {"token": token, "audiences": list(audiences)},
        }
        return await self.create(apitypes.TOKEN_REVIEWS, review, request_timeout=request_timeout)

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
