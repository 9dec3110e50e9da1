"""Admission webhook handling: AdmissionReview `admission.k8s.io/v1` in and out.

- `AdmissionServer`: a registry of handlers keyed by URL path and the aiohttp application that
  serves them (`app()`). A handler is `async (Request) -> Response`; build responses with
  `allowed()`, `denied()` and `patched()`. `metadata_patch()` builds JSON-patch ops for labels
  and annotations. TLS serving (hot-reloaded certificate, the TCP site) is `runtime.tls`.

Contract:
- Every 200 response is an AdmissionReview carrying the request's `uid`.
- A body over `max_body_bytes` gets 413; a body not received within `body_timeout_s` gets 408
  and the connection is closed (handshake and idle limits are `runtime.tls.serve`'s); a body
  that is not JSON or not an `admission.k8s.io/v1` AdmissionReview with a request uid gets
  400; none of these reaches a handler.
- A handler that raises or outlives its timeout is answered per its `on_failure`: `"deny"`
  (a denial saying so: code 500 or 504) or `"error"` (HTTP 500/504, so the apiserver applies the
  webhook's failurePolicy). Keep timeouts below the configuration's `timeoutSeconds`.
- Metrics: `controller_runtime_webhook_requests_total{webhook,code}`,
  `controller_runtime_webhook_latency_seconds{webhook}`,
  `controller_runtime_webhook_requests_in_flight{webhook}` (the `webhook` label is the path),
  plus `localcache_admission_reviews_total{webhook,result}` with result in `RESULTS`.
  `stats()` returns the same counts as data. Logs carry uid, kind, namespace, name, operation.
- Not promised: handlers for one path may run concurrently; responses carry no audit
  annotations.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from aiohttp import web

from localcache.runtime import clock as clock_mod
from localcache.runtime import metrics as metrics_mod

log = structlog.get_logger(__name__)

API_VERSION = "admission.k8s.io/v1"
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
DEFAULT_TIMEOUT_S = 8.0
DEFAULT_BODY_TIMEOUT_S = 10.0
RESULTS = (
    "allowed", "patched", "denied", "timeout", "error", "malformed", "too_large", "slow_client",
)  # fmt: skip

JsonObject = dict[str, Any]
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
FailureMode = Literal["deny", "error"]


class MalformedReview(ValueError):
    """The body is not an AdmissionReview this server can answer."""


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True, slots=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    """The parts of an AdmissionRequest a handler reads. Objects are plain dicts (None when the
    operation has none: `object` on DELETE, `old_object` on CREATE)."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    namespace: str
    name: str
    operation: Operation
    user: UserInfo
    object: JsonObject | None
    old_object: JsonObject | None
    dry_run: bool = False
    sub_resource: str = ""
    options: JsonObject | None = None

    def log_context(self) -> dict[str, str]:
        """uid, kind, namespace, name and operation, for structured logs."""
        return {"uid": self.uid, "kind": self.kind.kind, "namespace": self.namespace,
                "name": self.name, "operation": self.operation}  # fmt: skip

    @classmethod
    def from_review(cls, review: Any) -> Request:
        """Parse a decoded AdmissionReview; raise MalformedReview saying what is wrong."""
        if not isinstance(review, dict):
            raise MalformedReview("body is not a JSON object")
        if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
            raise MalformedReview(f"expected an AdmissionReview of apiVersion {API_VERSION}")
        req = review.get("request")
        if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
            raise MalformedReview("AdmissionReview has no request with a uid")
        op = req.get("operation")
        if op not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
            raise MalformedReview(f"request.operation {op!r} is not an admission operation")
        try:
            kind, res, user = _dict(req, "kind"), _dict(req, "resource"), _dict(req, "userInfo")
            extra = {k: tuple(v) for k, v in (user.get("extra") or {}).items()}
            return cls(
                uid=req["uid"],
                kind=GroupVersionKind(kind.get("group", ""), kind["version"], kind["kind"]),
                resource=GroupVersionResource(
                    res.get("group", ""), res["version"], res["resource"]
                ),
                namespace=req.get("namespace") or "",
                name=req.get("name") or "",
                operation=op,
                user=UserInfo(
                    user.get("username", ""),
                    user.get("uid", ""),
                    tuple(user.get("groups") or ()),
                    extra,
                ),
                object=_optional_dict(req, "object"),
                old_object=_optional_dict(req, "oldObject"),
                dry_run=bool(req.get("dryRun")),
                sub_resource=req.get("subResource") or "",
                options=_optional_dict(req, "options"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise MalformedReview(f"AdmissionReview request is incomplete: {exc!r}") from exc


def _dict(obj: JsonObject, key: str) -> JsonObject:
    value = obj.get(key) or {}
    if not isinstance(value, dict):
        raise TypeError(f"request.{key} is not an object")
    return value


def _optional_dict(obj: JsonObject, key: str) -> JsonObject | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"request.{key} is not an object")
    return value


@dataclass(frozen=True, slots=True)
class Response:
    """An AdmissionResponse without its uid (added by `review()`)."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    field: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[JsonObject, ...] = ()

    def review(self, uid: str) -> JsonObject:
        """The AdmissionReview answering the request `uid`."""
        resp: JsonObject = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            status: JsonObject = {"status": "Failure", "message": self.message, "code": self.code}
            if self.reason:
                status["reason"] = self.reason
            if self.field:
                cause = {
                    "type": "FieldValueForbidden",
                    "field": self.field,
                    "message": self.message,
                }
                status["details"] = {"causes": [cause]}
            resp["status"] = status
        if self.warnings:
            resp["warnings"] = list(self.warnings)
        if self.patch:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}

    @property
    def result(self) -> str:
        return "patched" if self.patch else ("allowed" if self.allowed else "denied")


def allowed(*, warnings: Iterable[str] = ()) -> Response:
    return Response(True, warnings=tuple(warnings))


def denied(
    message: str,
    *,
    field: str = "",
    code: int = 403,
    reason: str = "Forbidden",
    warnings: Iterable[str] = (),
) -> Response:
    """A denial; with `field`, the message starts with it (`spec.x: ...`) and names it in
    `status.details.causes`, as Kubernetes field errors do."""
    text = f"{field}: {message}" if field and not message.startswith(field) else message
    return Response(False, text, code, reason, field, tuple(warnings))


def patched(ops: Sequence[JsonObject], *, warnings: Iterable[str] = ()) -> Response:
    """Allowed with a JSONPatch; no ops is a plain `allowed`."""
    return Response(True, warnings=tuple(warnings), patch=tuple(ops))


def escape_pointer(token: str) -> str:
    """One JSON-pointer reference token (RFC 6901): `~` → `~0`, `/` → `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def metadata_patch(
    obj: JsonObject,
    *,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> list[JsonObject]:
    """JSON-patch ops that make `obj`'s labels/annotations match: a value sets the key, None
    removes it when present. Keys already as wanted produce no op."""
    meta = obj.get("metadata") or {}
    ops: list[JsonObject] = []
    if "metadata" not in obj and (labels or annotations):
        ops.append({"op": "add", "path": "/metadata", "value": {}})
    for section, wanted in (("labels", labels or {}), ("annotations", annotations or {})):
        current = meta.get(section)
        to_set = {k: v for k, v in wanted.items() if v is not None and (current or {}).get(k) != v}
        if current is None:
            if to_set:
                ops.append({"op": "add", "path": f"/metadata/{section}", "value": to_set})
            continue
        for key, value in wanted.items():
            path = f"/metadata/{section}/{escape_pointer(key)}"
            if value is None and key in current:
                ops.append({"op": "remove", "path": path})
            elif key in to_set:
                ops.append(
                    {"op": "replace" if key in current else "add", "path": path, "value": value}
                )
    return ops


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class AdmissionStats:
    """Answered reviews by (path, result), and the registered paths."""

    paths: tuple[str, ...]
    counts: Mapping[tuple[str, str], int]

    def count(self, path: str, result: str | None = None) -> int:
        return sum(n for (p, r), n in self.counts.items() if p == path and result in (None, r))


@dataclass(frozen=True)
class _Route:
    handler: Handler
    timeout_s: float
    on_failure: FailureMode


class AdmissionServer:
    """Handlers by path, and the aiohttp application serving them (see module doc)."""

    def __init__(
        self,
        *,
        metrics: metrics_mod.Metrics | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        clock: clock_mod.Clock | None = None,
    ) -> None:
        self._routes: dict[str, _Route] = {}
        self._body_timeout_s = body_timeout_s
        self._max_body = max_body_bytes
        self._timeout_s = timeout_s
        self._clock = clock or clock_mod.SystemClock()
        self._counts: Counter[tuple[str, str]] = Counter()
        m = metrics or metrics_mod.Metrics()
        self._requests = m.counter(
            "controller_runtime_webhook_requests_total",
            "Total number of admission requests by HTTP status code.",
            labels=("webhook", "code"),
        )
        self._latency = m.histogram(
            "controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests",
            labels=("webhook",),
            buckets=metrics_mod.WORKQUEUE_BUCKETS,
        )
        self._in_flight = m.gauge(
            "controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.",
            labels=("webhook",),
        )
        self._results = m.counter(
            "localcache_admission_reviews_total",
            "Admission requests by outcome (allowed, patched, denied, timeout, error, ...).",
            labels=("webhook", "result"),
        )

    def register(
        self,
        path: str,
        handler: Handler,
        *,
        timeout_s: float | None = None,
        on_failure: FailureMode = "deny",
    ) -> None:
        """Serve `handler` at `path` (POST). Register before `app()`; a path is taken once."""
        if not path.startswith("/"):
            raise ValueError(f"webhook path must start with '/': {path!r}")
        if path in self._routes:
            raise ValueError(f"webhook path already registered: {path}")
        self._routes[path] = _Route(handler, timeout_s or self._timeout_s, on_failure)

    def stats(self) -> AdmissionStats:
        return AdmissionStats(tuple(self._routes), dict(self._counts))

    def app(self) -> web.Application:
        """A new aiohttp application with one POST route per registered path."""
        application = web.Application(client_max_size=self._max_body)
        for path in self._routes:
            application.router.add_post(path, self._handle)
        return application

    async def _handle(self, http: web.Request) -> web.StreamResponse:
        path = http.path
        started = self._clock.now()
        self._in_flight.inc(webhook=path)
        status, result = 500, "error"
        try:
            response, result = await self._review(path, http)
            status = response.status
            return response
        finally:
            self._in_flight.dec(webhook=path)
            self._requests.inc(webhook=path, code=str(status))
            self._results.inc(webhook=path, result=result)
            self._latency.observe(self._clock.now() - started, webhook=path)
            self._counts[(path, result)] += 1

    async def _review(self, path: str, http: web.Request) -> tuple[web.Response, str]:
        if (http.content_length or 0) > self._max_body:
            return _too_large(path, http.content_length or 0, self._max_body)
        if http.content_type not in ("application/json", "application/octet-stream"):
            return _bad_request(path, f"content type {http.content_type!r}, want application/json")
        try:
            async with asyncio.timeout(self._body_timeout_s):
                body = await http.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(path, -1, self._max_body)
        except TimeoutError:
            log.warning("admission.slow_body", webhook=path, timeout_s=self._body_timeout_s)
            text = f"request body not received within {self._body_timeout_s:g}s"
            response = web.Response(status=408, text=text, headers={"Connection": "close"})
            response.force_close()
            return response, "slow_client"
        try:
            request = Request.from_review(json.loads(body))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and MalformedReview
            return _bad_request(
                path, str(exc) if isinstance(exc, MalformedReview) else "invalid JSON"
            )
        route = self._routes[path]
        with structlog.contextvars.bound_contextvars(webhook=path, **request.log_context()):
            try:
                async with asyncio.timeout(route.timeout_s):
                    answer = await route.handler(request)
            except TimeoutError:
                log.warning("admission.handler_timeout", timeout_s=route.timeout_s)
                msg = f"admission handler {path} did not answer within {route.timeout_s:g}s"
                return _failure(request.uid, route, msg, status=504, reason="Timeout"), "timeout"
            except Exception as exc:
                log.exception("admission.handler_failed", error_type=type(exc).__name__)
                msg = f"admission handler {path} failed: {type(exc).__name__}"
                failure = _failure(request.uid, route, msg, status=500, reason="InternalError")
                return failure, "error"
            emit = log.debug if answer.allowed else log.info  # denials are worth a line
            emit("admission.reviewed", result=answer.result, message=answer.message or None)
            return web.json_response(answer.review(request.uid)), answer.result


def _failure(uid: str, route: _Route, message: str, *, status: int, reason: str) -> web.Response:
    if route.on_failure == "error":
        return web.Response(status=status, text=message)
    return web.json_response(denied(message, code=status, reason=reason).review(uid))


def _bad_request(path: str, message: str) -> tuple[web.Response, str]:
    log.warning("admission.malformed", webhook=path, error=message)
    return web.Response(status=400, text=f"malformed AdmissionReview: {message}"), "malformed"


def _too_large(path: str, size: int, limit: int) -> tuple[web.Response, str]:
    log.warning("admission.too_large", webhook=path, size=size, limit=limit)
    text = f"request body exceeds the {limit}-byte limit of this admission webhook"
    return web.Response(status=413, text=text), "too_large"
