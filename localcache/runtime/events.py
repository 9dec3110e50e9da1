"""The one core/v1 Event recorder: Events about an object, deduplicated with a count bump.

`Recorder.record(involved, type=..., reason=..., message=...)` writes an Event about the
object `involved` (built with `involved_object()`), as client-go's recorder and its
EventCorrelator do: a repeat of the same Event bumps the existing object's `count` and
`lastTimestamp` instead of adding another object.

Naming, the same for every component:
- `metadata.name` is `<involved name>.<digest>`: the first 16 hex digits of a SHA-256 over the
  involved object's uid, the type, the reason and the message (a caller may pass its own
  stable `name`, as the CRD schema check does: `<crd>.<digest of uid and finding>`). The
  involved name is cut so the whole stays a valid name. The same Event therefore has the same
  name in every replica and after a restart, which is what makes the count bump work
  across processes.
- `metadata.namespace` is the involved object's namespace; a cluster-scoped object's Events
  go to `default` (`CLUSTER_EVENT_NAMESPACE`), as client-go's do.
- `source.component` and `reportingComponent` name the component, `reportingInstance` (and
  `source.host`, when given) the process:
  - the cache controllers and the CRD schema check: `localcache-controller`, instance the
    replica's host name (`controllers.status.COMPONENT`, `runtime.crds.crdcheck.COMPONENT`);
  - the node agent: `localcache-agent`, instance and `source.host` the node's name
    (`agent.report.EVENT_SOURCE`).

Contract:
- The first record of a name creates the Event (`count` 1, `firstTimestamp` =
  `lastTimestamp` = `now()`); on AlreadyExists (another replica, an earlier process) it reads
  the Event and patches `count + 1` and `lastTimestamp`. A later record of the same name in
  this process patches directly from the count it remembers (an LRU of `CACHE_SIZE` names);
  if that Event is gone meanwhile (the apiserver's event TTL), it is created again.
- Failures raise the `errors` tree (a denied create raises `errors.Forbidden`): whether an
  Event is worth a retry is the caller's decision (Events are informative; most callers log
  and go on).
- Volume is capped as client-go's spam filter does: a token bucket per involved object and
  `spam_key` (default: the reason; callers pass what a tenant varies, such as a cache's status
  key, so one tenant cannot use up another's budget on a shared object), `SPAM_BURST` Events
  at once, then one per `SPAM_REFILL_S`; Events over it are dropped (a debug log line), never
  queued. The buckets are an LRU of `CACHE_SIZE`.
- Not promised: exact counts under concurrent bumps from several replicas (a merge patch of
  `count` is last-writer-wins, as in client-go), or ordering between Events.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, kube

Obj = dict[str, Any]

CLUSTER_EVENT_NAMESPACE: Final = "default"
MAX_NAME: Final = 253
DIGEST_LENGTH: Final = 16
CACHE_SIZE: Final = 4096
SPAM_BURST: Final = 25
SPAM_REFILL_S: Final = 300.0
_log = structlog.get_logger(__name__)


class Api(Protocol):
    """The API calls a recorder makes: create, and get and patch for the count bump
    (`kube.Kube` provides them)."""

    async def create(
        self, res: kube.Resource, obj: Obj, *, namespace: str | None = None
    ) -> Obj: ...

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj: ...

    async def patch(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj: ...


def involved_object(
    *,
    api_version: str,
    kind: str,
    name: str,
    uid: str,
    namespace: str = "",
    resource_version: str | None = None,
) -> Obj:
    """An Event's `involvedObject`; `namespace` and `resource_version` only when given."""
    obj: Obj = {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}
    if namespace:
        obj["namespace"] = namespace
    if resource_version is not None:
        obj["resourceVersion"] = resource_version
    return obj


def event_name(object_name: str, suffix: str) -> str:
    """client-go's Event name `{object}.{suffix}`, the object's name cut so the whole stays a
    valid name."""
    head = object_name[: MAX_NAME - len(suffix) - 1].rstrip("-.")
    return f"{head}.{suffix}"


def digest(*parts: str) -> str:
    """The naming digest: 16 hex digits of SHA-256 over `parts`, one per line."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:DIGEST_LENGTH]


class Recorder:
    """Records core/v1 Events for one component (module docstring)."""

    def __init__(
        self,
        api: Api,
        *,
        component: str,
        instance: str = "",
        host: str = "",
        now: Callable[[], str] = clock_mod.now_rfc3339,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self.component = component
        self.instance = instance
        self._host = host
        self._now = now
        self._monotonic = monotonic
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()

    def name_for(self, involved: Obj, *, type: str, reason: str, message: str) -> str:
        """The Event's name when the caller gives none (module docstring, "Naming")."""
        suffix = digest(str(involved.get("uid") or ""), type, reason, message)
        return event_name(str(involved.get("name") or ""), suffix)

    async def record(
        self,
        involved: Obj,
        *,
        type: str,
        reason: str,
        message: str,
        name: str | None = None,
        namespace: str | None = None,
        spam_key: str | None = None,
    ) -> None:
        """Record (or bump) the Event `type`/`reason`/`message` about `involved`, unless its
        `spam_key` is over budget (module doc); raises the `errors` tree when the API refuses."""
        if not self._allowed(str(involved.get("uid") or involved.get("name")), spam_key or reason):
            _log.debug("event_dropped_over_budget", reason=reason, spam_key=spam_key or reason)
            return
        name = name or self.name_for(involved, type=type, reason=reason, message=message)
        ns = namespace or str(involved.get("namespace") or "") or CLUSTER_EVENT_NAMESPACE
        now = self._now()
        known = self._counts.get((ns, name))
        if known is not None:
            try:
                await self._bump(ns, name, known, now)
                return
            except errors.NotFound:
                self._counts.pop((ns, name), None)  # expired: record it afresh
        source: Obj = {"component": self.component}
        if self._host:
            source["host"] = self._host
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type,
            "source": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        try:
            await self._api.create(kube.EVENTS, body, namespace=ns)
            self._remember(ns, name, 1)
            return
        except errors.Conflict as exc:
            if not exc.already_exists:
                raise
        current = await self._api.get(kube.EVENTS, name, namespace=ns)
        await self._bump(ns, name, int(current.get("count") or 1), now)

    def _allowed(self, involved: str, spam_key: str) -> bool:
        """Take a token from the bucket of (`involved`, `spam_key`), if it has one."""
        key, now = (involved, spam_key), self._monotonic()
        tokens, since = self._buckets.pop(key, (float(SPAM_BURST), now))
        tokens = min(float(SPAM_BURST), tokens + (now - since) / SPAM_REFILL_S)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > CACHE_SIZE:
            self._buckets.popitem(last=False)
        return allowed

    async def _bump(self, namespace: str, name: str, count: int, now: str) -> None:
        patch = {"count": count + 1, "lastTimestamp": now}
        await self._api.patch(kube.EVENTS, name, patch, namespace=namespace)
        self._remember(namespace, name, count + 1)

    def _remember(self, namespace: str, name: str, count: int) -> None:
        self._counts[(namespace, name)] = count
        self._counts.move_to_end((namespace, name))
        while len(self._counts) > CACHE_SIZE:
            self._counts.popitem(last=False)
