"""An in-memory Lease API for leader-election unit tests (no network).

`LeaseStore` holds Leases with the apiserver's compare-and-swap rules: `create` of an
existing name and `replace` with a stale resourceVersion raise `Conflict`. Each elector gets
its own `LeaseClient` view, whose `reachable` flag simulates a partition or an apiserver
outage for that client only (every call then raises `TransportError`). Every call yields to
the event loop once, as a real request would.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any, cast

from localcache.runtime import errors, kube

Obj = dict[str, Any]


@dataclass
class LeaseStore:
    leases: dict[tuple[str, str], Obj] = field(default_factory=dict)
    version: int = 0

    def put(self, obj: Obj) -> Obj:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        meta = stored["metadata"]
        self.leases[(meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

    def holder(self, namespace: str, name: str) -> str:
        lease = self.leases.get((namespace, name)) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def client(self) -> LeaseClient:
        return LeaseClient(self)


@dataclass
class LeaseClient:
    """The part of `kube.Kube` the elector uses, over a `LeaseStore`."""

    store: LeaseStore
    reachable: bool = True
    calls: int = 0

    def as_kube(self) -> kube.Kube:
        return cast(kube.Kube, self)

    async def _enter(self) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if not self.reachable:
            raise errors.TransportError("connection refused (simulated outage)")

    async def get(
        self, res: kube.Resource, name: str, *, namespace: str, request_timeout: float
    ) -> Obj:
        await self._enter()
        lease = self.store.leases.get((namespace, name))
        if lease is None:
            raise errors.NotFound(404, f"lease {namespace}/{name} not found", reason="NotFound")
        return copy.deepcopy(lease)

    async def create(self, res: kube.Resource, body: Obj, *, request_timeout: float) -> Obj:
        await self._enter()
        meta = body["metadata"]
        if (meta["namespace"], meta["name"]) in self.store.leases:
            raise errors.Conflict(409, "already exists", reason="AlreadyExists")
        return self.store.put(body)

    async def replace(self, res: kube.Resource, body: Obj, *, request_timeout: float) -> Obj:
        await self._enter()
        meta = body["metadata"]
        current = self.store.leases.get((meta["namespace"], meta["name"]))
        if current is None:
            raise errors.NotFound(404, "not found", reason="NotFound")
        if current["metadata"]["resourceVersion"] != meta.get("resourceVersion"):
            raise errors.Conflict(409, "the object has been modified", reason="Conflict")
        return self.store.put(body)
