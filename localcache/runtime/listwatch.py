"""Where a reflector reads from and what it writes to: the `ListerWatcher` and `StoreSink`
protocols, and `ListWatch`, the ListerWatcher of one resource through the API client
(optionally narrowed to a namespace and label/field selectors).

Contract: `ListWatch` adds nothing to the calls it forwards (no retries, no caching); every
LIST carries `list_timeout` and every WATCH asks for bookmarks and carries the reflector's
`timeout_seconds` and client-side `read_deadline`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from localcache.runtime import kube

Obj = dict[str, Any]


class ListerWatcher(Protocol):
    """Where a reflector reads from: one LIST page and one WATCH stream at a time."""

    @property
    def description(self) -> str: ...

    async def list(
        self, *, resource_version: str, limit: int | None, continue_token: str
    ) -> kube.ObjList: ...

    def watch(
        self, *, resource_version: str, timeout_seconds: int, read_deadline: float
    ) -> AbstractAsyncContextManager[AsyncIterator[Obj]]: ...


class StoreSink(Protocol):
    """What a reflector writes to (the informer)."""

    def replace(self, objs: list[Obj], resource_version: str) -> None: ...

    def upsert(self, obj: Obj) -> None: ...

    def delete(self, obj: Obj) -> None: ...


class ListWatchClient(Protocol):
    """The two API calls `ListWatch` makes (`kube.Kube` provides them)."""

    async def list(
        self,
        res: kube.Resource,
        *,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        resource_version: str | None,
        limit: int | None,
        continue_token: str | None,
        request_timeout: float | None,
    ) -> kube.ObjList: ...

    def watch(
        self,
        res: kube.Resource,
        *,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        resource_version: str | None,
        allow_bookmarks: bool,
        timeout_seconds: int | None,
        read_deadline: float,
    ) -> AbstractAsyncContextManager[AsyncIterator[Obj]]: ...


class ListWatch:
    """A `ListerWatcher` for one resource through `kube.Kube` (or any `ListWatchClient`),
    optionally narrowed to a namespace and label/field selectors."""

    def __init__(
        self,
        client: ListWatchClient,
        resource: kube.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        list_timeout: float = 60.0,
    ) -> None:
        self._kube = client
        self.resource = resource
        self.namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._list_timeout = list_timeout

    @property
    def description(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.resource}{where}"

    async def list(
        self, *, resource_version: str, limit: int | None, continue_token: str
    ) -> kube.ObjList:
        return await self._kube.list(
            self.resource,
            namespace=self.namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            resource_version=resource_version,
            limit=limit,
            continue_token=continue_token,
            request_timeout=self._list_timeout,
        )

    def watch(
        self, *, resource_version: str, timeout_seconds: int, read_deadline: float
    ) -> AbstractAsyncContextManager[AsyncIterator[Obj]]:
        return self._kube.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            resource_version=resource_version,
            allow_bookmarks=True,
            timeout_seconds=timeout_seconds,
            read_deadline=read_deadline,
        )
