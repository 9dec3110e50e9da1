"""Writes of a cache's PVs and PVCs, with the apiserver's answers sorted into what the
cache's status reports (`volumes.reconcile_volumes` drives it).

`Writer.create_new`/`patch`/`delete` never raise an `ApiError`: an object already there (create),
already gone (patch, delete) is fine; a guarded patch that meets a newer resourceVersion (409)
becomes `Outcome.error`, to raise at the end so the cache is looked at again; any other
answer (422 Invalid, 403 Forbidden by RBAC, quota or an admission policy, ...) is a
`conditions.Refusal` and its error, the first of which is raised at the end. Transport errors
(no answer) propagate at once. `Outcome` also carries what the caller found on the way: the
objects adopted and the wanted names taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from localcache.caching import conditions
from localcache.controllers import state
from localcache.runtime import errors, kube

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


@dataclass(frozen=True, slots=True)
class Adopted:
    """A PV or PVC adopted in this reconcile."""

    kind: str
    name: str
    namespace: str

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return (
            f"adopted {self.kind} {where}: it is this cache's (created by KServe's localmodel "
            "add-on or an earlier controller); localcache manages it from now on"
        )


@dataclass(slots=True)
class Outcome:
    """What `reconcile_volumes` did: the writes sent, the writes the apiserver refused, the
    objects adopted, the wanted names held by objects that are not the cache's, and the
    error to raise once the status reports them (the first refusal's, or a 409)."""

    writes: int = 0
    refused: list[conditions.Refusal] = field(default_factory=list)
    adopted: list[Adopted] = field(default_factory=list)
    taken: list[conditions.NameTaken] = field(default_factory=list)
    error: errors.ApiError | None = None
    waiting: bool = False
    """A legacy pair waits for the pods that mount it (`legacy`): look again later."""


class Writer:
    """Create/delete with idempotent error handling; counts writes and collects refusals."""

    def __init__(self, api: state.Api) -> None:
        self.api = api
        self.outcome = Outcome()

    def _refused(
        self,
        verb: Literal["create", "delete", "patch"],
        res: kube.Resource,
        obj: Obj,
        exc: errors.ApiError,
    ) -> None:
        meta = _meta(obj)
        _log.warning(
            "volume_write_refused",
            verb=verb,
            kind=res.kind,
            name=meta.get("name"),
            namespace=meta.get("namespace"),
            code=exc.status,
            reason=exc.reason,
            error=exc.message,
        )
        self.outcome.refused.append(
            conditions.Refusal(
                verb=verb,
                kind=res.kind,
                name=str(meta.get("name") or ""),
                namespace=str(meta.get("namespace") or ""),
                code=exc.status,
                reason=exc.reason,
                message=exc.message,
            )
        )
        if self.outcome.error is None:
            self.outcome.error = exc

    async def create_new(self, res: kube.Resource, obj: Obj) -> Obj | None:
        """Create `obj` and return the apiserver's copy (with its uid); None when it was
        refused or already there (then it is someone's we have not seen yet)."""
        meta = _meta(obj)
        try:
            made = await self.api.create(res, obj, namespace=meta.get("namespace") or None)
        except errors.Conflict as exc:
            if not exc.already_exists:
                self._refused("create", res, obj, exc)
            return None
        except errors.ApiError as exc:
            self._refused("create", res, obj, exc)
            return None
        _log.info(
            "volume_created", kind=res.kind, name=meta["name"], namespace=meta.get("namespace")
        )
        self.outcome.writes += 1
        return made

    async def patch(self, res: kube.Resource, obj: Obj, patch: Obj) -> bool:
        """Merge-patch `obj` (guarded by the resourceVersion inside `patch`); False when it
        did not happen: gone (fine), changed since (409, raised later), or refused."""
        meta = _meta(obj)
        try:
            await self.api.patch(
                res, str(meta["name"]), patch, namespace=meta.get("namespace") or None
            )
        except errors.NotFound:
            return False
        except errors.Conflict as exc:
            _log.info("volume_changed_meanwhile", kind=res.kind, name=meta["name"])
            if self.outcome.error is None:
                self.outcome.error = exc
            return False
        except errors.ApiError as exc:
            self._refused("patch", res, obj, exc)
            return False
        self.outcome.writes += 1
        return True

    async def delete(self, res: kube.Resource, obj: Obj) -> None:
        meta = _meta(obj)
        if meta.get("deletionTimestamp"):
            return
        try:
            await self.api.delete(res, str(meta["name"]), namespace=meta.get("namespace") or None)
            _log.info(
                "volume_deleted", kind=res.kind, name=meta["name"], namespace=meta.get("namespace")
            )
        except errors.NotFound:
            pass
        except errors.ApiError as exc:
            self._refused("delete", res, obj, exc)
            return
        self.outcome.writes += 1
