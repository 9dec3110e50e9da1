"""Who may fetch a model folder from this node's peer server: a download pod of a trusted Job.

`Authorizer.authorize(token, storage_key, scopes)` answers `Requester` or `Refusal`
(`identify(token, storage_key)`: steps 1-3 only, for the peer server, which also serves a
requester of another scope that proved access at the origin, `agent.peer.proofs`):

1. TokenReview (audience `localcache-peer`): authenticated, the audience in
   `status.audiences`, user `system:serviceaccount:<ns>:<sa>`, extras
   `authentication.kubernetes.io/pod-name` and `pod-uid` (a token bound to a pod).
2. The pod: LIST pods in `<ns>` with `metadata.name=<pod>` (the agent may list pods, not get
   them); its uid must equal the token's; its controller ownerReference must be a batch/v1 Job.
3. The LocalModelNode named by the pod's `spec.nodeName` (GET) must record that Job
   (`status.downloadJobs`: namespace, name and uid; only that node's agent writes it, tenants
   cannot) with `storageKey == storage_key`.
4. That record's `scope` must be one of `scopes` (the served folder's).

Refusal reasons, a fixed vocabulary (metrics, Events): `no-token`, `bad-token`,
`wrong-audience` (401); `not-a-pod`, `pod-gone`, `not-a-download-job`, `untrusted-job`,
`wrong-key`, `other-scope` (403).

Steps 1-3 are cached per (SHA-256 of the token, storage key): an identity until
min(the token's `exp`, 60 s), a refusal 10 s; at most `max_entries` (LRU). Step 4 is checked on
every call against the scopes given, so a folder's scopes may change under a cached identity.
Concurrent identical lookups share one; at most `max_concurrent_lookups` run at once (a
flood of fresh tokens queues here rather than on the apiserver), and a token that is not
shaped like a JWT is refused without asking. A failing API call (timeout, 5xx, connection) is not a
decision: `authorize` raises `Unavailable` and nothing is cached. Tokens are never logged or
kept (only their hash is).

The three API calls are the `AuthApi` protocol (`KubeAuthApi` over `kube.Kube`, each call with
a timeout), so the decision logic is testable without an apiserver.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import json
import re
import time
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from localcache.agent.jobs import trust
from localcache.api import groupversion, peer
from localcache.runtime import apitypes, apiverbs, errors
from localcache.runtime import clock as clock_mod

Obj = dict[str, Any]
Reason = Literal[
    "no-token",
    "bad-token",
    "wrong-audience",
    "not-a-pod",
    "pod-gone",
    "not-a-download-job",
    "untrusted-job",
    "wrong-key",
    "other-scope",
]
REASONS: Final[tuple[Reason, ...]] = typing.get_args(Reason)
SA_PREFIX: Final = "system:serviceaccount:"
POD_NAME_EXTRA: Final = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA: Final = "authentication.kubernetes.io/pod-uid"
MAX_TOKEN_BYTES: Final = 16384
POSITIVE_TTL_S: Final = 60.0
NEGATIVE_TTL_S: Final = 10.0
MAX_ENTRIES: Final = 4096
MAX_CONCURRENT_LOOKUPS: Final = 8
WAITING_PER_LOOKUP: Final = 8
"""Lookups that may wait for a free one, per concurrent lookup; beyond them: 503."""
API_TIMEOUT_S: Final = 5.0
_JWT: Final = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class Requester:
    """A download pod entitled to the folder: its namespace, pod, Job, node and record scope."""

    namespace: str
    pod: str
    job: str
    node: str
    scope: str


@dataclass(frozen=True, slots=True)
class Refusal:
    status: Literal[401, 403]
    reason: Reason


class Unavailable(Exception):
    """The apiserver could not be asked (timeout, error status, connection): no decision."""


def refusal(reason: Reason) -> Refusal:
    return Refusal(401 if reason in ("no-token", "bad-token", "wrong-audience") else 403, reason)


class AuthApi(Protocol):
    """The three API calls the authorizer makes; each raises `Unavailable` on failure."""

    async def review_token(self, token: str) -> Mapping[str, Any]:
        """The TokenReview's `status` for `token` with audience `localcache-peer`."""
        ...

    async def list_pods(self, namespace: str, name: str) -> list[Obj]:
        """The pods named `name` in `namespace` (zero or one)."""
        ...

    async def get_node(self, name: str) -> Obj | None:
        """The LocalModelNode `name`, or None when there is none."""
        ...


class KubeAuthApi:
    """`AuthApi` over the runtime's API client; every call has `timeout_s`."""

    def __init__(self, api: apiverbs.Verbs, *, timeout_s: float = API_TIMEOUT_S) -> None:
        self._api = api
        self._timeout_s = timeout_s

    async def review_token(self, token: str) -> Mapping[str, Any]:
        try:
            review = await self._api.token_review(
                token, audiences=[peer.TOKEN_AUDIENCE], request_timeout=self._timeout_s
            )
        except (errors.ApiError, errors.TransportError) as exc:
            raise Unavailable(f"TokenReview: {type(exc).__name__}") from None
        status = review.get("status")
        return status if isinstance(status, dict) else {}

    async def list_pods(self, namespace: str, name: str) -> list[Obj]:
        try:
            found = await self._api.list(
                apitypes.PODS,
                namespace=namespace,
                field_selector=f"metadata.name={name}",
                limit=2,
                request_timeout=self._timeout_s,
            )
        except (errors.ApiError, errors.TransportError) as exc:
            raise Unavailable(f"list pods: {type(exc).__name__}") from exc
        return found.items

    async def get_node(self, name: str) -> Obj | None:
        try:
            return await self._api.get(
                groupversion.LOCAL_MODEL_NODE.api, name, request_timeout=self._timeout_s
            )
        except errors.NotFound:
            return None
        except (errors.ApiError, errors.TransportError) as exc:
            raise Unavailable(f"get LocalModelNode: {type(exc).__name__}") from exc


def token_expiry(token: str) -> float | None:
    """The `exp` claim (epoch seconds) of a JWT, read without verifying it (the apiserver
    did): only to bound how long a decision is cached. None when it has none."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _extra(extra: Mapping[str, Any], key: str) -> str:
    values = extra.get(key)
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return ""


def identity(status: Mapping[str, Any]) -> tuple[str, str, str] | Refusal:
    """(namespace, pod name, pod uid) of a TokenReview status, or the refusal."""
    if status.get("authenticated") is not True:
        return refusal("bad-token")
    audiences = status.get("audiences")
    if not isinstance(audiences, list) or peer.TOKEN_AUDIENCE not in audiences:
        return refusal("wrong-audience")
    user = _mapping(status.get("user"))
    username = _str(user.get("username"))
    extra = _mapping(user.get("extra"))
    parts = username[len(SA_PREFIX) :].split(":") if username.startswith(SA_PREFIX) else []
    pod, uid = _extra(extra, POD_NAME_EXTRA), _extra(extra, POD_UID_EXTRA)
    if len(parts) != 2 or not all(parts) or not pod or not uid:
        return refusal("not-a-pod")
    return parts[0], pod, uid


def _controller_job(pod: Obj) -> tuple[str, str] | None:
    """(name, uid) of the pod's controller ownerReference when it is a batch/v1 Job."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            if ref.get("apiVersion") == "batch/v1" and ref.get("kind") == "Job":
                name, uid = _str(ref.get("name")), _str(ref.get("uid"))
                return (name, uid) if name and uid else None
            return None
    return None


def entitled(
    *, namespace: str, pod_uid: str, pods: list[Obj], node: Obj | None, storage_key: str
) -> Requester | Refusal:
    """Steps 2 and 3 of the module docstring, given what the API returned. `node` is the
    LocalModelNode of the pod's node (None when it has none or the pod names no node)."""
    pod = next((p for p in pods if _str((p.get("metadata") or {}).get("uid")) == pod_uid), None)
    if pod is None:
        return refusal("pod-gone")
    job = _controller_job(pod)
    if job is None:
        return refusal("not-a-download-job")
    node_name = _str((pod.get("spec") or {}).get("nodeName"))
    if node is None or not node_name or _str((node.get("metadata") or {}).get("name")) != node_name:
        return refusal("untrusted-job")
    records = [
        r
        for r in trust.parse_records(node.get("status"))
        if (r.namespace, r.name, r.uid) == (namespace, job[0], job[1])
    ]
    if not records:
        return refusal("untrusted-job")
    record = next((r for r in records if r.storage_key == storage_key), None)
    if record is None:
        return refusal("wrong-key")
    name = _str(pod["metadata"].get("name"))
    return Requester(namespace=namespace, pod=name, job=job[0], node=node_name, scope=record.scope)


@dataclass(slots=True)
class _Entry:
    decision: Requester | Refusal
    expires: float


class Authorizer:
    """See the module docstring. Not thread-safe: one event loop."""

    def __init__(
        self,
        api: AuthApi,
        *,
        clock: clock_mod.Clock | None = None,
        wall: Callable[[], float] = time.time,
        max_entries: int = MAX_ENTRIES,
        max_concurrent_lookups: int = MAX_CONCURRENT_LOOKUPS,
        positive_ttl_s: float = POSITIVE_TTL_S,
        negative_ttl_s: float = NEGATIVE_TTL_S,
    ) -> None:
        self._api = api
        self._clock: clock_mod.Clock = clock or clock_mod.SystemClock()
        self._wall = wall
        self._max = max_entries
        self._positive_ttl = positive_ttl_s
        self._negative_ttl = negative_ttl_s
        self._cache: collections.OrderedDict[tuple[str, str], _Entry] = collections.OrderedDict()
        self._pending: dict[tuple[str, str], asyncio.Future[Requester | Refusal]] = {}
        self._lookups = asyncio.Semaphore(max_concurrent_lookups)
        self._max_waiting = max_concurrent_lookups * WAITING_PER_LOOKUP
        self._waiting = 0

    @property
    def cached(self) -> int:
        return len(self._cache)

    async def authorize(
        self, token: str | None, storage_key: str, scopes: frozenset[str]
    ) -> Requester | Refusal:
        decision = await self.identify(token, storage_key)
        if isinstance(decision, Requester) and decision.scope not in scopes:
            return refusal("other-scope")
        return decision

    async def identify(self, token: str | None, storage_key: str) -> Requester | Refusal:
        """Steps 1-3: the download pod and its record's scope, whatever the folder's."""
        if not token:
            return refusal("no-token")
        if len(token) > MAX_TOKEN_BYTES or _JWT.fullmatch(token) is None:
            return refusal("bad-token")
        return await self._lookup(token, storage_key)

    async def _lookup(self, token: str, storage_key: str) -> Requester | Refusal:
        key = (hashlib.sha256(token.encode()).hexdigest(), storage_key)
        entry = self._cache.get(key)
        if entry is not None:
            if entry.expires > self._clock.now():
                self._cache.move_to_end(key)
                return entry.decision
            del self._cache[key]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Requester | Refusal] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            decision = await self._decide(token, storage_key)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else Unavailable("cancelled"))
            future.exception()  # retrieved: waiters (if any) get it, no "never retrieved" warning
            raise
        finally:
            del self._pending[key]
        future.set_result(decision)
        self._remember(key, decision, token)
        return decision

    def _remember(self, key: tuple[str, str], decision: Requester | Refusal, token: str) -> None:
        ttl = self._negative_ttl
        if isinstance(decision, Requester):
            exp = token_expiry(token)
            left = self._positive_ttl if exp is None else exp - self._wall()
            ttl = min(self._positive_ttl, left)
        if ttl <= 0:
            return
        self._cache[key] = _Entry(decision, self._clock.now() + ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)

    async def _decide(self, token: str, storage_key: str) -> Requester | Refusal:
        # a flood of fresh tokens must not queue real fetchers behind it without end: beyond
        # the bound the caller is told to come back (503) at once
        if self._waiting >= self._max_waiting:
            raise Unavailable("too many token reviews waiting")
        self._waiting += 1
        try:
            await self._lookups.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._ask(token, storage_key)
        finally:
            self._lookups.release()

    async def _ask(self, token: str, storage_key: str) -> Requester | Refusal:
        who = identity(await self._api.review_token(token))
        if isinstance(who, Refusal):
            return who
        namespace, pod_name, pod_uid = who
        pods = await self._api.list_pods(namespace, pod_name)
        pod = next((p for p in pods if _str((p.get("metadata") or {}).get("uid")) == pod_uid), None)
        node_name = _str(((pod or {}).get("spec") or {}).get("nodeName"))
        node = await self._api.get_node(node_name) if node_name else None
        return entitled(
            namespace=namespace, pod_uid=pod_uid, pods=pods, node=node, storage_key=storage_key
        )
