"""Node groups the informer has not delivered yet, read from the apiserver (cache admission).

`kubectl apply` of a node group and a cache that names it, in one file, creates the group and
at once the cache: the cache's admission request can come before the group's watch event
has reached the validator's store, and the write was denied ("LocalModelNodeGroup … not
found") although the group existed. So a group that a write adds and the store lacks is read
from the apiserver before the write is judged (`complete`); the read is linearizable, so a
group created before the request is seen.

Bounds (a tenant writes namespace caches, dry runs included): only names that can be a node
group's (`NAME`) are read, at most `MAX_LIVE_READS` per request, concurrently, each within
`READ_TIMEOUT_S` (well inside the handler's own 8 s), and at most `MAX_READS_IN_FLIGHT` in
the whole process: past that a read is skipped, so no burst of requests can fill the
controller's connection pool. Anything but the group (404, any error, a timeout, a skipped
read) leaves it missing, and the denial names it as before; an error is logged with the
group's name. Nothing is read when the store has every group, nor for an update of a cache
being deleted (always allowed).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import structlog

from localcache.api import groupversion, modelcache, nodegroup
from localcache.runtime import errors, kube
from localcache.webhooks import stores

log = structlog.get_logger(__name__)

MAX_LIVE_READS: Final = 4
MAX_READS_IN_FLIGHT: Final = 8
READ_TIMEOUT_S: Final = 2.0
NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A DNS subdomain: what the apiserver accepts as a cluster-scoped object's name."""

Obj = dict[str, Any]
Reader = Callable[[str], Awaitable[Obj | None]]
Groups = dict[str, nodegroup.LocalModelNodeGroup]
AnyCache = modelcache.LocalModelCache | modelcache.LocalModelNamespaceCache


def reader(client: kube.Kube) -> Reader:
    """Reads one LocalModelNodeGroup by name through `client`; None when it cannot."""

    in_flight = asyncio.Semaphore(MAX_READS_IN_FLIGHT)

    async def read(name: str) -> Obj | None:
        if in_flight.locked():
            log.warning("node_group_read_skipped", node_group=name, reason="reads in flight")
            return None
        async with in_flight:
            try:
                return await client.get(
                    groupversion.LOCAL_MODEL_NODE_GROUP.api, name, request_timeout=READ_TIMEOUT_S
                )
            except errors.NotFound:
                return None
            except Exception as exc:  # any failure: the group stays missing (fail closed)
                log.warning(
                    "node_group_read_failed",
                    node_group=name,
                    error_type=type(exc).__name__,
                    error=str(exc)[:200],
                )
                return None

    return read


async def complete(
    known: Mapping[str, nodegroup.LocalModelNodeGroup],
    new: AnyCache,
    old: AnyCache | None,
    read: Reader | None,
) -> Groups:
    """`known` plus the groups that `new` adds to `old` and `known` lacks, as `read` finds
    them (module docstring); `known` as it is without a reader."""
    found: Groups = dict(known)
    if old is not None and new.metadata.deletion_timestamp:
        return found  # an update of a cache being deleted is allowed without looking
    before = set(old.spec.node_groups) if old is not None else set()
    missing = [
        g for g in dict.fromkeys(new.spec.node_groups)
        if g not in before and g not in found and NAME.fullmatch(g)
    ][:MAX_LIVE_READS]  # fmt: skip
    if read is None or not missing:
        return found
    answers = await asyncio.gather(*(read(g) for g in missing))
    for group, raw in zip(missing, answers, strict=True):
        parsed = stores.parse_all(nodegroup.LocalModelNodeGroup, [raw] if raw else [])
        if parsed and parsed[0].metadata.name == group:
            found[group] = parsed[0]
    return found
